"""Secure aggregation around a FedAvg-family algorithm (--secagg full|plus): SecAgg (Bonawitz et
al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017) and
SecAgg+ (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead",
CCS 2020). Spec: docs/algorithms.md, "Secure aggregation".

Each round is four stages, each a task to every client still in it and its result, through the
server (the round driver releases a stage's tasks when the last reply of the one before is in):
keys, shares, input (the training task itself: the client trains, then sends its update
quantized, weighted by its sample count and masked), unmask. The server sums the masked inputs
and removes the masks (fednet/secagg/server.py): it learns the weighted sum of the survivors'
updates and nothing else. The algorithm's own server then aggregates one result, the unmasked
mean (its model: the model the round began with plus the mean update), weighted by the
survivors' samples. What differs from plain FedAvg is the quantization (within one step,
2 * clip / (2^bits - 1), of the mean of the clipped updates) and the clipping itself.

The server's side here: SecAggServer; the client's: SecAggClient (secagg_client.py). The
primitives and the protocol are fednet/secagg/."""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from fednet import rng, types as roster
from fednet.algorithms.contract import (ClientUpdate, RoundContext, ServerInfo, StagedStrategy,
                                        Strategy)
from fednet.algorithms.layout import Layout
from fednet import opcount
from fednet.secagg import client as C
from fednet.secagg import cost
from fednet.compress.field import grid_levels
from fednet.secagg.field import dequantize, dtype_of, field_bits, packed_size, unpack, wire_bits
from fednet.secagg.graph import default_neighbours
from fednet.secagg.server import STAGES, Aggregation, SecAggFailed
from fednet.algorithms.secagg_client import BAD_FROM, PREFIX, _floats, counted_prefix
from fednet.algorithms.secagg_client import SecAggClient as SecAggClient  # (re-exported)
from fednet.privacy import distributed, plan
from fednet.types import Arrays, ClientInfo, Failure, Result, Task
from fednet.config import RunConfig

T = TypeVar("T")
log = logging.getLogger("fednet.server")
KEYS_LAYOUT: Layout = {"c_pk": ((32,), np.dtype(np.uint8)), "s_pk": ((32,), np.dtype(np.uint8))}


def refusal(cfg: RunConfig, server: Strategy, client: type[ClientUpdate]) -> str:
    """Why the built halves do not fit secure aggregation ('' when they do): what validate
    cannot see from the declarations (algorithms/checks.secagg_problem refuses the rest before
    any data loads): an algorithm that declares Spec.secagg must have a FedAvg-family server
    and clients that send models (a client's own state, SCAFFOLD's c_k, never travels)."""
    from fednet.algorithms.fedavg import FedAvg

    if (not isinstance(server, FedAvg) or isinstance(server, StagedStrategy)
            or getattr(client, "sends_updates", False)):
        return (f"{cfg.algo.name} declares secagg=True in its Spec, and its server is not a "
                "FedAvg-family Strategy or its clients send updates; drop secagg=True from its "
                "Spec")
    return ""


