"""Latency profiles and the virtual-clock arithmetic."""
from __future__ import annotations

import json

import pytest

from fednet.network import latency
from fednet.config import LatencyConfig
from fednet.errors import ConfigError
from fednet.network.latency import Profile


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
    slow = [p for p in ps if p.train_flops_per_s < latency.EDGE_FLOPS]
    assert len(slow) == 20
    assert all(p.train_flops_per_s == latency.EDGE_FLOPS / 5 for p in slow)
    assert all(p.compute_s_per_sample == 0 for p in ps)


def test_delay_arithmetic():
    p = Profile(compute_s_per_sample=0.002, rtt_s=0.1, up_bps=1e6, down_bps=4e6)
    assert latency.down_delay(p, 2_000_000) == pytest.approx(0.05 + 0.5)
    assert latency.up_delay(p, 2_000_000) == pytest.approx(0.05 + 2.0)
    assert latency.compute_time(p, 150) == pytest.approx(0.3)
    q = Profile(rtt_s=0.02, up_bps=8e6, down_bps=2e6)
    assert latency.peer_delay(p, q, 1_000_000) == pytest.approx((0.1 + 0.02) / 4 + 1_000_000 / 1e6)


def test_trace_files_csv_and_json(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("client,compute_s_per_sample,rtt_s,up_bps,down_bps\n1,0.004,0.05,5e5,1e6\n"
                   "0,0.001,0.01,1e6,2e6\n")
    ps = latency.profiles(LatencyConfig(file=str(csv)), 2, 0)  # rows found by their client id
    assert [p.compute_s_per_sample for p in ps] == [0.001, 0.004]
    js = tmp_path / "t.json"
    js.write_text(json.dumps([{"compute_s_per_sample": 0.01, "rtt_s": 0.2, "up_bps": 0,
                               "down_bps": 0}]))
    ps = latency.profiles(LatencyConfig(file=str(js)), 3, 0)  # one row: every client's
    assert len(ps) == 3 and ps[0] == ps[2] and ps[0].up_bps == float("inf")  # 0 = unlimited
    long = tmp_path / "long.csv"  # more rows than clients: the first ones
    long.write_text("compute_s_per_sample,rtt_s,up_bps,down_bps\n"
                    + "".join(f"{i / 1000},0,0,0\n" for i in range(5)))
    assert [p.compute_s_per_sample for p in latency.profiles(LatencyConfig(file=str(long)), 3, 0)] \
        == [0.0, 0.001, 0.002]


HEAD = "compute_s_per_sample,rtt_s,up_bps,down_bps"
BAD_TRACES = [
    ("rows.csv", f"{HEAD}\n0.001,0.01,0,0\n0.002,0.01,0,0\n",
     "2 rows for 5 clients; give one row per client (row i is client i), or a single row for "
     "all of them"),
    ("misspelt.csv", "compute_s_per_sample,rtt,up_bps,down_bps\n0.001,0.01,0,0\n",
     "line 2: unknown column(s) rtt; missing column(s) rtt_s; a trace has the columns "
     "rtt_s, up_bps, down_bps, one of train_flops_per_s or compute_s_per_sample (and optionally "
     "client)"),
    ("missing.csv", "compute_s_per_sample,rtt_s,up_bps\n0.001,0.01,0\n",
     "line 2: missing column(s) down_bps; a trace has the columns rtt_s, up_bps, down_bps, one "
     "of train_flops_per_s or compute_s_per_sample (and optionally client)"),
    ("no_compute.csv", "rtt_s,up_bps,down_bps\n0.01,0,0\n",
     "line 2: missing column(s) train_flops_per_s or compute_s_per_sample; a trace has the "
     "columns rtt_s, up_bps, down_bps, one of train_flops_per_s or compute_s_per_sample (and "
     "optionally client)"),
    ("both.csv", f"{HEAD},train_flops_per_s\n0.001,0.01,0,0,1e9\n",
     "line 2: give the compute as train_flops_per_s (FLOP/s) or as compute_s_per_sample (s per "
     "example), not both"),
    ("text.csv", f"{HEAD}\nfast,0.01,0,0\n", "line 2: compute_s_per_sample must be a finite "
     "number >= 0 (got 'fast')"),
    ("empty_cell.csv", f"{HEAD}\n0.001,,0,0\n", "line 2: rtt_s must be a finite number >= 0 "
     "(got '')"),
    ("negative.csv", f"{HEAD}\n0.001,0.01,-5,0\n", "line 2: up_bps: '-5' must be a finite rate "
     f">= 0; {latency.RATE_HELP}"),
    ("nan.csv", f"{HEAD}\n0.001,0.01,0,nan\n", f"line 2: down_bps: 'nan' is not {latency.RATE_HELP}"),
    ("bps.csv", f"{HEAD}\n0.001,0.01,0,0\n0.001,0.01,10Mbps,0\n", "line 3: up_bps: '10Mbps' is "
     "ambiguous ('bps' means bits to some tools and bytes to others); write 10Mbit for bits/s or "
     "10MB for bytes/s"),
    ("unit.csv", f"{HEAD}\n0.001,0.01,0,5 furlongs\n", "line 2: down_bps: unknown unit 'furlongs' "
     f"in '5 furlongs'; {latency.RATE_HELP}"),
    ("blank.csv", f"{HEAD}\n0.001,0.01,,0\n", f"line 2: up_bps is empty; give {latency.RATE_HELP}"),
    ("unit.json", json.dumps([{"compute_s_per_sample": 0, "rtt_s": 0, "up_bps": "1Gbps",
                               "down_bps": 0}]),
     "entry 0: up_bps: '1Gbps' is ambiguous ('bps' means bits to some tools and bytes to others); "
     "write 1Gbit for bits/s or 1GB for bytes/s"),
    ("ids.csv", f"client,{HEAD}\n0,0.001,0.01,0,0\n0,0.001,0.01,0,0\n",
     "the client column must give every row a distinct id"),
    ("gap.csv", f"client,{HEAD}\n0,0.001,0.01,0,0\n7,0.001,0.01,0,0\n",
     "no row for client(s) 1, 2, 3, 4; give one row per client 0..4, or one row for all"),
    ("header_only.csv", f"{HEAD}\n", "the trace has no rows"),
    ("obj.json", json.dumps({"rtt_s": 1}), "a JSON trace is a list of objects with the keys "
     "rtt_s, up_bps, down_bps, train_flops_per_s (or compute_s_per_sample)"),
    ("bool.json", json.dumps([{"compute_s_per_sample": True, "rtt_s": 0, "up_bps": 0,
                               "down_bps": 0}]),
     "entry 0: compute_s_per_sample must be a finite number >= 0 (got True)"),
]


@pytest.mark.parametrize("name,text,expected", BAD_TRACES, ids=[b[0] for b in BAD_TRACES])
def test_bad_traces_are_refused_with_one_line(tmp_path, name, text, expected):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        latency.profiles(LatencyConfig(file=str(f)), 5, 0)
    assert str(e.value) == f"--latency {f}: {expected}"


def test_bad_trace_file_names_the_option(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        latency.profiles(LatencyConfig(file=str(tmp_path / "nope.csv")), 2, 0)
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(ConfigError, match=r"^--latency .*bad.json: cannot read it \("):
        latency.profiles(LatencyConfig(file=str(bad)), 2, 0)


def test_profile_dict_round_trip():
    p = Profile(0.001, 0.02, float("inf"), 5e6)
    assert Profile.from_dict(p.to_dict()) == p
    q = Profile(0.0, 0.02, 1e6, 5e6, 3e9)
    assert Profile.from_dict(q.to_dict()) == q
    assert latency.Profiles.from_array(latency.to_array([p, q])) == [p, q]


def test_compute_time_in_flops_or_per_sample():
    """A FLOP/s profile charges the FLOPs counted (whatever the samples); the older per-example
    profile charges the samples (whatever the FLOPs); none: free."""
    assert latency.compute_time(Profile(train_flops_per_s=2e9), 100, 6 * 10**9) == 3.0
    assert latency.compute_time(Profile(compute_s_per_sample=0.002), 150, 10**12) == 0.002 * 150
    assert latency.compute_time(Profile(), 150, 10**12) == 0.0


def test_dispatched_operations_cost_s_per_op_in_a_flops_profile_only():
    """A FLOP/s profile charges each dispatched operation (opcount.DISPATCH) its s_per_op, as
    training, not protocol work; a per-example profile charges the samples alone."""
    from fednet.opcount import DISPATCH

    work = {DISPATCH: 400.0, "noise": 1e6}
    p = Profile(train_flops_per_s=2e9, s_per_op=1e-5, noise_per_s=1e7)
    assert latency.compute_time(p, 100, 6 * 10**9, work) == pytest.approx(3.0 + 0.004 + 0.1)
    assert latency.protocol_time(p, work) == pytest.approx(0.1)
    per_example = Profile(compute_s_per_sample=0.002, s_per_op=1e-5)
    assert latency.compute_time(per_example, 150, 10**12, {DISPATCH: 400.0}) == 0.002 * 150


def test_presets_charge_operations_at_the_edge_class_scaled_by_speed():
    """A preset's client k times slower at FLOPs is k times slower per operation (hetero's slow
    clients: 5x); none is free; an older table without s_per_op (or without the protocol
    rates) reads it as 0."""
    ps = latency.profiles(LatencyConfig(preset="hetero"), 10, 0)
    fast = [p for p in ps if p.train_flops_per_s == latency.EDGE_FLOPS]
    slow = [p for p in ps if p.train_flops_per_s < latency.EDGE_FLOPS]
    assert len(slow) == 2 and all(p.s_per_op == latency.EDGE_S_PER_OP for p in fast)
    assert all(p.s_per_op == pytest.approx(5 * latency.EDGE_S_PER_OP) for p in slow)
    assert all(p.s_per_conv == pytest.approx(5 * latency.EDGE_S_PER_CONV) for p in slow)
    assert latency.profiles(LatencyConfig(preset="none"), 3, 0)[0].s_per_op == 0.0
    table = latency.to_array(list(ps))
    for older in (table[:, :11], table[:, :5]):  # (before s_per_op; before the protocol rates)
        back = latency.Profiles.from_array(older)
        assert len(back) == 10 and back[0].s_per_op == back[0].s_per_conv == 0.0
        assert back[0].train_flops_per_s == ps[0].train_flops_per_s


def test_flops_trace_and_older_trace_load(tmp_path, caplog):
    """A trace in FLOP/s; an older one of seconds per example loads as it did, with one note."""
    new = tmp_path / "host.json"
    new.write_text(json.dumps([{"train_flops_per_s": 5e9, "rtt_s": 0.01, "up_bps": 0,
                                "down_bps": "100Mbit"}]))
    ps = latency.profiles(LatencyConfig(file=str(new)), 2, 0)
    # (the protocol rates not given: the edge class's at 5 GFLOP/s, latency.edge_rates)
    assert ps[0] == ps[1] == Profile(0.0, 0.01, float("inf"), 12.5e6, 5e9,
                                     *(float(v) for v in latency.edge_rates(5e9).values()))
    old = tmp_path / "old.csv"
    old.write_text(f"{HEAD}\n0.002,0.01,0,0\n")
    latency._PER_SAMPLE_NOTED = False
    with caplog.at_level("WARNING", logger="fednet"):
        assert latency.profiles(LatencyConfig(file=str(old)), 2, 0)[1].compute_s_per_sample == 0.002
        latency.profiles(LatencyConfig(file=str(old)), 2, 0)
    notes = [r for r in caplog.records if "compute_s_per_sample" in r.getMessage()]
    assert len(notes) == 1 and "fednet calibrate" in notes[0].getMessage()


@pytest.mark.parametrize("text,bps", [("100Mbit", 12.5e6), ("100mbit/s", 12.5e6), ("12.5MB", 12.5e6),
                                      ("2MiB", 2 * 1024 ** 2), ("1e6", 1e6), (5, 5.0),
                                      ("500kbit", 62500.0), ("0", float("inf")),
                                      ("unlimited", float("inf"))])
def test_parse_rate_units(text, bps):
    from fednet.network.latency import parse_rate
    assert parse_rate(text, "--x") == bps


@pytest.mark.parametrize("text,says", [("100Mbps", "ambiguous"), ("3 parsecs", "unknown unit"),
                                       ("-1", ">= 0"), ("fast", "is not a rate")])
def test_parse_rate_refuses(text, says):
    from fednet.network.latency import parse_rate
    with pytest.raises(ConfigError, match=says) as e:
        parse_rate(text, "--server-bandwidth")
    assert "--server-bandwidth" in str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_trace_rates_take_units_and_plain_numbers_are_bytes_per_second(tmp_path, suffix):
    cells = [("100Mbit", "12.5MB"), ("2MiB", "500kbit"), ("125000", 250000.0), ("0", "unlimited"),
             ("1Gbit/s", " 3 KiB ")]
    want = [(12.5e6, 12.5e6), (2 * 1024 ** 2, 62_500.0), (125_000.0, 250_000.0),
            (float("inf"), float("inf")), (125e6, 3072.0)]
    f = tmp_path / f"t{suffix}"
    if suffix == ".csv":
        f.write_text(HEAD + "\n" + "".join(f"0.001,0.01,{u},{d}\n" for u, d in cells))
    else:
        f.write_text(json.dumps([{"compute_s_per_sample": 0.001, "rtt_s": 0.01, "up_bps": u,
                                  "down_bps": d} for u, d in cells]))
    got = latency.profiles(LatencyConfig(file=str(f)), len(cells), 0)
    assert [(p.up_bps, p.down_bps) for p in got] == want


def test_profiles_travel_as_an_array_and_come_back_equal(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(HEAD + "\n0.002,0.03,2Mbit,0\n0.0005,0.12,1MB,400kB\n")
    cfg = LatencyConfig(file=str(f))
    profs = latency.profiles(cfg, 2, 0)
    arr = latency.to_array(profs)
    assert arr.shape == (2, len(latency.COLUMNS)) and arr.dtype.name == "float64"
    f.unlink()  # a client host has no copy of the file: WELCOME's array is enough
    assert latency.links(cfg, 2, 0, {"profiles": arr}) == profs
    assert latency.links(LatencyConfig(preset="wan"), 3, 5, {}) == latency.profiles(
        LatencyConfig(preset="wan"), 3, 5)


def test_a_handoff_pays_the_senders_uplink_and_both_latencies():
    src = latency.Profile(0.0, 0.1, 1e6, 1e9)   # 1 MB/s up
    dst = latency.Profile(0.0, 0.02, 1e9, 8e6)  # 8 MB/s down
    n = 61_864
    assert latency.receive_delay(dst, n, src) == (0.1 + 0.02) / 4 + n / 1e6
    assert latency.receive_delay(dst, n) == 0.01 + n / 8e6  # from the server: downlink only
    assert latency.wire_time(dst, n, src) == n / 1e6 and latency.wire_time(dst, n) == n / 8e6


def test_shaped_links_need_real_time_at_scale_one():
    from fednet.config import from_dict
    from fednet.algorithms.checks import validate

    for lat in ({"shaped": True}, {"shaped": True, "real": True, "time_scale": 2.0}):
        with pytest.raises(ConfigError, match="^--shaped-links says the network itself runs"):
            validate(from_dict({"latency": lat}))
    assert validate(from_dict({"latency": {"shaped": True, "real": True}})).latency.shaped


def test_time_scale_needs_real_time():
    from fednet.config import from_dict
    from fednet.algorithms.checks import validate

    with pytest.raises(ConfigError, match=r"^--time-scale 2 scales the delays --real-time sleeps"):
        validate(from_dict({"latency": {"time_scale": 2.0}}))
    assert validate(from_dict({"latency": {"time_scale": 2.0, "real": True}})).latency.time_scale == 2


@pytest.mark.parametrize("row,why", [
    ("0.001,0.01,1000000", "line 2: no cell for column(s) down_bps (the row has 3 of 4 cells)"),
    ("0.001,0.01,1000000,5,7", "line 2: 5 cells, but the header has 4 columns"),
])
def test_a_trace_row_with_a_missing_or_extra_cell_is_refused(tmp_path, row, why):
    """Issue 24: a short row was read as down_bps = 0 (unlimited); an extra cell as 'unknown
    column(s) None'."""
    from fednet.errors import ConfigError
    from fednet.network.latency import _from_file

    p = tmp_path / "t.csv"
    p.write_text("compute_s_per_sample,rtt_s,up_bps,down_bps\n" + row + "\n")
    with pytest.raises(ConfigError) as e:
        _from_file(str(p), 2)
    assert why in str(e.value) and str(p) in str(e.value)


def test_profiles_are_one_table_that_behaves_as_a_list_of_profiles():
    """network/latency.Profiles: indexing, slices, concatenation, subsets and the WELCOME array
    give the Profile objects the list of them gave (a million clients: one table, not objects)."""
    ps = latency.profiles(LatencyConfig(preset="hetero"), 10, 3)
    objs = list(ps)
    assert all(isinstance(p, latency.Profile) for p in objs) and len(ps) == 10
    assert ps[-1] == objs[-1] and ps[2:5] == objs[2:5] and ps[1:] + ps[:1] == objs[1:] + objs[:1]
    assert ps.subset([7, 0, 7]) == [objs[7], objs[0], objs[7]]
    assert latency.Profiles.of(objs) == ps
    arr = latency.to_array(ps)
    assert arr.shape == (10, len(latency.COLUMNS)) and latency.Profiles.from_array(arr) == ps
    none = latency.profiles(LatencyConfig(preset="none"), 2, 0)
    assert latency.to_array(none).tolist() == [[0.0] * len(latency.COLUMNS)] * 2  # unlimited: 0
    assert latency.Profiles.from_array(latency.to_array(none))[1].up_bps == float("inf")
    with pytest.raises(IndexError):
        ps[10]
