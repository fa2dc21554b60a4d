"""A client process's ids as columns: what its idle clients cost is a few bits each, not objects.

A process of `fednet launch` holds up to hundreds of thousands of logical clients (625,000 each
for 16 processes at 10,000,000), almost all idle at any time. Python containers of their ids (a
list, a frozenset, a set of the idle ones, a dict of WELCOME rows, lists built at WELCOME and
SHUTDOWN) cost about 100-200 bytes per id each; here they are one int64 array (none at all for a
range of ids, the launcher's case), a binary search (np.searchsorted) or a subtraction for an
id's row, and one bool per id for each flag. Only a client with something to do (a task, a peer
socket) is an object (client/host.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class IdIndex:
    """The row of each id of an array of distinct ids (the order it was given in): arithmetic
    for a range, else a binary search over the sorted ids; -1 for an id that is not there."""

    def __init__(self, ids: Sequence[int] | np.ndarray) -> None:
        if isinstance(ids, range) and ids.step == 1:
            self.lo, self.size, self.keys, self.order = ids.start, len(ids), None, None
            return
        a = np.asarray(ids, dtype=np.int64).ravel()
        self.size, self.lo = int(a.size), int(a[0]) if a.size else 0
        step = np.diff(a)
        if bool((step == 1).all()):  # a range given as an array: nothing kept
            self.keys, self.order = None, None
        elif bool((step > 0).all()):
            self.keys, self.order = a, None
        else:
            self.order = np.argsort(a, kind="stable")
            self.keys = a[self.order]
        if self.keys is not None and np.unique(self.keys).size != self.size:
            raise ValueError("ids must be distinct")

    def rows(self, cids: np.ndarray) -> np.ndarray:
        """The row of every id of `cids` (int64), -1 where it is not there."""
        c = np.asarray(cids, dtype=np.int64)
        if self.keys is None:
            r = c - self.lo
            return np.where((r >= 0) & (r < self.size), r, -1)
        pos = np.minimum(np.searchsorted(self.keys, c), max(self.size - 1, 0))
        hit = self.keys[pos] == c if self.size else np.zeros(c.shape, bool)
        rows = pos if self.order is None else self.order[pos]
        return np.where(hit, rows, -1)

    def row(self, cid: int) -> int:
        """The row of one id, -1 if it is not there."""
        if self.keys is None:
            r = cid - self.lo
            return r if 0 <= r < self.size else -1
        return int(self.rows(np.array([cid]))[0])

    def ids(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The ids of `rows` (all of them by default), int64."""
        if self.keys is None:
            r = np.arange(self.size, dtype=np.int64) if rows is None else rows
            return r.astype(np.int64) + self.lo
        if self.order is None:
            return self.keys.copy() if rows is None else self.keys[rows]
        given = np.empty(self.size, np.int64)
        given[self.order] = self.keys
        return given if rows is None else given[rows]

    def sorted_ids(self) -> np.ndarray:
        """Every id, ascending."""
        return self.keys.copy() if self.keys is not None else self.ids()

    def __len__(self) -> int:
        return self.size

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, (int, np.integer)) and self.row(int(cid)) >= 0

    def text(self) -> str:
        """'0-299' for consecutive ids, else the ids with commas (at most 10 shown), in the
        order given (ids_text)."""
        if self.keys is None:
            hi = self.lo + self.size - 1
            return f"{self.lo}-{hi}" if self.size > 1 else str(self.lo)
        first = self.ids(np.arange(min(self.size, 10)))
        return ",".join(map(str, first.tolist())) + (",..." if self.size > 10 else "")


class IdTable:
    """A process's ids (IdIndex) and two flags per id, as bool columns: idle (welcomed, no object
    now) and stopped (an idle one SHUTDOWN named, its BYE not yet sent). Counts are kept so that
    the poll loop's `anything idle?` costs nothing."""

    def __init__(self, ids: Sequence[int] | np.ndarray) -> None:
        self.index = IdIndex(ids)
        self.first = ids[0]  # the id that speaks for the process (Host.first)
        self.idle = np.zeros(len(self.index), bool)
        self.stopped = np.zeros(len(self.index), bool)
        self.n_idle = self.n_stopped = 0

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, cid: object) -> bool:
        return cid in self.index

    def is_idle(self, cid: int) -> bool:
        r = self.index.row(cid)
        return r >= 0 and bool(self.idle[r])

    def set_idle(self, cid: int, idle: bool) -> None:
        """Client cid (one of ours) is idle now, or has an object now."""
        r = self.index.row(cid)
        if r >= 0 and bool(self.idle[r]) != idle:
            self.idle[r] = idle
            self.n_idle += 1 if idle else -1

    def make_idle(self, rows: np.ndarray) -> None:
        """The clients of `rows` are idle (a WELCOME for clients with no object)."""
        self.idle[rows] = True
        self.n_idle = int(np.count_nonzero(self.idle))

    def idle_ids(self) -> np.ndarray:
        """The idle clients' ids, ascending."""
        return self._ids_of(self.idle)

    def stop_idle(self, cids: np.ndarray) -> None:
        """SHUTDOWN named `cids`: the idle ones among them are stopped (their BYE pending);
        ids not ours, or not idle, are ignored."""
        rows = self.index.rows(cids)
        rows = rows[rows >= 0]
        rows = rows[self.idle[rows]]
        self.idle[rows] = False
        self.stopped[rows] = True
        self.n_idle = int(np.count_nonzero(self.idle))
        self.n_stopped = int(np.count_nonzero(self.stopped))

    def take_stopped(self) -> np.ndarray:
        """The stopped idle ids, ascending; they are forgotten (their BYE is being sent)."""
        if not self.n_stopped:
            return np.zeros(0, np.int64)
        out = self._ids_of(self.stopped)
        self.stopped[:] = False
        self.n_stopped = 0
        return out

    def _ids_of(self, mask: np.ndarray) -> np.ndarray:
        return np.sort(self.index.ids(np.flatnonzero(mask)))

    def text(self) -> str:
        return self.index.text()

    def name(self) -> str:
        """'client 3' or 'clients 0-299': what log lines call the process's clients."""
        return f"client{'s' if len(self) > 1 else ''} {self.text()}"


def ids_text(cids: Sequence[int]) -> str:
    """'0-299' for consecutive ids, else the ids with commas (at most 10 shown)."""
    return IdIndex(cids).text()
