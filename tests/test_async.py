"""FedAsync and FedBuff (docs/algorithms.md §3.12): replies released in simulated-time order
whatever order they come in, the update rules on toy numbers, and an analytic clock."""
from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest

from fednet import algorithms
from fednet.algorithms.asynchronous import staleness_weight
from fednet.core.arrivals import Arrivals
from fednet.core.session import Session
from fednet.core.inproc import run_local
from fednet.algorithms.asynchronous import buffer_ops, fold_ops
from fednet.types import Failure, Result, Task
from tests.conftest import small_config


def _task(tid: int, cid: int, start: float) -> Task:
    return Task(task_id=tid, round=0, route=[cid], sim_time=start)


def _drain(order: Arrivals, replies: list[Result | Failure]) -> list[tuple[float, int]]:
    out = []
    for r in replies:
        order.arrive(r)
        while (ready := order.next()) is not None:
            out.append((ready.sim_time, ready.task_id))
    return out


def test_replies_are_released_in_simulated_time_order_whatever_order_they_come_in():
    bounds = {t: 0.5 * t for t in range(1, 9)}  # task t cannot return before 0.5 t
    times = {1: 3.0, 2: 1.5, 3: 2.0, 4: 2.0, 5: 9.0, 6: 3.5, 7: 3.6, 8: 4.0}
    seen = set()
    for seed in range(20):
        order = Arrivals(lambda t: bounds[t.task_id], lambda t: 100)
        order.sent([_task(t, t, 0.0) for t in times])
        replies = [Result(t, 0, t, sim_time=s, nbytes=10) for t, s in times.items()]
        random.Random(seed).shuffle(replies)
        got = _drain(order, replies)
        seen.add(tuple(got))
        assert order.waiting() == 0 and order.back_bytes == 80 and order.sent_bytes == 800
    assert seen == {((1.5, 2), (2.0, 3), (2.0, 4), (3.0, 1), (3.5, 6), (3.6, 7), (4.0, 8),
                     (9.0, 5))}  # ties by task id


def test_a_reply_is_held_while_a_task_out_could_still_come_first():
    order = Arrivals(lambda t: {1: 1.0, 2: 2.5}[t.task_id], lambda t: 0)
    order.sent([_task(1, 0, 0.0), _task(2, 1, 0.0)])
    order.arrive(Result(1, 0, 0, sim_time=3.0))  # task 2 may still return at 2.5
    assert order.next() is None
    order.arrive(Result(2, 0, 1, sim_time=2.6))
    assert [order.next().task_id, order.next().task_id] == [2, 1]


def test_a_reply_stamped_before_its_bound_is_moved_to_it_and_a_late_one_is_a_straggler():
    order = Arrivals(lambda t: 2.0, lambda t: 0, deadline=5.0)
    order.sent([_task(1, 0, 1.0), _task(2, 1, 1.0)])
    early = _drain(order, [Failure(1, 0, 0, "offline", sim_time=1.2)])
    assert early == [(2.0, 1)] and order.moved == 1  # at its bound; task 2's (2.0, id 2) after
    late = Result(2, 0, 1, sim_time=7.5)
    assert _drain(order, [late]) == [(6.0, 2)]  # the straggler fails at its start + 5
    assert order.stragglers == 1


@pytest.mark.parametrize("kind,tau,want", [("constant", 7, 1.0), ("polynomial", 3, 0.5),
                                           ("hinge", 2, 1.0), ("hinge", 4, 1 / 2)])
def test_staleness_weights(kind, tau, want):
    assert staleness_weight(kind, tau, a=0.5, b=2) == pytest.approx(want)


def _strategy(name: str, **params):
    cfg = small_config(algo={"name": name, "params": params})
    s = algorithms.build(cfg)
    s.setup({"w": np.array([1.0, 2.0], np.float32), "n": np.array([3], np.int64)})
    return s


def test_fedbuff_steps_by_the_mean_of_k_staleness_weighted_updates():
    s = _strategy("fedbuff", buffer=2, server_lr=0.5, staleness="polynomial", a=1.0)
    x0 = s.state.model
    s.use(Result(1, 0, 0, {"w": np.array([0.0, 0.0], np.float32), "n": np.array([5])}), 0, x0)
    s.use(Result(2, 0, 1, {"w": np.array([3.0, 4.0], np.float32), "n": np.array([6])}), 1, x0)
    s.finish_round()
    # buffer: 1 * ([1, 2] - [0, 0]) + 1/2 * ([1, 2] - [3, 4]) = [0, 1]; x - 0.5 * [0, 1] / 2
    assert s.state.model["w"].tolist() == [1.0, 1.75] and s.state.model["w"].dtype == np.float32
    assert s.state.model["n"].tolist() == [6]  # integer buffers: the latest reply's
    assert s.updates == 1


