"""The epsilon fednet reports is dp-accounting's for the same mechanism, computed here from scratch
with the library's own accountants (docs/algorithms.md §11.5): Poisson and fixed-size sampling at
three settings each (RDP), Poisson with PLD, a whole run's rows, and the calibration of the noise
to a target epsilon (within 1%). DP-SGD's per-example epsilon is also Opacus's own accountant's."""
from __future__ import annotations

import json

import pytest

dp_accounting = pytest.importorskip("dp_accounting")

from fednet.privacy.accountant import Accountant, calibrate  # noqa: E402
from fednet.privacy import plan  # noqa: E402
from tests.conftest import small_config  # noqa: E402

REL = dp_accounting.NeighboringRelation


def _rdp(event, count: int, delta: float, relation=None) -> float:
    """dp-accounting's RDP accountant, composing `event` `count` times, at delta."""
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation or REL.ADD_OR_REMOVE_ONE)
    return acc.compose(event, count).get_epsilon(delta)


def _poisson(q: float, z: float):
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))


@pytest.mark.parametrize("q, z, rounds, delta", [(0.001, 1.0, 100, 1e-6), (0.01, 0.7, 300, 1e-5),
                                                 (0.1, 2.0, 50, 1e-3)])
def test_poisson_sampling_rdp(q, z, rounds, delta):
    """Central DP with Poisson sampling: PoissonSampled(q, Gaussian(z)), add or remove one."""
    want = _rdp(_poisson(q, z), rounds, delta)
    got = Accountant("rdp", delta).epsilon([(plan.central_key("poisson", z, q, 10**6, 1), rounds)])
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n, m, z, rounds, delta", [(1000, 10, 1.0, 100, 1e-3),
                                                    (10**6, 1000, 1.5, 200, 1e-6),
                                                    (50, 25, 3.0, 20, 0.01)])
def test_fixed_size_sampling_rdp(n, m, z, rounds, delta):
    """Central DP with m of n without replacement: replace one user changes the clipped sum by
    up to 2C, so the accountant's multiplier is z/2 (docs/algorithms.md §11.2)."""
    event = dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.GaussianDpEvent(z / 2))
    want = _rdp(event, rounds, delta, REL.REPLACE_ONE)
    got = Accountant("rdp", delta).epsilon([(plan.central_key("fixed", z, m / n, n, m), rounds)])
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("q, z, rounds, delta", [(0.01, 1.0, 20, 1e-5), (0.2, 3.0, 10, 1e-3)])
def test_poisson_sampling_pld(q, z, rounds, delta):
    acc = dp_accounting.pld.PLDAccountant()
    want = acc.compose(_poisson(q, z), rounds).get_epsilon(delta)
    got = Accountant("pld", delta).epsilon([(("poisson", q, z), rounds)])
    assert got == pytest.approx(want, rel=1e-9)


def test_a_history_of_several_events_is_their_composition():
    """Rounds with different cohorts (fixed-size sampling among fewer live clients)."""
    h = [(("fixed", 100, 10, 0.5), 3), (("fixed", 90, 9, 0.5), 2)]
    d = dp_accounting
    event = d.ComposedDpEvent([
        d.SelfComposedDpEvent(d.SampledWithoutReplacementDpEvent(100, 10, d.GaussianDpEvent(0.5)), 3),
        d.SelfComposedDpEvent(d.SampledWithoutReplacementDpEvent(90, 9, d.GaussianDpEvent(0.5)), 2)])
    want = _rdp(event, 1, 1e-4, REL.REPLACE_ONE)
    assert Accountant("rdp", 1e-4).epsilon(h) == pytest.approx(want, rel=1e-12)


def test_local_dp_is_a_gaussian_mechanism_per_task():
    """Local DP: each task releases clip(update) + N(0, (zC)^2): sensitivity 2C, multiplier z/2."""
    want = _rdp(dp_accounting.GaussianDpEvent(4.0 / 2), 7, 1e-5)
    assert Accountant("rdp", 1e-5).epsilon([(plan.local_key(4.0), 7)]) == pytest.approx(want)


@pytest.mark.parametrize("mode, sampling, target, accountant", [
    ("central", "poisson", 1.0, "rdp"), ("central", "poisson", 3.0, "rdp"),
    ("central", "poisson", 8.0, "rdp"), ("central", "fixed", 3.0, "rdp"),
    ("local", "poisson", 8.0, "rdp"),
    pytest.param("central", "poisson", 3.0, "pld", marks=pytest.mark.slow)])  # PLD: 15 s
def test_calibration_reaches_the_target_within_one_percent(mode, sampling, target, accountant):
    cfg = small_config(clients=10000, rounds=20 if accountant == "pld" else 100,
                       algo={"fraction": 0.01},
                       dp={"mode": mode, "epsilon": target, "delta": 1e-6, "sampling": sampling,
                           "accountant": accountant})
    z, said = plan.calibrated(cfg)
    eps = plan.planned_epsilon(cfg, z)
    assert target * 0.99 <= eps <= target * (1 + 1e-9), (z, eps)
    assert f"{z:.6g}" in said and f"epsilon {target:g}" in said


def test_calibrate_is_dp_accountings_own():
    z = calibrate(lambda x: ("poisson", 0.01, x), 50, 2.0, 1e-5, "rdp")
    want = dp_accounting.calibrate_dp_mechanism(
        dp_accounting.rdp.RdpAccountant,
        lambda x: dp_accounting.SelfComposedDpEvent(_poisson(0.01, x), 50), 2.0, 1e-5,
        dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-6)
    assert z == want


@pytest.mark.parametrize("sampling, fraction", [("poisson", 0.5), ("fixed", 0.5)])
def test_a_runs_rows_report_dp_accountings_epsilon(tmp_path, sampling, fraction):
    """Every row's epsilon is dp-accounting's for the rounds done so far; so is the summary's."""
    from fednet.core.inproc import run_local

    cfg = small_config(clients=4, rounds=3, out=str(tmp_path / "r"), algo={"fraction": fraction},
                       dp={"mode": "central", "noise": 0.8, "clip": 0.5, "sampling": sampling})
    summary = run_local(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    delta = plan.default_delta(4)  # min(1e-5, 1/(10 N))
    for r in rows:
        if sampling == "poisson":
            want = _rdp(_poisson(fraction, 0.8), r["round"] + 1, delta)
        else:
            event = dp_accounting.SampledWithoutReplacementDpEvent(
                4, 2, dp_accounting.GaussianDpEvent(0.4))
            want = _rdp(event, r["round"] + 1, delta, REL.REPLACE_ONE)
        assert r["epsilon"] == pytest.approx(want, rel=1e-12)
    assert summary["dp"]["epsilon"] == rows[-1]["epsilon"] and summary["dp"]["delta"] == delta
    assert summary["dp"]["rounds_accounted"] == 3


@pytest.mark.parametrize("z, q, steps", [(1.0, 1 / 20, 60), (1.1, 0.01, 1000), (0.8, 0.1, 300)])
def test_dpsgd_epsilon_is_opacus_accountants(z, q, steps):
    """DP-SGD's per-example epsilon (dp-accounting's RDP) against Opacus's RDP accountant."""
    accountants = pytest.importorskip("opacus.accountants")
    acc = accountants.RDPAccountant()
    acc.history = [(z, q, steps)]
    got = Accountant("rdp", 1e-5).epsilon([(plan.sgd_key(z, q), steps)])
    assert got == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
