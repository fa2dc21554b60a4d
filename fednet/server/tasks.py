"""The server's tasks of a round, one record each: those out (by id, and which client of its
route holds the model now), those waiting for room (--max-inflight, a process's share:
inflight.py), and the replies so far. No socket: the server hands it a `send` that delivers a
task (or fails it), so the book is testable alone."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable

from fednet.core.rounds import FollowUp
from fednet.server.inflight import next_task
from fednet.types import Failure, Result, Task


class TaskBook:
    """Tasks out, queued and answered in the round in progress."""

    def __init__(self, max_inflight: int, per_process: int,
                 process_of: Callable[[int], Hashable], send: Callable[[Task], None]) -> None:
        self.max_inflight, self.per_process = max_inflight, per_process
        self.process_of, self.send = process_of, send
        self.pending: dict[int, Task] = {}
        self.holder: dict[int, int] = {}  # task id -> route index of the client holding it
        self.queue: deque[Task] = deque()  # tasks waiting for room (inflight.py)
        self.replies: list[Result | Failure] = []
        self.on_reply: FollowUp | None = None
        self.accepting = True
        self.progress = time.monotonic()  # results and HOP_DONEs move it: chains may be long
        self._filling = False

    def start(self, tasks: list[Task], follow: FollowUp | None) -> None:
        """A round begins with `tasks`; `follow` sees each reply the moment it arrives."""
        self.replies = []
        self.on_reply, self.accepting = follow, True
        self.queue.extend(tasks)
        self.progress = time.monotonic()

    def busy(self) -> bool:
        """Whether a task is out or waiting."""
        return bool(self.pending or self.queue)

    def holding(self, task: Task) -> int:
        """The client holding task's model now (its hop's, or the one a HOP_DONE named)."""
        return task.route[self.holder.get(task.task_id, task.hop)]

    def fill(self) -> None:
        """Send queued tasks while there is room.

        Not re-entrant: a send that fails records a Failure, whose follow-ups join the queue
        that the running loop is already emptying (no recursion however many sends fail)."""
        if self._filling:
            return
        self._filling = True
        try:
            while (task := next_task(self.queue, self.pending, self.max_inflight,
                                     self.per_process, self.process_of)) is not None:
                self.pending[task.task_id] = task
                self.send(task)
        finally:
            self._filling = False

    def answered(self, tid: int) -> Task:
        """Task tid's reply arrived (the caller checked it is pending): it is out no more."""
        self.holder.pop(tid, None)
        self.progress = time.monotonic()
        return self.pending.pop(tid)

    def handed(self, tid: int, to: int) -> None:
        """Task tid's model went to hop `to` of its route (a HOP_DONE)."""
        self.progress = time.monotonic()
        if tid in self.pending:
            self.holder[tid] = to

    def fail(self, tid: int, reason: str) -> None:
        """Task tid failed: its Failure is the round's reply."""
        task = self.pending.pop(tid)
        self.holder.pop(tid, None)
        self.reply(Failure(tid, task.round, task.route[-1], reason, task.sim_time))

    def fail_holders(self, held: Callable[[int], bool], why: Callable[[int], str]) -> None:
        """Fail every task whose model a client `held(cid)` holds, for `why(cid)`."""
        for tid, task in list(self.pending.items()):
            if tid in self.pending and held(holder := self.holding(task)):
                self.fail(tid, why(holder))

    def reply(self, done: Result | Failure) -> None:
        """Record a reply; the round's callback sees it at once (a streaming algorithm folds it
        in, an asynchronous one releases follow-up tasks, sent here)."""
        self.replies.append(done)
        if self.on_reply is not None:
            if self.accepting:
                self.queue.extend(self.on_reply(done))
                self.fill()
            else:
                self.on_reply(done)

    def time_out(self, why: str) -> None:
        """No progress: what is out or queued fails, nothing new is started."""
        self.accepting = False
        for task in self.queue:
            self.pending[task.task_id] = task
            self.fail(task.task_id, why + " (never sent: no room under --max-inflight or its "
                                          "process's share)")
        self.queue.clear()
        for tid in list(self.pending):
            self.fail(tid, why)

    def stage_time_out(self, why: str) -> None:
        """No progress in a stage of a staged round (secure aggregation): the tasks out fail as
        dropouts, and the follow-ups their failures release (the next stage) are sent; the
        next stage has the same deadline from now."""
        self.progress = time.monotonic()
        for tid in list(self.pending):
            self.fail(tid, why)

    def end(self) -> tuple[list[Result], list[Failure]]:
        """The round is over (also when a callback raised): its results and failures; no stale
        task survives into the next round."""
        self.on_reply, self.accepting = None, True
        self.queue.clear()
        return ([r for r in self.replies if isinstance(r, Result)],
                [r for r in self.replies if isinstance(r, Failure)])
