"""--real-time on plain (unshaped) links: the client processes sleep every simulated delay, the
upload's transfer included, so each round's wall-clock follows its simulated time. (On links that
tc tbf shapes, --shaped-links: tests/integration/test_netns_shaped.py.)"""
from __future__ import annotations

import json

import pytest

from fednet.server.main import run_zmq
from tests.conftest import small_config

pytestmark = [pytest.mark.net, pytest.mark.slow]

# a slow uplink: 61,864 B of model take 0.62 s up; before the upload's transfer was slept, a
# round's wall-clock fell that much short of its simulated time
TRACE = "compute_s_per_sample,rtt_s,up_bps,down_bps\n0.002,0.05,100kB,1MB\n"


def test_real_time_rounds_take_their_simulated_time(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    cfg = small_config(clients=2, rounds=3, out=str(tmp_path / "run"),
                       latency={"file": str(trace), "real": True})
    s = run_zmq(cfg, quiet=True)
    assert s["status"] == "completed" and not s["failures"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    prev, per = (0.0, 0.0), []
    for r in rows:
        per.append((r["sim_s"] - prev[0], r["wall_s"] - prev[1]))
        prev = (r["sim_s"], r["wall_s"])
    print("\n[real-time, plain links] per round (simulated s, wall s): "
          + ", ".join(f"({a:.3f}, {b:.3f})" for a, b in per))
    for sim, wall in per:
        assert sim > 1.5 and abs(wall - sim) <= 0.15 * sim, per
