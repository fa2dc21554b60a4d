"""--batch-clients: a round's tasks trained in blocks (issue 56), in both runtimes.

The rule: the tasks a runtime holds that go to one client only (a star task, not a ring) are
taken in client-id order, each device's apart (`--gpus`: a block is trained on one device, its
clients'), and cut into consecutive blocks of at most --batch-clients tasks and at most
BLOCK_BYTES of estimated memory. `fednet local` holds the whole round (its tasks as they are
first sent; an asynchronous step's later tasks train alone); a `fednet launch` client process
holds the tasks queued for its clients. A block is trained as one batch before its tasks run
(algorithms/updates.train_ahead); then every task runs exactly as without batching (received,
checked, its result encoded and sent, its FLOPs charged to the simulated clock batch by batch),
only its local training is taken from the block (updates.take_ahead). So the bytes, the ledger
and the simulated clock are those of the unbatched run, and a client's model is its plain
training's to float32 rounding (training/batched.py states the tolerance). A client's bits do
not depend on which block it is trained in (measured on this CPU; tests/test_batched_runtime.py
checks it): `fednet local` and `fednet launch` agree bit for bit although a client process
holds only its own clients' tasks.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from fednet import algorithms
from fednet.algorithms import updates
from fednet.config import RunConfig
from fednet.types import Task

if TYPE_CHECKING:
    from fednet.core.executor import Executor

log = logging.getLogger("fednet.client")

BLOCK_BYTES = 1 << 30
"""The estimated memory of one block's batched training (block_bytes), at most."""

_WARNED: set[str] = set()  # refusals already logged by this process


def batching(cfg: RunConfig) -> bool:
    """Whether this run trains its clients in blocks (--batch-clients and the Spec's batched)."""
    return cfg.train.batch_clients > 0 and algorithms.get(cfg.algo.name).batched


def note(cfg: RunConfig) -> str:
    """The console's one line when --batch-clients is asked of an algorithm that cannot batch
    ('' otherwise)."""
    if cfg.train.batch_clients > 0 and not algorithms.get(cfg.algo.name).batched:
        return (f"--batch-clients: {cfg.algo.name}'s client update is not batched (its Spec "
                "says batched=False); its clients train one at a time")
    return ""


def blocks(tasks: Iterable[Task], most: int, device_of: Callable[[int], str]
           ) -> list[list[Task]]:
    """The star training tasks (one client, not a hand-off, not a secure aggregation stage, the
    model sent as it is, not compressed) in client-id order, each device's apart, cut
    into consecutive blocks of at most `most`."""
    star = sorted((t for t in tasks if len(t.route) == 1 and t.hop == 0 and t.kind == "train"
                   and not t.stage and t.wire is None), key=lambda t: t.cid)
    by_device: dict[str, list[Task]] = {}
    for t in star:
        by_device.setdefault(device_of(t.cid), []).append(t)
    return [ts[i:i + most] for _, ts in sorted(by_device.items())
            for i in range(0, len(ts), max(1, most))]


def client_bytes(ex: Executor, params: int | None = None) -> int:
    """About what one client adds to a block: its trainable parameters eight times (stacked,
    start, gradient, momentum, anchor, end, update temporaries), its examples twice (gathered,
    batched) and a batch's activations (sixteen examples' worth per example of a batch).
    `params`: its model's trainable bytes (param_bytes) when the caller has them."""
    c = ex.ctx
    if params is None:
        params = param_bytes(c.model)
    example = c.x[:1].numel() * c.x.dtype.itemsize if len(c.y) else 0
    return 8 * params + example * (2 * len(c.y) + 16 * ex.cfg.train.batch_size)


def param_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's trainable parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def train_block(pairs: Sequence[tuple[Executor, Task]]) -> None:
    """Train the block's tasks ahead (updates.train_ahead), in pieces within BLOCK_BYTES; a block
    that cannot be batched (a model with BatchNorm, DP-SGD, another optimizer: the reason is
    logged once per process) is left to train task by task. A model object several clients
    share (the working model) has its parameters' bytes read once: nothing runs in between."""
    piece: list[tuple[Executor, Task]] = []
    used = 0
    sizes: dict[int, int] = {}  # id(model) -> param_bytes (the models are held by `pairs`)
    for ex, task in pairs:
        model = ex.ctx.model
        params = sizes.get(id(model))
        if params is None:
            params = sizes[id(model)] = param_bytes(model)
        n = client_bytes(ex, params)
        if piece and used + n > BLOCK_BYTES:
            _train(piece)
            piece, used = [], 0
        piece.append((ex, task))
        used += n
    if piece:
        _train(piece)


def _train(pairs: Sequence[tuple[Executor, Task]]) -> None:
    rules = [getattr(ex.update, "local", None) for ex, _ in pairs]
    why = updates.train_ahead([ex.ctx for ex, _ in pairs], [t for _, t in pairs], rules)
    if why and why not in _WARNED:
        _WARNED.add(why)
        log.warning("--batch-clients: these clients train one at a time: %s", why)


class Ahead:
    """fednet local's blocks of one round: each trained when its first task is about to run.
    executor(cid) builds (or finds) a client's Executor; hold(ex) keeps it for its task, which
    then builds none again (a client's data is made once a round, as without batching)."""

    def __init__(self, cfg: RunConfig, tasks: Iterable[Task], device_of: Callable[[int], str],
                 executor: Callable[[int], Executor], hold: Callable[[Executor], None]) -> None:
        self.executor, self.hold = executor, hold
        self.block_of: dict[int, list[Task]] = {}  # task id -> its block, until trained
        for b in blocks(tasks, cfg.train.batch_clients, device_of):
            self.block_of.update((t.task_id, b) for t in b)

    def before(self, task: Task) -> None:
        """The task is about to run: its block is trained now unless it was."""
        block = self.block_of.get(task.task_id)
        if block is None:
            return
        pairs = []
        for t in block:
            del self.block_of[t.task_id]
            pairs.append((self.executor(t.cid), t))
        try:
            train_block(pairs)
        finally:
            for ex, _ in pairs:
                self.hold(ex)
