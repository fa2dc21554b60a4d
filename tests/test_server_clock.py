"""Issue 52 items 1 (protocol), 3 and 4: secure aggregation's and the server's work counted in
operations and charged on the clock; the rows' split of simulated time."""
from __future__ import annotations

import json
import math

import pytest

from fednet import opcount
from fednet.errors import ConfigError
from fednet.network import ops
from fednet.network.server_cost import aggregation_ops, defense_ops, server_rates
from fednet.secagg import cost

from fednet.config import RunConfig
from fednet.core.inproc import run_local
from tests.conftest import small_config


def test_counts_follow_the_protocols_parameters():
    assert cost.keys() == {"x25519": 2}
    assert cost.shares(5, 3) == {"shamir": 2 * 5 * 3 * cost.CHUNKS, "x25519": 5, "kdf": 5,
                                 "aead": 5}
    assert cost.masked(100, 8, 4)["prg"] == 5 * 100 * 8
    # the server's unmasking: a self mask per survivor, a pairwise mask per dropped pair
    u = cost.unmasked(survivors=90, pairs=90 * 10, dropped=10, d=1000, itemsize=8,
                      replies=90, taken=90 * 50, t=[30] * 100)
    assert u["prg"] == (90 + 900) * 1000 * 8 and u["mask"] == 990
    assert u["x25519"] == 10 + 900
    # each reply and share taken, t shares read into each of the 100 secrets, and each
    # secret's weights: 8 t^2 + 124 t element operations (shamir.lagrange_rows, _inverse)
    assert u["reply"] == 90 and u["taken"] == 4500 and u["rebuilt"] == 3000
    assert u["lagrange"] == 100 * (8 * 30 * 30 + 124 * 30)


