"""Differential privacy's mechanisms on toy clients, numbers worked out by hand
(docs/algorithms.md §11): clipping, DP-FedAvg's noised fixed-denominator mean (any arrival
order), Poisson sampling, adaptive clipping, local DP, the budget; and the rules of what composes
with what, each refused in one line.

The toy model is w = [1, 2] (float32) and a counter n = 7 (int64). Client 0 returns w = [4, 6]
(update [3, 4], norm 5: clipped to C = 2.5 it is [1.5, 2]); client 1 returns [1, 2.5] (update
[0, 0.5], not clipped). With D = 2 the clipped mean is [0.75, 1.25]: exact binary fractions.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("dp_accounting")

from fednet import rng  # noqa: E402
from fednet.algorithms import build  # noqa: E402
from fednet.algorithms.dp_mean import PrivateMean  # noqa: E402
from fednet.algorithms.checks import validate  # noqa: E402
from fednet.errors import ConfigError  # noqa: E402
from fednet.privacy import mechanisms, plan  # noqa: E402
from fednet.privacy.accountant import Accountant  # noqa: E402
from fednet.types import ClientInfo, Result  # noqa: E402
from tests.conftest import small_config  # noqa: E402

W0 = [1.0, 2.0]


def _model() -> dict[str, np.ndarray]:
    return {"w": np.array(W0, np.float32), "n": np.array(7, np.int64)}


def _results(rnd: int = 0) -> list[Result]:
    return [Result(2 * rnd + 1, rnd, 0, {"w": np.array([4, 6], np.float32), "n": np.array(9)}, {}, 5),
            Result(2 * rnd + 2, rnd, 1, {"w": np.array([1, 2.5], np.float32), "n": np.array(3)},
                   {}, 50)]


def test_clip_by_hand():
    got, norm, clipped = mechanisms.clip({"a": np.array([3.0, 4.0])}, 2.5)
    assert got["a"].tolist() == [1.5, 2.0] and norm == 5.0 and clipped
    got, norm, clipped = mechanisms.clip({"a": np.array([0.0, 0.5])}, 2.5)
    assert got["a"].tolist() == [0.0, 0.5] and norm == 0.5 and not clipped


def test_private_mean_without_noise_by_hand_in_either_order():
    for order in ([0, 1], [1, 0]):
        pm = PrivateMean(_model(), 2.5, 0.0, 2.0, lambda: rng.generator(0, "x"))
        for i in order:
            r = _results()[i]
            pm.add(r.arrays, r.num_examples, key=r.cid)  # every user counts once: n_k unused
        out = pm.result()
        assert out["w"].tolist() == [1.75, 3.25] and out["w"].dtype == np.float32
        assert int(out["n"]) == 7  # not floating: the server's own, never a client's
        assert pm.clipped == 1 and pm.count == 2


def test_private_mean_noise_comes_from_the_rounds_stream_in_any_order():
    outs = []
    for order in ([0, 1], [1, 0]):
        pm = PrivateMean(_model(), 2.5, 0.3, 2.0, lambda: rng.generator(5, "dp-central", 2))
        for i in order:
            pm.add(_results()[i].arrays)
        outs.append(pm.result()["w"])
    noise = rng.generator(5, "dp-central", 2).standard_normal((2,)) * 0.3
    want = (np.array(W0) + (np.array([1.5, 2.5]) + noise) / 2).astype(np.float32)
    assert outs[0].tobytes() == outs[1].tobytes() == want.tobytes()


def _private(name: str = "fedavg", clients: int = 2, **dp):
    cfg = small_config(clients=clients, algo={"name": name, "fraction": dp.pop("fraction", 1.0),
                                              "params": dp.pop("params", {})},
                       dp={"mode": "central", "noise": 0.4, "clip": 2.5, **dp})
    algo = build(cfg)
    algo.setup(_model(), trainable={"w"})
    return algo, [ClientInfo(c, 10) for c in range(clients)]


def _round(algo, clients, rnd: int = 0) -> dict:
    tasks = algo.configure_round(rnd, clients)
    assert sorted(t.cid for t in tasks) == [0, 1]
    rs = _results(rnd)
    for r in rs:
        algo.absorb(r)
    return algo.aggregate_round(rnd, rs, [])


@pytest.mark.parametrize("name, params", [("fedavg", {}), ("fedprox", {"mu": 0.1}),
                                          ("fedavgm", {"server_lr": 1.0, "server_momentum": 0.0})])
def test_dp_fedavg_round_by_hand(name, params):
    """q = 1 (both clients), D = 2: w1 = w0 + ([1.5, 2] + [0, 0.5] + N(0, (zC)^2)) / 2, the
    noise from (seed, "dp-central", round); FedAvgM with lr 1 and no momentum steps to it too."""
    algo, clients = _private(name, params=params)
    m = _round(algo, clients)
    noise = rng.generator(algo.cfg.seed, "dp-central", 0).standard_normal((2,)) * 0.4 * 2.5
    want = (np.array(W0) + (np.array([1.5, 2.5]) + noise) / 2).astype(np.float32)
    assert algo.state.model["w"].tobytes() == want.tobytes() and int(algo.state.model["n"]) == 7
    assert m["dp_clipped"] == 0.5 and m["dp_cohort"] == 2 and m["dp_sigma"] == 0.4 * 2.5
    want_eps = Accountant("rdp", plan.default_delta(2)).epsilon([(("poisson", 1.0, 0.4), 1)])
    assert m["epsilon"] == want_eps and algo.report()["dp"]["epsilon"] == want_eps


def test_poisson_sampling_is_one_uniform_per_client_id():
    algo, _ = _private(clients=1000, fraction=0.3)
    everyone = [ClientInfo(c, 10) for c in range(1000)]
    u = rng.generator(algo.cfg.seed, "dp-select", 4).random(1000)
    picked = [c.cid for c in algo.select(4, everyone)]
    assert picked == [c for c in range(1000) if u[c] < 0.3] and 250 < len(picked) < 350
    some = everyone[::3]  # the clients alive: each keeps its own draw
    assert [c.cid for c in algo.select(4, some)] == [c for c in picked if c % 3 == 0]


def test_adaptive_clipping_by_hand():
    """Andrew et al. 2021: one of the two updates is under C = 2.5; with the count's noise
    sigma_b = 1, b = (1 - 2/2 + N(0, 1)) / 2 + 1/2 and C1 = C exp(-0.2 (b - 0.5)); the update's
    noise multiplier is (z^-2 - (2 sigma_b)^-2)^-1/2 (the total stays z)."""
    algo, clients = _private(adaptive=True, count_noise=1.0, quantile=0.5, clip_lr=0.2)
    m = _round(algo, clients)
    z_u = (0.4 ** -2 - 2.0 ** -2) ** -0.5
    assert m["dp_sigma"] == pytest.approx(z_u * 2.5)
    b = rng.generator(algo.cfg.seed, "dp-count", 0).standard_normal() / 2 + 0.5
    assert m["dp_unclipped"] == pytest.approx(b)
    assert algo.state.dp["clip"] == pytest.approx(2.5 * math.exp(-0.2 * (b - 0.5)))
    assert algo.report()["dp"]["clip"] == algo.state.dp["clip"]


def test_the_budget_stops_the_run_before_the_round_that_would_exceed_it():
    e1 = Accountant("rdp", plan.default_delta(2)).epsilon([(("poisson", 1.0, 0.4), 1)])
    e2 = Accountant("rdp", plan.default_delta(2)).epsilon([(("poisson", 1.0, 0.4), 2)])
    algo, clients = _private(epsilon=(e1 + e2) / 2)
    assert algo.stop_before(0, clients) is None
    _round(algo, clients)
    status, why = algo.stop_before(1, clients)
    assert status == "budget_spent" and f"{e2:.4g}" in why and f"{e1:.4g}" in why
    assert algo.report()["dp"]["stopped"] == why


def test_local_dp_privatizes_each_update_by_hand():
    ref = {"w": np.array(W0)}
    gen = rng.generator(3, "dp-local", 1, 0)
    out, norm, clipped = mechanisms.privatize({"w": np.array([4, 6], np.float32),
                                               "n": np.array(9)}, ref, 2.5, 0.5, gen)
    noise = rng.generator(3, "dp-local", 1, 0).standard_normal((2,)) * 0.5
    assert out["w"].tobytes() == (np.array([2.5, 4.0]) + noise).astype(np.float32).tobytes()
    assert int(out["n"]) == 9 and norm == 5.0 and clipped


def test_local_dp_accounts_each_clients_tasks():
    cfg = small_config(clients=4, algo={"fraction": 0.5}, dp={"mode": "local", "noise": 3.0})
    algo = build(cfg)
    algo.setup(_model(), trainable={"w"})
    clients = [ClientInfo(c, 10) for c in range(4)]
    for rnd in range(3):
        algo.configure_round(rnd, clients)
        # a round's tasks count when it is aggregated (an interrupted round: not yet)
        assert algo.state.dp_counts.sum() == 2 * rnd
        algo.aggregate_round(rnd, [], [])
    worst = int(algo.state.dp_counts.max())
    assert algo.state.dp_counts.sum() == 6 and worst >= 2
    assert algo.epsilon() == Accountant("rdp", plan.default_delta(4)).epsilon([(("gaussian", 1.5), worst)])


CONFIG_RULES = [
    ({"algo": {"name": "scaffold"}, "dp": {"mode": "central", "noise": 1.0}},
     "--dp central does not apply to scaffold"),
    ({"algo": {"name": "fedbuff"}, "dp": {"mode": "local", "noise": 1.0}},
     "--dp local does not apply to fedbuff"),
    ({"algo": {"name": "feddyn"}, "dp": {"sgd_noise": 1.0}},
     "--dp-sgd-noise does not apply to feddyn"),
    ({"dp": {"mode": "central"}}, "needs --dp-noise Z, or --dp-epsilon E"),
    ({"dp": {"clip": 2.0}}, "--dp-clip: settings of --dp central|local"),
    ({"dp": {"sgd_clip": 2.0}}, "--dp-sgd-clip: settings of DP-SGD"),
    ({"dp": {"mode": "local", "noise": 1.0, "adaptive": True}}, "--dp-adaptive: settings of --dp "
                                                               "central"),
    ({"dp": {"mode": "central", "noise": 1.0}, "latency": {"over_select": 2.0}},
     "--over-select does not go with --dp central"),
    ({"dp": {"mode": "central", "noise": 1.0, "sampling": "fixed"},
      "latency": {"availability": "diurnal"}}, "--dp-sampling fixed does not go with"),
    ({"dp": {"mode": "central", "noise": 1.0, "sampling": "fixed", "accountant": "pld"}},
     "--dp-accountant pld has no fixed-size sampling"),
    ({"dp": {"mode": "local", "noise": 1.0}, "data": {"permute": True}},
     "--eval clients does not go with --dp local"),
    ({"dp": {"mode": "central", "noise": 1.0}, "defense": {"name": "median"}},
     "--defense median does not go with --dp central: one update can move a coordinate's "
     "median"),
    ({"dp": {"mode": "central", "noise": 1.0}, "defense": {"name": "krum"}, "clients": 20},
     "--defense krum does not go with --dp central: it chooses rows by their distances"),
    ({"dp": {"mode": "central", "noise": 1.0}, "defense": {"name": "centered_clip"}},
     "--defense centered_clip does not go with --dp central: its center"),
    ({"dp": {"mode": "central", "noise": 1.0}, "defense": {"name": "norm_bound"}},
     "--defense norm_bound does not go with --dp central: its bound M is the median"),
    ({"dp": {"mode": "central", "noise": 1.0}, "defense": {"name": "trimmed_mean"}},
     "--defense trimmed_mean with --dp central: the rule's sensitivity is stated for a fixed "
     "cohort"),
    ({"dp": {"mode": "nope"}}, "--dp 'nope' is not a DP mechanism; choose one of none, central, "
     "local, distributed"),
    ({"dp": {"mode": "local", "noise": 1.0}, "attack": {"name": "signflip", "malicious": "0.2"}},
     "--attack does not go with --dp local"),
]


@pytest.mark.parametrize("over, says", CONFIG_RULES, ids=[s for _, s in CONFIG_RULES])
def test_what_does_not_compose_is_refused_in_one_line(over, says):
    with pytest.raises(ConfigError) as e:
        validate(small_config(**over))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_missing_library_names_the_extra(monkeypatch):
    import fednet.algorithms.checks as checks

    monkeypatch.setattr(checks, "missing", lambda module: True)
    with pytest.raises(ConfigError) as e:
        validate(small_config(dp={"mode": "central", "noise": 1.0}))
    assert "pip install 'fednet[dp]'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate(small_config(dp={"sgd_noise": 1.0}))
    assert "opacus" in str(e.value) and "fednet[dp]" in str(e.value)


def test_update_noise_needs_enough_count_noise():
    assert plan.update_noise(1.0, 10.0) == pytest.approx((1 - 1 / 400) ** -0.5)
    with pytest.raises(ConfigError):
        plan.update_noise(1.0, 0.5)
