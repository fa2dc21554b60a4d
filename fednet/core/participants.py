"""Who took part in a run: how many tasks each client was given (its place on a task's route,
setup stages included), kept only for the clients that had one, so that clients.jsonl and the
checkpoint grow with the cohorts a run trained, not with its population.

A step's tasks count once the step is logged (`commit`): a run interrupted in the middle of a
round records the clients of the rounds it finished, as its checkpoint and summary do."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

KEYS = ("participants/clients", "participants/tasks")
"""Their arrays in a checkpoint's state.npz."""


class Participants:
    """Tasks per client (cid -> count), for the clients given at least one."""

    def __init__(self, tasks: dict[int, int] | None = None) -> None:
        self.tasks: dict[int, int] = dict(tasks or {})
        self._pending: dict[int, int] = {}

    def note(self, tasks: Iterable[Any]) -> None:
        """Tasks about to be sent (core/rounds.stamp): every client of each route."""
        pending = self._pending
        for t in tasks:
            for cid in t.route:
                pending[cid] = pending.get(cid, 0) + 1

    def commit(self) -> None:
        """The step's tasks count: it was logged."""
        for cid, n in self._pending.items():
            self.tasks[cid] = self.tasks.get(cid, 0) + n
        self._pending.clear()

    def clients(self) -> list[int]:
        """The clients that took part, in id order."""
        return sorted(self.tasks)

    def arrays(self) -> dict[str, np.ndarray]:
        """The checkpoint's arrays (KEYS): the clients and their task counts."""
        cids = self.clients()
        return {KEYS[0]: np.array(cids, dtype=np.int64),
                KEYS[1]: np.array([self.tasks[c] for c in cids], dtype=np.int64)}

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray], num_clients: int,
           need: Callable[[bool, str], None]) -> Participants:
        """From a checkpoint's arrays, checked (`need(ok, problem)` refuses); empty for a
        checkpoint of an older fednet, which did not keep them."""
        if not any(k in arrays for k in KEYS):
            return cls()
        need(all(k in arrays for k in KEYS), "the participants' arrays are incomplete")
        cids, counts = arrays[KEYS[0]], arrays[KEYS[1]]
        need(cids.ndim == counts.ndim == 1 and len(cids) == len(counts)
             and cids.dtype.kind in "iu" and counts.dtype.kind in "iu",
             "the participants must be two integer vectors of one length")
        need(bool(np.all((cids >= 0) & (cids < num_clients))) and len(np.unique(cids)) == len(cids),
             f"the participants must be distinct clients in 0..{num_clients - 1}")
        need(bool(np.all(counts >= 1)), "every participant's task count must be 1 or more")
        return cls(dict(zip(cids.tolist(), counts.tolist())))
