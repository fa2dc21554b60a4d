"""The in-process and ZeroMQ runtimes agree exactly: parameters, byte totals, simulated time."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.core.inproc import run_local
from fednet.server.main import run_zmq
from fednet.core.session import Session
from tests.conftest import small_config
from tests.harness import LEDGER_KEYS as KEYS
from tests.harness import final_model as _model
from tests.harness import run_both as _both

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _launch_matches_local(tmp_path, algo, clients, params, net):
    """The run in-process and under ZeroMQ with `net`: both summaries, after checking that the
    ZeroMQ one completed without failures with the same model, bytes and simulated time."""
    over = {"clients": clients, "rounds": 2, "latency": {"preset": "hetero"},
            "algo": {"name": algo, "params": params}}
    a = run_local(small_config(**over, out=str(tmp_path / "local")), quiet=True)
    b = run_zmq(small_config(**over, out=str(tmp_path / "launch"), net=net), quiet=True)
    assert b["status"] == "completed" and not b["failures"]
    ma, mb = _model(tmp_path / "local"), _model(tmp_path / "launch")
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["messages"] == b["messages"]
    assert a["sim_time_s"] == b["sim_time_s"]
    return a, b


def test_local_and_launch_agree_exactly(tmp_path):
    cfg = small_config(clients=4, rounds=3, latency={"preset": "wan"})
    a, b, ma, mb = _both(tmp_path, cfg)
    assert b["status"] == "completed" and b["rounds"] == 3
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["messages"] == b["messages"]
    assert a["sim_time_s"] == b["sim_time_s"] > 0
    assert a["final_accuracy"] == b["final_accuracy"]
    # the clients' own ledgers (sent at BYE) saw exactly what the server saw
    cv = b["bytes_client_view"]
    assert cv["server_to_client"] == b["bytes"]["server_to_client"]
    assert cv["client_to_server"] == b["bytes"]["client_to_server"]
    rows = [json.loads(x) for x in (tmp_path / "launch" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]


def test_synthetic_fedprox_local_and_launch_agree_exactly(tmp_path):
    """A naturally federated dataset: each client process generates its own data from the seed
    and its id, and the server sends only its rows; the same model, bytes and time as local."""
    cfg = small_config(clients=20, rounds=2, data={"dataset": "synthetic-fedprox",
                                                   "partition": "natural"})
    a, b, ma, mb = _both(tmp_path, cfg)
    assert b["status"] == "completed" and not b["failures"] and b["rounds"] == 2
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["messages"] == b["messages"]
    assert a["sim_time_s"] == b["sim_time_s"] and a["final_accuracy"] == b["final_accuracy"]


def _ring(session: Session) -> None:
    """Route all clients through one chain per round (a superclient ring) instead of a star."""
    algo = session.algo
    session.handoffs = True  # the clients listen for hand-offs (WELCOME's `peers`)

    def configure_round(rnd, clients):
        ids = sorted(c.cid for c in clients)
        route = ids[rnd % len(ids):] + ids[:rnd % len(ids)]
        return [algo.new_task(rnd, route, algo.global_arrays, algo.task_body(rnd, clients[0]))]
    algo.configure_round = configure_round


def test_ring_route_hands_off_peer_to_peer_and_matches_local(tmp_path):
    cfg = small_config(clients=3, rounds=2, latency={"preset": "hetero"})
    a, b, ma, mb = _both(tmp_path, cfg, prepare=_ring)
    assert b["status"] == "completed" and not b["failures"]
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["messages"] == b["messages"]
    assert a["sim_time_s"] == pytest.approx(b["sim_time_s"], abs=0)
    model = 4 * 15_466
    # per round: server -> first client, 2 peer hand-offs (+acks), last client -> server
    assert b["bytes"]["client_to_client"] > 2 * 2 * model
    assert b["bytes"]["tensor_bytes"] == 2 * 4 * model
    assert b["bytes"]["server_to_client"] < 2 * (model + 1000)
    # the clients' ledgers: what the holders sent to peers is what the server was told
    assert b["bytes_client_view"]["client_to_client"] == 2 * b["bytes"]["client_to_client"]


def test_fedseq_inter_over_sockets_matches_local(tmp_path):
    """Asynchronous bank slots, peer-to-peer chains and pre-training, over real processes."""
    p = {"min_samples": 400, "max_clients": 3, "superclient_fraction": 0.5, "pretrain_epochs": 1,
         "period": 2}
    cfg = small_config(clients=6, rounds=2, latency={"preset": "hetero"},
                       algo={"name": "fedseq_inter", "params": p})
    a, b, ma, mb = _both(tmp_path, cfg)
    assert b["status"] == "completed" and not b["failures"]
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["messages"] == b["messages"]
    assert b["bytes"]["client_to_client"] > 0
    assert a["sim_time_s"] == b["sim_time_s"]
    assert a["setup"]["groups"] == b["setup"]["groups"]
    # the client compute the server counts, pre-training included: the same in every row
    keys = ("round", "interim", "client_epochs", "samples")
    assert [{k: r.get(k) for k in keys} for r in _rows(tmp_path / "local")] == \
        [{k: r.get(k) for k in keys} for r in _rows(tmp_path / "launch")]
    assert a["compute"] == b["compute"] and a["compute"]["client_epochs"] > 6


@pytest.mark.parametrize("algo, clients, params", [
    ("fedavg", 5, {}),
    ("fedseq_inter", 6, {"min_samples": 400, "max_clients": 3, "superclient_fraction": 0.5,
                         "pretrain_epochs": 1, "period": 2}),
])
def test_max_inflight_bounds_tasks_out_and_changes_no_result(tmp_path, monkeypatch, algo,
                                                             clients, params):
    """--max-inflight 1: one task out at a time (follow-ups queue too); same model, bytes, time."""
    from fednet.server.app import ZmqServer

    most = []
    dispatch = ZmqServer._dispatch

    def counting(self, task):
        dispatch(self, task)
        most.append(len(self.tasks.pending))
    monkeypatch.setattr(ZmqServer, "_dispatch", counting)
    _launch_matches_local(tmp_path, algo, clients, params, {"max_inflight": 1})
    assert max(most) == 1 and len(most) >= clients


@pytest.mark.parametrize("algo, clients, params", [
    ("fedavg", 5, {}),
    ("fedseq_inter", 6, {"min_samples": 400, "max_clients": 3, "superclient_fraction": 0.5,
                         "pretrain_epochs": 1, "period": 2}),
])
def test_several_clients_per_process_match_local(tmp_path, monkeypatch, algo, clients, params):
    """--clients-per-process 3: fewer processes, same wire: model, bytes and time as in-process
    (FedSeqInter's chains hand off between clients of one process and across processes)."""
    from fednet.server.registrar import Registrar

    pids = {}
    on_ready = Registrar.on_ready

    def recording(self, got):  # a process's READY(readys) registers all its clients
        on_ready(self, got)
        pids.update({c: info.pid for c, info in self.srv.clients.items()})
    monkeypatch.setattr(Registrar, "on_ready", recording)
    _, b = _launch_matches_local(tmp_path, algo, clients, params, {"clients_per_process": 3})
    assert len(pids) == clients and len(set(pids.values())) == -(-clients // 3)
    assert pids[0] == pids[1] == pids[2] != pids[3]
    cv = b["bytes_client_view"]  # every logical client still reports its own ledger at BYE
    assert cv["client_to_server"] == b["bytes"]["client_to_server"]


@pytest.mark.parametrize("algo, clients, params", [
    ("fedavg", 6, {}),
    ("fedseq_inter", 6, {"min_samples": 400, "max_clients": 3, "superclient_fraction": 0.5,
                         "pretrain_epochs": 1, "period": 2}),
])
def test_a_process_share_of_tasks_changes_no_result(tmp_path, monkeypatch, algo, clients, params):
    """The big-model rule (server/inflight.py), forced onto digits with a share of 1 task per
    process of 3 clients: never two tasks out to one process; model, bytes and time as
    in-process."""
    from fednet.server import inflight
    from fednet.server.app import ZmqServer

    monkeypatch.setattr(inflight, "BIG_MODEL_BYTES", 0)
    monkeypatch.setattr(inflight, "PROCESS_CAP", 1)
    most = []
    dispatch = ZmqServer._dispatch

    def counting(self, task):
        dispatch(self, task)
        out = [self._process_of(t.cid) for t in self.tasks.pending.values()]
        assert all(isinstance(p, tuple) for p in out)  # (host, pid) from the hellos
        most.append((max(out.count(p) for p in out), len(out)))
    monkeypatch.setattr(ZmqServer, "_dispatch", counting)
    a, b = _launch_matches_local(tmp_path, algo, clients, params, {"clients_per_process": 3})
    assert b["tasks_per_process"] == 1 and "tasks_per_process" not in a
    assert max(m for m, _ in most) == 1 and max(n for _, n in most) <= 2  # 2 processes
    assert len(most) >= clients


@pytest.mark.parametrize("compress", ["fp16", "int8", "qsgd:16", "topk:0.01", "sign"])
@pytest.mark.parametrize("algo,clients_per_process", [("fedavg", 2), ("scaffold", 2)])
def test_compressed_results_agree_exactly_under_launch(tmp_path, compress, algo,
                                                       clients_per_process):
    """--compress: the model, the bytes (the encoded arrays on the wire) and the simulated time
    of `fednet launch` equal `fednet local`'s, with QSGD's seeded rounding and the clients'
    error-feedback residuals kept in the store between tasks (2 clients per process)."""
    over = {"clients": 4, "rounds": 2, "latency": {"preset": "hetero"}, "algo": {"name": algo}}
    a, b = _agree(tmp_path, over, {"compress": compress},
                  {"clients_per_process": clients_per_process})
    assert not b["failures"]
    dense = run_local(small_config(**over, out=str(tmp_path / "dense")), quiet=True)
    assert a["bytes"]["client_to_server"] < 0.52 * dense["bytes"]["client_to_server"]


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _agree(tmp_path, over, net, launch_net=None):
    """The run of `over` with `net` in-process and (with `launch_net` added) under ZeroMQ: both
    complete, with the same model, byte totals and simulated time; (local, launch) summaries."""
    a = run_local(small_config(**over, net=net, out=str(tmp_path / "local")), quiet=True)
    b = run_zmq(small_config(**over, net={**net, **(launch_net or {})},
                             out=str(tmp_path / "launch")), quiet=True)
    assert a["status"] == b["status"] == "completed"
    ma, mb = _model(tmp_path / "local"), _model(tmp_path / "launch")
    assert all(np.array_equal(ma[k], mb[k]) for k in ma)
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["messages"] == b["messages"]
    assert a["sim_time_s"] == b["sim_time_s"]
    return a, b


@pytest.mark.parametrize("algo,params", [
    ("fedbuff", {"concurrency": 5, "buffer": 3}),
    ("fedasync", {"concurrency": 4, "buffer": 3, "staleness": "hinge", "b": 1})])
@pytest.mark.parametrize("latency", [
    {"preset": "hetero"},
    {"preset": "wan", "availability": "offline:0.3:0.2", "deadline": 0.8,
     "server_bandwidth": "50Mbit"}])
def test_asynchronous_runs_agree_exactly_under_launch(tmp_path, algo, params, latency):
    """FedAsync and FedBuff release replies in simulated-time order (core/arrivals.py), so the
    launch run, whose processes race, gives local's model, bytes, times and every row's
    accuracy, staleness and bytes; also with clients going offline, stragglers past a deadline
    and a shared server link (2 clients per process)."""
    over = {"clients": 8, "rounds": 5, "latency": latency, "algo": {"name": algo,
                                                                    "params": params}}
    a, b = _agree(tmp_path, over, {}, {"clients_per_process": 2})
    assert a["sim_time_s"] > 0
    keys = ("round", "accuracy", "sim_s", "bytes_total", "bytes_round", "staleness_mean",
            "staleness_max", "results", "failures", "client_epochs", "samples",
            "client_compute_s")
    ra, rb = _rows(tmp_path / "local"), _rows(tmp_path / "launch")
    assert [r["round"] for r in ra] == list(range(5))
    assert [{k: r.get(k) for k in keys} for r in ra] == [{k: r.get(k) for k in keys} for r in rb]
    assert [f["task"] for f in a["failures"]] == [f["task"] for f in b["failures"]]


@pytest.mark.parametrize("algo,net", [
    ("fedavg", {"compress_down": "int8"}),
    ("scaffold", {"compress_down": "fp16", "compress": "topk:0.05"}),
    ("fedbuff", {"compress_down": "qsgd:127"})])
def test_compressed_tasks_agree_exactly_under_launch(tmp_path, algo, net):
    """--compress-down: the encoded tasks on the wire, the models the clients rebuild (QSGD's
    seeded rounding) and what the server aggregates against are the same in both runtimes."""
    over = {"clients": 4, "rounds": 3, "latency": {"preset": "hetero"}, "algo": {"name": algo}}
    a, b = _agree(tmp_path, over, net, {"clients_per_process": 2})
    assert not b["failures"]
    dense = run_local(small_config(**over, out=str(tmp_path / "dense")), quiet=True)
    assert a["bytes"]["server_to_client"] < 0.52 * dense["bytes"]["server_to_client"]


@pytest.mark.parametrize("algo,net", [
    ("fedseq", {"compress_handoff": "qsgd:127", "compress_down": "int8"}),
    ("fedseq_inter", {"compress_handoff": "fp16"})])
def test_compressed_hand_offs_agree_exactly_under_launch(tmp_path, algo, net):
    """--compress-handoff: a chain's peer-to-peer models travel encoded (QSGD's rounding seeded
    by task and hop), each peer decodes what it received and trains from it; the model, the
    bytes on every link and the simulated time equal fednet local's."""
    p = {"min_samples": 400, "max_clients": 3, "superclient_fraction": 0.5, "pretrain_epochs": 1}
    if algo == "fedseq_inter":
        p["period"] = 2
    over = {"clients": 6, "rounds": 2, "latency": {"preset": "hetero"},
            "algo": {"name": algo, "params": p}}
    a, b = _agree(tmp_path, over, net)
    assert not b["failures"]
    dense = run_local(small_config(**over, out=str(tmp_path / "dense")), quiet=True)
    assert 0 < a["bytes"]["client_to_client"] < 0.52 * dense["bytes"]["client_to_client"]


@pytest.mark.parametrize("dp", [
    {"mode": "central", "noise": 0.3, "clip": 1.0, "adaptive": True, "count_noise": 1.0},
    {"mode": "central", "epsilon": 50.0, "clip": 1.0, "sampling": "fixed"},
    {"mode": "local", "noise": 0.05, "clip": 2.0},
    {"sgd_noise": 1.0, "sgd_clip": 1.0}],
    ids=["central-adaptive", "central-fixed-calibrated", "local", "dp-sgd"])
def test_differential_privacy_agrees_exactly_under_launch(tmp_path, dp):
    """The noise (the server's, the clients' own, DP-SGD's in every step), the sampled cohorts,
    the calibrated noise multiplier and epsilon are the same in both runtimes
    (docs/algorithms.md §11.6)."""
    pytest.importorskip("dp_accounting")
    if dp.get("sgd_noise"):
        pytest.importorskip("opacus")
    cfg = small_config(clients=6, rounds=3, algo={"fraction": 0.5}, dp=dp)
    a, b, ma, mb = _both(tmp_path, cfg)
    assert b["status"] == "completed" and not b["failures"]
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["sim_time_s"] == b["sim_time_s"] and a["dp"] == b["dp"]
    rows = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
            for d in ("local", "launch")]
    for key in ("epsilon", "dp_sgd_epsilon", "dp_clip", "dp_cohort"):
        assert [r.get(key) for r in rows[0]] == [r.get(key) for r in rows[1]], key
