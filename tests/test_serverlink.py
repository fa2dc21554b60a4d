"""The server's shared link (max-min fair fluid sharing), deadlines and over-selection: completion
times checked against hand computations, then through whole fednet local runs."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fednet.errors import ConfigError
from fednet.core.evaluate import Evaluator
from fednet.core.inproc import run_local
from fednet.metrics.report import summary_rows
from fednet.network.deadline import Cutoff
from fednet.network.serverlink import Flow, busy_seconds, fair_rates, share
from fednet.cli.options_extra import overrides
from fednet.algorithms.checks import validate
from fednet.types import Result
from tests.conftest import small_config

INF = float("inf")


def test_water_filling_gives_capped_flows_their_cap_and_splits_the_rest():
    assert fair_rates([10, 20, INF, INF], 120) == [10, 20, 45, 45]
    assert fair_rates([INF] * 4, 100) == [25] * 4
    assert fair_rates([5, 5], 100) == [5, 5]  # the link is not the bottleneck


def test_k_clients_download_n_bytes_through_a_shared_link_with_client_caps():
    """k = 4 flows of n bytes from t = 0, link R = 120 B/s, caps 10, 20, inf, inf: max-min
    fairness gives the capped flows their caps for their whole transfer (n/10 = 12 s, n/20 = 6 s)
    and the two others (R - 30)/2 = 45 B/s each: n/45 s."""
    n = 120.0
    done, busy = share([Flow(0, n, 10), Flow(0, n, 20), Flow(0, n), Flow(0, n)], 120)
    assert done == pytest.approx([12.0, 6.0, n / 45, n / 45], rel=1e-12)
    assert busy == [(0.0, pytest.approx(12.0))]


def test_unequal_sizes_release_capacity_to_the_others():
    """Sizes 1, 2, 3 B at R = 12 B/s: 4 B/s each until the first is done (0.25 s), then 6 B/s
    each (the second needs 1 more byte: +1/6 s), then the last alone at 12 B/s (+1/12 s)."""
    done, _ = share([Flow(0, 1), Flow(0, 2), Flow(0, 3)], 12)
    assert done == pytest.approx([0.25, 0.25 + 1 / 6, 0.5], rel=1e-12)


def test_a_late_flow_joins_and_idle_gaps_are_not_busy():
    """A: 10 B from 0, B: 10 B from 0.5 s, R = 10 B/s: A alone sends 5 B, then 5 B/s each: A
    done at 1.5 s, B has 5 B left, alone: 2.0 s. C from 5 s: busy 0-2 and 5-6."""
    done, spans = share([Flow(0, 10), Flow(0.5, 10), Flow(5, 10)], 10)
    assert done == pytest.approx([1.5, 2.0, 6.0], rel=1e-12)
    assert busy_seconds(spans) == pytest.approx(3.0)


def test_an_unlimited_link_charges_each_flow_its_own_rate():
    done, spans = share([Flow(1, 100, 50), Flow(0, 0, 50)], INF)
    assert done == [3.0, 0.0] and busy_seconds(spans) == 2.0


def _res(cid, t, rnd=0):
    return Result(cid, rnd, cid, sim_time=t)


def test_deadline_and_over_selection_keep_the_first_arrivals():
    rs = [_res(0, 5.0), _res(1, 2.0), _res(2, 9.0), _res(3, 3.0)]
    kept, late, end = Cutoff(0.0, 0, deadline=6.0).close(rs)
    assert [r.cid for r in kept] == [1, 3, 0] and [r.cid for r in late] == [2] and end == 6.0
    kept, late, end = Cutoff(0.0, 0, target=2).close(rs)  # target reached: closes at its arrival
    assert [r.cid for r in kept] == [1, 3] and [r.cid for r in late] == [0, 2] and end == 3.0
    kept, late, end = Cutoff(1.0, 0, deadline=3.5, target=3).close(rs)  # 2 on time by 4.5
    assert [r.cid for r in kept] == [1, 3] and end == 4.5
    # a FedSeqInter step of 2 rounds from t = 1: round 1's results are due at 1 + 2 x 3
    assert Cutoff(1.0, 0, deadline=3.0).due(1) == 7.0


@pytest.mark.parametrize("over, why", [
    ({"latency.deadline": -1.0}, "--deadline"), ({"latency.deadline": float("nan")}, "--deadline"),
    ({"latency.over_select": 0.5}, "--over-select"),
    ({"latency.over_select": 1.5, "algo.name": "fedseq_inter"}, "--over-select"),
])
def test_bad_values_are_one_line_errors_naming_the_option(over, why):
    with pytest.raises(ConfigError, match=why):
        validate(small_config().replace(**over))


def test_server_bandwidth_takes_rates_with_units():
    assert overrides({"server_bandwidth": "100Mbit"}, {})["latency.server_bandwidth"] == 12.5e6
    assert overrides({"server_bandwidth": "unlimited"}, {})["latency.server_bandwidth"] == 0.0
    with pytest.raises(ConfigError, match="--server-bandwidth"):
        overrides({"server_bandwidth": "10mbps"}, {})


def _trace(tmp_path, rows):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps([{"compute_s_per_sample": 0, "rtt_s": 0.01, "up_bps": u,
                              "down_bps": d} for u, d in rows]))
    return str(p)


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_fedavg_round_through_the_shared_link_takes_the_fluid_time(tmp_path):
    """4 clients, no compute, rtt 10 ms; client 0 capped at R/8 both ways, the others not.
    Downloads: client 0 at R/8 (8 n_d / R), the others at 7R/24. Uploads: the three others are
    done by 24 n_d/(7R) + 3 n_u / R < 8 n_d / R, when client 0 starts alone at R/8. So the round
    takes 8 (n_d + n_u) / R + rtt, and the link is busy all of 8 (n_d + n_u) / R."""
    rate = 2e6
    cfg = small_config(clients=4, rounds=1, latency={
        "file": _trace(tmp_path, [(rate / 8, rate / 8)] + [(0, 0)] * 3),
        "server_bandwidth": rate, "server_profile": "none"})  # (the link's time alone)
    s = run_local(cfg.replace(out=str(tmp_path / "a")), quiet=True)
    row = _rows(tmp_path / "a")[0]
    down, up = row["bytes_round"]["server_to_client"], row["bytes_round"]["client_to_server"]
    assert down % 4 == 0 and up % 4 == 0  # same-size messages: n_d, n_u per client
    n_d, n_u = down / 4, up / 4
    assert s["sim_time_s"] == pytest.approx(8 * (n_d + n_u) / rate + 0.01, rel=1e-9)
    assert row["server_busy_s"] == pytest.approx(8 * (n_d + n_u) / rate, rel=1e-9)
    assert s["server_link"] == {"rate_Bps": rate, "busy_s": row["server_busy_s"]}
    shown = dict(summary_rows(s))  # fednet report
    assert shown["server link busy"].endswith("at 16 Mbit/s") and shown["stragglers"] == "0"
    # unlimited: client 0 alone sets the time, at its own cap; the same model either way
    u = run_local(cfg.replace(out=str(tmp_path / "u"), **{"latency.server_bandwidth": 0.0}),
                  quiet=True)
    assert u["sim_time_s"] == pytest.approx(8 * (n_d + n_u) / rate + 0.01, rel=1e-9)
    assert "server_link" not in u
    assert u["final_accuracy"] == s["final_accuracy"]


def test_a_deadline_drops_late_results_and_over_selection_keeps_the_first(tmp_path):
    """Client 0's link is 8x slower: with a deadline between the others' arrival and its own,
    its result is a straggler (bytes still counted), and the round closes at the deadline."""
    rate = 2e6
    trace = _trace(tmp_path, [(rate / 8, rate / 8)] + [(rate, rate)] * 3)
    cfg = small_config(clients=4, rounds=2, latency={"file": trace, "server_profile": "none"})
    full = run_local(cfg.replace(out=str(tmp_path / "f")), quiet=True)
    r0 = _rows(tmp_path / "f")[0]
    slow = full["sim_time_s"] / 2  # both rounds take client 0's time
    fast = (r0["bytes_round"]["server_to_client"] + r0["bytes_round"]["client_to_server"]) \
        / 4 / rate + 0.01
    dl = (slow + fast) / 2
    s = run_local(cfg.replace(out=str(tmp_path / "d"), **{"latency.deadline": dl}), quiet=True)
    rows = _rows(tmp_path / "d")
    assert [r["stragglers"] for r in rows] == [1, 1] and s["stragglers"] == 2
    assert [r["results"] for r in rows] == [3, 3] and [r["tasks"] for r in rows] == [4, 4]
    assert s["sim_time_s"] == pytest.approx(2 * dl, rel=1e-12)
    assert s["bytes"] == full["bytes"]  # late bytes are still received and counted
    assert s["final_accuracy"] != full["final_accuracy"]  # the straggler was not aggregated
    # over-selection: fraction 0.5 -> target 2, 1.5 x 2 = 3 selected, the first 2 kept
    o = run_local(cfg.replace(out=str(tmp_path / "o"), **{"latency.over_select": 1.5,
                                                          "algo.fraction": 0.5}), quiet=True)
    rows = _rows(tmp_path / "o")
    assert [r["tasks"] for r in rows] == [3, 3] and [r["results"] for r in rows] == [2, 2]
    assert all(r["stragglers"] == 1 for r in rows)
    assert math.isfinite(o["sim_time_s"]) and o["sim_time_s"] <= s["sim_time_s"]


def test_fedseq_inter_slots_that_miss_every_deadline_keep_the_server_model(tmp_path):
    """A deadline nothing can meet: every ring result of the 2-round period is a straggler; each
    slot keeps its copy of the server model and starts its next superclient at the deadline, so
    the period ends exactly 2 deadlines after the setup stage and the model does not move."""
    dl = 1e-4
    p = {"min_samples": 400, "max_clients": 3, "superclient_fraction": 0.5, "pretrain_epochs": 1,
         "period": 2}
    cfg = small_config(clients=6, rounds=2, algo={"name": "fedseq_inter", "params": p},
                       latency={"deadline": dl})
    s = run_local(cfg.replace(out=str(tmp_path / "i")), quiet=True)
    rows = [r for r in _rows(tmp_path / "i") if not r.get("interim")]
    slots = rows[0]["tasks"] // 2
    assert slots >= 1 and s["stragglers"] == rows[0]["stragglers"] == 2 * slots
    assert rows[0]["results"] == 0
    assert s["sim_time_s"] == pytest.approx(s["setup"]["sim_s"] + 2 * dl, rel=1e-12)
    with np.load(tmp_path / "i" / "final_model.npz", allow_pickle=False) as z:
        final = {k: z[k] for k in z.files}
    init = Evaluator(cfg).initial
    assert set(final) == set(init) and all(np.array_equal(final[k], init[k]) for k in init)
