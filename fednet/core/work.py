"""The work a task may ask of a client: bounded by the run, whatever its sender chose; and the
algorithm's own body keys, checked by the kinds its Spec declares before the algorithm reads them."""
from __future__ import annotations

import dataclasses
from typing import Any

from fednet import algorithms
from fednet.config import RunConfig
from fednet.protocol.fields import Bool, Int, List, Num, Str
from fednet.protocol.schema import MAX_CLIENTS

KINDS = {"number": Num(), "number >= 0": Num(0.0), "number or nan": Num(allow_nan=True),
         "flag": Bool(), "name": Str(64), "count": Int(1, 1_000_000),
         "client ids": List(Int(0, MAX_CLIENTS - 1), 100_000), "names": List(Str(256), 100_000)}
"""The protocol field each of algorithms/spec.BODY_KINDS stands for."""


def check_body(body: dict[str, Any], kinds: dict[str, str], what: str) -> None:
    """The keys of `body` that the algorithm declares (`kinds`: Spec.task_body or result_body)
    hold what they declare; ProtocolError names the first that does not."""
    for key, kind in kinds.items():
        if key in body:
            KINDS[kind].check(body[key], f"{what}.{key}")


def max_epochs(cfg: RunConfig) -> int:
    """The most epochs a task of this run may ask for: --epochs, or the largest parameter of the
    algorithm whose name ends in 'epochs' (FedSeq's pre-training)."""
    params = algorithms.get(cfg.algo.name).parse(cfg.algo.params)
    named = [int(getattr(params, f.name)) for f in dataclasses.fields(params)
             if f.name.endswith("epochs")] if dataclasses.is_dataclass(params) else []
    return max([int(cfg.train.epochs), *named])


def check_work(body: dict, cfg: RunConfig) -> None:
    """A task (or hand-off) asking for more work than the run allows fails (ValueError): a
    sender cannot keep a client training past the run's end; one whose algorithm keys do not
    hold what the algorithm declares fails too (ProtocolError)."""
    check_body(body, algorithms.get(cfg.algo.name).task_body, "task body")
    epochs = body.get("epochs")
    if epochs is not None and int(epochs) > (most := max_epochs(cfg)):
        raise ValueError(f"the task asks for {int(epochs)} epochs; this run allows at most "
                         f"{most} (--epochs, or the algorithm's *epochs parameters)")