def test_fedasync_mixes_each_reply_in_with_its_staleness_weight():
    s = _strategy("fedasync", alpha=0.5, staleness="hinge", a=1.0, b=0)
    x0 = s.state.model
    s.use(Result(1, 0, 0, {"w": np.array([3.0, 0.0], np.float32), "n": np.array([4])}), 1, x0)
    # alpha s(1) = 0.5 / (1 * (1 - 0) + 1) = 0.25: 0.75 x + 0.25 y
    assert s.state.model["w"].tolist() == [1.5, 1.5] and s.updates == 1


def _trace(path, rates: list[float]) -> str:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["client", "compute_s_per_sample", "rtt_s", "up_bps", "down_bps"])
        for cid, r in enumerate(rates):
            w.writerow([cid, repr(r), 0, 0, 0])
    return str(path)


def test_fedbuff_rows_follow_the_analytic_clock(tmp_path):
    """Two clients training 1 s and 2.5 s, K = 1, C = 2: updates at 1 (client 0, staleness 0),
    2 (client 0, 0), 2.5 (client 1, 2) and 3 (client 0, 1). At 2.5 one reply is still needed
    and one task is out, so client 1 is not started again: nothing is wasted, the run ends at 3.
    (The server computes for free here: --server-profile none.)"""
    over = {"clients": 2, "rounds": 4, "data": {"partition": "iid"},
            "algo": {"name": "fedbuff", "params": {"buffer": 1, "concurrency": 2}}}
    sizes = [len(p) for p in Session(small_config(**over), quiet=True, write=False).parts]
    lat = _trace(tmp_path / "lat.csv", [1.0 / sizes[0], 2.5 / sizes[1]])  # epochs = 1
    cfg = small_config(**over, latency={"preset": "lan", "file": lat, "server_profile": "none"},
                       out=str(tmp_path / "run"))
    summary = run_local(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert [r["sim_s"] for r in rows] == pytest.approx([1.0, 2.0, 2.5, 3.0])
    assert [r["staleness_max"] for r in rows] == [0, 0, 2, 1]
    assert summary["sim_time_s"] == pytest.approx(3.0) and rows[-1]["unused"] == 0
    assert summary["status"] == "completed" and rows[-1]["moved"] == 0
    assert sum(r["results"] for r in rows) == 4 and rows[-1]["tasks"] == 4
    assert sum(r["bytes_round"]["client_to_server"] for r in rows) == summary["bytes"][
        "client_to_server"]


@pytest.mark.parametrize("name", ["fedbuff", "fedasync"])
def test_the_server_s_work_is_on_the_clock_and_queues(tmp_path, name):
    """The same two clients (1 s and 2.5 s, K = 1, C = 2) with a server whose update takes 0.4 s
    (FedBuff's step over a buffer of one, FedAsync's mix: the stream rate set from the model's
    size): client 0's reply at 1 is used by 1.4, when its next task leaves (back at 2.4); that
    one's update ends at 2.8; client 1's reply at 2.5 waits for the server, its update ends at
    3.2 (one processor: the work queues); client 0's third task left at 2.8 and is back at 3.8,
    the run ends at 4.2. server_compute_s counts 0.4 s an update, and the last row's sim_split
    server_s is the last update's wait for the server."""
    over = {"clients": 2, "rounds": 4, "data": {"partition": "iid"},
            "algo": {"name": name, "params": {"buffer": 1, "concurrency": 2}}}
    session = Session(small_config(**over), quiet=True, write=False)
    sizes = [len(p) for p in session.parts]
    d = sum(int(a.size) for a in session.algo.state.model.values() if a.dtype.kind == "f")
    work = (buffer_ops(1, d) if name == "fedbuff" else fold_ops(d))["stream"]
    (tmp_path / "server.json").write_text(json.dumps({"stream_per_s": work / 0.4}))
    lat = _trace(tmp_path / "lat.csv", [1.0 / sizes[0], 2.5 / sizes[1]])  # epochs = 1
    cfg = small_config(**over, latency={"preset": "lan", "file": lat,
                                        "server_profile": str(tmp_path / "server.json")},
                       out=str(tmp_path / "run"))
    summary = run_local(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sim_s"] for r in rows] == pytest.approx([1.4, 2.8, 3.2, 4.2])
    assert [r["server_compute_s"] for r in rows] == pytest.approx([0.4, 0.8, 1.2, 1.6])
    assert [r["staleness_max"] for r in rows] == [0, 0, 2, 1]
    assert rows[-1]["sim_split"]["server_s"] == pytest.approx(0.4)
    assert summary["sim_time_s"] == pytest.approx(4.2) and summary["status"] == "completed"


def test_the_asynchronous_server_s_work_is_counted_as_fednet_does_it():
    """FedAsync's mix: two products and a sum a value, and the staleness weight; FedBuff's step
    over K updates: each one's weighted difference summed (3 K d, K weights), then
    x - eta * sum / K (3 d)."""
    assert fold_ops(10) == {"stream": 31}
    assert buffer_ops(4, 10) == {"stream": 3 * 4 * 10 + 3 * 10 + 4}
    assert fold_ops(0) == {} and buffer_ops(0, 10) == {}


def test_a_step_whose_tasks_keep_failing_ends_short_and_says_so(tmp_path, monkeypatch):
    """Every task fails: the step stops starting tasks after its failure budget, the run ends
    (failed: no usable result) instead of looping, and its last row says how many rounds it
    missed."""
    from fednet.algorithms import fedavg

    def boom(self, ctx, task):
        raise RuntimeError("no data here")
    monkeypatch.setattr(fedavg.FedAvgClient, "run", boom)
    cfg = small_config(clients=3, rounds=2, algo={"name": "fedbuff", "params": {"buffer": 1}},
                       out=str(tmp_path / "run"))
    s = run_local(cfg, quiet=True)
    assert s["status"] == "failed" and "no data here" in s["error"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rounds_missed"] == 2 and rows[-1]["results"] == 0
    assert len(s["failures"]) > 10 * 2 * 1  # the budget: 10 failures per reply the step needs


@pytest.mark.parametrize("name", ["fedasync", "fedbuff"])
def test_the_servers_encoding_of_a_follow_up_task_occupies_its_queue(tmp_path, monkeypatch, name):
    """--compress-down on an asynchronous server (issue 52's follow-up): the encoding of a
    follow-up task's model (ServerClock.before) is the server's work as its folds and steps are;
    the one processor does one piece at a time, so no reply's work starts before an encoding
    that began earlier has ended (the old code let the next reply's start at the model's time,
    inside the encoding). A server slow at encoding (about 0.02 s a model here, where a task
    takes about 0.005 s) makes replies arrive during one."""
    from fednet.algorithms import asynchronous
    from fednet.core import server_clock
    from fednet.metrics import plots
    monkeypatch.setattr(plots, "plot_run", lambda *a, **k: None)
    spans: list[tuple[float, float, str]] = []
    charge, before = asynchronous.Asynchronous.charge, server_clock.ServerClock.before

    def spy_charge(self, work):
        start = max(self.at, self.server_free)
        charge(self, work)
        spans.append((start, self.server_free, "reply"))

    def spy_before(self, tasks, work):
        at = min((t.sim_time for t in tasks), default=0.0)
        s = before(self, tasks, work)
        if s > 0:
            spans.append((at, at + s, "encode"))
        return s
    monkeypatch.setattr(asynchronous.Asynchronous, "charge", spy_charge)
    monkeypatch.setattr(server_clock.ServerClock, "before", spy_before)
    over = {"clients": 6, "rounds": 10, "train": {"model": "mclr"},
            "algo": {"name": name, "params": {"buffer": 1, "concurrency": 3}}}
    d = sum(int(a.size) for a in Session(small_config(**over), quiet=True, write=False)
            .algo.state.model.values() if a.dtype.kind == "f")
    (tmp_path / "server.json").write_text(json.dumps({"code_per_s": 40 * d / 0.05,
                                                      "stream_per_s": 1e12}))
    cfg = small_config(**over, net={"compress_down": "fp16"}, out=str(tmp_path / "run"),
                       latency={"server_profile": str(tmp_path / "server.json")})
    assert run_local(cfg, quiet=True)["status"] == "completed"
    kinds = {k for _, _, k in spans}
    assert kinds == {"reply", "encode"} and sum(k == "encode" for _, _, k in spans) > 3
    spans.sort()
    for (a0, a1, ka), (b0, _, kb) in zip(spans, spans[1:]):
        assert b0 >= a1 - 1e-9, f"{kb} work at {b0} starts inside {ka} work {a0}-{a1}"
