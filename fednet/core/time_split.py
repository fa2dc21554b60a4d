"""Where a step's simulated time went (rows' `sim_split`, summary.json's `time_split`): the
step's critical path, the reply that arrived last, split into its download, the client's
training compute, its protocol compute (secure aggregation's primitives, at its profile's
rates), its upload, then the server's compute after it; `wait_s` is the rest of the step's
span (the stages before that reply's task left, churn waits, a deadline). Secure aggregation's
four stages are split each the same way (`sim_split_by_stage`), with the server's work of
that stage. Computed by the server from its own tables and the replies' stamps: the same in
every runtime."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fednet.network import latency
from fednet.network.profiles import Profile
from fednet.types import Failure, Result, Task

PARTS = ("download_s", "client_compute_s", "protocol_s", "upload_s", "server_s", "wait_s")


class TimeSplit:
    """One step's sent tasks and last arrivals (per protocol stage too)."""

    def __init__(self) -> None:
        self.profiles: Sequence[Profile] | None = None  # set by the session
        self.task_work: Callable[[Task], dict[str, float]] | None = None  # protocol work
        self.sent_at: dict[int, tuple[float, float, float]] = {}  # task -> (t, down, protocol)
        self.stage_of: dict[int, str] = {}
        self.last: dict[str, tuple[float, float, float, float, float]] = {}  # "" or stage

    def sent(self, tasks: list[Task]) -> None:
        """Tasks leaving now (stamped): when, their download and their protocol seconds."""
        if self.profiles is None:
            return
        for t in tasks:
            p = self.profiles[t.cid]
            tensors = sum(a.nbytes for a in (t.arrays if t.wire is None else t.wire).values())
            work = self.task_work(t) if self.task_work is not None else {}
            self.sent_at[t.task_id] = (t.sim_time, latency.down_delay(p, tensors),
                                       latency.protocol_time(p, work))
            if t.stage:
                self.stage_of[t.task_id] = t.stage

    def arrived(self, done: Result | Failure) -> None:
        """A reply taken: the last of its step (and stage) so far is kept."""
        at = self.sent_at.pop(done.task_id, None)
        stage = self.stage_of.pop(done.task_id, "")
        if at is None or not isinstance(done, Result):
            return
        t0, down, proto = at
        up = max(0.0, done.sim_time - done.sent) if done.sent else 0.0
        work = max(0.0, done.sim_time - up - t0 - down)
        path = (done.sim_time, down, min(proto, work), max(0.0, work - proto), up)
        for key in ("", stage) if stage else ("",):
            if key not in self.last or path[0] > self.last[key][0]:
                self.last[key] = path

    def close(self, start: float, end: float, server_s: float,
              metrics: dict[str, Any]) -> dict[str, Any]:
        """The step's row entries: sim_split (and sim_split_by_stage for staged protocols)."""
        out: dict[str, Any] = {"sim_split": _split(self.last.get(""), end - start, server_s)}
        spans = metrics.get("secagg_sim_s") or {}
        server = metrics.get("secagg_server_sim_s") or {}
        if spans:
            out["sim_split_by_stage"] = {
                s: _split(self.last.get(s), float(span), float(server.get(s, 0.0)))
                for s, span in spans.items()}
        self.sent_at, self.stage_of, self.last = {}, {}, {}
        return out


def _split(path: tuple[float, float, float, float, float] | None, span: float,
           server_s: float) -> dict[str, float]:
    """A span split along one reply's path (none: all of it waiting, or the server's)."""
    _, down, proto, comp, up = path if path is not None else (0.0, 0.0, 0.0, 0.0, 0.0)
    parts = [down, comp, proto, up, server_s]
    return {**dict(zip(PARTS, parts)), "wait_s": max(0.0, span - sum(parts))}


def add(total: dict[str, float], split: dict[str, float]) -> dict[str, float]:
    """Sums of splits (summary.json's time_split over the run's rows)."""
    for k in PARTS:
        total[k] = total.get(k, 0.0) + float(split.get(k, 0.0))
    return total
