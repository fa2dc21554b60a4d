"""Replies in simulated-time order, for servers whose state depends on the order of arrivals
(FedAsync, FedBuff: Strategy.virtual_order).

The runtimes hand replies over in real order, which differs between `fednet local` (one task
after another) and `fednet launch` (processes racing). A server that mixed each reply in as it
came would then depend on timing. Here a reply is held until no task still out can arrive
before it in simulated time, the conservative rule of parallel discrete-event simulation with
lookahead (Chandy and Misra, 1979):

- every task sent has a lower bound on its return, computed by the server from its own tables
  (`bound`, Session.earliest_return: the task's start, the client's round trip, the download of
  the task's tensors and the compute of its epochs over the client's partition, at the client's
  profile);
- a held reply (t, task id) is released when every task out has (bound, id) > (t, id); ties in
  simulated time go by task id;
- a reply stamped before its task's bound (a client that claims less work than it was given, or
  fails early) is moved to the bound, so no sender can reorder the run; `moved` counts them;
- with a deadline S (--deadline), a result that arrives after its task's start + S is a
  straggler: a Failure at start + S (the bound of a task is at most its start + S).

Released replies come in (simulated time, task id) order whatever the runtime's order, so the
model, bytes and times are identical under local and launch. The bytes of what was sent and
released are counted here too (`sent_bytes`, `back_bytes`): the rows of such a step carry them,
since the ledger also holds replies that arrived for real but are not released yet.

A synchronous step takes its replies as they come (AsArrived, the same interface): released at
once, its rows reading the ledger itself. The round driver runs every step through one of the
two, so that its loop has a single path.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from fednet.metrics.accounting import Ledger
from fednet.types import Failure, Result, Task

Reply = Result | Failure
LINKS = ("server_to_client", "client_to_server", "client_to_client")


class RowCount(NamedTuple):
    """The traffic a metrics row carries, and the ledger as of that row."""

    bytes_round: dict[str, int]  # the row's bytes (its round's, or an ordered step's since its last row)
    total: int  # every byte sent so far
    totals: dict[str, int]  # the ledger's totals as of the row (an interrupted run's summary)
    messages: int
    stages: dict[str, dict[str, int]]  # a protocol's stages inside the round (secure aggregation)
    upto: int | None  # the row's client compute: of the logical rounds <= upto (None: all sent)


class Arrivals:
    """The replies of one step, released in simulated-time order."""

    def __init__(self, bound: Callable[[Task], float], size: Callable[[Task], int],
                 deadline: float = 0.0) -> None:
        self.bound, self.size, self.deadline = bound, size, deadline
        self.out: dict[int, tuple[float, float]] = {}  # task id -> (bound, start)
        self.lows: list[tuple[float, int]] = []  # (bound, task id) of tasks out (lazily pruned)
        self.held: list[tuple[float, int, Reply]] = []  # (simulated time, task id, reply)
        self.moved = self.stragglers = 0
        self.sent_bytes = self.back_bytes = 0
        self.sent_tensor = self.back_tensor = self.sent_msgs = self.back_msgs = 0
        self._at_row = (0, 0)  # sent_bytes and back_bytes at the last row
        self.base: dict[str, int] = {}  # the ledger's totals and messages at the step's start

    def open(self, ledger: Ledger) -> None:
        """The step starts: its rows count from the ledger as it is now."""
        self.base = {**ledger.totals(), "messages": ledger.messages}

    def sent(self, tasks: list[Task]) -> None:
        """Tasks that left (their start stamped): each is out until its reply arrives."""
        for t in tasks:
            low = self.bound(t)
            if self.deadline:
                low = min(low, t.sim_time + self.deadline)
            self.out[t.task_id] = (low, t.sim_time)
            heapq.heappush(self.lows, (low, t.task_id))
            self.sent_bytes += self.size(t)
            self.sent_tensor += sum(a.nbytes for a in (t.arrays if t.wire is None
                                                       else t.wire).values())
            self.sent_msgs += 1

    def arrive(self, done: Reply) -> None:
        """A reply came (in any order): held until it is the earliest possible."""
        low, start = self.out.pop(done.task_id, (done.sim_time, done.sim_time))
        if done.sim_time < low:
            done.sim_time = low
            self.moved += 1
        due = start + self.deadline
        if self.deadline and isinstance(done, Result) and done.sim_time > due:
            self.stragglers += 1
            done = Failure(done.task_id, done.round, done.cid, f"straggler: arrived at "
                           f"{done.sim_time:.3f}s, after its deadline {due:.3f}s", due)
        heapq.heappush(self.held, (done.sim_time, done.task_id, done))

    def next(self) -> Reply | None:
        """The earliest held reply once no task out can arrive before it; else None."""
        if not self.held:
            return None
        while self.lows and self.lows[0][1] not in self.out:
            heapq.heappop(self.lows)
        t, tid, _ = self.held[0]
        if self.lows and self.lows[0] <= (t, tid):
            return None
        done = heapq.heappop(self.held)[2]
        if isinstance(done, Result):
            self.back_bytes += done.nbytes
            self.back_tensor += done.tensor_nbytes
            self.back_msgs += 1
        return done

    def released(self) -> Iterator[Reply]:
        """The held replies that may go on now, earliest first (more once sent() is told of
        the tasks each one released)."""
        while (done := self.next()) is not None:
            yield done

    def columns(self, failures: list[Failure], step_row: dict[str, Any]) -> dict[str, Any]:
        """The step's row columns: the network step's, then the stragglers and replies moved
        here (failures: their own round's rows)."""
        return {**step_row, "stragglers": self.stragglers, "moved": self.moved}

    def row(self, rnd: int) -> RowCount:
        """A row's traffic: what the step sent and released since its last row."""
        base = self.base
        at, messages = self.totals({k: v for k, v in base.items() if k != "messages"},
                                   base["messages"])
        bytes_round = self.row_bytes(base)
        total = bytes_round.pop("total")
        return RowCount(bytes_round, total, at, messages, {}, None)

    def waiting(self) -> int:
        """Replies held now."""
        return len(self.held)

    def row_bytes(self, base: dict[str, int]) -> dict[str, int]:
        """A row's bytes: what was sent and released since the last row, and the total (the
        ledger's `base` at the step's start plus all the step sent and released so far)."""
        down, up = self.sent_bytes - self._at_row[0], self.back_bytes - self._at_row[1]
        self._at_row = (self.sent_bytes, self.back_bytes)
        total = (base["server_to_client"] + base["client_to_server"] + base["client_to_client"]
                 + self.sent_bytes + self.back_bytes)
        return {"server_to_client": down, "client_to_server": up, "client_to_client": 0,
                "total": total}

    def totals(self, base: dict[str, int], base_messages: int) -> tuple[dict[str, int], int]:
        """The ledger's totals and message count as the rows see them now: `base` (the ledger
        at the step's start) plus what the step sent and released (an interrupted run's
        summary: not the replies that arrived for real but were never released)."""
        tensor = self.sent_tensor + self.back_tensor
        out = dict(base, server_to_client=base["server_to_client"] + self.sent_bytes,
                   client_to_server=base["client_to_server"] + self.back_bytes,
                   tensor_bytes=base["tensor_bytes"] + tensor,
                   header_bytes=base["header_bytes"] + self.sent_bytes + self.back_bytes - tensor,
                   messages=base_messages + self.sent_msgs + self.back_msgs)
        return out, out["messages"]


class AsArrived:
    """The replies of a synchronous step, released as they come; its rows read the ledger (the
    messages of their logical round)."""

    def __init__(self) -> None:
        self.ready: list[Reply] = []
        self.ledger = Ledger()

    def open(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def sent(self, tasks: list[Task]) -> None:
        """Nothing to wait for: a reply goes on as it comes."""

    def arrive(self, done: Reply) -> None:
        self.ready.append(done)

    def released(self) -> Iterator[Reply]:
        while self.ready:
            yield self.ready.pop(0)

    def columns(self, failures: list[Failure], step_row: dict[str, Any]) -> dict[str, Any]:
        """The step's failures, then the network step's columns."""
        return {"failures": len(failures), **step_row}

    def row(self, rnd: int) -> RowCount:
        """Logical round rnd's bytes, and the ledger's totals now."""
        per, after = self.ledger.round_totals(rnd), self.ledger.totals()
        total = sum(after[k] for k in LINKS)
        return RowCount({k: per[k] for k in (*LINKS, "tensor_bytes")}, total, after,
                        self.ledger.messages, self.ledger.stage_totals(rnd), rnd)


Order = Arrivals | AsArrived
"""How a step takes its replies in (the round driver's)."""
