"""The update path's seam (issue 58, algorithms/seam.py): a defense and an attack registered the
way a plugin registers them, run in a real fednet local run; the composition rules derived
from their declared facts; the refusals before any data loads."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.algorithms import robust_spec as S
from fednet.algorithms.checks import validate
from fednet.algorithms.seam import AttackSpec, DefenseSpec, Facts
from fednet.core.inproc import run_local
from fednet.errors import ConfigError
from tests.conftest import small_config


def _coordinate_max(x, w, f, p, center):
    """A toy rule with a result worked out by hand: each coordinate's largest value."""
    return x.max(axis=0), [int(np.argmax(x[:, 0]))], {"toy_rows": float(len(x))}


def _zero(delta, p, gen):
    return np.zeros_like(delta)


@pytest.fixture(scope="module", autouse=True)
def pieces():
    d = S.register_defense(DefenseSpec("toy_max", _coordinate_max, least=lambda f: f + 2))
    a = S.register_attack(AttackSpec("toy_zero", forge=_zero))
    yield d, a
    S.DEFENSES.pop("toy_max"), S.ATTACKS.pop("toy_zero")


def test_a_registered_rule_runs_on_the_rounds_updates():
    """The rule sees the n x d updates (float64, one row per result) and its outcome is the
    round's update; its metrics and the f the --malicious share gives are in the outcome."""
    from fednet.algorithms.robust import apply

    x = np.array([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0], [0.0, 0.0]])
    out = apply("toy_max", S.P.NoParams(), 0.25, x, np.ones(4))
    assert out.update.tolist() == [3.0, 4.0] and out.chosen == [1]
    assert out.metrics == {"robust_f": 1.0, "toy_rows": 4.0}  # f = ceil(0.25 x 4)
    refused = apply("toy_max", S.P.NoParams(), 0.5, x[:3], np.ones(3))  # f = 2 needs n >= 4
    assert refused.update is None and "needs n >= 4" in refused.why


def test_a_registered_defense_and_attack_in_a_real_run(tmp_path):
    """--defense toy_max --attack toy_zero under fednet local: the rows carry the rule's
    metric, and the attackers' zero updates leave the maximum of the honest ones."""
    cfg = small_config(clients=5, rounds=1, out=str(tmp_path / "r"), algo={"fraction": 1.0},
                       defense={"name": "toy_max"},
                       attack={"name": "toy_zero", "malicious": "ids:0"})
    s = run_local(cfg, quiet=True)
    assert s["status"] == "completed" and s["defense"]["name"] == "toy_max"
    import json
    row = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["toy_rows"] == 5.0 and row["results"] == 5


def test_the_composition_rules_come_from_the_facts():
    """Under --secagg a rule that reads each update and an attack that forges one are refused
    (whoever registered them); a rule that only needs the sum, and label flipping (poisoned
    data, an honest-looking update), are not."""
    each, summed = DefenseSpec("e", "m:f"), DefenseSpec("s", "m:f", facts=Facts())
    forger, poisoner = AttackSpec("a"), AttackSpec("p", facts=Facts(poisons_data=True))
    none_d, none_a = S.defense_spec("none"), S.attack_spec("none")
    assert "reads each client's update" in S.seam.problems(each, none_a, "plus")
    assert "forges the update" in S.seam.problems(none_d, forger, "full")
    assert S.seam.problems(summed, poisoner, "full") == ""
    assert S.seam.problems(each, forger, "off") == ""


def test_refusals_name_the_piece_before_any_data_loads():
    with pytest.raises(ConfigError, match="--defense 'nope' is not a defense; choose one of none"):
        validate(small_config(defense={"name": "nope"}))
    with pytest.raises(ConfigError, match="--defense toy_max does not go with --secagg plus"):
        validate(small_config(clients=10, algo={"fraction": 1.0}, defense={"name": "toy_max"},
                              net={"secagg": "plus"}))
    S.register_attack(AttackSpec("toy_noforge", facts=Facts(poisons_data=True)))
    try:
        with pytest.raises(ConfigError, match="--attack toy_noforge registers no forgery"):
            validate(small_config(clients=10, attack={"name": "toy_noforge"}))
    finally:
        S.ATTACKS.pop("toy_noforge")


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ConfigError, match="--defense krum is registered twice"):
        S.register_defense(DefenseSpec("krum", _coordinate_max))


def test_label_flipping_runs_under_secure_aggregation(tmp_path):
    """Its facts (poisoned data, an update that still sums in the field) let label flipping
    compose with --secagg: the attackers train on flipped labels and mask what they trained,
    so the round's sum moves away from the clean run's."""
    from tests.harness import final_model

    def run(name, attack):
        cfg = small_config(clients=6, rounds=1, out=str(tmp_path / name), algo={"fraction": 1.0},
                           net={"secagg": "plus"}, attack={"name": attack, "malicious": "ids:0-1"})
        assert run_local(cfg, quiet=True)["status"] == "completed"
        return final_model(tmp_path / name)

    clean, flipped = run("clean", "none"), run("flipped", "labelflip")
    assert any(not np.array_equal(clean[k], flipped[k]) for k in clean)


# ---- a DP mechanism of a plugin (docs/extending.md's Laplace mechanism) ----------------------


def _laplace_noise(shapes, scale, gen):
    return {n: gen.laplace(0.0, scale, shapes[n]) for n in sorted(shapes)}


