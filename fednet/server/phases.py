"""Where each client is in its life, as the server's own records say it: one vocabulary (Phase)
for the summary, the errors a user reads and the tests.

A client's state is kept in columns over the run's ids, each owned by the book that writes it
(conns.py: its connection and whether that was lost; registrar.py: its hello accepted;
book.py: its READY(readys) accepted; tasks.py: the tasks out; fates.py: BYE and death), about
18 bytes a client, so that ten million cost 180 MB and a process's registration is a few array
writes. ClientTable derives each client's phase from them, in one place: a stored phase would be
a second copy of what those columns say.
"""
from __future__ import annotations

import enum

import numpy as np

from fednet.server.book import ClientBook
from fednet.server.conns import Connections
from fednet.server.fates import Fates
from fednet.server.tasks import TaskBook


class Phase(enum.IntEnum):
    """A client's phase; where several hold (a client that said BYE and whose connection then
    closed), the later one in this order is its phase."""

    ABSENT = 0  # no hello of it was accepted
    WELCOMED = 1  # its hello was accepted (a WELCOME sent), its READY(readys) not yet
    READY = 2  # registered (READY(readys) accepted), its connection live, holding no task
    BUSY = 3  # holds the model of a task out (its own, or a ring's hop)
    LOST = 4  # its connection was lost: it comes back, or is dead after the grace
    LEFT = 5  # said BYE: its process exits by itself
    EXITED = 6  # gone after its BYE or the run's SHUTDOWN (the normal end)
    DEAD = 7  # gone otherwise (its process died, or its connection stayed lost)

    @property
    def text(self) -> str:
        """Its name as the summary and errors write it."""
        return self.name.lower()


WHAT = {Phase.ABSENT: "never registered", Phase.WELCOMED: "welcomed but not ready",
        Phase.LOST: "lost their connection", Phase.DEAD: "died", Phase.EXITED: "exited",
        Phase.LEFT: "said BYE"}
"""The phases a client that is not registered can be in, as an error's sentence says them."""


class ClientTable:
    """The phases of the run's clients, read from the books that keep them (no socket, no
    Session: each book is built on its own)."""

    def __init__(self, book: ClientBook, conns: Connections, fates: Fates, said: np.ndarray,
                 tasks: TaskBook) -> None:
        self.book, self.conns, self.fates, self.said, self.tasks = book, conns, fates, said, tasks

    def phase(self, cid: int) -> Phase:
        """Client cid's phase."""
        return Phase(int(self.phases(np.array([cid], np.int64))[0]))

    def phases(self, ids: np.ndarray | None = None) -> np.ndarray:
        """The phase (uint8) of each of `ids` (default: every id of the run)."""
        ids = np.arange(self.fates.died.size) if ids is None else np.asarray(ids, np.int64)
        out = np.where(self.said[ids], np.uint8(Phase.WELCOMED), np.uint8(Phase.ABSENT))
        out[self.book.registered(ids)] = Phase.READY
        out[self._busy(ids)] = Phase.BUSY
        out[self._lost(ids)] = Phase.LOST
        out[self.fates.said_bye[ids]] = Phase.LEFT
        died = self.fates.died[ids] >= 0
        out[died] = np.where(self.fates.clean[ids[died]], np.uint8(Phase.EXITED),
                             np.uint8(Phase.DEAD))
        return out

    def census(self, ids: np.ndarray | None = None) -> dict[str, int]:
        """How many of `ids` (default: all) are in each phase, the empty ones left out, in the
        order of Phase."""
        counts = np.bincount(self.phases(ids), minlength=len(Phase))
        return {p.text: int(counts[p]) for p in Phase if counts[p]}

    def missing(self, ids: np.ndarray) -> str:
        """Which of `ids` are not registered, by phase: 'ids 3, 8 never registered; id 5 welcomed
        but not ready' ('' when every one is)."""
        ph = self.phases(ids)
        out = ~self.book.registered(ids)
        parts = []
        for p in WHAT:
            of = ids[(ph == p) & out]
            if of.size:
                parts.append(f"{_ids(of.tolist())} {WHAT[p]}")
        return "; ".join(parts)

    def _busy(self, ids: np.ndarray) -> np.ndarray:
        holders = [self.tasks.holding(t) for t in self.tasks.pending.values()]
        return np.isin(ids, np.array(holders, np.int64)) if holders else np.zeros(ids.size, bool)

    def _lost(self, ids: np.ndarray) -> np.ndarray:
        if not self.conns.lost:
            return np.zeros(ids.size, bool)
        return np.isin(self.conns.slot[ids], np.fromiter(self.conns.lost, np.int32))


def _ids(ids: list[int], most: int = 8) -> str:
    """'id 5', 'ids 3, 8', 'ids 0, 1, ... (and 92 more)'."""
    more = f" (and {len(ids) - most} more)" if len(ids) > most else ""
    return ("id " if len(ids) == 1 else "ids ") + ", ".join(map(str, ids[:most])) + more
