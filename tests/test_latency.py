"""Latency profiles and the virtual-clock arithmetic."""
from __future__ import annotations

import json

import pytest

from fednet import latency
from fednet.config import LatencyConfig
from fednet.errors import ConfigError
from fednet.latency import Profile


def test_presets_are_deterministic_per_seed():
    a = latency.profiles(LatencyConfig(preset="wan"), 20, seed=3)
    b = latency.profiles(LatencyConfig(preset="wan"), 20, seed=3)
    c = latency.profiles(LatencyConfig(preset="wan"), 20, seed=4)
    assert a == b and a != c
    assert all(0.02 <= p.rtt_s <= 0.2 for p in a)


def test_none_preset_costs_no_time():
    p = latency.profiles(LatencyConfig(preset="none"), 3, 0)[0]
    assert latency.down_delay(p, 10**9) == 0 and latency.compute_time(p, 10**6) == 0


def test_hetero_preset_has_twenty_percent_slow_clients():
    ps = latency.profiles(LatencyConfig(preset="hetero"), 100, 0)
    slow = [p for p in ps if p.compute_s_per_sample > 1e-3]
    assert len(slow) == 20
    assert all(p.compute_s_per_sample == 5 * 1e-3 for p in slow)


def test_delay_arithmetic():
    p = Profile(compute_s_per_sample=0.002, rtt_s=0.1, up_bps=1e6, down_bps=4e6)
    assert latency.down_delay(p, 2_000_000) == pytest.approx(0.05 + 0.5)
    assert latency.up_delay(p, 2_000_000) == pytest.approx(0.05 + 2.0)
    assert latency.compute_time(p, 150) == pytest.approx(0.3)
    q = Profile(rtt_s=0.02, up_bps=8e6, down_bps=2e6)
    assert latency.peer_delay(p, q, 1_000_000) == pytest.approx((0.1 + 0.02) / 4 + 1_000_000 / 1e6)


def test_trace_files_csv_and_json_are_cycled(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("client,compute_s_per_sample,rtt_s,up_bps,down_bps\n0,0.001,0.01,1e6,2e6\n"
                   "1,0.004,0.05,5e5,1e6\n")
    ps = latency.profiles(LatencyConfig(file=str(csv)), 5, 0)
    assert [p.compute_s_per_sample for p in ps] == [0.001, 0.004, 0.001, 0.004, 0.001]
    js = tmp_path / "t.json"
    js.write_text(json.dumps([{"compute_s_per_sample": 0.01, "rtt_s": 0.2, "up_bps": 0,
                               "down_bps": 0}]))
    (p,) = latency.profiles(LatencyConfig(file=str(js)), 1, 0)
    assert p.up_bps == float("inf")  # 0 = unlimited


def test_bad_trace_file_names_the_option(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("compute_s_per_sample,rtt_s\nfast,1\n")
    with pytest.raises(ConfigError, match="--latency"):
        latency.profiles(LatencyConfig(file=str(bad)), 2, 0)
    with pytest.raises(ConfigError, match="does not exist"):
        latency.profiles(LatencyConfig(file=str(tmp_path / "nope.csv")), 2, 0)


def test_profile_dict_round_trip():
    p = Profile(0.001, 0.02, float("inf"), 5e6)
    assert Profile.from_dict(p.to_dict()) == p
