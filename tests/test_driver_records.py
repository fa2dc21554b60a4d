"""The round driver's small records (core/boundary.py: Clock, Marks, Checkpoints), the
synchronous step's reply order (core/arrivals.AsArrived), the Verdict ending a run through the
driver's end, and a driver built with only the collaborators it cannot do without."""
from __future__ import annotations

import io
import math
import time

import numpy as np
import pytest

from fednet.algorithms.contract import Strategy
from fednet.core.arrivals import Arrivals, AsArrived
from fednet.core.boundary import Checkpoints, Clock, Marks
from fednet.core.rounds import RoundDriver
from fednet.core.status import RunStatus
from fednet.core.verdict import Verdict
from fednet.core.work import ClientCompute
from fednet.metrics.accounting import Ledger
from fednet.metrics.history import History
from fednet.metrics.progress import Progress
from fednet.types import ClientInfo, Failure, Result, Task
from tests.conftest import small_config


def _task(tid: int, cid: int, rnd: int = 0, start: float = 0.0) -> Task:
    return Task(task_id=tid, round=rnd, route=[cid], sim_time=start)


# ---- Clock ----------------------------------------------------------------------------------

def test_the_clock_counts_the_earlier_segments_and_stops_with_the_run():
    clock = Clock(planned=10)
    clock.segments = [{"rounds": [0, 3], "rounds_planned": 10, "wall_s": 2.0},
                      {"rounds": [3, 5], "rounds_planned": 10, "wall_s": 1.5}]
    clock.start()
    time.sleep(0.01)
    clock.stop()
    wall = clock.wall()
    assert wall >= 3.5 + 0.01 and clock.wall() == wall  # stopped: it no longer moves
    *earlier, now = clock.all_segments(rounds_done=8)
    assert earlier == clock.segments
    assert now["rounds"] == [5, 8] and now["rounds_planned"] == 10
    assert now["wall_s"] == wall - 3.5


def test_a_first_segment_starts_at_round_zero():
    assert Clock(planned=4).all_segments(rounds_done=2)[0]["rounds"] == [0, 2]


# ---- Marks ----------------------------------------------------------------------------------

def test_ctrl_c_is_caught_at_a_boundary_only_after_a_round_and_outside_aggregation():
    marks = Marks(({"server_to_client": 1}, 4, 2.5), (1, 2.5, {}, 3))
    marks.interrupted(rounds_done=0)
    assert not marks.caught  # nothing finished to checkpoint
    marks.mutating = True
    marks.interrupted(rounds_done=2)
    assert not marks.caught  # the state is half the next round's
    marks.mutating = False
    marks.interrupted(rounds_done=2)
    assert marks.caught and marks.mark == ({"server_to_client": 1}, 4, 2.5)


# ---- Checkpoints ----------------------------------------------------------------------------

def test_checkpoints_are_due_at_every_multiple_and_at_the_last_round():
    seen: list[int] = []
    done = [0]

    def write() -> bool:
        seen.append(done[0])
        return True
    cp = Checkpoints(every=2, planned=5, write=write)
    for rnd in range(5):
        done[0] = rnd + 1
        cp.step_done(rnd, rnd + 1)
    assert seen == [2, 4, 5] and cp.ckpt_round == 5


def test_steps_of_several_rounds_checkpoint_when_they_cross_a_multiple():
    seen: list[int] = []
    done = [0]
    cp = Checkpoints(every=3, planned=8, write=lambda: seen.append(done[0]) is None)
    for rnd, done[0] in [(0, 2), (2, 4), (4, 6), (6, 8)]:  # crosses 3, then 6, then the end
        cp.step_done(rnd, done[0])
    assert seen == [4, 6, 8]


def test_no_checkpoint_without_every_unless_resumed_and_a_failed_write_keeps_the_tag():
    calls: list[int] = []
    cp = Checkpoints(every=0, planned=4, write=lambda: calls.append(1) is None and False)
    for rnd in range(4):
        cp.step_done(rnd, rnd + 1)
    assert calls == []
    cp.resume(rounds_done=2)  # a resumed run's checkpoint never stays behind its rounds
    assert cp.ckpt_round == 2
    cp.step_done(3, 4)
    assert calls == [1] and cp.ckpt_round == 2  # written? no (no results folder): tag kept


class _Touched:
    def __init__(self) -> None:
        self.cids: list[int] = []

    def touch(self, cids) -> None:
        self.cids += list(cids)


def test_tasks_of_stateful_clients_carry_the_checkpoints_tag():
    store = _Touched()
    every = Checkpoints(every=2, planned=6, write=lambda: True, manifest=store, client_state=True)
    every.step_done(1, 2)  # a checkpoint at 2
    every.step_start = 3
    tasks = [_task(1, 4), _task(2, 5)]
    every.stamp(tasks)
    assert [t.body["ckpt"] for t in tasks] == [2, 2] and store.cids == [4, 5]
    at_step = Checkpoints(every=0, planned=6, write=lambda: True, client_state=True)
    at_step.step_start = 3  # without --checkpoint-every: the step's start (an interrupt's)
    tasks = [_task(3, 1)]
    at_step.stamp(tasks)
    assert tasks[0].body == {"ckpt": 3}
    stateless = Checkpoints(every=2, planned=6, write=lambda: True, manifest=store)
    tasks = [_task(4, 9)]
    stateless.stamp(tasks)
    assert tasks[0].body == {} and store.cids == [4, 5]


