"""--availability under both runtimes: fednet local and the ZeroMQ runtime (client processes
forked as under fednet launch) select the same clients, fail the same tasks at the same simulated
moments, skip the same offline peers and end with the same model, bytes and simulated time. The
trace file is removed once the server has read it: the clients get it in WELCOME."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from fednet.core.inproc import run_local
from fednet.server.main import run_zmq
from tests.conftest import small_config
from tests.harness import DIGITS_MODEL_BYTES as MODEL, hetero_at_1ms, spans_csv
from tests.harness import ring as make_ring
from tests.harness import LEDGER_KEYS as KEYS
from tests.harness import final_model as _model

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _both(tmp_path, cfg, ring=False, trace=None):
    def prepare(session):
        if ring:
            make_ring(session)
        if trace and os.path.exists(trace):
            os.remove(trace)  # read by the session; the clients must not need it

    a = run_local(cfg.replace(out=str(tmp_path / "local")), quiet=True, prepare=prepare)
    if trace:
        spans_csv(tmp_path, SPANS[trace_key(cfg)])
    b = run_zmq(cfg.replace(out=str(tmp_path / "launch")), quiet=True, prepare=prepare)
    ma, mb = _model(tmp_path / "local"), _model(tmp_path / "launch")
    assert ma.keys() == mb.keys() and all(np.array_equal(ma[k], mb[k]) for k in ma)
    assert {k: a["bytes"][k] for k in KEYS} == {k: b["bytes"][k] for k in KEYS}
    assert a["messages"] == b["messages"]
    assert a["sim_time_s"] == b["sim_time_s"] > 0
    assert a["failures"] == b["failures"] and a["availability"] == b["availability"]
    assert a["status"] == b["status"]
    return a, b


INF = math.inf
SPANS = {
    "fedavg": [[(0, INF)], [(0, 0.05), (2.5, INF)], [(1.0, INF)], [(0, 3.0), (6.0, INF)]],
    "ring": [[(0, INF)], [(0, 0.01), (3.0, INF)], [(0, INF)], [(0, 0.02), (5.0, INF)]],
}


def trace_key(cfg):
    return "ring" if cfg.clients == 4 and cfg.rounds == 3 else "fedavg"


def test_fedavg_selection_and_offline_failures_agree(tmp_path):
    p = spans_csv(tmp_path, SPANS["fedavg"])
    cfg = small_config(clients=4, rounds=4, latency={"preset": "", "availability": p,
                                                     "file": hetero_at_1ms(tmp_path, 4)})
    a, b = _both(tmp_path, cfg, trace=p)
    assert b["status"] == "completed"
    assert any(f["client"] == 1 and f["round"] == 0 and "offline at 0.05 s" in f["reason"]
               for f in b["failures"])
    assert b["availability"]["offline_failures"] >= 1


def test_ring_skips_offline_peers_the_same_way(tmp_path):
    p = spans_csv(tmp_path, SPANS["ring"])
    cfg = small_config(clients=4, rounds=3, latency={"preset": "hetero", "availability": p})
    a, b = _both(tmp_path, cfg, ring=True, trace=p)
    assert b["status"] == "completed" and not b["failures"]
    assert b["availability"]["skipped_peers"] >= 2
    assert b["availability"]["skipped_by_round"]["0"] == 2  # clients 1 and 3 in round 0
    # round 0: server -> 0, one hand-off 0 -> 2, 2 -> server (1 and 3 skipped: no hand-off)
    rows = [r for r in (tmp_path / "launch" / "metrics.jsonl").read_text().splitlines()]
    import json
    r0 = json.loads(rows[0])
    assert r0["bytes_round"]["tensor_bytes"] == 3 * MODEL and r0["skipped_peers"] == 2


def test_fedseq_inter_under_a_churn_preset_agrees(tmp_path):
    p = {"min_samples": 400, "max_clients": 3, "superclient_fraction": 0.5, "pretrain_epochs": 1,
         "period": 2}
    cfg = small_config(clients=6, rounds=4, algo={"name": "fedseq_inter", "params": p},
                       latency={"preset": "", "availability": "offline:0.3:0.5",
                                "file": hetero_at_1ms(tmp_path, 6)})
    a, b = _both(tmp_path, cfg)
    assert b["status"] == "completed"
    churned = b["availability"]["skipped_peers"] + b["availability"]["offline_failures"]
    assert churned > 0
