"""The server's registered clients (READY accepted), by id: one record per client process for
the clients it registered together, and a ClientInfo of its own only for a client that
registered alone (it has an endpoint of its own: a ring hand-off's peer port).

A million clients of 16 processes are 16 records and one int32 per id of the run (which record
holds it); a client's ClientInfo is built when it is read (a million built at registration took
3 s of a launch's ready time, and as long again for the summary). Reads are a Mapping's; a
client registered alone replaces its process's record for that id, and a process's registration
replaces a lone one.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from fednet.types import ClientInfo, Roster

Process = tuple[str, int, str]  # (device, pid, host) of a process's hello


class ClientBook(Mapping[int, ClientInfo]):
    """cid -> ClientInfo of every registered client; `size(cid)` is the server's own count."""

    def __init__(self, clients: int, size: Callable[[int], int]) -> None:
        self.size = size
        self.singles: dict[int, ClientInfo] = {}
        self.procs: list[Process] = []
        self._proc_slot: dict[Process, int] = {}  # a process's record (its ids may come apart)
        self.owner = np.full(clients, -1, np.int32)  # index into procs, -1: none
        self.in_procs = 0  # ids whose owner is set

    # ---- writes ---------------------------------------------------------------------------
    def __setitem__(self, cid: int, info: ClientInfo) -> None:
        """Client cid registered alone."""
        if self.owner[cid] >= 0:
            self.owner[cid] = -1
            self.in_procs -= 1
        self.singles[cid] = info

    def add_process(self, cids: np.ndarray, device: str, pid: int, host: str) -> None:
        """Clients `cids` (distinct, in range) registered together by one process."""
        if self.singles:
            for cid in self.singles.keys() & set(cids.tolist()):
                del self.singles[cid]
        self.in_procs += int((self.owner[cids] < 0).sum())
        proc = (device, pid, host)
        slot = self._proc_slot.get(proc)
        if slot is None:  # a process whose clients registered one by one keeps one record
            slot = self._proc_slot[proc] = len(self.procs)
            self.procs.append(proc)
        self.owner[cids] = slot

    # ---- reads ----------------------------------------------------------------------------
    def __getitem__(self, cid: int) -> ClientInfo:
        got = self.singles.get(cid)
        if got is not None:
            return got
        if not 0 <= cid < self.owner.size or self.owner[cid] < 0:
            raise KeyError(cid)
        device, pid, host = self.procs[self.owner[cid]]
        return ClientInfo(cid, self.size(cid), device, "", pid, host)

    def __contains__(self, cid: object) -> bool:
        if cid in self.singles:
            return True
        return bool(isinstance(cid, (int, np.integer)) and 0 <= cid < self.owner.size
                    and self.owner[cid] >= 0)

    def __len__(self) -> int:
        return len(self.singles) + self.in_procs

    def __iter__(self) -> Iterator[int]:
        yield from self.ids().tolist()

    def registered(self, ids: np.ndarray) -> np.ndarray:
        """Which of `ids` (in range) are registered (a bool each)."""
        out = self.owner[ids] >= 0
        if self.singles:
            out |= np.isin(ids, np.fromiter(self.singles, np.int64, len(self.singles)))
        return out

    def ids(self) -> np.ndarray:
        """Every registered id, ascending (int64)."""
        held = np.flatnonzero(self.owner >= 0)
        if not self.singles:
            return held.astype(np.int64)
        return np.sort(np.concatenate([held, np.fromiter(self.singles, np.int64,
                                                          len(self.singles))]))

    def roster(self, ids: np.ndarray | None = None) -> Roster:
        """The clients `ids` (default: all) as a roster, their devices counted per record."""
        return Roster(self.ids() if ids is None else ids, self.__getitem__, self._devices)

    def _devices(self, ids: np.ndarray) -> dict[str, int]:
        counts: dict[str, int] = {}
        owners = self.owner[ids]
        for slot, k in enumerate(np.bincount(owners[owners >= 0],
                                             minlength=len(self.procs)).tolist()):
            if k:
                counts[self.procs[slot][0]] = counts.get(self.procs[slot][0], 0) + k
        for cid in ids[owners < 0].tolist():
            d = self.singles[cid].device
            counts[d] = counts.get(d, 0) + 1
        return counts

    def process_of(self, cid: int) -> tuple[str, int] | None:
        """(host, pid) of client cid's process, when it said its pid."""
        info = self.singles.get(cid)
        if info is not None:
            return (info.host, info.pid) if info.pid else None
        if 0 <= cid < self.owner.size and self.owner[cid] >= 0:
            _, pid, host = self.procs[self.owner[cid]]
            return (host, pid) if pid else None
        return None
