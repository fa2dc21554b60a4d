"""Where a run stands between its rounds, kept for the round driver (core/rounds.py) in three
small records: the wall-clock of its segments (Clock), its last round boundary and last row
(Marks: what an interrupted run checkpoints and reports) and its checkpoints (Checkpoints: when
one is due, which the driver asks after every step, and the tag that tasks carry)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fednet.core.state_files import NO_MANIFEST, Manifest
from fednet.types import Task

Mark = tuple[dict[str, int], int, float]
"""(ledger totals, task counter, simulated time) at a round boundary."""
Logged = tuple[int, float, dict[str, int], int]
"""(rounds, simulated time, ledger totals, messages) as of a row logged."""


class Clock:
    """Seconds of training: from the first round's start to the last round's end (or now), the
    earlier segments of a resumed run included (summary.json's wall_clock_s and segments)."""

    def __init__(self, planned: int) -> None:
        self.planned = planned  # the rounds the run plans (a segment's rounds_planned)
        self.segments: list[dict[str, Any]] = []  # a resumed run's earlier segments
        self.t0 = self.t_end = time.monotonic()
        self.running = True

    def start(self) -> None:
        self.t0, self.running = time.monotonic(), True

    def stop(self) -> None:
        self.t_end, self.running = time.monotonic(), False

    def before(self) -> float:
        """The wall-clock of the earlier segments."""
        return float(sum(s["wall_s"] for s in self.segments))

    def wall(self) -> float:
        end = time.monotonic() if self.running else self.t_end
        return self.before() + end - self.t0

    def all_segments(self, rounds_done: int) -> list[dict[str, Any]]:
        """Every segment, this one so far last (the checkpoint's and the summary's)."""
        first = self.segments[-1]["rounds"][1] if self.segments else 0
        now = {"rounds": [first, rounds_done], "rounds_planned": self.planned,
               "wall_s": self.wall() - self.before()}
        return [*self.segments, now]


@dataclass
class Marks:
    """The run's state at its last round boundary (`mark`) and as of its last row (`logged`:
    an interrupted run's summary reports it, not the tasks of the round it was in)."""

    mark: Mark
    logged: Logged
    mutating: bool = False  # a round is being aggregated, evaluated and logged
    caught: bool = False  # Ctrl-C came while the state was still `mark` (Session.checkpoint_interrupted)

    def interrupted(self, rounds_done: int) -> None:
        """Ctrl-C: the state is the last finished round's unless that round was mutating it."""
        self.caught = not self.mutating and rounds_done > 0


class Checkpoints:
    """When the driver checkpoints, and the tag tasks carry for clients that keep state.

    Due after a step that crossed a multiple of --checkpoint-every, and after the last round
    when the run checkpoints at all (--checkpoint-every, or a resumed run: its checkpoint must
    never stay behind the rounds it finished, core/checkpoint._check_history). `write` writes
    one and says whether it did (none without a results folder). With clients that keep state
    (`client_state`), every task says the rounds done at the last checkpoint (`ckpt`; without
    --checkpoint-every, at the step's start, where an interrupt writes one): the clients keep
    their state files by it (core/state_files.py), and the manifest notes their files may change."""

    def __init__(self, every: int, planned: int, write: Callable[[], bool], manifest: Manifest
                 = NO_MANIFEST, client_state: bool = False) -> None:
        self.every, self.planned, self.write = every, planned, write
        self.manifest, self.client_state = manifest, client_state
        self.keep_last = bool(every)
        self.ckpt_round = 0  # rounds done at the last checkpoint
        self.step_start = 0  # the first round of the step now running

    def stamp(self, tasks: list[Task]) -> None:
        if not self.client_state:
            return
        ckpt = self.ckpt_round if self.every else self.step_start
        for t in tasks:
            t.body = {**t.body, "ckpt": ckpt}
        self.manifest.touch(c for t in tasks for c in t.route)  # files that may change

    def step_done(self, rnd: int, rounds_done: int) -> None:
        """The step that began at round `rnd` is logged: a checkpoint when one is due."""
        every = self.every
        due = (every and rounds_done // every > rnd // every) or (
            rounds_done == self.planned and self.keep_last)
        if due and self.write():
            self.ckpt_round = rounds_done

    def resume(self, rounds_done: int) -> None:
        self.ckpt_round, self.keep_last = rounds_done, True