# ---- the order of a step's replies ------------------------------------------------------------

def test_a_synchronous_step_releases_each_reply_as_it_comes_and_counts_rows_from_the_ledger():
    ledger = Ledger()
    ledger.record(0, "TASK", "server", "client_1", 10, 90, tensor_bytes=80)
    order = AsArrived()
    order.open(ledger)
    order.sent([_task(1, 1)])
    assert list(order.released()) == []
    r = Result(1, 0, 1)
    order.arrive(r)
    assert list(order.released()) == [r] and list(order.released()) == []
    f = Failure(2, 0, 2, "crash")
    assert order.columns([f], {"stragglers": 0}) == {"failures": 1, "stragglers": 0}
    row = order.row(0)
    assert row.bytes_round == {"server_to_client": 100, "client_to_server": 0,
                               "client_to_client": 0, "tensor_bytes": 80}
    assert row.total == 100 and row.messages == 1 and row.upto == 0 and row.stages == {}


def test_an_ordered_step_counts_its_rows_from_what_it_sent_and_released():
    ledger = Ledger()
    order = Arrivals(lambda t: t.sim_time + 1.0, lambda t: 50)
    order.open(ledger)
    order.sent([_task(1, 1), _task(2, 2)])
    order.arrive(Result(2, 0, 2, sim_time=2.0, nbytes=30))
    assert list(order.released()) == []  # task 1 may still come back at 1.0
    order.arrive(Result(1, 0, 1, sim_time=3.0, nbytes=20))
    assert [r.task_id for r in order.released()] == [2, 1]
    assert order.columns([], {"stragglers": 0, "server_busy_s": 1.0}) == {
        "stragglers": 0, "server_busy_s": 1.0, "moved": 0}
    row = order.row(0)
    assert row.bytes_round == {"server_to_client": 100, "client_to_server": 50,
                               "client_to_client": 0}
    assert row.total == 150 and row.messages == 4 and row.upto is None
    assert order.row(0).bytes_round["server_to_client"] == 0  # since the last row


# ---- the Verdict ends the run through the driver's end ----------------------------------------

def test_the_verdict_ends_the_run_through_the_end_it_was_given():
    ended: list[tuple[RunStatus, str]] = []
    v = Verdict(2, Progress(3, quiet=True), lambda s, why: ended.append((s, why)))
    v.note(0, [Failure(1, 0, 3, "boom")])
    v.count_usable(0, {"results": 0}, 0, 1)
    assert ended == []
    v.count_usable(1, {"results": 0, "round_failed": "secure aggregation failed at stage input: "
                       "1 clients left, 2 needed"}, 0, 1)
    assert ended[0][0] == RunStatus.FAILED and "client 3: boom" in ended[0][1]
    assert "rounds 1-2" in ended[0][1]  # (counted from 1, as the progress lines count)
    assert "the last: secure aggregation failed at stage input" in ended[0][1]
    v.check_finite(2, {"w": np.ones(2, np.float32)}, [], [], 0.5)
    assert len(ended) == 1  # a finite model: nothing
    v.check_finite(2, {"w": np.array([np.nan], np.float32)}, [], [], 0.5)
    assert ended[1][0] == RunStatus.DIVERGED and "NaN/inf" in ended[1][1]


def test_every_round_without_a_usable_result_is_said_with_its_cause():
    out = io.StringIO()
    v = Verdict(0, Progress(4, stream=out), lambda s, why: None)
    v.count_usable(0, {"results": 0, "round_failed": "secure aggregation failed at stage unmask: "
                       "19 clients left, 21 needed"}, 1, 21)
    v.count_usable(1, {"results": 0, "non_finite": 3}, 3, 0)
    v.count_usable(2, {}, 0, 5)
    v.count_usable(3, {"results": 2}, 2, 0)
    lines = out.getvalue().splitlines()
    assert lines == [
        "round 1: no usable result: secure aggregation failed at stage unmask: 19 clients left, "
        "21 needed",
        "round 2: no usable result: 3 of 3 results had NaN/inf values",
        "round 3: no usable result: all 5 tasks failed"]
    assert v.usable_rounds == 1 and [r for r, _ in v.unusable] == [0, 1, 2]