class _Inner(Generic[T]):
    """A field of the wrapped Strategy, read and set through the wrapper (SecAggServer)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:  # looked up on the class: the descriptor itself
            return self  # type: ignore[return-value]  # (class access, not a field value)
        return getattr(obj.inner, self.name)

    def __set__(self, obj: Any, value: T) -> None:
        setattr(obj.inner, self.name, value)


class SecAggServer(StagedStrategy):
    """The server's stages around an inner FedAvg-family Strategy, whose configure_round picks
    the cohort and builds the training tasks and whose aggregate gets the unmasked result."""

    chained = True  # the stages' tasks follow the replies within one round (core/rounds.py)

    def __init__(self, inner: Strategy) -> None:  # (the inner Strategy holds cfg, state, layout)
        self.inner = inner
        n = inner.cfg.net
        self.mode, self.bits, self.clip = n.secagg, n.secagg_bits, n.secagg_clip
        # --compress int8|qsgd: the codec's common grid (compress/field.py) in place of
        # --secagg-bits', and the masked vector sent in wbits bits a value, packed
        grid = n.codecs().field
        self.packed = grid.on
        self.levels = grid_levels(grid.kind, grid.arg) if grid.on else (1 << self.bits) - 1
        self.wbits = 0
        self.examples: dict[int, int] = {}  # the cohort's examples (the grid's weights)
        self.fraction, self.forced_field = n.secagg_threshold, n.secagg_field
        self.degree_asked, self.dropout = n.secagg_neighbours, n.secagg_dropout
        # --dp distributed: each client's update clipped, rounded and noised (its share), every
        # client weighing 1, in a 64-bit field; a round unmasks at least ddg_t clients
        dp = inner.cfg.dp
        self.ddp = dp.mode == "distributed"
        self.ddg_t = plan.ddg_threshold(inner.cfg) if self.ddp else 2
        # Spec.secagg_counted: the result arrays summed apart, each client weighing 1
        self.counted = counted_prefix(inner.cfg)
        self.agg: Aggregation | None = None
        self.stage = ""
        self.waiting: set[int] = set()
        self.training: dict[int, Task] = {}
        self.asked: dict[int, dict[str, Any]] = {}  # task id -> what it asked (unmask), layout
        self.answers: dict[str, int] = {}  # stage -> the replies it took this round
        self.starts: dict[str, float] = {}  # stage -> the simulated time its tasks left
        self.last_keys: set[bytes] = set()  # the previous round's public keys (replays refused)
        self.stats: dict[str, Any] = {}
        self.failed = ""
        self.clock = 0.0  # the simulated time the current stage's last reply came
        self.server_rates: dict[str, float] = {}  # the server's (set by the round driver)
        self.server_ops: dict[str, dict[str, float]] = {}  # stage -> the server's work in it

    # ---- the inner's fields, named (no delegation by __getattr__: a member this wrapper
    # lacks is an AttributeError, not a guess); the driver and the session read and set them
    cfg: _Inner[RunConfig] = _Inner("cfg")
    state: _Inner[Any] = _Inner("state")
    layout: _Inner[Layout] = _Inner("layout")
    ctx: _Inner[RoundContext] = _Inner("ctx")
    trainable: _Inner[set[str]] = _Inner("trainable")
    info: _Inner[ServerInfo] = _Inner("info")
    eval_clients: _Inner[bool] = _Inner("eval_clients")

    @property
    def calibrated(self) -> bool:
        """--dp distributed: whether the session calibrated the noise (the inner's)."""
        return bool(getattr(self.inner, "calibrated", False))

    @calibrated.setter
    def calibrated(self, value: bool) -> None:
        self.inner.calibrated = value  # (the Strategy's: its Privacy piece reads it)

    @property
    def resume_problem(self) -> Callable[..., str] | None:
        """The inner's own --resume checks (differential privacy's), if it has them."""
        return getattr(self.inner, "resume_problem", None)

    # ---- what the driver and the session ask ----------------------------------------------
    def setup(self, init: Arrays, trainable: set[str] | None = None) -> None:
        self.inner.setup(init, trainable)

    def bind(self, info: ServerInfo) -> None:
        self.inner.bind(info)

    def eval_arrays(self) -> Arrays:
        return self.inner.eval_arrays()

    def report(self) -> dict[str, Any]:  # summary.json's sections of the inner (`dp`, ...)
        return self.inner.report()

    def stop_before(self, rnd: int, clients: Sequence[ClientInfo]) -> tuple[str, str] | None:
        return self.inner.stop_before(rnd, clients)

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """The round's cohort (the inner algorithm's tasks, kept for the input stage); the keys
        stage's tasks to each."""
        tasks = self.inner.configure_round(rnd, clients)
        self.training = {t.route[0]: t for t in tasks}
        info = roster.lookup(clients)
        cohort = sorted(self.training)
        weights = {c: 1 if self.ddp else int(info(c).num_examples)  # type: ignore[union-attr]  # in the roster
                   for c in cohort}
        if self.packed:  # the grid: each client's weight in its values, every input counts 1
            self.examples, weights = weights, dict.fromkeys(cohort, 1)
        fbits = distributed.FIELD_BITS if self.ddp else field_bits(
            sum(weights.values()), self.bits, self.forced_field,
            self.levels if self.packed else 0)
        # (the fewest bits every sum of the round fits, the cohort's size times the grid's L,
        # and a guard bit for the unmasked sum's check; within the masks' field)
        self.wbits = min(wire_bits(len(cohort), self.levels), fbits) if self.packed else 0
        degree = None if self.mode == "full" else (
            self.degree_asked or default_neighbours(len(cohort), self.dropout, self.fraction))
        self.agg = Aggregation(rnd, cohort, weights, degree, self.fraction, fbits,
                               rng.generator(self.cfg.seed, "secagg-graph", rnd), self.ddg_t)
        self.stats = {"secagg_server_s": {}, "secagg_neighbours": self.agg.k()}
        self.answers, self.starts, self.server_ops = {}, {}, {}
        self.failed, self.clock = "", self.now
        return self._stage("keys", {c: ({}, {}) for c in cohort}, rnd)

    def _stage(self, stage: str, per: dict[int, tuple[Arrays, dict[str, Any]]], rnd: int,
               again: bool = False) -> list[Task]:
        """One stage's tasks: per client (arrays, body); `again`: the stage asked again (its
        time runs on from its first tasks')."""
        self.stage, self.waiting, out = stage, set(), []
        if not again:  # (the simulated time each stage took: stage_seconds)
            self.starts[stage] = self.clock
        for cid, (arrays, body) in sorted(per.items()):
            trains = stage == "input"  # the other stages train nothing (no client compute)
            t = self.new_task(rnd, [cid], arrays, body if trains else {**body, "epochs": 0},
                              stage=stage)
            t.sim_time = self.clock  # a stage starts when the server has the last one's replies
            self.waiting.add(t.task_id)
            out.append(t)
        return out

    def result_layout(self, task: Task) -> Layout | None:
        """Each stage's result: its own arrays, exactly (the input stage's: the masked vector)."""
        return self.asked.get(task.task_id, {}).get("layout", KEYS_LAYOUT)

    def absorb(self, done: Result | Failure) -> None:
        """A stage's reply: what it carries taken into the round's aggregation, its arrays let go."""
        self.waiting.discard(done.task_id)
        self.clock = max(self.clock, done.sim_time)
        if not isinstance(done, Result) or self.agg is None or self.failed:
            return
        t0 = time.process_time()
        a, stage, why = done.arrays, self.stage, ""
        if stage == "keys":
            why = self.agg.take_keys(done.cid, a["c_pk"], a["s_pk"], self.last_keys)
        elif stage == "shares":
            why = self.agg.take_shares(done.cid, a["to"], a["sealed"])
        elif stage == "input":
            why = self.agg.complain(done.cid, done.body.get(BAD_FROM) or [])
            if not why:
                self.agg.take_input(done.cid, unpack(a["y"], self.wbits, self._length(), dtype_of(
                    self.agg.fbits)) if self.packed else a["y"])
        else:
            why = self.agg.take_unmask(done.cid, a, self.asked[done.task_id]["unmask"])
        if why:  # the protocol's own check refused it: that client is a dropout of this stage
            self._refuse(done.round, done.cid, stage, why)
        else:
            self.answers[stage] = self.answers.get(stage, 0) + 1
        self._cpu(stage, done, t0)
        done.arrays = {}

    def _refuse(self, rnd: int, cid: int, stage: str, why: str) -> None:
        """A reply the protocol's checks refused: logged naming the client, in the row's
        secagg_refused; the client counts as a dropout of that stage."""
        log.warning("round %d: secure aggregation: client %d's reply at stage %s is refused "
                    "(%s); it counts as a dropout", rnd + 1, cid, stage, why)
        self.stats.setdefault("secagg_refused", []).append([cid, stage, why])

    def _cpu(self, stage: str, done: Result, t0: float) -> None:
        s = self.stats["secagg_server_s"]
        s[stage] = s.get(stage, 0.0) + time.process_time() - t0
        c = self.stats.setdefault("secagg_client_s", {})
        c[stage] = c.get(stage, 0.0) + float(done.body.get("cpu_s", 0.0))

    def follow_up(self, done: Result | Failure) -> list[Task]:
        """The next stage's tasks, once every reply of this one is in."""
        if self.waiting or self.agg is None or self.failed or self.stage == "unmask":
            return []
        t0 = time.process_time()
        if self.stage == "input":  # the masked inputs summed before the unmask stage leaves
            self.clock += self._server("input", cost.summed(self.agg.summed(), self._d(),
                                                            self.packed))  # (each unpacked)
        try:
            nxt = {"keys": self._shares, "shares": self._inputs, "input": self._unmasks}[
                self.stage](done.round)
        except SecAggFailed as e:
            self.failed = self._why(e)
            return []
        finally:
            srv = self.stats["secagg_server_s"]
            srv[self.stage] = srv.get(self.stage, 0.0) + time.process_time() - t0
        return nxt

    def _why(self, e: SecAggFailed) -> str:
        """The failure, with what to change when a SecAgg+ neighbourhood lost too many shares."""
        if self.mode != "plus" or not re.search(r"needs \d+ shares, \d+ came", str(e)) \
                or self.agg is None:
            return str(e)
        return (f"{e} (SecAgg+ gave each client {self.agg.k()} neighbours, enough for "
                + (f"--secagg-dropout {self.dropout}: raise it" if not self.degree_asked else
                   "--secagg-neighbours: raise it") + " to survive more dropouts)")

    def _shares(self, rnd: int) -> list[Task]:
        agg = self.agg
        assert agg is not None, "the shares stage follows the keys stage, which builds agg"
        req = agg.share_requests()
        tasks = self._stage("shares", {c: ({"nbrs": r["nbrs"], "c_pks": r["c_pks"],
                                             "s_pks": r["s_pks"]}, {"t": agg.t[c]})
                                       for c, r in req.items()}, rnd)
        for t in tasks:
            k = len(req[t.cid]["nbrs"])
            self.asked[t.task_id] = {"layout": {"to": ((k,), np.dtype(np.int64)),
                                                "sealed": ((k, C.SEALED_BYTES),
                                                           np.dtype(np.uint8))}}
        return tasks

    @property
    def live(self) -> Aggregation:
        """The round's aggregation, which its keys stage builds (every later stage has it)."""
        assert self.agg is not None, "a stage after keys runs with the round's aggregation"
        return self.agg

    def _inputs(self, rnd: int) -> list[Task]:
        agg = self.live
        req = agg.input_requests()
        per = {}
        for c, r in req.items():
            train = self.training[c]
            arrays = {**train.arrays, **{PREFIX + k: v for k, v in r.items()}}
            per[c] = (arrays, {**train.body, "fbits": agg.fbits, "bits": self.bits,
                               "clip": self.clip, **self._grid()})
        return self._expect_inputs(self._stage("input", per, rnd))

    def _grid(self) -> dict[str, int]:
        """What an input task adds under --compress's common grid: its steps L and the bits a
        masked value travels in (nothing otherwise: the body of a plain SecAgg task as it was)."""
        return ({"levels": self.levels, "wbits": self.wbits, "top": max(self.examples.values())}
                if self.packed else {})

    def _expect_inputs(self, tasks: list[Task]) -> list[Task]:
        """The input stage's reply: the update's d values and the training loss, then the
        counted arrays' values (Spec.secagg_counted), masked (under --compress's grid: wbits
        bits a value, packed into bytes)."""
        d = self._length()
        y = ((packed_size(d, self.wbits),), np.dtype(np.uint8)) if self.packed else \
            ((d,), dtype_of(self.live.fbits))
        for t in tasks:  # (distributed DP: no loss travels)
            self.asked[t.task_id] = {"layout": {"y": y}}
        return tasks

    def _counted(self) -> Layout:
        """The inner's result arrays summed apart (Spec.secagg_counted), by name: their layout."""
        if not self.counted:
            return {}
        task = next(iter(self.training.values()), None) or Task(-1, 0, [-1])  # (the same for
        full = self.inner.result_layout(task) or {}  # every task: the declaration's promise)
        return {n: full[n] for n in sorted(full) if n.startswith(self.counted)}

    def _length(self) -> int:
        """The masked vector's length: the model's floating values, the loss (not under
        distributed DP), the counted arrays' values."""
        d = sum(int(np.prod(self.layout[n][0])) for n in _floats(self.inner.state.model))
        return d + (not self.ddp) + sum(int(np.prod(s)) for s, _ in self._counted().values())

    def _remask(self, rnd: int) -> list[Task]:
        """Survivors could not open some senders' shares: those senders are left out (each
        named in secagg_refused, a dropout of the shares stage) and the input stage is asked
        again of the others, without training (secagg/server.remask_requests)."""
        agg = self.live
        req = agg.remask_requests()
        for v, at in agg.excluded.items():
            self._refuse(rnd, v, "shares", "its sealed shares did not open at client(s) "
                         + ", ".join(map(str, at)))
            self.answers["shares"] -= 1
        self.answers["input"] = 0
        again = {"again": True, "epochs": 0, **self._grid()}  # (no training: no epochs charged)
        return self._expect_inputs(self._stage(
            "input", {c: ({PREFIX + "partners": r["partners"]}, again) for c, r in req.items()},
            rnd, again=True))

    def _unmasks(self, rnd: int) -> list[Task]:
        if self.live.accused():
            return self._remask(rnd)
        req = self.live.unmask_requests()
        tasks = self._stage("unmask", {c: (dict(r), {}) for c, r in req.items()}, rnd)
        for t in tasks:
            r = req[t.cid]
            a, b = len(r["survivors"]), len(r["dropped"])
            self.asked[t.task_id] = {"unmask": r, "layout": {
                "b_of": ((a,), np.dtype(np.int64)), "b_share": ((a, C.SB), np.dtype(np.uint8)),
                "s_of": ((b,), np.dtype(np.int64)), "s_share": ((b, C.SB), np.dtype(np.uint8))}}
        return tasks

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """The unmasked weighted mean as the inner algorithm's one result (the model kept when
        the round could not be unmasked: too many dropouts, named)."""
        t0 = time.process_time()
        mean = None
        if not self.failed and self.stage == "unmask" and self.agg is not None:
            try:
                total, weight = self.agg.result(self.levels, self._outside())
                if self.packed:  # the sum modulo 2^wbits: the clients' (every sum fits)
                    total = total & total.dtype.type((1 << self.wbits) - 1)
                mean = (total, weight)
            except SecAggFailed as e:
                self.failed = self._why(e)
        if mean is not None:  # (the round's end waits for it: core/server_clock.py)
            self._server("unmask", cost.unmasking(self.agg))
        inner_results = [] if mean is None else [self._unmasked(rnd, *mean)]
        metrics = self.inner.aggregate_round(rnd, inner_results, failures)
        self.stats["secagg_server_s"]["unmask"] = (self.stats["secagg_server_s"].get("unmask", 0.0)
                                                  + time.process_time() - t0)
        for cid, why in sorted(self.agg.liars.items()) if self.agg is not None else ():
            self._refuse(rnd, cid, "unmask", why)
            self.answers["unmask"] -= 1
        if mean is None and not self.failed:  # a stage released no tasks: nothing to unmask
            self.failed = (f"secure aggregation stopped at stage {self.stage}: no client could "
                           f"go on to the next stage ({self._left()} clients left)")
        out = {**metrics, **self.stats, "secagg_field_bits": self.agg.fbits if self.agg else 0,
               **({"secagg_wire_bits": self.wbits} if self.packed else {}),
               "secagg_clients": self._survivors(), "secagg_sim_s": self._stage_seconds(),
               "secagg_server_sim_s": {k: opcount.seconds(v, self.server_rates)
                                       for k, v in self.server_ops.items()}}
        if self.failed:
            out["secagg_failed"] = out["round_failed"] = self.failed
        self.last_keys = self.agg.used if self.agg is not None else set()
        self.agg, self.asked, self.training = None, {}, {}
        return out

    def _server(self, stage: str, work: dict[str, float]) -> float:
        """The server's work at `stage` (fednet/secagg/cost.py) counted; its simulated seconds."""
        opcount.add(self.server_ops.setdefault(stage, {}), work)
        return opcount.seconds(work, self.server_rates)

    def _d(self) -> int:
        """The masked vector's length."""
        return self.agg.length() if self.agg is not None else 0

    def task_work(self, task: Task) -> dict[str, float]:
        """The protocol work a stage's task asks of its client (secagg/cost.of_task)."""
        layout = self.asked.get(task.task_id, {}).get("layout", {}).get("y")
        item = dtype_of(self.agg.fbits).itemsize if self.agg is not None else 8
        d = (self._length() if self.packed else int(np.prod(layout[0]))) if layout else 0
        return cost.of_task(task.stage, task.body, task.arrays, d, item, PREFIX, self.ddp)

    def work_bound(self) -> dict[str, float]:
        """The most protocol work a client's task can charge (core/session.py's bound)."""
        return cost.bound(int(self.cfg.clients), self._length() + self.ddp)

    def final_work(self) -> dict[str, float]:
        """The round's last server work, which its end waits for (core/server_clock.py)."""
        return self.server_ops.get("unmask", {})

    def _survivors(self) -> list[int]:
        """The cohort, then the clients whose reply each stage took, up to the last stage
        reached (a round that failed at a stage ends with that stage's count)."""
        cohort = len(self.agg.cohort) if self.agg is not None else 0
        reached = STAGES[:STAGES.index(self.stage) + 1] if self.stage in STAGES else ()
        return [cohort] + [self.answers.get(s, 0) for s in reached]

    def _stage_seconds(self) -> dict[str, float]:
        """The simulated seconds each stage reached took: from its tasks' release to the next
        stage's (the last: to its last reply)."""
        t = [(s, self.starts[s]) for s in STAGES if s in self.starts]
        ends = [b for _, b in t[1:]] + [max(self.clock, t[-1][1])] if t else []
        return {s: e - b for (s, b), e in zip(t, ends)}

    def _left(self) -> int:
        return self._survivors()[-1]

    def _outside(self) -> Any:
        """Distributed DP's bound check of the unmasked sum (signed values); under --compress's
        grid the sum modulo 2^wbits within [0, L k], k the inputs (the values that travelled
        were reduced modulo 2^wbits); else None (the levels' own bound)."""
        if self.packed:
            most, low = self.levels, (1 << self.wbits) - 1
            return lambda total, k: int(np.count_nonzero(
                (total & total.dtype.type(low)) > total.dtype.type(most * k)))
        if not self.ddp:
            return None
        z, t = self.cfg.dp.noise, self.ddg_t
        return lambda total, k: distributed.out_of_bound(total, k, z, t)

    def _unmasked(self, rnd: int, total: np.ndarray, weight: int) -> Result:
        """The round's one result: the model it began with plus the unmasked mean update, and
        the mean training loss (the masked vector's last value). Distributed DP: the noisy sum
        of the clipped updates over the `weight` clients it holds, no loss; the result's weight
        is that count (the Privacy piece accounts the round from it)."""
        base, counted = self.inner.state.model, self._counted()
        apart = sum(int(np.prod(s)) for s, _ in counted.values())
        if self.ddp:
            delta = distributed.decode(total, self.cfg.dp.clip) / weight
        elif self.packed:  # sum_u s_u x_u over sum_u s_u, s_u = n_u / n_top: FedAvg's mean
            k, top = len(self.live.inputs), max(self.examples.values())
            mass = sum(self.examples[u] for u in self.live.inputs)
            delta = dequantize(total[:total.size - apart], k, self.clip, self.bits,
                               self.levels) * (k * top / mass)
            weight = mass  # (the result's weight: the survivors' examples, as without a grid)
        else:
            delta = dequantize(total[:total.size - apart], weight, self.clip, self.bits,
                               self.levels)
        model, i = dict(base), 0
        for n in _floats(base):
            a = base[n]
            model[n] = (a.astype(np.float64) + delta[i:i + a.size].reshape(a.shape)).astype(a.dtype)
            i += a.size
        if apart:  # their sum: each client weighed 1 (the mean times the inputs' count)
            k = len(self.live.inputs)
            sums, j = dequantize(total[total.size - apart:], k, self.clip, self.bits,
                                 self.levels) * k, 0
            for n, (shape, dt) in counted.items():
                size = int(np.prod(shape))
                model[n] = sums[j:j + size].reshape(shape).astype(dt)
                j += size
        body = {} if self.ddp else {"loss": float(delta[i])}
        return Result(-1, rnd, -1, model, body, weight)
