"""The ring timeline check over real processes (run_zmq: the server of `fednet launch`, its
clients forked from the zygote, hand-offs over ZeroMQ peer sockets): each result arrives when the
analytic timeline says, and exactly when it does under fednet local (tests/test_ring_timeline.py,
benchmarks/bench_ring_timeline.py). The latency trace reaches the client processes through
WELCOME, so the hand-offs' receivers know their senders' uplinks."""
from __future__ import annotations

import pytest

from tests.harness import bench as load_bench

bench = load_bench("bench_ring_timeline")

pytestmark = [pytest.mark.net, pytest.mark.slow]


def test_ring_timeline_over_processes_equals_the_analytic_one_and_local(tmp_path):
    local = bench.run("local", tmp_path)
    launch = bench.run("launch", tmp_path)
    assert launch["summary"]["status"] == "completed" and not launch["summary"]["failures"]
    rows = bench.timeline(local)
    got = launch["recorder"].arrivals
    for r in rows:
        assert got[r["task"]] == pytest.approx(r["analytic"], rel=1e-12, abs=1e-12), r
        assert got[r["task"]] == local["recorder"].arrivals[r["task"]]  # bit for bit
    assert launch["summary"]["sim_time_s"] == local["summary"]["sim_time_s"]
    # the server saw the same TASK and RESULT sizes the analytic timeline used
    seen = [(e.kind, e.total) for e in launch["entries"] if e.kind in ("TASK", "RESULT")]
    want = [(e.kind, e.total) for e in local["entries"] if e.kind in ("TASK", "RESULT")]
    assert sorted(seen) == sorted(want)
    keys = ("server_to_client", "client_to_server", "client_to_client")
    assert {k: launch["summary"]["bytes"][k] for k in keys} == \
        {k: local["summary"]["bytes"][k] for k in keys}
