"""A ring's simulated timeline equals the analytic one for asymmetric profiles (fednet local):
each hand-off pays the sender's uplink, the receiver's downlink and both latencies
(latency.peer_delay). The same check over real processes: tests/integration/
test_ring_timeline_launch.py; the figures: benchmarks/bench_ring_timeline.py."""
from __future__ import annotations


import pytest

from fednet.network import latency
from fednet.config import LatencyConfig
from tests.harness import bench as load_bench

bench = load_bench("bench_ring_timeline")


def test_ring_timeline_equals_the_analytic_one(tmp_path):
    local = bench.run("local", tmp_path)
    rows = bench.timeline(local)
    rec = local["recorder"]
    assert local["summary"]["status"] == "completed"
    assert [len(r["route"]) for r in rows] == [1, 2, 3, 4] * bench.ROUNDS
    assert all(len(r["H"]) == len(r["route"]) - 1 and r["R"] > 60_000 for r in rows)
    for r in rows:
        assert rec.arrivals[r["task"]] == pytest.approx(r["analytic"], rel=1e-12, abs=1e-12), r
    assert local["summary"]["sim_time_s"] == pytest.approx(max(r["analytic"] for r in rows),
                                                           rel=1e-12)
    # the check can fail: charging a hand-off to the receiver's downlink alone (the old model)
    # is off by more than 0.5 s on this trace
    profs = latency.profiles(local["cfg"].latency, 4, local["cfg"].seed)
    longest = rows[3]
    old = longest["hops"][0]
    for prev, cur, h in zip(longest["route"], longest["route"][1:], longest["H"]):
        n = rec.examples[prev] * local["cfg"].train.epochs
        old += n * profs[prev].compute_s_per_sample + latency.down_delay(profs[cur], h)
    assert longest["hops"][-1] - old > 0.5


def test_symmetric_profiles_give_down_delay_to_the_last_bit():
    """lan/none presets: peer_delay equals what the receiver's downlink alone gave (golden)."""
    for preset in ("lan", "none"):
        profs = latency.profiles(LatencyConfig(preset=preset), 8, 0)
        for p, q in zip(profs, profs[1:] + profs[:1]):
            for n in (0, 1, 61_864, 10**7 + 3):
                assert latency.receive_delay(q, n, p) == latency.receive_delay(q, n)


def test_the_receiver_charges_the_senders_link_and_never_trusts_an_unknown_sender():
    from fednet.core.executor import Executor
    from fednet.protocol import Message, MsgKind
    from tests.conftest import small_config

    cfg = small_config(clients=3, latency={"preset": "hetero"}, seed=1)
    profs = latency.profiles(cfg.latency, 3, cfg.seed)
    ex = Executor(2, cfg, profs[2])
    assert ex.sender_link(Message(MsgKind.TASK, "server")) is None
    assert ex.sender_link(Message(MsgKind.HANDOFF, "c0001")) == profs[1]  # rebuilt lazily
    # a peer without a run key may claim any name: no IndexError, no link of its own charged
    assert ex.sender_link(Message(MsgKind.HANDOFF, "c9999999")) is None
