"""Robust aggregation (algorithms/robust.py) and the attacks' math (algorithms/attacks.py) on toy
vectors whose results are worked out by hand in the comments; who is malicious, the parameters
and the refusals (algorithms/robust_spec.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fednet.algorithms import attacks as A
from fednet.algorithms import robust as R
from fednet.algorithms import robust_spec as S
from fednet.config import RunConfig
from fednet.errors import ConfigError

# five 2-D updates: a cluster around the origin and one far away (r3)
X5 = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [10.0, 10.0], [1.0, 1.0]])


def test_squared_distances_by_hand():
    d = R.sq_distances(X5)
    assert d[0].tolist() == [0, 1, 1, 200, 2]
    assert d[3].tolist() == [200, 181, 181, 0, 162]
    assert (d == d.T).all()


def test_krum_by_hand():
    # f = 1, n = 5: each score sums the n - f - 2 = 2 smallest distances to the others:
    # s0 = 1+1, s1 = 1+1, s2 = 1+1, s3 = 162+181, s4 = 1+1; the first least is r0
    assert R.krum_scores(R.sq_distances(X5), 1).tolist() == [2, 2, 2, 343, 2]
    agg, chosen = R.krum(X5, 1)
    assert chosen == [0] and agg.tolist() == [0, 0]


def test_multi_krum_by_hand():
    # m = n - f = 4 least scores: r0, r1, r2, r4, averaged plainly: (0.5, 0.5)
    agg, chosen = R.multi_krum(X5, 1, 4)
    assert chosen == [0, 1, 2, 4] and agg.tolist() == [0.5, 0.5]


def test_median_and_trimmed_mean_by_hand():
    # x: 0 1 0 10 1 -> sorted 0 0 1 1 10: median 1, trimmed (k=1) mean of 0 1 1 = 2/3
    assert R.median(X5).tolist() == [1, 1]
    assert np.allclose(R.trimmed_mean(X5, 1), [2 / 3, 2 / 3], rtol=0, atol=1e-15)
    assert np.array_equal(R.trimmed_mean(X5, 0), X5.mean(axis=0))
    assert R.median(X5[:4]).tolist() == [0.5, 0.5]  # even n: the mean of the two middle ones
    with pytest.raises(ValueError):
        R.trimmed_mean(X5, 3)


def test_bulyan_by_hand():
    # 1-D values 0 1 2 3 4 5 100, f = 1: theta = 5 chosen by Krum one at a time:
    #   n'=7, 4 neighbours: scores 30 15 10 10 15 30 ..: 2 (first least)
    #   n'=6, 3 neighbours over 0 1 3 4 5 100: 26 14 9 11 21 ..: 3
    #   n'=5, 2 neighbours over 0 1 4 5 100: 17 10 10 17 ..: 1
    #   n'=4, 1 neighbour over 0 4 5 100: 16 1 1 ..: 4
    #   n'=3, 1 neighbour over 0 5 100: 25 25 ..: 0
    # then beta = theta - 2f = 3 closest to the median 2 of 0 1 2 3 4: 2, 1, 3 -> 2
    x = np.array([0.0, 1, 2, 3, 4, 5, 100])[:, None]
    agg, chosen = R.bulyan(x, 1)
    assert chosen == [2, 3, 1, 4, 0]
    assert agg.tolist() == [2.0]


def test_norm_bound_by_hand():
    x = np.array([[3.0, 4.0], [0.0, 1.0]])  # norms 5 and 1
    agg, m = R.norm_bound(x, np.array([1.0, 1.0]), 2.5)  # (3,4) -> (1.5,2): mean (0.75, 1.5)
    assert m == 2.5 and agg.tolist() == [0.75, 1.5]
    agg, m = R.norm_bound(x, np.array([1.0, 3.0]), 2.5)  # weighted: ((1.5,2) + 3 (0,1)) / 4
    assert agg.tolist() == [0.375, 1.25]
    agg, m = R.norm_bound(x, np.array([1.0, 1.0]), 0)  # M = median norm 3: (1.8, 2.4) and (0, 1)
    assert m == 3 and np.allclose(agg, [0.9, 1.7], rtol=0, atol=1e-15)


def test_centered_clip_by_hand():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    # v0 = 0, tau = 1: (3,4) clipped to (0.6,0.8), (0,0) stays: v = (0.3, 0.4)
    assert np.allclose(R.centered_clip(x, np.zeros(2), 1.0, 1)[0], [0.3, 0.4], atol=1e-15)
    # a second pass: (2.7,3.6) (norm 4.5) -> (0.6,0.8); (-0.3,-0.4) (norm 0.5) stays: + (0.15,0.2)
    assert np.allclose(R.centered_clip(x, np.zeros(2), 1.0, 2)[0], [0.45, 0.6], atol=1e-15)
    assert np.allclose(R.centered_clip(x, np.zeros(2), 100.0, 1)[0], x.mean(axis=0))  # no clip


def test_apply_refuses_a_round_too_small_with_its_reason():
    p = S.ByzantineCount(f=1)
    out = R.apply("krum", p, 0.0, X5[:4], np.ones(4))  # n = 4 < 2f + 3 = 5
    assert out.update is None and out.metrics == {"robust_refused": 1.0}
    assert "needs n >= 5" in out.why and "krum" in out.why and "4 results" in out.why


def test_f_follows_the_malicious_share():
    assert S.byzantine_count(-1, 0.2, 100) == 20
    assert S.byzantine_count(-1, 0.2, 11) == 3  # ceil(2.2)
    assert S.byzantine_count(-1, 0.0, 11) == 0
    assert S.byzantine_count(2, 0.5, 11) == 2
    assert S.least_results("bulyan", 20) == 83 and S.least_results("krum", 2) == 7


def test_robust_mean_takes_the_place_of_the_mean():
    model = {"w": np.zeros((2, 1), np.float32), "n": np.array(7)}
    rm = R.RobustMean("median", S.ByzantineCount(f=0), 0.0, model)
    for cid, v in ((2, [1.0, 5.0]), (0, [3.0, -1.0]), (1, [2.0, 2.0])):  # any arrival order
        rm.add({"w": np.array(v, np.float32)[:, None], "n": np.array(cid)}, 10, key=cid)
    out = rm.result()
    assert out["w"].dtype == np.float32 and out["w"].ravel().tolist() == [2.0, 2.0]
    assert out["n"] == 0  # non-floating entries: the smallest client id's
    assert rm.mean64()["w"].dtype == np.float64 and not rm.refused


# ---- the attacks' math ---------------------------------------------------------------------------

def test_alie_and_ipm_by_hand():
    h = np.array([[0.0, 0.0], [2.0, 4.0]])  # mean (1, 2), sample std (sqrt 2, 2 sqrt 2)
    assert np.allclose(A.alie(h, 1.0), [1 - math.sqrt(2), 2 - 2 * math.sqrt(2)], atol=1e-15)
    assert A.ipm(h, 0.5).tolist() == [-0.5, -1.0]
    assert A.alie(h[:1], 3.0).tolist() == [0, 0]  # one update: no spread
    assert A.sign_flip(np.array([1.0, -2.0]), 4).tolist() == [-4, 8]


def test_alie_z_max():
    # n = 100, m = 20: s = floor(51) - 20 = 31, Phi(z) = 69/100
    assert S.alie_z(100, 20) == pytest.approx(0.49585, abs=1e-5)
    assert S.alie_z(50, 12) == pytest.approx(0.58284, abs=1e-5)  # Phi(z) = 36/50


def test_min_max_and_min_sum_by_hand():
    # H: (2,0), (0,0), (0,0); mu = (2/3, 0), unit-vector perturbation (-1, 0), mal = mu + g p.
    # min-max: max((4/3 + g)^2, (2/3 - g)^2) <= 4 (the largest honest distance) -> g = 2/3
    # min-sum: (4/3 + g)^2 + 2 (2/3 - g)^2 = 8/3 + 3 g^2 <= 8 (the largest honest sum) -> g = 4/3
    h = np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    assert np.allclose(A.min_max(h, "minmax", "unit_vec", 10.0), [0, 0], atol=1e-4)
    assert np.allclose(A.min_max(h, "minsum", "unit_vec", 10.0), [-2 / 3, 0], atol=1e-4)
    mal = A.min_max(h, "minmax", "sign", 10.0)  # sign: the same direction here
    assert np.allclose(mal, [0, 0], atol=1e-4)
    assert max(np.sum((h - mal) ** 2, axis=1)) <= A.min_max_bound(h, "minmax")


# ---- who is malicious, parameters, refusals -------------------------------------------------------

def _cfg(**over) -> RunConfig:
    return RunConfig().replace(**over)


def test_malicious_ids_drawn_from_the_seed():
    cfg = _cfg(clients=100, **{"attack.name": "signflip", "attack.malicious": "0.2"})
    ids = S.malicious_ids(cfg)
    assert len(ids) == 20 and ids == sorted(set(ids)) and ids == S.malicious_ids(cfg)
    assert ids != S.malicious_ids(cfg.replace(seed=1))
    assert S.malicious_ids(cfg.replace(**{"attack.name": "none"})) == []
    # a defense's f assumes the declared share, with or without an attack
    assert S.assumed_share(cfg.replace(**{"attack.name": "none"})) == 0.2
    assert S.malicious_ids(cfg.replace(**{"attack.malicious": "0"})) == []
    assert S.malicious_ids(cfg.replace(**{"attack.malicious": "ids:3,7-9+1"})) == [1, 3, 7, 8, 9]
    assert len(S.malicious_ids(cfg.replace(clients=6, **{"attack.malicious": "0.01"}))) == 1
    for bad in ("1.5", "x", "ids:100", "ids:a"):
        with pytest.raises(ConfigError, match="--malicious"):
            S.parse_malicious(bad, 100)


def test_param_routing():
    split = S.route_params({"mu": "0.1", "z": "1", "f": "2"}, {"mu"}, "alie", "krum")
    assert split == {"algo": {"mu": "0.1"}, "attack": {"z": "1"}, "defense": {"f": "2"}}
    with pytest.raises(ConfigError, match="not a parameter of the algorithm, the attack"):
        S.route_params({"nope": "1"}, {"mu"}, "alie", "krum")
    assert S.route_params({"nope": "1"}, {"mu"}, "none", "none")["algo"] == {"nope": "1"}


def test_attack_and_defense_param_names_are_unique():
    """--param finds its owner by name: no attack or defense parameter is also a built-in
    algorithm's (nor the attacks' and the defenses' the same)."""
    from fednet.algorithms.registry import REGISTRY
    from fednet.config.declare import declared

    algo = {i.name for s in REGISTRY.values() for i in declared(s.params)}
    attack = set().union(*(S.names_of(a.params) for a in S.ATTACKS.values()))
    defense = set().union(*(S.names_of(d.params) for d in S.DEFENSES.values()))
    assert not (attack & algo) and not (defense & algo) and not (attack & defense)


def test_validate_refuses_what_cannot_hold(tmp_path):
    from fednet.algorithms.checks import validate

    with pytest.raises(ConfigError, match="f = 2 .* needs n >= 11, but a round selects 10"):
        validate(_cfg(clients=10, **{"attack.name": "alie", "defense.name": "bulyan"}))
    with pytest.raises(ConfigError, match="--defense krum needs an algorithm"):
        validate(_cfg(**{"algo.name": "scaffold", "defense.name": "krum"}))
    with pytest.raises(ConfigError, match="--attack backdoor stamps an image"):
        validate(_cfg(**{"data.dataset": "synthetic-fedprox", "data.partition": "natural",
                         "attack.name": "backdoor"}))
    with pytest.raises(ConfigError, match="--defense krum does not go with --secagg full"):
        validate(_cfg(**{"defense.name": "krum", "net.secagg": "full"}))
    validate(_cfg(clients=20, **{"attack.name": "alie", "defense.name": "krum"}))
