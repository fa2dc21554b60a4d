"""What one client trains with: the run's settings its WELCOME gave and its Executor.

An idle client is its id and a few numbers: its Executor (data, model, client half) is built
when its first task arrives. With several clients in a process (`drop_idle`, client/host.py) it
is dropped after each task unless it is the only home of its state (a stateful client keeps its
state in the run's store between tasks; one client alone in its process keeps its objects and
writes the store only for checkpoints); a stateless client's goes to the process's kept
Executors (core/executor.KeptExecutors, within a budget) for its next task, as under fednet
local. `--real-time` waits out the simulated delays here. With --batch-clients the tasks
queued for a process's clients train in blocks before the first of them runs (train_queued).
"""
from __future__ import annotations

import time
from typing import Callable

import logging
from collections.abc import Sequence

import numpy as np

from fednet.algorithms.updates import forget_ahead
from fednet.core.batching import batching, blocks, train_block
from fednet.core.executor import Executor, KeptExecutors, Outcome, num_examples
from fednet.core.wire import message_task
from fednet.network.availability import Availability
from fednet.network.latency import Profile, up_delay, wire_time
from fednet.protocol import Message, tensor_bytes
from fednet.types import Task
from fednet.config import RunConfig

log = logging.getLogger("fednet.client")

NO_PROFILE = Profile()


class Trainer:
    """One client's training settings (from WELCOME) and its Executor. Slotted: a process
    holds thousands of idle clients."""

    __slots__ = ("cid", "device", "run_id", "executor", "build", "drop_idle", "links",
                 "availability", "real", "scale", "shaped", "profile", "kept")

    def __init__(self, cid: int, device: str, kept: KeptExecutors | None = None) -> None:
        self.cid, self.device, self.run_id = cid, device, ""
        self.executor: Executor | None = None
        self.build: tuple | None = None  # (config, partition) of the executor to build
        # kept: the process's kept Executors, given where it holds several clients (Host):
        # then the Executor is dropped after each task (see the module)
        self.drop_idle = kept is not None
        self.kept = kept
        self.links: Sequence[Profile] | None = None
        self.availability: Availability | None = None
        self.real, self.scale, self.shaped = False, 1.0, False
        self.profile = NO_PROFILE

    def take(self, cfg: RunConfig, run_id: str, profile: Profile, indices: np.ndarray | None, tables: tuple) -> int:
        """The run's settings from a WELCOME; the executor is kept when the configuration did
        not change (a restarted server resuming the same run). Returns the examples."""
        self.run_id, self.profile = run_id, profile
        lat = cfg.latency
        self.real, self.scale, self.shaped = lat.real, lat.time_scale, lat.shaped
        if self.executor is None or self.executor.cfg.replace(out="") != cfg.replace(out=""):
            self.executor = None  # built at this client's first task (executor_now)
            self.build = (cfg, indices)
        self.links, self.availability = tables
        if self.executor is not None:
            self._adopt(self.executor)
        return self.executor.num_examples if self.executor is not None else \
            num_examples(cfg, self.cid, indices)

    def _adopt(self, ex: Executor) -> None:
        """The run's id, the peers' links and the availability, as WELCOME gave them."""
        ex.run_id, ex.links, ex.availability = self.run_id, self.links, self.availability

    def executor_now(self) -> Executor:
        """This client's executor, built now if it has none."""
        if self.executor is None and self.kept is not None:
            self.executor = self.kept.take(self.cid)  # (dropped at each WELCOME: same settings)
            if self.executor is not None:
                self._adopt(self.executor)
        if self.executor is None:
            assert self.build is not None, "a task before WELCOME"
            cfg, indices = self.build
            self.executor = Executor(self.cid, cfg, self.profile, self.device, self.run_id,
                                     indices, files=self.drop_idle or
                                     bool(cfg.net.checkpoint_every))
            self._adopt(self.executor)
        return self.executor

    def train(self, ex: Executor, msg: Message, nbytes: int) -> tuple[Outcome, float]:
        """Run a task on `ex`: its outcome, and the simulated seconds its received bytes took
        on the wire where --shaped-links already spent them (0 otherwise)."""
        out = ex.on_task(msg, nbytes)
        if self.drop_idle and not ex.holds_state:
            self.executor = None  # nothing to keep: kept within the budget, or rebuilt
            if self.kept is not None and not ex.stateful:
                self.kept.keep(ex)
        wired = self.shaped and wire_time(self.profile, nbytes, ex.sender_link(msg))
        return out, float(wired)

    def batching(self) -> bool:
        """Whether the run's clients train in blocks (--batch-clients; core/batching.py)."""
        cfg = self.build[0] if self.build is not None else \
            self.executor.cfg if self.executor is not None else None
        return cfg is not None and batching(cfg)

    def up_delay(self, reply: Message) -> float:
        """The reply's upload delay (its latency, and its bytes unless the network shapes them)."""
        return up_delay(self.profile, 0 if self.shaped else tensor_bytes(reply))

    def sleep_real(self, sim_delay: float, elapsed: float, pump: Callable[[int], None],
                   extra: float = 0.0) -> None:
        """Real-time mode: wait out the simulated delay, still reading the sockets (`pump`)."""
        if not self.real:
            return
        end = time.monotonic() + max(0.0, (sim_delay + extra) * self.scale - elapsed)
        while (left := end - time.monotonic()) > 0:
            pump(max(1, int(min(left, 0.05) * 1000)))


def train_queued(queued: Sequence[tuple[Trainer, Message]], device: str) -> None:
    """--batch-clients under fednet launch: the TASKs queued for a process's clients (their
    trainers and messages, in the order they arrived) trained now in blocks by core/batching's
    rule, each kept for its task (algorithms/updates.take_ahead); what an earlier call trained
    and no task took is dropped first. A client whose executor cannot be built, or a block whose
    training fails, is left to run as without batching (its task then fails or trains alone)."""
    forget_ahead()
    pairs: dict[int, tuple[Executor, Task]] = {}
    for trainer, msg in queued:
        try:
            pairs[msg.task_id] = (trainer.executor_now(), message_task(msg))
        except Exception:  # noqa: BLE001 - its task reports it when it runs
            continue
    if not pairs:
        return
    most = next(iter(pairs.values()))[0].cfg.train.batch_clients
    for block in blocks((t for _, t in pairs.values()), most, lambda cid: device):
        try:
            train_block([pairs[t.task_id] for t in block])
        except Exception:  # noqa: BLE001 - the tasks train one at a time instead
            log.exception("--batch-clients: a block of %d tasks could not be trained together; "
                          "they train one at a time", len(block))
