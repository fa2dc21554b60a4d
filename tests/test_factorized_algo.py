"""Factorized-FL and pFedPara: what travels, similarity matching numbers, communication savings."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.algorithms import build
from fednet.algorithms.contract import ServerInfo
from fednet.algorithms.factorized import cosine
from fednet.core.inproc import InprocDispatcher
from fednet.core.session import Session
from fednet.types import Result
from tests.conftest import small_config

PERM = {"permute": True}


def _session(**over):
    s = Session(small_config(**over), quiet=True, write=False)
    s.driver.run(InprocDispatcher(s))
    return s


def test_factorized_uploads_only_u_norm_bias_and_the_matching_v():
    s = _session(clients=3, rounds=2, data=PERM, algo={"name": "factorized"})
    kinds = s.algo.info.kinds
    up = s.algo.state.latest[0]
    assert {kinds[n] for n in up} == {"u", "norm", "dense", "v"}
    assert [n for n in up if kinds[n] == "v"] == [s.algo.info.matching] == ["fc2.v"]
    assert not any(kinds[n] in ("mu", "head", "buffer") for n in up)
    beta = _session(clients=3, rounds=1, data=PERM, algo={"name": "factorized_beta"})
    assert {"u", "v", "mu", "norm", "dense"} == {kinds[n] for n in beta.algo.state.latest[0]}


def _algo(params, clients=3):
    cfg = small_config(clients=clients, algo={"name": "factorized", "params": params})
    algo = build(cfg)
    algo.bind(ServerInfo(10, kinds={"a.u": "u", "a.v": "v", "h.w": "head"}, matching="a.v"))
    algo.setup({"a.u": np.zeros(2, np.float32), "a.v": np.zeros(2, np.float32),
                "h.w": np.zeros(1, np.float32)})
    return algo


def _upload(algo, vs, us, sizes):
    rs = [Result(i, 0, i, {"a.u": np.array(u, np.float32), "a.v": np.array(v, np.float32)}, {}, n)
          for i, (v, u, n) in enumerate(zip(vs, us, sizes))]
    algo.aggregate_round(0, rs, [])


def test_similarity_matching_golden_numbers():
    algo = _algo({"tau": 0.5, "eps": 2.0, "min_peers": 1})
    _upload(algo, [[1, 0], [1, 1], [-1, 0]], [[1, 1], [3, 5], [9, 9]], [10, 10, 10])
    s01 = cosine(np.array([1, 0.0]), np.array([1, 1.0]))
    assert s01 == pytest.approx(2 ** -0.5)
    # client 0: sims (1, 0.707, -1); tau 0.5 keeps {0, 1}; weights softmax(2 * sim)
    w = np.exp([2.0, 2 * s01]) / np.exp([2.0, 2 * s01]).sum()
    out = algo.personalized(0)
    np.testing.assert_allclose(out["a.u"], w[0] * np.array([1, 1]) + w[1] * np.array([3, 5]),
                               rtol=1e-6)
    assert set(out) == {"a.u"}                              # v stays personal, the head never travels
    # client 2 matches nobody above tau: min_peers keeps itself only
    np.testing.assert_allclose(algo.personalized(2)["a.u"], [9, 9])


def test_min_peers_forces_the_most_similar_and_factorized_fedavg_weights_by_samples():
    algo = _algo({"tau": 0.99, "eps": 1.0, "min_peers": 2})
    _upload(algo, [[1, 0], [1, 1], [-1, 0]], [[1, 1], [3, 5], [9, 9]], [10, 10, 10])
    assert algo._weights(2)[0][0] == 2 and len(algo._weights(2)) == 2
    avg = _algo({"matching": "none"})
    _upload(avg, [[1, 0], [1, 1], [-1, 0]], [[1, 1], [3, 5], [9, 9]], [10, 30, 60])
    np.testing.assert_allclose(avg.personalized(1)["a.u"], [(10 + 90 + 540) / 100,
                                                            (10 + 150 + 540) / 100], rtol=1e-6)


@pytest.mark.parametrize("mode", ["random", "worst"])
def test_ablation_matchings_use_self_plus_three_peers(mode):
    algo = _algo({"matching": mode}, clients=6)
    vs = [[1, 0], [1, 0.1], [1, 0.2], [0, 1], [-1, 0], [-1, -0.1]]
    _upload(algo, vs, [[i, i] for i in range(6)], [10] * 6)
    group = [j for j, _ in algo._weights(0)]
    assert group[0] == 0 and len(group) == 4
    if mode == "worst":
        assert set(group[1:]) == {3, 4, 5}


def test_factorized_uplink_is_a_small_fraction_of_fedavg_on_the_same_backbone():
    model = {"model": "factorized_digits"}
    ffl = _session(clients=3, rounds=2, data=PERM, algo={"name": "factorized"})
    avg = _session(clients=3, rounds=2, data=PERM, algo={"name": "fedavg"}, train=model)
    up_f = ffl.ledger.totals()["client_to_server"]
    up_a = avg.ledger.totals()["client_to_server"]
    assert up_f < 0.15 * up_a
    assert ffl.history.rows[-1]["accuracy"] is not None and "acc_std" in ffl.history.rows[-1]


def test_pfedpara_shares_global_factors_only():
    s = _session(clients=3, rounds=2, data=PERM, algo={"name": "pfedpara"})
    kinds = s.algo.info.kinds
    sent = {n for n in s.algo.shared()}
    assert {kinds[n] for n in sent} <= {"global", "dense", "norm"}
    assert not any(k == "local" for k in (kinds[n] for n in sent))
    local = [n for n, k in kinds.items() if k == "local"]
    assert local and all(np.array_equal(s.algo.global_arrays[n], s.evaluator.initial[n])
                         for n in local)  # the server never learns the local factors
    assert s.driver.status == "completed"


def test_personalized_runs_report_mean_client_accuracy_and_fedavg_global_otherwise():
    per = _session(clients=3, rounds=1, data=PERM)
    glob = _session(clients=3, rounds=1)
    assert "acc_std" in per.history.rows[0] and "acc_std" not in glob.history.rows[0]


def test_what_travels_comes_from_the_class_not_the_algorithm_name():
    from fednet.algorithms import build
    from fednet.algorithms.factorized import SHARED, Factorized, FactorizedBeta
    from tests.conftest import small_config

    beta = build(small_config(algo={"name": "factorized_beta"}))
    plain = build(small_config(algo={"name": "factorized"}))
    assert type(beta) is FactorizedBeta and beta.shared_kinds == SHARED["factorized_beta"]
    assert type(plain) is Factorized and "v" not in plain.shared_kinds