def test_full_secaggs_unmasking_grows_as_its_implementation():
    """n (n - 1) shares taken, n secrets of t = n / 2 shares, the weights once per distinct
    set of first t holders (shamir.reconstruct_many: O(t^2) each; a client holds no share of
    its own secret, so t + 1 sets: {0..t} less v for v < t, {0..t-1} for
    the rest): the weights grow faster than the shares (as n^3 once 8 t^2 outgrows the
    inverses' 124 t)."""
    from types import SimpleNamespace

    import numpy as np

    def agg(n):
        others = {v: {h: None for h in range(n) if h != v} for v in range(n)}
        return SimpleNamespace(shared=lambda: list(range(n)), inputs=set(range(n)),
                               nbrs={v: list(others[v]) for v in range(n)},
                               b_shares=others, s_shares={}, answered=set(range(n)), liars={},
                               t={v: n // 2 for v in range(n)}, total=np.zeros(10, np.uint32))

    small, big = cost.unmasking(agg(20)), cost.unmasking(agg(40))
    assert small["reply"] == 20 and small["taken"] == 20 * 19 and small["rebuilt"] == 20 * 10
    assert big["taken"] == 40 * 39 and big["rebuilt"] == 40 * 20
    assert small["lagrange"] == 11 * cost.lagrange(10) and big["lagrange"] == 21 * cost.lagrange(20)
    assert big["lagrange"] / small["lagrange"] > big["taken"] / small["taken"] > 4


def test_bulyan_counts_its_krum_choices_and_sorts():
    from fednet.algorithms.robust_spec import bulyan_work, defense_spec

    assert defense_spec("bulyan").work is bulyan_work
    w = bulyan_work(1000, 100_000, 200)
    assert w["gemm"] == 2 * 1000 ** 2 * 100_000
    # theta = 600 Krum choices over 1000..401 rows: sum m^2 (3 + log2 m) + m k, and the
    # closest-to-median mean's stable argsort and median: 600 d (log2 600 + 2 (1 + ln 2))
    select = sum(3 * m * m + m * m * math.log2(m) + m * (m - 202) for m in range(401, 1001))
    assert w["stream"] == pytest.approx(3e8 + select + 4 * 600 * 1e5 + 2 * 200 * 1e5)
    assert w["sort"] == pytest.approx(600 * 1e5 * (math.log2(600) + 2 + 2 * math.log(2)))
    assert bulyan_work(0, 10, 0) == {}


def test_seconds_are_counts_over_rates_and_free_without_a_rate():
    assert opcount.seconds({"x25519": 7000, "prg": 65e6}, ops.EDGE) == pytest.approx(2.0)
    assert opcount.seconds({"gemm": 1e12}, {}) == 0.0


def test_robust_rules_cost_what_they_compute():
    n, d = 1000, 100_000
    krum = defense_ops("krum", n, d, 100)
    assert krum["gemm"] == 2 * n * n * d
    mean = aggregation_ops(RunConfig(), n, d)
    rates = server_rates("xeon-core")
    assert opcount.seconds(krum, rates) > 10 * opcount.seconds(mean, rates)  # (n^2 d, n d)
    from fednet.algorithms.robust_spec import bulyan_work

    assert opcount.seconds(bulyan_work(n, d, 100), rates) > opcount.seconds(krum, rates)


def test_server_profile_file_and_bad_names(tmp_path):
    f = tmp_path / "server.json"
    f.write_text(json.dumps({"stream_per_s": 2e9, "gemm_per_s": 1e11}))
    assert server_rates(str(f)) == {"stream_per_s": 2e9, "gemm_per_s": 1e11}
    f.write_text(json.dumps({"flops": 1}))
    with pytest.raises(ConfigError, match="unknown rate"):
        server_rates(str(f))
    with pytest.raises(ConfigError, match="neither a server class"):
        server_rates("no-such-server")


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_server_and_the_protocol_are_on_the_clock(tmp_path):
    """The same secure-aggregation run with a free server and a free protocol, and with both
    charged: the clock grows by what the split says they took; the split adds up."""
    sims = {}
    for name, server in (("free", "none"), ("charged", "xeon-core")):
        cfg = small_config(clients=4, rounds=1, net={"secagg": "full"}, out=str(tmp_path / name),
                           latency={"preset": "lan", "server_profile": server})
        s = run_local(cfg, quiet=True)
        sims[name] = s["sim_time_s"]
        row = _rows(tmp_path / name)[-1]
        split = row["sim_split"]
        assert sum(split.values()) == pytest.approx(row["sim_s"], rel=1e-9)
        stages = row["sim_split_by_stage"]
        assert set(stages) == {"keys", "shares", "input", "unmask"}
        assert stages["shares"]["protocol_s"] > 0 and stages["input"]["protocol_s"] > 0
        assert (stages["unmask"]["server_s"] > 0) == (server != "none")
        assert s["time_split"]["by_stage"]["input"]["protocol_s"] > 0
    assert sims["charged"] > sims["free"]


def test_a_plugin_defense_and_dp_mechanism_are_charged_on_the_servers_clock():
    """A plugin defense's declared work (DefenseSpec.work) is what the round's aggregation
    costs, the mean's when it declares none; a plugin DP mechanism that adds its noise at the
    server is charged central DP's clipping and noise as the built-in one is."""
    from types import SimpleNamespace

    import numpy as np

    from fednet import privacy
    from fednet.algorithms import dp_spec, seam
    from fednet.api import DPSpec, register_dp
    from fednet.core.server_clock import ServerClock
    from fednet.types import Result

    def rule(x, w, f, p, center):
        return x.mean(axis=0), list(range(len(x))), {}

    algo = SimpleNamespace(state=SimpleNamespace(model={"w": np.zeros(10, np.float32),
                                                        "n": np.zeros(3, np.int64)}))
    n, d = 4, 10
    results = [Result(i, 0, i) for i in range(n)]  # (nothing to decode: no server_ops)
    seam.register_defense(seam.DefenseSpec("toy_work", rule, work=lambda n, d, f, p:
                                           {"gemm": 7 * n * d}))
    seam.register_defense(seam.DefenseSpec("toy_free", rule))
    register_dp(DPSpec("toy_central", noise=lambda shapes, scale, gen: {
        k: np.zeros(s) for k, s in shapes.items()}, event=lambda z, q: None))
    try:
        worked = ServerClock(small_config(defense={"name": "toy_work"}), algo)
        assert worked.round_work(results) == {"gemm": 7 * n * d}
        free = ServerClock(small_config(defense={"name": "toy_free"}), algo)
        assert free.round_work(results) == aggregation_ops(RunConfig(), n, d)
        private = ServerClock(small_config(dp={"mode": "toy_central"}), algo)
        assert private.central_dp and private.round_work(results) == {
            "stream": 2 * n * d + d + 2 * n * d, "noise": d}
    finally:
        seam.DEFENSES.pop("toy_work"), seam.DEFENSES.pop("toy_free")
        dp_spec.MECHANISMS.pop("toy_central"), privacy.KINDS.pop("toy_central", None)
        privacy.EVENTS.pop("toy_central", None)
