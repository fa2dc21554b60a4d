"""The work a task may ask of a client: bounded by the run, whatever its sender chose."""
from __future__ import annotations

import dataclasses

from fednet import algorithms
from fednet.config import RunConfig


def max_epochs(cfg: RunConfig) -> int:
    """The most epochs a task of this run may ask for: --epochs, or the largest parameter of the
    algorithm whose name ends in 'epochs' (FedSeq's pre-training)."""
    params = algorithms.get(cfg.algo.name).parse(cfg.algo.params)
    named = [int(getattr(params, f.name)) for f in dataclasses.fields(params)
             if f.name.endswith("epochs")] if dataclasses.is_dataclass(params) else []
    return max([int(cfg.train.epochs), *named])


def check_work(body: dict, cfg: RunConfig) -> None:
    """A task (or hand-off) asking for more work than the run allows fails (ValueError): a
    sender cannot keep a client training past the run's end."""
    epochs = body.get("epochs")
    if epochs is not None and int(epochs) > (most := max_epochs(cfg)):
        raise ValueError(f"the task asks for {int(epochs)} epochs; this run allows at most "
                         f"{most} (--epochs, or the algorithm's *epochs parameters)")
