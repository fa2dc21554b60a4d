"""`fednet calibrate`: this host's FLOP/s measured and written as a --latency trace."""
from __future__ import annotations

import json

from click.testing import CliRunner

from fednet.cli import main
from fednet.config import LatencyConfig
from fednet.network import latency


def test_calibrate_writes_a_profile_a_run_reads(tmp_path):
    out = tmp_path / "host.json"
    r = CliRunner().invoke(main, ["calibrate", "--model", "mclr", "--input", "1x8x8", "--batch",
                                  "8", "--seconds", "0.1", "--rtt", "0.01", "--down", "100Mbit",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "GFLOP/s" in r.output and f"--latency {out}" in r.output
    rows = json.loads(out.read_text())
    assert list(rows[0]) == ["train_flops_per_s", "rtt_s", "up_bps", "down_bps"]
    ps = latency.profiles(LatencyConfig(file=str(out)), 3, 0)
    assert ps[0] == ps[2] and ps[0].train_flops_per_s > 1e6 and ps[0].compute_s_per_sample == 0
    assert ps[0].rtt_s == 0.01 and ps[0].down_bps == 12.5e6 and ps[0].up_bps == float("inf")


def test_calibrate_refuses_a_bad_shape_and_rate(tmp_path):
    r = CliRunner().invoke(main, ["calibrate", "--input", "3xx", "--out", str(tmp_path / "h")])
    assert r.exit_code == 2 and "is not a shape such as 3x32x32" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--up", "10Mbps", "--out", str(tmp_path / "h")])
    assert r.exit_code == 2 and "ambiguous" in r.output
    assert not (tmp_path / "h").exists()
