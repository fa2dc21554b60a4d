"""The message model shared by algorithms and runtimes, and the roster of clients a round picks
from; knows nothing of the wire."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

Arrays = dict[str, np.ndarray]


def client_name(cid: int) -> str:
    """The sender name of client cid on the wire and in ledgers ("c0007")."""
    return f"c{cid:04d}"


@dataclass(slots=True)
class ClientInfo:
    """What the server knows of a registered client (slots: a million of them take 0.1 GB)."""

    cid: int
    num_examples: int
    device: str = "cpu"
    endpoint: str = ""
    pid: int = 0
    host: str = ""


@dataclass
class Task:
    """Work for a route of clients: the first receives it, the last returns the Result."""

    task_id: int
    round: int
    route: list[int]
    arrays: Arrays = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    kind: str = "train"
    hop: int = 0
    sim_time: float = 0.0
    wire: Arrays | None = None  # the arrays as they travel, when not `arrays` (--compress-down)
    stage: str = ""  # a staged protocol's stage (secure aggregation's keys, shares, input,
    # unmask), set by the strategy that runs it; the ledger files the bytes under it

    @property
    def cid(self) -> int:
        """The client that holds the task now."""
        return self.route[self.hop]


@dataclass
class Result:
    """What came back from the last client of a task's route."""

    task_id: int
    round: int
    cid: int
    arrays: Arrays = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    num_examples: int = 0
    sim_time: float = 0.0
    sent: float = 0.0  # when the client sent it (simulated s) and its bytes on the wire:
    nbytes: int = 0    # what the server link's schedule of the uploads needs
    tensor_nbytes: int = 0  # of which its arrays as they travelled (the rest is its header)
    server_ops: dict[str, float] = field(default_factory=dict)  # the server's work taking it
    # in (--compress's decoding: opcount counts), charged at the server's rates
    vetted: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)  # the
    # array objects the server itself found finite (core/replies.accept_reply: layout.vet), in
    # order; an aggregate checks again only arrays that are not these (layout.proven_finite)


@dataclass
class Failure:
    """A task that produced no usable result: a crash, a timeout or an error."""

    task_id: int
    round: int
    cid: int
    reason: str
    sim_time: float = 0.0


# ---- the roster: the clients a round may pick from, as the dispatchers hand them to the
# driver and the Strategy: sorted by id, each ClientInfo built only when it is read.
#
# A population of ten million holds one array of ids here, not ten million records: a round
# reads the clients it samples (and their sizes) and nothing else. `fednet local` builds one
# roster of the whole population; the ZeroMQ server one of its live registered clients
# (server/app.py), rebuilt only when a client comes or goes. A Strategy sees a Sequence of
# ClientInfo as before; code that needs ids or a lookup uses `cids` and `lookup`, which are
# O(1) on a roster and the plain loop on a list.

Info = Callable[[int], ClientInfo]
Counts = Callable[[np.ndarray], dict[str, int]]


class Roster(Sequence[ClientInfo]):
    """Clients `ids` (int64, sorted, distinct); `info(cid)` builds a client's record on access;
    `counts(ids)` counts clients per device without building them (devices_of)."""

    __slots__ = ("ids", "_info", "_counts")

    def __init__(self, ids: np.ndarray, info: Info, counts: Counts | None = None) -> None:
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self._info = info
        self._counts = counts

    def __len__(self) -> int:
        return int(self.ids.size)

    @overload
    def __getitem__(self, i: int) -> ClientInfo: ...

    @overload
    def __getitem__(self, i: slice) -> Roster: ...

    def __getitem__(self, i: int | slice) -> ClientInfo | Roster:
        if isinstance(i, slice):
            return Roster(self.ids[i], self._info, self._counts)
        return self._info(int(self.ids[i]))

    def __iter__(self) -> Iterator[ClientInfo]:
        info = self._info
        for c in self.ids.tolist():
            yield info(c)

    def __contains__(self, c: object) -> bool:
        cid = c.cid if isinstance(c, ClientInfo) else c
        if not isinstance(cid, (int, np.integer)):
            return False
        i = int(np.searchsorted(self.ids, cid))
        return i < self.ids.size and int(self.ids[i]) == cid

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Roster):
            return bool(np.array_equal(self.ids, other.ids)) and list(self) == list(other)
        return isinstance(other, list) and list(self) == other

    __hash__ = None  # type: ignore[assignment]  # (equal by value, as a list: unhashable)

    def __repr__(self) -> str:
        return f"Roster({len(self)} clients)"

    def get(self, cid: int) -> ClientInfo | None:
        """Client cid's record, or None when it is not on the roster."""
        return self._info(int(cid)) if cid in self else None

    def devices(self) -> dict[str, int]:
        """Clients per device."""
        return self._counts(self.ids) if self._counts is not None else _count_devices(self)


def cids(clients: Sequence[ClientInfo]) -> list[int]:
    """The clients' ids, ascending."""
    if isinstance(clients, Roster):
        return clients.ids.tolist()
    return sorted(c.cid for c in clients)


def ordered(clients: Sequence[ClientInfo]) -> Sequence[ClientInfo]:
    """The clients sorted by id (a roster already is: nothing is built)."""
    return clients if isinstance(clients, Roster) else sorted(clients, key=lambda c: c.cid)


def lookup(clients: Sequence[ClientInfo]) -> Callable[[int], ClientInfo | None]:
    """cid -> its record among `clients` (None when absent)."""
    if isinstance(clients, Roster):
        return clients.get
    return {c.cid: c for c in clients}.get


def device_counts(clients: Sequence[ClientInfo]) -> dict[str, int]:
    """Clients per device, sorted by device name."""
    counts = clients.devices() if isinstance(clients, Roster) else _count_devices(clients)
    return dict(sorted(counts.items()))


def _count_devices(clients: Iterable[ClientInfo]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in clients:
        counts[c.device] = counts.get(c.device, 0) + 1
    return counts


def id_array(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Client ids as an int64 array; a range without a walk over it."""
    if isinstance(ids, range):
        return np.arange(ids.start, ids.stop, ids.step, dtype=np.int64)
    return np.asarray(ids, dtype=np.int64)
