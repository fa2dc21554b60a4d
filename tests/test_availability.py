"""Client availability (--availability): the trace reader, the presets, and what a run does with
them in-process: selection among online clients, failures at the moment a client goes offline,
rings that skip offline peers, rounds that wait for a client to come online."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fednet.errors import ConfigError
from fednet.core.inproc import run_local
from fednet.network import availability as av
from fednet.network.availability_trace import read_trace
from fednet.network.churn import Churn, next_online_hop
from fednet.types import ClientInfo, Failure, Result
from tests.conftest import small_config
from tests.harness import DIGITS_MODEL_BYTES as MODEL, hetero_at_1ms, ring, spans_csv



def _csv(tmp_path, text, name="trace.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# ---- the trace reader ----------------------------------------------------------------------
def test_trace_intervals_are_merged_and_sorted_and_extra_clients_unused(tmp_path):
    p = _csv(tmp_path, "client,start,end\n1,5,7\n0,0,\n1,0,2\n1,1,3\n2,4,inf\n9,0,1\n")
    assert read_trace(p, 3) == [[(0.0, math.inf)], [(0.0, 3.0), (5.0, 7.0)], [(4.0, math.inf)]]


def test_json_trace_matches_csv(tmp_path):
    rows = [{"client": 0, "start": 0, "end": None}, {"client": 1, "start": 2.5, "end": 4}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(rows))
    assert read_trace(str(p), 2) == [[(0.0, math.inf)], [(2.5, 4.0)]]


@pytest.mark.parametrize("text, words", [
    ("client,start,end\n0,0,1\n1,x,2\n", ["line 3", "start", "'x'"]),
    ("client,start,end\n0,0,1\n1,3,2\n", ["line 3", "end", "after start"]),
    ("client,start\n0,0\n", ["line 2", "missing column(s) end"]),
    ("client,start,end,speed\n0,0,1,3\n", ["line 2", "unknown column(s) speed"]),
    ("client,start,end\n0,0,1\n", ["no row for client(s) 1"]),
    ("client,start,end\n0.5,0,1\n1,0,1\n", ["line 2", "integer id"]),
    ("client,start,end\n0,-1,1\n1,0,1\n", ["line 2", "start", ">= 0"]),
    ("client,start,end\n", ["no rows"]),
])
def test_bad_traces_name_file_line_and_column(tmp_path, text, words):
    p = _csv(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        read_trace(p, 2)
    msg = str(e.value)
    assert "--availability" in msg and p in msg and "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("spec", ["offline:1", "offline:-0.1", "offline:0.2:0", "diurnal:0",
                                  "diurnal:60:0", "offline:abc", "nosuch", "diurnal:1:2:3"])
def test_bad_specs_are_config_errors(spec):
    with pytest.raises(ConfigError, match="--availability"):
        av.build(spec, 4, 0)


def test_always_is_no_availability():
    assert av.build("", 4, 0) is None and av.build("always", 4, 0) is None


# ---- the presets ---------------------------------------------------------------------------
def test_offline_fraction_per_window_is_exact_and_seeded():
    a = av.build("offline:0.3:2", 10, seed=1)
    b = av.build("offline:0.3:2", 10, seed=1)
    c = av.build("offline:0.3:2", 10, seed=2)
    sets = []
    for w in range(20):
        t = 2 * w + 0.5
        off = {i for i in range(10) if not a.online(i, t)}
        assert len(off) == 3
        assert off == {i for i in range(10) if not b.online(i, t)}
        assert {i for i in range(10) if not a.online(i, t + 1.4)} == off  # same window
        sets.append(off)
    assert len({frozenset(s) for s in sets}) > 5  # a fresh draw per window
    assert any(sets[w] != {i for i in range(10) if not c.online(i, 2 * w + 0.5)} for w in range(20))


def test_offline_zero_is_always_online():
    a = av.build("offline:0", 5, seed=0)
    assert all(a.until(c, t) == math.inf for c in range(5) for t in (0.0, 3.5, 1e6))


def test_offline_stretch_end_and_next_start_agree_with_online():
    a = av.build("offline:0.5:1", 6, seed=3)
    for cid in range(6):
        for t in np.linspace(0, 30, 61):
            end = a.until(cid, t)
            if end is None:
                s = a.next_start(cid, t)
                assert s > t and a.online(cid, s) and not a.online(cid, (t + s) / 2 if s - t < 1
                                                                   else t)
            else:
                assert end > t and a.online(cid, end - 1e-9) and not a.online(cid, end)


def test_diurnal_online_fraction_and_phase():
    a = av.build("diurnal:10:0.3", 50, seed=0)
    ts = np.arange(0, 10, 0.01)
    for cid in (0, 7, 49):
        frac = np.mean([a.online(cid, t) for t in ts])
        assert frac == pytest.approx(0.3, abs=0.011)
        end = next(a.until(cid, t) for t in ts if a.online(cid, t))
        assert not a.online(cid, end) and a.online(cid, end - 1e-6)
        assert a.online(cid, end + 7.0) and not a.online(cid, end + 7.0 - 1e-6)  # next day
    assert len({round(float(p), 6) for p in a.phase}) == 50  # a phase per client


def test_trace_travels_in_welcome_arrays(tmp_path):
    p = _csv(tmp_path, "client,start,end\n0,0,1\n0,2,\n1,0.5,3\n")
    a = av.build(p, 2, 0)
    b = av.from_welcome(p, 2, 0, a.to_arrays())  # the file is not read again
    assert b.spans == a.spans and b.spec == p
    assert av.from_welcome("offline:0.5", 4, 9, {}).online(0, 0.1) == \
        av.build("offline:0.5", 4, 9).online(0, 0.1)


# ---- the churn rules -----------------------------------------------------------------------
def _trace(spans):
    return av.Trace([list(s) for s in spans], "t")


def test_select_waits_for_the_first_client_to_come_online():
    ch = Churn(_trace([[(5.0, 9.0)], [(7.0, math.inf)], [(0.0, 1.0)]]))
    clients = [ClientInfo(c, 10, "cpu", "", 0, "h") for c in range(3)]
    on, t = ch.select(clients, 2.0)
    assert [c.cid for c in on] == [0] and t == 5.0 and ch.waited == 3.0
    on, t = ch.select(clients, 0.5)
    assert [c.cid for c in on] == [2] and t == 0.5 and ch.waited == 0.0
    ch2 = Churn(_trace([[(0.0, 1.0)], [(0.0, 2.0)], [(0.0, 1.0)]]))
    assert ch2.select(clients, 3.0) == ([], 3.0)


def test_upload_fails_at_the_moment_the_client_goes_offline():
    ch = Churn(_trace([[(0.0, 4.0)], [(0.0, math.inf)]]))
    got = ch.upload(Result(1, 0, 0, sim_time=4.5), sent=3.5, skipped=2)
    assert isinstance(got, Failure) and got.sim_time == 4.0 and got.cid == 0
    assert "while sending its result" in got.reason and got.reason.startswith("offline at 4 s")
    assert isinstance(ch.upload(Result(2, 0, 1, sim_time=9.0), 3.5, 0), Result)
    assert isinstance(ch.upload(Result(3, 1, 0, sim_time=3.9), 3.0, 0), Result)
    assert ch.skipped == {0: 2}


def test_next_online_hop_skips_offline_peers():
    a = _trace([[(0.0, math.inf)], [(0.0, 1.0)], [(2.0, 3.0)], [(0.0, math.inf)]])
    assert next_online_hop(a, [0, 1, 2, 3], 1, 0.5) == (1, 0)
    assert next_online_hop(a, [0, 1, 2, 3], 1, 1.5) == (3, 2)
    assert next_online_hop(a, [0, 1, 2, 3], 1, 2.5) == (2, 1)
    assert next_online_hop(a, [3, 1, 2], 1, 1.5) == (None, 2)
    assert next_online_hop(None, [0, 1], 1, 9.0) == (1, 0)


# ---- runs ----------------------------------------------------------------------------------
def _watch(session, seen):
    """Record (round, start time, selected clients) and the failures the algorithm gets."""
    algo, drv = session.algo, session.driver
    conf, agg = algo.configure_round, algo.aggregate_round

    def configure_round(rnd, clients):
        seen["rounds"].append((rnd, drv.sim_time, sorted(c.cid for c in clients)))
        return conf(rnd, clients)

    def aggregate_round(rnd, results, failures):
        seen["failures"] += [(rnd, f.cid, f.sim_time, f.reason) for f in failures]
        return agg(rnd, results, failures)
    algo.configure_round, algo.aggregate_round = configure_round, aggregate_round


def _online(spans, t):
    return sorted(c for c, sp in enumerate(spans) if any(s <= t < e for s, e in sp))


def test_fedavg_selects_exactly_the_online_clients_and_fails_at_the_offline_moment(tmp_path):
    inf = math.inf
    spans = [[(0, inf)], [(0, 0.05), (2.5, inf)], [(1.0, inf)], [(0, 3.0), (6.0, inf)]]
    p = spans_csv(tmp_path, spans)
    seen = {"rounds": [], "failures": []}
    cfg = small_config(clients=4, rounds=4, latency={"preset": "", "availability": p,
                                                     "file": hetero_at_1ms(tmp_path, 4)})
    s = run_local(cfg, quiet=True, write=False, prepare=lambda ss: _watch(ss, seen))
    assert s["status"] == "completed"
    for rnd, t, cids in seen["rounds"]:
        assert cids == _online(spans, t), (rnd, t)
    assert len({tuple(c) for _, _, c in seen["rounds"]}) >= 3  # the set changed between rounds
    # client 1 trains in round 0 and goes offline at 0.05 s: its task fails at that moment
    assert (0, 1, 0.05) in [f[:3] for f in seen["failures"]]
    f = next(f for f in seen["failures"] if f[:2] == (0, 1))
    assert "during local training" in f[3] and "offline at 0.05 s" in f[3]
    assert s["availability"]["offline_failures"] == len(seen["failures"]) >= 1
    assert s["availability"]["skipped_peers"] == 0


def test_a_round_with_nobody_online_waits_then_stops_when_nobody_comes_back(tmp_path):
    p = spans_csv(tmp_path, [[(2.0, 2.1)], [(3.0, 3.1)]])
    seen = {"rounds": [], "failures": []}
    cfg = small_config(clients=2, rounds=3, latency={"preset": "", "availability": p,
                                                     "file": hetero_at_1ms(tmp_path, 2)})
    s = run_local(cfg, quiet=True, write=False, prepare=lambda ss: _watch(ss, seen))
    assert seen["rounds"][0] == (0, 2.0, [0])  # waited from 0 to 2 s for client 0
    assert s["availability"]["waited_s"] >= 2.0 and s["availability"]["waits"] >= 1
    assert s["status"] == "no_clients_online"
    assert len(seen["failures"]) == len(seen["rounds"])  # every task outlived its client


def test_ring_skips_an_offline_peer_without_handing_off_to_it(tmp_path):
    inf = math.inf
    # client 1 is online at the round's start, offline when client 0 hands off (> 0.01 s)
    p = spans_csv(tmp_path, [[(0, inf)], [(0, 0.01), (100, inf)], [(0, inf)]])
    out = tmp_path / "run"
    cfg = small_config(clients=3, rounds=1, out=str(out),
                       latency={"preset": "hetero", "availability": p})
    s = run_local(cfg, quiet=True, prepare=ring)
    assert s["status"] == "completed" and not s["failures"]
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["skipped_peers"] == 1 and row["online"] == 3
    assert s["availability"]["skipped_peers"] == 1
    assert s["availability"]["skipped_by_round"] == {"0": 1}
    # server -> 0, one hand-off 0 -> 2 (none to 1), 2 -> server
    assert s["bytes"]["tensor_bytes"] == 3 * MODEL
    full = run_local(small_config(clients=3, rounds=1, latency={"preset": "hetero"}), quiet=True,
                     write=False, prepare=ring)
    assert full["bytes"]["tensor_bytes"] == 4 * MODEL
    assert 0 < s["bytes"]["client_to_client"] < full["bytes"]["client_to_client"]


def test_ring_whose_later_peers_are_all_offline_returns_to_the_server(tmp_path):
    inf = math.inf
    p = spans_csv(tmp_path, [[(0, inf)], [(0, 0.01)], [(0, 0.01)]])
    out = tmp_path / "run"
    cfg = small_config(clients=3, rounds=1, out=str(out),
                       latency={"preset": "hetero", "availability": p})
    s = run_local(cfg, quiet=True, prepare=ring)
    assert s["status"] == "completed" and not s["failures"]
    assert s["availability"]["skipped_peers"] == 2
    assert s["bytes"]["tensor_bytes"] == 2 * MODEL and s["bytes"]["client_to_client"] == 0


def test_passed_over_accepts_only_a_hand_off_past_offline_peers():
    from fednet.network.churn import passed_over
    a = _trace([[(0.0, math.inf)], [(0.0, 1.0)], [(0.0, math.inf)], [(0.0, 1.0)]])
    assert passed_over(a, [0, 1, 2], 2, "c0000", 1.5) == 0  # 1 is offline: 0 may hand to 2
    assert passed_over(a, [0, 1, 3, 2], 3, "c0000", 1.5) == 0  # past two offline peers
    assert passed_over(a, [0, 1, 2], 2, "c0000", 0.5) is None  # 1 is online: only 1 may
    assert passed_over(a, [0, 2, 1, 3], 3, "c0000", 1.5) is None  # 2 (online) stands between
    assert passed_over(a, [0, 1, 2], 2, "c0001", 1.5) is None  # the direct predecessor
    assert passed_over(None, [0, 1, 2], 2, "c0000", 1.5) is None


def test_welcome_carries_whole_traces_only_to_algorithms_that_hand_off():
    """A latency or availability trace travels whole in WELCOME only when the algorithm hands
    models between clients (a receiver needs its sender's link); otherwise each client gets its
    own intervals only, so registration costs O(P) bytes, not O(P^2)."""
    from types import SimpleNamespace

    from fednet.network import latency
    from fednet.network.availability import Trace
    from fednet.server.registrar import Registrar

    n = 50
    spans = [[(float(c), math.inf)] for c in range(n)]
    profs = [latency.Profile() for _ in range(n)]
    for handoffs in (False, True):
        s = SimpleNamespace(handoffs=handoffs, availability=Trace(spans, "trace.csv"),
                            profiles=profs, cfg=SimpleNamespace(latency=SimpleNamespace(file="t.csv")))
        reg = SimpleNamespace(srv=SimpleNamespace(s=s), _profiles_array=None)
        got = Registrar.traces(reg, [7])
        if handoffs:
            assert got["avail_client"].tolist() == list(range(n))
            assert got["profiles"].shape == (n, len(latency.COLUMNS))
        else:
            assert got["avail_client"].tolist() == [7] and got["avail_start"].tolist() == [7.0]
            assert "profiles" not in got
