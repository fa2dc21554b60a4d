"""The work a task may ask of a client: bounded by the run, whatever its sender chose; the
algorithm's own body keys, checked by the kinds its Spec declares before the algorithm reads them;
and the client compute a run asked for (ClientCompute: client-epochs and samples, in every row)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from fednet import algorithms
from fednet.config import RunConfig
from fednet.opcount import CONVOLUTION, DISPATCH
from fednet.protocol.fields import Bool, Int, List, Num, Str
from fednet.protocol.schema import MAX_CLIENTS
from fednet.training import flops
from fednet.types import Failure, Result, Task

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
    epochs = body.get("epochs")  # (max_epochs is at least --epochs: parsed only above it)
    if epochs is not None and int(epochs) > int(cfg.train.epochs) and \
            int(epochs) > (most := max_epochs(cfg)):
        raise ValueError(f"the task asks for {int(epochs)} epochs; this run allows at most "
                         f"{most} (--epochs, or the algorithm's *epochs parameters)")


def task_epochs(body: dict, cfg: RunConfig) -> int:
    """The local epochs a task asks of each client of its route: its body's `epochs`, else
    --epochs (what the client then runs; a protocol's stage that trains nothing says 0)."""
    return int(body.get("epochs", cfg.train.epochs))


class ClientCompute:
    """The client compute a run asked for, counted by the server from what it knows itself:
    every task it sent (setup stages included) charges each client of its route (from the
    task's hop on) the task's epochs, and as many samples as epochs x that client's training
    examples in the server's own partition (`size`; the whole training set for a client that
    trains on all of it). Work asked for: a task that failed, came too late or was cut short
    counts whole; the clients' own reports (their result's `samples`) are never read.

    Counted per logical round (`task.round`, -1 the setup), so that the row of round r
    carries the work of rounds <= r (FedSeqInter logs its interim rounds after the step's
    last task). In an ordered step (FedAsync, FedBuff) a task counts once its reply (result
    or failure) is taken in simulated-time order, so that a row carries the tasks done by its
    time; the step's last row carries every task it sent."""

    def __init__(self, cfg: RunConfig, size: Callable[[int], int],
                 seconds: Callable[[int, int, int], float] | None = None) -> None:
        self.cfg, self.size = cfg, size
        self.seconds = seconds or (lambda cid, epochs, n: 0.0)
        self.base: tuple[int, int, float] = (0, 0, 0.0)  # the rounds already in a row
        self.pending: dict[int, tuple[int, int, float]] = {}  # by round: counted, in no row yet
        self.out: dict[int, tuple[int, int, int, float]] = {}  # an ordered step's tasks out

    def charge(self, tasks: list[Task], by_reply: bool = False) -> list[Task]:
        """Count the tasks as sent (by_reply: once arrived() takes their reply); returns them."""
        for t in tasks:
            e = task_epochs(t.body, self.cfg)
            hops = t.route[t.hop:]
            if e and hops:
                sizes = [self.size(c) for c in hops]
                work = (e * len(hops), e * sum(sizes),
                        sum(self.seconds(c, e, n) for c, n in zip(hops, sizes)))
                if by_reply:
                    self.out[t.task_id] = (t.round, *work)
                else:
                    self._add(t.round, *work)
        return tasks

    def arrived(self, done: Result | Failure) -> None:
        """An ordered step's reply was taken: its task counts from now on."""
        work = self.out.pop(done.task_id, None)
        if work is not None:
            self._add(*work)

    def settle(self) -> None:
        """The step is over: every task it sent counts (replies held or never taken too)."""
        for rnd, ep, sa, sec in self.out.values():
            self._add(rnd, ep, sa, sec)
        self.out = {}

    def _add(self, rnd: int, ep: int, sa: int, sec: float) -> None:
        e0, s0, t0 = self.pending.get(rnd, (0, 0, 0.0))
        self.pending[rnd] = (e0 + ep, s0 + sa, t0 + sec)

    def row(self, rnd: int | None) -> dict[str, Any]:
        """The cumulative counts of a row of logical round `rnd` (None: all sent so far), as
        its `client_epochs`, `samples` and `client_compute_s` (the simulated seconds of that
        plain training at each client's rate, summed over the clients: Session's
        compute_seconds; apart from the network's, which `sim_s` holds with it)."""
        done = [r for r in self.pending if rnd is None or r <= rnd]
        ep, sa, sec = self.base
        for r in done:
            e, s, t = self.pending.pop(r)
            ep, sa, sec = ep + e, sa + s, sec + t
        self.base = (ep, sa, sec)
        return {"client_epochs": ep, "samples": sa, "client_compute_s": sec}

    def resume(self, rows: list[dict[str, Any]]) -> None:
        """Go on from the last row a resumed run keeps (its cumulative counts)."""
        last = rows[-1] if rows else {}
        self.base = (int(last.get("client_epochs", 0)), int(last.get("samples", 0)),
                     float(last.get("client_compute_s", 0.0)))
        self.pending, self.out = {}, {}


LATEST_WORK = 64
"""Session.latest_return's bound on a task's FLOPs and dispatched operations, in plain
training's FLOPs (and operations) of a batch of one example per example it allows (DP-SGD's
per-example gradients, Per-FedAvg's Hessian products and an evaluation add far less)."""


class PlainWork:
    """Plain training's FLOPs on the server's model (training/flops.py): what a client's meter
    counts for one epoch over n examples in batches of --batch-size, read by the server's
    bounds on a reply's simulated time (Session.earliest_return and latest_return)."""

    def __init__(self, model: torch.nn.Module, x: torch.Tensor, batch_size: int) -> None:
        self.model, self.shape, self.dtype = model, tuple(x.shape[1:]), x.dtype
        self.batch_size = int(batch_size)
        self.by_size: dict[int, flops.Work] = {}

    def epoch(self, examples: int) -> int:
        """The FLOPs of one epoch over `examples`."""
        full, rest = divmod(int(examples), self.batch_size)
        return full * self.batch(self.batch_size).flops + (self.batch(rest).flops if rest else 0)

    def epoch_ops(self, examples: int) -> dict[str, float]:
        """The dispatched tensor operations and convolutions of one epoch over `examples`, as a
        meter's Ops (opcount.DISPATCH and CONVOLUTION: network/latency.compute_time charges
        them at s_per_op and s_per_conv)."""
        full, rest = divmod(int(examples), self.batch_size)
        batches = [(full, self.batch(self.batch_size))] + ([(1, self.batch(rest))] if rest else [])
        return {DISPATCH: float(sum(n * w.ops for n, w in batches)),
                CONVOLUTION: float(sum(n * w.convs for n, w in batches))}

    def batch(self, size: int) -> flops.Work:
        """The FLOPs and operations of one training batch of `size` examples."""
        got = self.by_size.get(size)
        if got is None:
            got = self.by_size[size] = flops.batch_work(self.model, (size, *self.shape),
                                                        self.dtype, "train")
        return got
