"""The server link, deadlines and over-selection applied to one step of the round driver.

Both runtimes share this through core/rounds.py, on the same byte counts, so their simulated
times stay equal. What it does to a step (docs/architecture.md, "The server's link"):

- downloads: the step's TASKs start together and share the link (serverlink.share); each TASK
  is stamped with t = finish - bytes/down_bw, so that the client's own arithmetic
  (t + rtt/2 + bytes/down_bw, core/executor.py) gives finish + rtt/2;
- uploads: a synchronous step's RESULTs share the link from their clients' send times; the
  exact fluid schedule needs every reply of the step, so arrivals are final only at its end
  (a streaming algorithm still folds a result in when it comes, unless a deadline or
  over-selection must first say whether it counts: then the results are held until the end);
- a step with follow-up tasks (FedSeqInter's slots) cannot wait for the end: the next task of
  a slot leaves when its previous result arrives. There every transfer gets the static equal
  share R/S of the link (S: the step's slots), the share max-min fairness gives when all slots
  transfer at once, so transfer times are an upper bound when they do not overlap.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from fednet.config import RunConfig
from fednet.network.latency import Profile, parse_rate
from fednet.network.deadline import Cutoff
from fednet.network.serverlink import Flow, busy_seconds, share
from fednet.types import Failure, Result, Task

log = logging.getLogger("fednet.server")
INF = float("inf")


def capacity(cfg: RunConfig) -> float:
    """The server link's rate in bytes/s (inf: unlimited)."""
    return parse_rate(cfg.latency.server_bandwidth, "--server-bandwidth")


class Network:
    """The run's server link and round policies; `of` gives NoNetwork when every one is off."""

    def __init__(self, cfg: RunConfig, profiles: Sequence[Profile], task_size: Callable[[Task], int]
                 ) -> None:
        self.rate = capacity(cfg)
        self.deadline = float(cfg.latency.deadline)
        self.over = float(cfg.latency.over_select)
        self.profiles, self.task_size = profiles, task_size
        self.busy = 0.0
        self.stragglers = 0
        self._warned = False

    @classmethod
    def of(cls, cfg: RunConfig, profiles: Sequence[Profile], task_size: Callable[[Task], int]
           ) -> Network | NoNetwork:
        """The run's Network, or NoNetwork when every policy is off (its steps pass every
        task and reply through unchanged)."""
        lat = cfg.latency
        if math.isinf(capacity(cfg)) and not lat.deadline and lat.over_select == 1:
            return NO_NETWORK
        return cls(cfg, profiles, task_size)

    def step(self, start: float, first: int, tasks: list[Task], span: int,
             target: int | None, setup: bool = False, ordered: bool = False) -> Step:
        """A step starting at simulated time `start` with these first tasks. An `ordered` step
        (replies in simulated-time order: core/arrivals.py, which applies its deadline per
        task) has slots like a multi-round one and no cutoff here."""
        if self.over > 1 and target is None and not setup and not self._warned:
            self._warned = True
            log.warning("--over-select has no effect: this algorithm does not select clients")
        cut = Cutoff(start, first, 0.0 if setup or ordered else self.deadline,
                     None if setup or ordered or self.over == 1 else target)
        return Step(self, cut, span > 1 or ordered, max(len(tasks), 1))

    def summary(self) -> dict[str, Any]:
        """For summary.json."""
        out: dict[str, Any] = {"stragglers": self.stragglers}
        if not math.isinf(self.rate):
            out["server_link"] = {"rate_Bps": self.rate, "busy_s": self.busy}
        return out