def test_a_run_whose_rounds_mostly_failed_is_no_result():
    v = Verdict(0, Progress(3, quiet=True), lambda s, why: None)
    v.count_usable(0, {"results": 4}, 4, 0)
    v.count_usable(1, {"results": 0, "round_failed": "why 1"}, 0, 4)
    assert v.mostly_failed() is None  # half: still a result
    v.count_usable(2, {"results": 0, "round_failed": "why 2"}, 0, 4)
    status, error = v.mostly_failed()
    assert status == RunStatus.FAILED
    assert error.startswith("2 of 3 rounds had no usable result (the last, round 3: why 2)")
    none = Verdict(0, Progress(3, quiet=True), lambda s, why: None)
    none.count_usable(0, {"results": 0}, 0, 0)
    assert none.mostly_failed()[1].startswith("no round of the run had a usable result")


@pytest.mark.parametrize("reason, traceback", [
    ("ValueError: bad shapes", True), ("RuntimeError: boom", True),
    ("SecAggFailed: no", True), ("offline at 0.1 s (--availability offline:0.2:0.05): during "
                                 "local training", False),
    ("dropped out at stage input (--secagg-drop input:0.1)", False),
    ("straggler: arrived at 3 s", False), ("result refused: its shapes", False)])
def test_the_traceback_hint_only_for_a_failure_an_exception_raised(reason, traceback):
    ended: list[tuple[RunStatus, str]] = []
    v = Verdict(1, Progress(1, quiet=True), lambda s, why: ended.append((s, why)))
    v.log_hint = "its traceback is in this command's log above"
    v.note(0, [Failure(1, 0, 0, reason)])
    v.count_usable(0, {"results": 0}, 0, 1)
    assert ("its traceback" in ended[0][1]) == traceback


# ---- a driver with its defaults ---------------------------------------------------------------

class _Mean(Strategy):
    """The mean of the results' `w` (a toy server half: no model, no data)."""

    def aggregate_round(self, rnd, results, failures):
        if results:
            self.state.model = {"w": np.mean([r.arrays["w"] for r in results], axis=0)}
        return {"results": len(results)}


class _Dispatcher:
    def __init__(self, n: int, failing: set[int]) -> None:
        self.n, self.failing = n, failing

    def alive_clients(self):
        return [ClientInfo(c, 10) for c in range(self.n)]

    def run_round(self, rnd, tasks, follow=None):
        ok = [Result(t.task_id, rnd, t.cid, {"w": np.full(2, t.cid, np.float32)},
                     sim_time=t.sim_time + 1.0) for t in tasks if t.cid not in self.failing]
        bad = [Failure(t.task_id, rnd, t.cid, "crash", t.sim_time + 0.5)
               for t in tasks if t.cid in self.failing]
        return ok, bad


def _driver(cfg) -> RoundDriver:
    algo = _Mean(cfg, None)
    algo.setup({"w": np.zeros(2, np.float32)})
    return RoundDriver(cfg, algo, lambda arrays: (float(arrays["w"].mean()), 0.0), Ledger(),
                       History(None, cfg), Progress(cfg.rounds, quiet=True),
                       arrivals=lambda: Arrivals(lambda t: t.sim_time, lambda t: 0),
                       compute=ClientCompute(cfg, lambda cid: 0))


def test_a_driver_with_its_default_collaborators_runs_and_logs_every_round():
    cfg = small_config(clients=3, rounds=3, latency={"server_profile": "none"})  # (the clients'
    d = _driver(cfg)  # clock only: the server's mean of 2 values costs ~1e-8 s on xeon-core)
    d.run(_Dispatcher(3, failing={2}))
    rows = d.history.rows
    assert d.status == RunStatus.COMPLETED and d.rounds_done == 3
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(r["failures"] == 1 and r["tasks"] == 3 and "online" not in r for r in rows)
    assert rows[-1]["accuracy"] == 0.5 and rows[-1]["sim_s"] == 3.0  # mean of clients 0 and 1
    assert d.marks.logged[:2] == (3, 3.0) and not d.marks.mutating
    assert [f["client"] for f in d.failures] == [2, 2, 2]
    assert not math.isnan(d.clock.wall()) and d.checkpoints.ckpt_round == 0


def test_a_driver_whose_rounds_all_fail_ends_failed_at_max_failed_rounds():
    cfg = small_config(clients=2, rounds=5, net={"max_failed_rounds": 2})
    d = _driver(cfg)
    d.run(_Dispatcher(2, failing={0, 1}))
    assert d.status == RunStatus.FAILED and d.rounds_done == 2
    assert "2 rounds in a row without a usable result" in d.error


def test_a_model_the_server_noise_made_nan_names_the_noise():
    """No client result names DP's noise, but the server's own noise is large: the diverged
    line says the noise, not the learning rate."""
    nan = {"w": np.array([np.nan], np.float32)}
    _, plain = Verdict.diverged(2, nan, [], [], 0.5)
    assert "try a smaller --lr" in plain and plain.startswith("round 3: ")
    _, noisy = Verdict.diverged(2, nan, [], [], 0.5, lambda m: "the DP noise is the likely cause")
    assert "the DP noise is the likely cause" in noisy and "--lr" not in noisy
