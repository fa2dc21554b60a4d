"""Distributed DP under secure aggregation (`--dp distributed`, issue 58): the distributed
discrete Gaussian of Kairouz, Liu and Steinke 2021. The sampler's moments, the rounding's norm
bound, the field's round trip, the accountant's epsilon against dp-accounting's own from scratch,
the run's rows, summary and refusals, and a resumed run that ends where an unbroken one ends."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fednet.algorithms.checks import validate
from fednet.core.inproc import run_local
from fednet.errors import ConfigError
from fednet.privacy import distributed as D
from fednet.privacy.accountant import Accountant
from tests.conftest import small_config
from tests.harness import same_arrays

dp_accounting = pytest.importorskip("dp_accounting")


@pytest.mark.parametrize("sig", [0.8, 3.0, 1e6, 2.0 ** 40])
def test_the_discrete_gaussian_has_its_moments(sig):
    x = D.discrete_gaussian(sig, 200_000, np.random.default_rng(1))
    assert x.dtype == np.int64
    se = sig / math.sqrt(x.size)  # the mean's standard error
    assert abs(x.mean()) < 5 * se
    assert x.var() == pytest.approx(sig * sig, rel=0.02)


def test_rounding_keeps_the_norm_bound_and_the_field_round_trip_is_exact_up_to_the_noise():
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=1000) * s for s in (0.01, 0.5, 3.0)]
    z, t, clip = 1e-3, 2, 1.0
    total = np.zeros(1000, np.uint64)
    for u in updates:
        y = D.encode(u, clip, z, t, rng)
        assert y.dtype == np.uint64
        total = total + y  # (wraps modulo 2^64, as the masked sum does)
    clipped = sum(u * min(1.0, clip / np.linalg.norm(u)) for u in updates)
    got = D.decode(total, clip)
    noise_std = z * clip * math.sqrt(len(updates) / t)
    assert np.abs(got - clipped).max() < 6 * noise_std + 3 * clip / D.scale()
    r = D.rounded(updates[2] * (D.scale() / np.linalg.norm(updates[2])), D.delta2(1000), rng)
    assert float(np.linalg.norm(r.astype(np.float64))) <= D.delta2(1000)


def test_rho_is_the_gaussian_mechanisms_when_the_noise_is_large():
    """k = t clients: the sum's noise is z C, as DP-FedAvg's; rho = 1/(2 z^2) up to the
    rounding's norm bound (relative 1e-9 here), and fewer clients' noise is never assumed."""
    for z in (0.3, 1.0, 4.0):
        assert D.rho(z, 11, 11, 15_466) == pytest.approx(0.5 / z ** 2, rel=1e-9)
        assert D.rho(z, 11, 22, 15_466) == pytest.approx(0.25 / z ** 2, rel=1e-9)
    assert D.tau(0.5, 10) > 0 and D.tau(20.0, 10) == 0.0


def test_the_accountant_is_dp_accountings_zcdp_composition():
    key = ("ddg", 0.8, 11, 20, 15_466)
    ours = Accountant("rdp", 1e-5).epsilon([(key, 7)])
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(D.rho(0.8, 11, 20, 15_466)), 7)
    assert ours == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def _cfg(tmp_path, name, **dp):
    return small_config(clients=6, rounds=2, out=str(tmp_path / name), net={"secagg": "plus"},
                        dp={"mode": "distributed", "noise": 0.4, "against": "server", **dp})


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_run_accounts_each_round_from_the_clients_in_its_sum(tmp_path):
    s = run_local(_cfg(tmp_path, "run"), quiet=True)
    assert s["status"] == "completed"
    rows, dp = _rows(tmp_path / "run"), s["dp"]
    t = 4  # floor(0.5 x 6) + 1
    d = int(dp["events"][0][0][4])
    assert dp["mode"] == "distributed" and dp["threshold"] == t
    assert dp["events"] == [[["ddg", 0.4, t, 6, d], 2]]
    acc = Accountant("rdp", dp["delta"])
    assert [r["epsilon"] for r in rows] == [acc.epsilon([(("ddg", 0.4, t, 6, d), n)])
                                            for n in (1, 2)]
    assert all("train_loss" not in r and r["dp_cohort"] == 6 for r in rows)
    assert "against the server" in dp["guarantee"] and dp["against"] == "server"
    assert dp["epsilon_by_adversary"]["server"] == dp["epsilon"] == rows[-1]["epsilon"]
    # every client in every round (6 of 6): nothing to amplify, and replace-one's sensitivity
    # is twice zero-out's, so the released models' epsilon is the larger here
    assert dp["epsilon_by_adversary"]["release"] > dp["epsilon"]
    assert rows[-1]["secagg_field_bits"] == 64


def test_the_masked_vector_carries_no_loss(tmp_path, monkeypatch):
    from fednet.secagg.server import Aggregation

    seen = []
    take = Aggregation.take_input

    def spy(self, cid, y):
        seen.append(y.size)
        return take(self, cid, y)
    monkeypatch.setattr(Aggregation, "take_input", spy)
    s = run_local(_cfg(tmp_path, "spy").replace(rounds=1), quiet=True)
    params = int(s["dp"]["events"][0][0][4])
    assert seen and set(seen) == {params}


def test_a_resumed_run_ends_where_an_unbroken_one_ends(tmp_path):
    ref = run_local(_cfg(tmp_path, "ref").replace(rounds=3), quiet=True)
    part = _cfg(tmp_path, "run").replace(**{"net.checkpoint_every": 1})
    run_local(part, quiet=True)
    got = run_local(part.replace(rounds=3), quiet=True, resume=True)
    with np.load(tmp_path / "ref" / "final_model.npz") as a, \
            np.load(tmp_path / "run" / "final_model.npz") as b:
        assert same_arrays({k: a[k] for k in a.files}, {k: b[k] for k in b.files})
    assert got["dp"] == ref["dp"]


@pytest.mark.parametrize("over, says", [
    ({"net": {"secagg": "off"}}, "--dp distributed adds each client's share of the noise under "
                                 "secure aggregation"),
    ({"dp": {"accountant": "pld"}}, "--dp distributed.s rounds are zCDP events"),
    ({"dp": {"adaptive": True}}, "--dp-adaptive: settings of --dp central"),
    ({"dp": {"sampling": "fixed"}}, "--dp-sampling: settings of --dp central"),
])
def test_what_distributed_dp_cannot_take_is_refused_before_the_run(over, says):
    cfg = small_config(clients=6, rounds=1, net={"secagg": "plus", **over.get("net", {})},
                       dp={"mode": "distributed", "noise": 0.4, **over.get("dp", {})})
    with pytest.raises(ConfigError, match=f"^{says}"):
        validate(cfg)


def test_the_noise_is_calibrated_to_the_budget(tmp_path):
    from fednet.privacy import plan

    cfg = small_config(clients=6, rounds=5, net={"secagg": "plus"},
                       dp={"mode": "distributed", "epsilon": 3.0, "against": "server"})
    z, said = plan.calibrated(validate(cfg))
    assert "calibrated for epsilon 3" in said and "at least 4 clients" in said
    assert "against the server" in said
    eps = Accountant("rdp", plan.delta(cfg)).epsilon([(("ddg", z, 4, 4, D.D_PLAN), 5)])
    assert eps == pytest.approx(3.0, abs=1e-3) and eps <= 3.0 + 1e-9


def test_label_flipping_goes_with_distributed_dp_by_the_facts():
    """An attacker that trains on flipped labels then adds its noise share in secure
    aggregation's input stage, as an honest client does: nothing in the facts refuses it
    (--dp local, whose noise is the client half's own, is refused with an attack)."""
    from fednet.algorithms.checks import validate

    attack = {"name": "labelflip", "malicious": "ids:0"}
    validate(small_config(clients=6, net={"secagg": "plus"}, attack=attack,
                          dp={"mode": "distributed", "noise": 0.5}))
    with pytest.raises(ConfigError, match="--attack does not go with --dp local"):
        validate(small_config(clients=6, attack=attack, dp={"mode": "local", "noise": 0.5}))


def test_a_clients_noise_and_rounding_are_charged_to_its_task():
    """The distributed discrete Gaussian's draws on the clock (opcount "noise"): three an
    attempt of the noise (two geometric, one uniform), one a coordinate per rounding try."""
    import numpy as np

    from fednet import opcount
    from fednet.privacy import distributed as D

    x = np.random.default_rng(0).normal(size=500)
    with opcount.counted() as got:
        D.encode(x, 1.0, 1.0, 10, np.random.default_rng(1))
    assert got["noise"] >= 3 * 500 + 500  # at least one attempt a value, one rounding try
    with opcount.counted() as again:
        D.encode(x, 1.0, 1.0, 10, np.random.default_rng(1))
    assert again == got  # the seeded stream's draws: the same count every time
