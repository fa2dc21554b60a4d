"""Asynchronous aggregation on the virtual clock: FedAsync and FedBuff (docs/algorithms.md §3.12).

- FedAsync. Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019: the server mixes
  each arriving model in at once, x <- (1 - a_t) x + a_t x_k, with a_t = alpha * s(staleness).
- FedBuff. Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS
  2022: the server buffers the clients' updates Delta_k = x_start - x_k, weighted by s(staleness),
  and every K of them steps x <- x - eta_g * (sum of the buffer) / K.

Both keep C clients training at once (--param concurrency; default: the cohort of a synchronous
round, max(floor(fraction * N), 1)). When a reply is released (in simulated-time order: the
driver's core/arrivals.py, so local and launch agree exactly) its client is free and a new
client, drawn uniformly from the idle ones (online ones first with --availability), starts from
the current model at that moment. A logical round is K replies used (FedBuff: one server step;
FedAsync: K mixes), so rounds count the same client work as a synchronous round of K clients.
Staleness is the number of server updates (FedBuff: steps, FedAsync: mixes) between a task's
start and its use; each row records its mean and maximum.

A driver step is the whole run (or --param drain=R rounds: then everything in flight ends at
each R-th round, a checkpoint may be written there, and the run may be resumed from it; the
paper has no drains). Replies that arrive after the step's last update are not used; the step,
and its simulated time, end at that update. The clients are FedAvg's: they send their models,
and the server takes Delta_k against the model the task carried.

The server is on the clock (--server-profile, as a synchronous round's aggregation: core/
server_clock.py), charged where its work happens: FedAsync's mix of each used reply
(fold_ops: 3 d element operations and the staleness weight; before it, its decoding under
--compress, which a reply the step does not use, one after its last update or not finite,
is charged too: the server decoded it), FedBuff's step
once its buffer holds K updates (buffer_ops: their weighted differences summed, 3 K d, and the
step, 3 d). The server is one processor: a piece of work starts when its reply is released or
when the server's earlier work ends, whichever is later (`server_free`), so work queues when
replies come faster than it folds them; its encoding of a task's model under --compress-down
(core/server_clock.ServerClock.before, counted there) holds the queue too (server_busy).
The model that results is there only once that work is done: a task leaves at max(its
freeing reply's time, server_free), and a round's point and the step's end are at its last
update's end. The seconds are counted from the replies' simulated
times and the model's size alone, so they are the same in every runtime; the driver adds them
to rows' server_compute_s as they are charged (server_charged), and the step's sim_split
server_s is its last update's wait for the server (tail_s: from the reply that closed the step
to its end, all of it the server's work).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from fednet import opcount, rng, types as roster
from fednet.algorithms.common import finite, round_metrics
from fednet.algorithms.contract import StagedStrategy
from fednet.config import RunConfig
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

log = logging.getLogger("fednet.server")


DRAWS = 64  # uniform draws for an idle (online) client before falling back to a scan
FAILURE_BUDGET = 10  # failed replies per reply a step needs, before it stops starting tasks


STALENESS_OPS = 1
"""A staleness weight s(tau): one scalar operation (a power or a quotient)."""


def fold_ops(d: int) -> opcount.Ops:
    """FedAsync's mix of one arriving model into the server's, x <- (1 - w) x + w y, in each of
    the d values: two products and a sum (3 d); and its weight w = alpha s(tau)."""
    return {"stream": 3 * d + STALENESS_OPS} if d > 0 else {}


def buffer_ops(k: int, d: int) -> opcount.Ops:
    """FedBuff's server step over a full buffer of k updates of d values: each update's weighted
    difference against the model its task carried, s(tau) (x_start - x_k), summed (the streamed
    mean's scale and add, 2 k d, and the difference, k d) and its weight; then
    x <- x - eta * sum / k (the mean's division, d, and the step's product and difference, 2 d):
    network/server_cost.mean_ops's 2 k d + d and the rest (an algorithm counts its own server
    work, as a robust rule's DefenseSpec.work does)."""
    if k <= 0 or d <= 0:
        return {}
    return {"stream": 2 * k * d + d + k * d + 2 * d + k * STALENESS_OPS}


def staleness_weight(kind: str, tau: int, a: float, b: int) -> float:
    """s(tau) of FedAsync §5.2: constant 1; polynomial (tau + 1)^-a; hinge 1 for tau <= b,
    else 1 / (a (tau - b) + 1). FedBuff's 1/sqrt(1 + tau) is polynomial with a = 0.5."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((tau + 1) ** -a)
    return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


class Asynchronous(StagedStrategy):
    """The shared pipeline: C tasks out, one released reply frees one client."""

    virtual_order = True
    streams_points = True

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, params)
        self.pool: list[int] = []
        self.busy: dict[int, tuple[int, int, Arrays]] = {}  # task id -> (cid, updates, model)
        self.busy_cids: set[int] = set()
        self.points: list[tuple[int, Arrays, float, dict[str, Any]]] = []
        self.updates = 0  # server updates so far in this step (staleness counts them)
        self.rnd = self.end = self.start = self.failures_seen = 0
        self.used: list[Result] = []
        self.stale: list[int] = []
        self.failed: list[Failure] = []
        self.dropped = self.unused = 0
        self.last_time: float | None = None
        self.final: dict[str, Any] = {}
        # the server on the clock: its rates (set by the driver's ServerClock), when it is free,
        # the seconds charged since the driver last asked, the step's last update's wait
        self.server_rates: dict[str, float] = {}
        self.server_free = 0.0
        self.charged = self.tail_s = 0.0
        self.at = 0.0  # the simulated time of the reply being used
        self.values: int | None = None

    def rounds_per_step(self) -> int:
        """The whole run, or --param drain rounds."""
        return self.p.drain or self.cfg.rounds

    def per_round(self) -> int:
        """K: replies used per logical round (--param buffer; default the cohort)."""
        return self.p.buffer or self.cohort()

    def cohort(self) -> int:
        """max(floor(fraction * N), 1): a synchronous round's clients."""
        return max(int(self.cfg.algo.fraction * len(self.pool)), 1)

    # ---- the pipeline ----------------------------------------------------------------------
    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """Start of a step: C tasks from the current model, all at the step's start."""
        self.pool = roster.cids(clients)
        self.rnd = self.start = rnd
        self.end = min(rnd + self.rounds_per_step(), self.cfg.rounds)
        self.busy, self.busy_cids, self.points, self.updates = {}, set(), [], 0
        self.failures_seen = 0
        self.used, self.stale, self.failed, self.dropped, self.unused = [], [], [], 0, 0
        self.last_time, self.final = None, {}
        self.server_free, self.tail_s = self.now, 0.0
        if rnd == 0 and self.cfg.net.checkpoint_every and not self.p.drain:
            log.warning("%s: a checkpoint can be written only where the run drains, and this "
                        "run drains only at its end; give --param drain=R to checkpoint every R "
                        "rounds (docs/algorithms.md §3.12)", self.cfg.algo.name)
        c = min(self.p.concurrency or self.cohort(), len(self.pool))
        return [self._task(self.now) for _ in range(c)]

    def _task(self, now: float) -> Task:
        cid = self._pick(now)
        t = self.new_task(self.rnd, [cid], self.state.model, self.task_body(self.rnd, ClientInfo(cid, 0)))
        t.sim_time = now
        self.busy[t.task_id] = (cid, self.updates, self.state.model)
        self.busy_cids.add(cid)
        return t

    def _pick(self, now: float) -> int:
        """A client drawn uniformly from the idle ones (online at `now` first), seeded by the
        task id (ids follow the release order, which is the simulated-time order)."""
        g = rng.generator(self.cfg.seed, "async", self.state.next_task + 1)
        online = self.online
        for ok in ((lambda c: online(c, now)) if online else None, lambda c: True):
            if ok is None:
                continue
            for _ in range(DRAWS):
                c = self.pool[int(g.integers(len(self.pool)))]
                if c not in self.busy_cids and ok(c):
                    return c
            idle = [c for c in self.pool if c not in self.busy_cids and ok(c)]
            if idle:
                return idle[int(g.integers(len(idle)))]
        raise RuntimeError("no idle client (concurrency is at most the population)")

    def follow_up(self, done: Result | Failure) -> list[Task]:
        """Use the reply (unless the step is over), then start a new client if more replies
        are still needed than are out."""
        cid, start, _ = self.busy[done.task_id]
        self.busy_cids.discard(cid)
        if self.rnd >= self.end:  # the step's last update is done: not used
            self.busy.pop(done.task_id)
            self.unused += 1
            self.taken_in(done)  # (decoded all the same)
            return []
        if isinstance(done, Failure):
            self.failed.append(done)
            self.failures_seen += 1
        elif not finite(done.arrays):
            self.dropped += 1
            self.taken_in(done)  # (decoded before it was found not finite)
        else:
            self.stale.append(self.updates - start)
            self.used.append(done)
            self.at = done.sim_time
            self.taken_in(done)
            self.use(done, self.updates - start, self.busy[done.task_id][2])
            if len(self.used) == self.per_round():
                self._close_round(done.sim_time)
        self.busy.pop(done.task_id)
        if isinstance(done, Result):
            done.arrays = {}  # (its arrays are used: let them go)
        if (self.rnd >= self.end or len(self.busy) >= self.needed()
                or self.failures_seen > FAILURE_BUDGET * (self.end - self.start) * self.per_round()):
            return []  # (a step whose tasks keep failing ends short)
        # the current model is there once the server's work on it is done
        return [self._task(max(done.sim_time, self.server_free))]

    # ---- the server on the clock -----------------------------------------------------------
    def charge(self, work: dict[str, float]) -> None:
        """The server does `work` for the reply being used: from its release, or once the
        server's earlier work is done; the model that results is there at server_free."""
        s = opcount.seconds(work, self.server_rates)
        self.server_free = max(self.at, self.server_free) + s
        self.charged += s

    def taken_in(self, done: Result | Failure) -> None:
        """The server's work taking a result in (--compress's decoding, its server_ops), used
        or not (a reply after the step's last update, or one not finite): charged from its
        release, where the server did it."""
        if isinstance(done, Result) and done.server_ops:
            self.at = done.sim_time  # (the reply being taken in)
            self.charge(done.server_ops)

    def server_busy(self, until: float) -> None:
        """The server encoded a task's model (--compress-down) until `until`: its one queue
        holds the next reply's work until then (the encoding is counted by the driver's
        ServerClock: server_compute_s, not here)."""
        self.server_free = max(self.server_free, until)

    def server_charged(self) -> float:
        """The server seconds charged since the last call (the driver's server_compute_s)."""
        s, self.charged = self.charged, 0.0
        return s

    def server_tail(self) -> float:
        """The step's last update's wait for the server (tail_s)."""
        return self.tail_s

    def model_values(self) -> int:
        """d: the model's floating values (what a fold or a step goes over)."""
        if self.values is None:
            self.values = sum(int(a.size) for a in self.state.model.values()
                              if a.dtype.kind == "f")
        return self.values

    def needed(self) -> int:
        """Replies the step still has to use."""
        return (self.end - self.rnd) * self.per_round() - len(self.used)

    def _close_round(self, arrived: float) -> None:
        """A logical round is complete (its last reply released at `arrived`): its row (a point
        unless it is the step's last), at the end of the server's work on it."""
        self.finish_round()
        now = max(arrived, self.server_free)
        self.tail_s = now - arrived  # (the server's work all of it: it is busy until now)
        m = round_metrics(sorted(self.used, key=lambda r: (r.cid, r.task_id)), self.failed,
                          self.dropped)
        m.update({"staleness_mean": sum(self.stale) / len(self.stale),
                  "staleness_max": max(self.stale), "concurrency": len(self.busy)})
        self.used, self.stale, self.failed, self.dropped = [], [], [], 0
        self.last_time = now
        if self.rnd + 1 < self.end:
            self.points.append((self.rnd, self.state.model, now, m))
        else:
            self.final = m
        self.rnd += 1

    def interim_points(self) -> list[tuple[int, Arrays, float, dict[str, Any]]]:
        """The rounds completed since the last call (the driver evaluates them at once)."""
        out, self.points = self.points, []
        return out

    def step_end(self) -> float | None:
        """The step's last update (None when it made none: the driver's own reckoning)."""
        return self.last_time

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """The step's last round's metrics (the updates were made as replies came)."""
        missed = self.end - self.rnd
        if missed:  # ended short (its tasks kept failing): what there was
            log.error("%s: the step ended %d round(s) short of round %d: %d of its tasks failed "
                      "(see summary.json's failures)", self.cfg.algo.name, missed, self.end,
                      self.failures_seen)
            self.final = {**round_metrics(self.used, self.failed, self.dropped),
                          "rounds_missed": missed}
            self.rnd = self.end
        return {**self.final, "unused": self.unused}

    # ---- what each algorithm defines -------------------------------------------------------
    def use(self, r: Result, staleness: int, start: Arrays) -> None:
        """Fold one reply in (its task carried `start`)."""
        raise NotImplementedError

    def finish_round(self) -> None:
        """The round's K replies are in."""

    def weight(self, staleness: int) -> float:
        """s(staleness) of --param staleness."""
        p = self.p
        return staleness_weight(p.staleness, staleness, p.a, p.b)


def _mix(x: np.ndarray, y: np.ndarray, w: float) -> np.ndarray:
    """(1 - w) x + w y in float64, in x's dtype."""
    return ((1.0 - w) * x.astype(np.float64) + w * y.astype(np.float64)).astype(x.dtype)


class FedAsync(Asynchronous):
    """x <- (1 - alpha s(tau)) x + alpha s(tau) x_k for every reply; buffers take x_k's."""

    def use(self, r: Result, staleness: int, start: Arrays) -> None:
        w = self.p.alpha * self.weight(staleness)
        self.charge(fold_ops(self.model_values()))
        x = self.state.model
        self.state.model = {k: _mix(x[k], r.arrays[k], w) if x[k].dtype.kind == "f"
                            else r.arrays[k] for k in x}
        self.updates += 1


class FedBuff(Asynchronous):
    """Buffer s(tau) (x_start - x_k); every K: x <- x - eta_g * buffer / K."""

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, params)
        self.buf: dict[str, np.ndarray] = {}
        self.latest: Arrays = {}

    def use(self, r: Result, staleness: int, start: Arrays) -> None:
        w = self.weight(staleness)
        for k, y in r.arrays.items():
            if y.dtype.kind != "f":
                continue
            d = w * (start[k].astype(np.float64) - y.astype(np.float64))
            self.buf[k] = self.buf[k] + d if k in self.buf else d
        self.latest = r.arrays

    def finish_round(self) -> None:
        x, k = self.state.model, self.per_round()
        self.charge(buffer_ops(k, self.model_values()))
        eta = self.p.server_lr
        self.state.model = {n: (x[n].astype(np.float64) - eta * self.buf[n] / k).astype(x[n].dtype)
                            if n in self.buf else self.latest.get(n, x[n]) for n in x}
        self.buf, self.latest = {}, {}
        self.updates += 1

