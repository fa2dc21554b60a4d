"""What became of each client: died (when, why), said BYE (with its ledger's totals), exited
cleanly after SHUTDOWN. Columns over the run's ids (one int32, one int32, two bools a client),
so the end of a ten-million-client run (every client's process exits) marks them in a few array
writes, not ten million dict entries; the reasons are a short list of distinct strings."""
from __future__ import annotations

from typing import Any

import numpy as np

NO_TOTALS: dict = {}  # the BYE of a client whose totals came added into another's


class Fates:
    """Deaths, BYEs and clean exits of the run's clients, by id."""

    def __init__(self, clients: int) -> None:
        n = max(clients, 0)
        self.died = np.full(n, -1, np.int32)  # the round it died in; -1: alive
        self.why = np.zeros(n, np.int32)  # index into reasons
        self.reasons: list[str] = []
        self._reason_ids: dict[str, int] = {}
        self.said_bye = np.zeros(n, bool)
        self.clean = np.zeros(n, bool)  # exited with code 0 after SHUTDOWN or its BYE
        self.totals: dict[int, dict[str, Any]] = {}  # the BYEs that carried ledger totals
        self.dead_count = 0

    # ---- deaths ---------------------------------------------------------------------------
    def die(self, ids: np.ndarray, why: str, rnd: int, shutting_down: bool) -> np.ndarray:
        """Clients `ids` are gone for `why` in round rnd; returns those not dead before. An
        exit after its BYE, or with code 0 after SHUTDOWN, is a clean exit (the normal end)."""
        ids = np.asarray(ids, np.int64)
        new = ids[self.died[ids] < 0]
        if not new.size:
            return new
        r = self._reason_ids.get(why)
        if r is None:
            r = self._reason_ids[why] = len(self.reasons)
            self.reasons.append(why)
        self.died[new], self.why[new] = rnd, r
        self.dead_count += int(new.size)
        normal = shutting_down and why.endswith("code 0")
        self.clean[new] = True if normal else self.said_bye[new]
        return new

    def revive(self, ids: np.ndarray | list[int]) -> None:
        """Clients `ids` registered again: alive."""
        ids = np.asarray(ids, np.int64)
        back = ids[self.died[ids] >= 0]
        if back.size:
            self.died[back] = -1
            self.clean[back] = False
            self.dead_count -= int(back.size)

    def is_dead(self, cid: int) -> bool:
        """Whether client cid is dead."""
        return bool(self.died[cid] >= 0)

    def reason(self, cid: int) -> str:
        """Why client cid died ('' if it did not)."""
        return self.reasons[self.why[cid]] if self.died[cid] >= 0 else ""

    def dead_ids(self) -> np.ndarray:
        """Every dead id, ascending."""
        return np.flatnonzero(self.died >= 0) if self.dead_count else np.zeros(0, np.int64)

    def dead(self) -> dict[int, str]:
        """cid -> reason of every dead client (a view for reports and tests)."""
        return {c: self.reason(c) for c in self.dead_ids().tolist()}

    def unclean(self, reported: set[Any]) -> list[dict[str, Any]]:
        """Failure rows for the clients that died other than cleanly (not after their BYE or a
        SHUTDOWN) and are not in `reported`."""
        ids = np.flatnonzero((self.died >= 0) & ~self.clean & ~self.said_bye)
        return [{"round": int(self.died[c]), "client": c, "task": None,
                 "reason": f"client died: {self.reason(c)}"}
                for c in ids.tolist() if c not in reported]

    # ---- BYEs -----------------------------------------------------------------------------
    def bye(self, ids: np.ndarray | list[int], totals: dict[str, Any]) -> None:
        """Clients `ids` said BYE; `totals` (their ledgers added up) are kept with the first."""
        ids = np.asarray(ids, np.int64)
        if ids.size:
            self.said_bye[ids] = True
            self.totals[int(ids[0])] = dict(totals)

    def bye_count(self) -> int:
        """How many clients said BYE."""
        return int(self.said_bye.sum())

    def byes(self) -> dict[int, dict[str, Any]]:
        """cid -> its BYE's totals ({} when they came added into another's) for every client
        that said BYE (a view for tests; the summary reads `totals`)."""
        return {c: self.totals.get(c, NO_TOTALS) for c in np.flatnonzero(self.said_bye).tolist()}

    def waiting_exit(self) -> np.ndarray:
        """Clients that said BYE and are not dead yet (their processes exit by themselves)."""
        return np.flatnonzero(self.said_bye & (self.died < 0))
