"""What availability does to a run's rounds, shared by both runtimes (docs/architecture.md,
"Client availability"):

- selection: a round starts among the clients online at its start; when none is, simulated time
  advances to the first moment one of them comes online (no one ever again: the run stops with
  status no_clients_online);
- a task fails at the moment its client goes offline: while the task (or hand-off) arrives and
  the client trains (the executor, offline_reason), or while the result travels to the server
  (Churn.upload);
- a ring skips a peer that is offline at the moment the hand-off is sent (next_online_hop), and
  a task whose first clients are offline when it is released starts at the first online one
  (Churn.trim); the summary counts the peers skipped, per round and in total.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fednet.network.availability import Availability
from fednet.types import ClientInfo, Failure, Result, Task, client_name

OFFLINE = "offline"  # every availability failure's reason starts with it


def offline_reason(avail: Availability | None, cid: int, t0: float, t1: float, what: str
                   ) -> tuple[float, str] | None:
    """(the moment, the reason) when client `cid` is offline at some moment of [t0, t1]."""
    if avail is None:
        return None
    off = avail.offline_in(cid, t0, t1)
    if off is None:
        return None
    return off, f"{OFFLINE} at {off:.6g} s (--availability {avail.spec}): {what}"


def next_online_hop(avail: Availability | None, route: list[int], nxt: int, t: float
                    ) -> tuple[int | None, int]:
    """The first hop >= nxt of `route` whose client is online at t (the moment the hand-off is
    sent), and how many offline peers were skipped on the way; (None, skipped) when none is."""
    if avail is None:
        return nxt, 0
    for hop in range(nxt, len(route)):
        if avail.online(int(route[hop]), t):
            return hop, hop - nxt
    return None, len(route) - nxt


class Churn:
    """The round driver's view of availability: selection, waits, skipped peers, failures."""

    def __init__(self, avail: Availability) -> None:
        self.avail = avail
        self.online_at: Callable[[int, float], bool] | None = avail.online  # (Strategy.online)
        self.skipped: dict[int, int] = {}  # logical round -> offline peers skipped
        self.online = 0  # clients online at the start of the last step
        self.waited = 0.0  # simulated seconds the last step waited for a client to come online
        self.waited_total = 0.0
        self.waits = 0
        self.clock = 0.0  # the latest moment a task failed as its client went offline

    def select(self, clients: Sequence[ClientInfo], t: float
               ) -> tuple[Sequence[ClientInfo], float]:
        """The clients online at t, and t; when none is, those online at the first moment one
        comes online, and that moment ([] and t when none ever does). t is at least the moment
        of the last offline failure (a round whose tasks all failed still took that long)."""
        t = max(t, self.clock)  # a round lasts until its last failure too
        on = [c for c in clients if self.avail.online(c.cid, t)]
        self.waited = 0.0
        if not on and clients:
            nxt = self.avail.next_online([c.cid for c in clients], t)
            if nxt is not None:
                on = [c for c in clients if self.avail.online(c.cid, nxt)]
                self.waited, t = nxt - t, nxt
                self.waited_total += self.waited
                self.waits += 1
        self.online = len(on)
        return on, t

    def note(self, rnd: int, skipped: int) -> None:
        """`skipped` offline peers were passed over in logical round rnd."""
        if skipped:
            self.skipped[rnd] = self.skipped.get(rnd, 0) + int(skipped)

    def trim(self, tasks: list[Task]) -> list[Task]:
        """A released task starts at its first client online at the task's start (the others
        before it count as skipped); a task with nobody online is left to fail at its first."""
        for t in tasks:
            hop, skipped = next_online_hop(self.avail, t.route, t.hop, t.sim_time)
            if hop is not None and skipped:
                t.route = t.route[:t.hop] + t.route[hop:]
                self.note(t.round, skipped)
        return tasks

    def upload(self, done: Result | Failure, sent: float, skipped: int) -> Result | Failure:
        """A result that left its client at `sent` and arrives at done.sim_time: a Failure at
        the moment the client went offline meanwhile. Counts the peers its ring skipped."""
        self.note(done.round, skipped)
        if isinstance(done, Failure):
            if done.reason.startswith(OFFLINE):
                self.clock = max(self.clock, done.sim_time)
            return done
        off = offline_reason(self.avail, done.cid, sent, done.sim_time,
                             "while sending its result to the server")
        if off is None:
            return done
        self.clock = max(self.clock, off[0])
        return Failure(done.task_id, done.round, done.cid, off[1], off[0])

    def row(self, rnd: int, span: int) -> dict[str, Any]:
        """A metrics row's availability columns (a step of `span` logical rounds)."""
        return {"online": self.online, "waited_s": self.waited,
                "skipped_peers": sum(self.skipped.get(r, 0) for r in range(rnd, rnd + span))}

    def summary(self, failures: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary's "availability" entry."""
        return {"spec": self.avail.spec, "skipped_peers": sum(self.skipped.values()),
                "skipped_by_round": {str(r): n for r, n in sorted(self.skipped.items())},
                "offline_failures": sum(1 for f in failures
                                        if str(f.get("reason", "")).startswith(OFFLINE)),
                "waited_s": self.waited_total, "waits": self.waits}


def passed_over(avail: Availability | None, route: list[int], hop: int, sender: str, t: float
                ) -> int | None:
    """The hop of `sender` (a client name) when its hand-off, sent at t to route[hop], passed
    over only offline peers (two hops back or more, every peer between offline at t); else None."""
    if avail is None:
        return None
    for i in range(hop - 1, -1, -1):
        if client_name(int(route[i])) == sender:
            return i if i < hop - 1 else None
        if avail.online(int(route[i]), t):
            return None
    return None


class NoChurn:
    """The run's availability when every client is always online (no --availability): the
    clients selected are the clients alive, nothing is trimmed, delayed or counted."""

    online_at = None

    def select(self, clients: Sequence[ClientInfo], t: float
               ) -> tuple[Sequence[ClientInfo], float]:
        return clients, t

    def note(self, rnd: int, skipped: int) -> None:
        pass

    def trim(self, tasks: list[Task]) -> list[Task]:
        return tasks

    def upload(self, done: Result | Failure, sent: float, skipped: int) -> Result | Failure:
        return done

    def row(self, rnd: int, span: int) -> dict[str, Any]:
        return {}

    def summary(self, failures: list[dict[str, Any]]) -> dict[str, Any] | None:
        """No "availability" entry in summary.json."""
        return None


NO_CHURN = NoChurn()