def _laplace_event(z, q):
    import dp_accounting

    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.LaplaceDpEvent(z))


@pytest.fixture()
def laplace():
    from fednet.algorithms import dp_spec
    from fednet.api import DPSpec, register_dp
    from fednet import privacy

    m = register_dp(DPSpec("toy_laplace", noise=_laplace_noise, event=_laplace_event, norm="l1",
                           samplings=("poisson",), accountants=("pld",)))
    yield m
    dp_spec.MECHANISMS.pop("toy_laplace"), privacy.KINDS.pop("toy_laplace")
    privacy.EVENTS.pop("toy_laplace")


def test_a_mechanisms_noise_and_norm_on_two_toy_updates(laplace):
    """l1 clipping to C = 2: (3, -1) has l1 norm 4 and becomes (1.5, -0.5); (0.5, 0.5) stays.
    The mean is theta + (their sum (2, 0) + Laplace(0, z C) noise) / D, the noise drawn from the
    round's generator by the plugin's function."""
    from fednet.algorithms.dp_mean import PrivateMean

    ref = {"w": np.array([1.0, 1.0], np.float32)}
    mean = PrivateMean(ref, 2.0, 0.5 * 2.0, 4.0, lambda: np.random.default_rng(3),
                       laplace.noised, laplace.norm)
    mean.add({"w": np.array([4.0, 0.0], np.float32)}, key=0)
    mean.add({"w": np.array([1.5, 1.5], np.float32)}, key=1)
    want = np.array([1.0, 1.0]) + (np.array([2.0, 0.0])
                                   + np.random.default_rng(3).laplace(0.0, 1.0, 2)) / 4.0
    assert mean.clipped == 1 and np.allclose(mean.mean64()["w"], want, rtol=0, atol=1e-12)
    assert mean.result()["w"].dtype == np.float32


def test_a_plugin_mechanism_in_a_real_run_accounts_with_its_own_event(laplace, tmp_path):
    """--dp toy_laplace under fednet local: the summary's epsilon is dp-accounting's PLD epsilon
    of the plugin's event composed over the rounds (computed here from scratch), and the
    checkpointed events name the piece."""
    import dp_accounting
    from dp_accounting import pld

    cfg = small_config(clients=4, rounds=2, out=str(tmp_path / "lap"), algo={"fraction": 0.5},
                       dp={"mode": "toy_laplace", "noise": 1.0, "clip": 0.05,
                           "accountant": "pld"})
    s = run_local(validate(cfg), quiet=True)
    assert s["status"] == "completed", s.get("error")
    acc = pld.PLDAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(_laplace_event(1.0, 0.5), 2))
    assert s["dp"]["epsilon"] == pytest.approx(acc.get_epsilon(s["dp"]["delta"]), rel=1e-9)
    assert s["dp"]["events"] == [[["piece", "toy_laplace", 1.0, 0.5], 2]]


@pytest.mark.parametrize("over, says", [
    ({"dp": {"accountant": "rdp"}}, "--dp-accountant rdp: --dp toy_laplace's event is taken by "
     "dp-accounting's pld accountant"),
    ({"dp": {"sampling": "fixed"}}, "--dp-sampling fixed: --dp toy_laplace accounts for poisson"),
    ({"net": {"secagg": "plus"}, "clients": 6}, "--dp toy_laplace's clipping or accounting reads "
     "each client's update"),
    ({"defense": {"name": "trimmed_mean"}, "clients": 6},
     "--defense trimmed_mean does not go with --dp toy_laplace: a robust rule runs between"),
])
def test_a_plugin_mechanism_is_refused_by_its_facts_before_any_data(laplace, over, says):
    dp = {"mode": "toy_laplace", "noise": 1.0, "accountant": "pld", **over.pop("dp", {})}
    with pytest.raises(ConfigError) as e:
        validate(small_config(dp=dp, **over))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_plugin_mechanism_adds_its_noise_at_the_server():
    from fednet.api import DPSpec, register_dp

    with pytest.raises(ConfigError, match="a mechanism of a plugin adds its noise at the server"):
        register_dp(DPSpec("toy_local", kind="local", noise=_laplace_noise))


@pytest.mark.parametrize("noise, event, says", [
    (lambda shapes, scale, gen: {"w": np.zeros(1)}, _laplace_event,
     "its noise(shapes, scale, gen) must give one finite array per name"),
    (lambda shapes, scale, gen: 1 / 0, _laplace_event,
     "its noise(shapes, scale, gen) failed: ZeroDivisionError"),
    (_laplace_noise, lambda z, q: "not an event",
     "dp-accounting's pld accountant does not take its event(z, q)")])
def test_a_plugin_mechanism_that_does_not_work_is_refused_before_any_data(noise, event, says):
    from fednet.algorithms import dp_spec
    from fednet.api import DPSpec, register_dp
    from fednet import privacy

    register_dp(DPSpec("toy_bad", noise=noise, event=event, samplings=("poisson",),
                       accountants=("pld",)))
    try:
        with pytest.raises(ConfigError) as e:
            validate(small_config(dp={"mode": "toy_bad", "noise": 1.0, "accountant": "pld"}))
        assert says in str(e.value) and "\n" not in str(e.value)
    finally:
        dp_spec.MECHANISMS.pop("toy_bad"), privacy.KINDS.pop("toy_bad")
        privacy.EVENTS.pop("toy_bad")
