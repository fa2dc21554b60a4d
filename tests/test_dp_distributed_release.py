"""Distributed DP against whoever sees only the released models (`--dp-against release`, the
default): each round's zCDP curve (replace one user: rho at span 2) amplified by the sampling of
its cohort, m drawn without replacement from N, by Wang, Balle and Kasiviswanathan's general
bound (privacy/distributed.sampled_rdp), converted by dp-accounting; and against the server (no
amplification), both reported."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.algorithms.checks import validate
from fednet.core.inproc import run_local
from fednet.errors import ConfigError
from fednet.privacy import distributed as D
from fednet.privacy import plan
from fednet.privacy.accountant import Accountant, relation
from tests.conftest import small_config

dp_accounting = pytest.importorskip("dp_accounting")
R = dp_accounting.rdp.rdp_privacy_accountant
ORDERS = np.array(dp_accounting.rdp.RdpAccountant().orders, dtype=np.float64)


@pytest.mark.parametrize("sig, gamma", [(0.5, 100 / 1400), (1.0, 100 / 1400), (3.0, 0.3),
                                        (1.5, 1000 / 1400)])
def test_the_sampled_bound_is_dp_accountings_theorem_9_where_it_computes_it(sig, gamma):
    """dp-accounting's sampled Gaussian without replacement takes Theorem 9 itself above order
    256 (Theorem 27's Gaussian-only forward differences below): there the two agree; below,
    the general bound is never under the Gaussian-only one but where it takes no sampling's
    r a (which dp-accounting does not); never above no sampling."""
    r = 0.5 / sig ** 2
    ours = D.sampled_rdp(r, gamma, ORDERS)
    theirs = R._compute_rdp_sample_wor_gaussian(gamma, sig, ORDERS)
    high = ORDERS > 256
    assert high.any()
    np.testing.assert_allclose(ours[high], theirs[high], rtol=1e-12)
    assert np.all(ours >= np.minimum(theirs, r * ORDERS) * (1 - 1e-12))
    assert np.all(ours <= r * ORDERS * (1 + 1e-12))
    assert np.array_equal(D.sampled_rdp(r, 1.0, ORDERS), r * ORDERS)


def test_a_sampled_round_is_its_bound_converted_by_dp_accounting():
    n, m, z, t, k, d = 1400, 100, 2.0, 51, 100, 650
    key = ("ddg_wor", n, m, z, t, k, d)
    assert relation([key]) == dp_accounting.NeighboringRelation.REPLACE_ONE
    ours = Accountant("rdp", 1e-6).epsilon([(key, 5)])
    rdp = 5 * D.sampled_rdp(D.rho(z, t, k, d, span=2), m / n, ORDERS)
    assert ours == float(R.compute_epsilon(ORDERS, rdp, 1e-6)[0])
    server = Accountant("rdp", 1e-6).epsilon([(("ddg", z, t, k, d), 5)])
    assert ours < server  # (a cohort of 7%: the amplification outweighs replace-one's 2x)
    with pytest.raises(ValueError, match="cannot mix"):
        Accountant("rdp", 1e-6).epsilon([(key, 1), (("poisson", 0.1, 1.0), 1)])


def _cfg(**dp):
    return small_config(clients=100, rounds=5, algo={"fraction": 0.05}, net={"secagg": "plus"},
                        dp={"mode": "distributed", "epsilon": 3.0, **dp})


def test_the_noise_is_calibrated_against_the_released_models_by_default():
    cfg = validate(_cfg())
    z, said = plan.calibrated(cfg)
    assert cfg.dp.against == "release" and "against the released models: cohorts of 5 of 100" \
        in said
    t = plan.ddg_threshold(cfg)
    key = ("ddg_wor", 100, 5, z, t, t, D.D_PLAN)
    eps = Accountant("rdp", plan.delta(cfg)).epsilon([(key, 5)])
    assert eps <= 3.0 + 1e-9 and eps == pytest.approx(3.0, abs=1e-3)
    z_server, _ = plan.calibrated(validate(_cfg(against="server")))
    assert z < z_server  # (a cohort of 5%: amplified)


def test_dp_against_is_a_setting_of_distributed_dp_only():
    with pytest.raises(ConfigError, match="^--dp-against server: a setting of --dp distributed"):
        validate(small_config(clients=6, dp={"mode": "central", "noise": 1.0,
                                             "against": "server"}))


@pytest.mark.slow  # (a run: ~4 s)
def test_a_run_reports_both_and_spends_the_one_it_names(tmp_path):
    cfg = small_config(clients=8, rounds=2, algo={"fraction": 0.5}, net={"secagg": "plus"},
                       dp={"mode": "distributed", "noise": 0.8}, out=str(tmp_path / "r"))
    s = run_local(cfg, quiet=True)
    dp = s["dp"]
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    hist = [(tuple(k), c) for k, c in dp["events"]]
    acc = Accountant("rdp", dp["delta"])
    want = {who: acc.epsilon(h) for who, h in plan.ddg_histories(cfg, hist).items()}
    assert dp["against"] == "release" and dp["epsilon_by_adversary"] == want
    assert dp["epsilon"] == rows[-1]["epsilon"] == want["release"]
    assert "replace one user" in dp["relation"] and "against the server" in dp["guarantee"]
    # (a cohort of half the clients: the released models' epsilon is the larger, and the
    # end-of-run table says each one's relation and why)
    from fednet.metrics.report import summary_table
    assert want["release"] > want["server"]
    assert dp["relation_by_adversary"] == plan.ADVERSARY_RELATIONS
    table = summary_table(s)
    for who, label in (("release", "released models"), ("server", "server")):
        assert f"epsilon vs {label}" in table and plan.ADVERSARY_RELATIONS[who] in table
    assert "epsilon: release > server" in table and plan.RELATIONS_DIFFER in table


def test_dp_survivors_sets_the_clients_the_noise_is_scaled_for():
    """t = floor(F m) + 1, at most m: --dp-survivors 1 scales each share for the whole cohort
    (the sum carries z C when all survive, and a round that loses one fails); 0 takes
    --secagg-threshold's."""
    def t(**dp):
        return plan.ddg_threshold(small_config(
            clients=1400, algo={"fraction": 100 / 1400}, net={"secagg": "plus"},
            dp={"mode": "distributed", "noise": 1.0, **dp}))
    assert (t(), t(survivors=0.9), t(survivors=1.0)) == (51, 91, 100)
    with pytest.raises(ConfigError, match="^--dp-survivors 1: a setting of --dp distributed"):
        validate(small_config(clients=6, dp={"mode": "central", "noise": 1.0, "survivors": 1}))


@pytest.mark.slow  # (three short runs: ~8 s)
def test_a_resumed_run_is_checked_against_the_epsilon_its_rows_report(tmp_path):
    """Every client in every round (6 of 6): the released models' epsilon (replace one user)
    is above the server's, and a resumed run checks its state against the former, as its rows
    report it (a check against the server's would refuse every resume)."""
    def cfg(name):
        return small_config(clients=6, rounds=2, out=str(tmp_path / name),
                            net={"secagg": "plus", "checkpoint_every": 1},
                            dp={"mode": "distributed", "noise": 0.4})
    ref = run_local(cfg("ref").replace(rounds=3), quiet=True)
    run_local(cfg("run"), quiet=True)
    got = run_local(cfg("run").replace(rounds=3), quiet=True, resume=True)
    assert got["status"] == "completed" and got["dp"] == ref["dp"]
    assert got["dp"]["epsilon"] == got["dp"]["epsilon_by_adversary"]["release"] > \
        got["dp"]["epsilon_by_adversary"]["server"]


def test_the_report_names_each_epsilons_adversary_and_relation():
    """Both epsilons of --dp distributed are shown one line each, with whom they hold against
    and their neighbouring relation; where the released models' is the larger (large cohorts:
    replace-one's doubled sensitivity outweighs the amplification), the table says why."""
    from fednet.metrics.what_ran import privacy_rows

    def rows(release, server):
        by = {"server": server, "release": release}
        return dict(privacy_rows({"mode": "distributed", "epsilon": release, "delta": 1e-6,
                                  "against": "release", "epsilon_by_adversary": by,
                                  **plan.adversary_relations(by)}))

    got = rows(2.30, 1.30)
    assert got["epsilon vs released models"].startswith("2.3 at delta 1e-06 (whoever sees "
                                                        "only the released models")
    assert "neighbours: replace one user" in got["epsilon vs released models"]
    assert got["epsilon vs server"].startswith("1.3 at delta 1e-06 (the server")
    assert "neighbours: one user's update replaced by zero" in got["epsilon vs server"]
    assert "different neighbouring relations" in got["epsilon: release > server"]
    assert all("\n" not in v for v in got.values())
    assert "epsilon: release > server" not in rows(1.30, 2.30)


@pytest.mark.parametrize("codec", ["fp16", "topk:0.1", "sign", "int8", "qsgd"])
def test_a_codec_under_distributed_dp_is_refused_with_what_to_do(codec):
    """--dp distributed rounds each value onto its noise's grid: every codec is refused with that
    reason and told to drop --compress, never to use a gridded codec (refused as well)."""
    with pytest.raises(ConfigError) as e:
        validate(small_config(clients=6, net={"secagg": "plus", "compress": codec},
                              dp={"mode": "distributed", "noise": 1.0}))
    said = str(e.value)
    assert said.startswith(f"--secagg plus: --compress {codec}: --dp distributed rounds each "
                           "value onto its own grid") and said.endswith("drop --compress")
    assert "common grid" not in said and "\n" not in said


def test_dp_sgd_under_distributed_dp_is_told_to_drop_dp_sgd_not_to_add_distributed():
    with pytest.raises(ConfigError, match="reads each client's update, which secure aggregation "
                       "hides; drop --dp-sgd-noise ") as e:
        validate(small_config(clients=6, net={"secagg": "plus"},
                              dp={"mode": "distributed", "noise": 1.0, "sgd_noise": 1.0}))
    assert "use --dp distributed" not in str(e.value)
    with pytest.raises(ConfigError, match="hides; use --dp distributed"):
        validate(small_config(clients=6, net={"secagg": "plus"}, dp={"sgd_noise": 1.0}))


@pytest.mark.parametrize("dp, says", [
    ({"sampling": "fixed"}, "--dp-sampling: settings of --dp central (under --dp distributed each "
     "cohort is floor(fraction N) clients drawn without replacement, as its accounting takes "
     "them (amplified against the released models, not the server)); drop it"),
    ({"adaptive": True}, "--dp-adaptive: settings of --dp central (under --dp distributed the "
     "server sees only the noisy sum, no update's norm to adapt the clip to); drop it")])
def test_central_dps_settings_are_refused_with_their_own_reason(dp, says):
    """--dp-sampling's refusal says how distributed DP's cohorts are drawn (it is amplified
    against the released models: not 'sampling amplifies nothing'), --dp-adaptive's why no
    clip adapts; each says what to do."""
    with pytest.raises(ConfigError) as e:
        validate(small_config(clients=6, rounds=1, net={"secagg": "plus"},
                              dp={"mode": "distributed", "noise": 0.4, **dp}))
    assert str(e.value) == says