class Step:
    """One step's transfers through the server link and its cutoff."""

    def __init__(self, net: Network, cut: Cutoff, slots: bool, n: int) -> None:
        self.net, self.cut, self.slots = net, cut, slots
        self.limited = not math.isinf(net.rate)
        self.fair = net.rate / n  # the static share of a step with follow-ups
        self.spans: list[tuple[float, float]] = []
        self.held: list[Result] = []
        self.end = -INF
        self.stragglers = 0
        self.row: dict[str, Any] = {}
        # held until the end: when lateness or the first `target` arrivals need every reply
        self.hold = cut.target is not None or (bool(cut.deadline) and self.limited and not slots)

    def send(self, tasks: list[Task]) -> list[Task]:
        """Stamp the tasks' TASK times with their downloads through the link."""
        if not self.limited or not tasks:
            return tasks
        sizes = [self.net.task_size(t) for t in tasks]
        caps = [self.net.profiles[t.cid].down_bps for t in tasks]
        if self.slots:
            done = [t.sim_time + n / min(c, self.fair) for t, n, c in zip(tasks, sizes, caps)]
            self.spans += [(t.sim_time, e) for t, e in zip(tasks, done)]
        else:
            done, spans = share([Flow(t.sim_time, n, c) for t, n, c in zip(tasks, sizes, caps)],
                                self.net.rate)
            self.spans += spans
        for t, n, c, e in zip(tasks, sizes, caps, done):
            t.sim_time = e - n / c if not math.isinf(c) else e
        return tasks

    def reply(self, done: Result | Failure) -> Result | Failure | None:
        """What the algorithm sees of a reply now: the reply, a straggler (a Failure at its
        deadline, for a slot that goes on), or None (held, or late in a one-round step)."""
        if not isinstance(done, Result):
            return done
        if self.slots and self.limited:  # follow-ups leave from this arrival: fix it now
            p = self.net.profiles[done.cid]
            end = done.sent + done.nbytes / min(p.up_bps, self.fair)
            self.spans.append((done.sent, end))
            done.sim_time = end + p.rtt_s / 2
        if self.hold:
            self.held.append(done)
            return None
        if self.cut.late(done):
            due = self.cut.due(done.round)
            return Failure(done.task_id, done.round, done.cid, f"straggler: arrived at "
                           f"{done.sim_time:.3f}s, after the deadline {due:.3f}s", due) \
                if self.slots else None
        return done

    def close(self, results: list[Result], absorb: Callable[[Result], None] | None
              ) -> list[Result]:
        """The results that count (uploads scheduled, cutoff applied); held ones that count are
        absorbed now, in arrival order."""
        if self.limited and not self.slots and results:
            flows = [Flow(r.sent, r.nbytes, self.net.profiles[r.cid].up_bps) for r in results]
            done, spans = share(flows, self.net.rate)
            self.spans += spans
            for r, e in zip(results, done):
                r.sim_time = e + self.net.profiles[r.cid].rtt_s / 2
        kept, late, self.end = self.cut.close(results)
        if absorb is not None and self.hold:
            for r in kept:
                absorb(r)
        self.stragglers = len(late)
        self.net.stragglers += len(late)
        busy = busy_seconds(self.spans)
        self.net.busy += busy
        self.row = {"stragglers": len(late), **({"server_busy_s": busy} if self.limited else {})}
        return sorted(kept, key=lambda r: (r.cid, r.task_id))


class PassStep:
    """A step without a server link limit, a deadline or over-selection: every task and reply
    passes unchanged, and it adds nothing to the step's row or end."""

    end = 0.0
    stragglers = 0

    @property
    def row(self) -> dict[str, Any]:
        return {}

    def send(self, tasks: list[Task]) -> list[Task]:
        return tasks

    def reply(self, done: Result | Failure) -> Result | Failure | None:
        return done

    def close(self, results: list[Result], absorb: Callable[[Result], None] | None
              ) -> list[Result]:
        return results


class NoNetwork:
    """The run's network when --server-bandwidth, --deadline and --over-select are off."""

    def step(self, start: float, first: int, tasks: list[Task], span: int,
             target: int | None, setup: bool = False, ordered: bool = False) -> PassStep:
        return PassStep()

    def summary(self) -> dict[str, Any]:
        """Nothing for summary.json."""
        return {}


NO_NETWORK = NoNetwork()
