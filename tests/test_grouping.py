"""Tests of FedSeq grouping: measures (4.4), superclient builders and leftover handling (4.5), statistics (4.10)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fednet.algorithms.grouping import (
    GROUPINGS, MEASURES, PROBABILITY_ONLY, group, measure, representation, superclient_stats,
)
from fednet.errors import ConfigError
from fednet.rng import generator


def _onehot(classes: list[int], n: int) -> np.ndarray:
    """One one-hot row per client."""
    return np.eye(n)[classes]


# ---- measures -------------------------------------------------------------------------------
def test_measure_names():
    assert MEASURES == ("kl", "gini", "cosine", "euclidean", "wasserstein")
    assert PROBABILITY_ONLY == {"kl", "gini"}
    with pytest.raises(ConfigError, match=r"--param measure=kullback"):
        measure("kullback")


def test_kl_of_a_one_hot_mixture_is_one_minus_log_five():
    e = np.eye(10)
    assert measure("kl")(e[0], e[1]) == pytest.approx(1 - math.log(5), abs=1e-12)
    assert measure("kl")(e[0], e[0]) == pytest.approx(1 - math.log(10), abs=1e-12)
    u = np.full(10, 0.1)
    assert measure("kl")(u, u) == pytest.approx(1.0, abs=1e-12)


def test_gini_is_the_impurity_of_the_unweighted_midpoint():
    e = np.eye(10)
    assert measure("gini")(e[0], e[1]) == pytest.approx(0.5)
    assert measure("gini")(e[0], e[0]) == pytest.approx(0.0)
    assert measure("gini")(np.full(4, 0.25), np.full(4, 0.25)) == pytest.approx(0.75)
    # m = ([0.5, 0.5] + [1, 0]) / 2 = [0.75, 0.25]: 1 - 0.5625 - 0.0625
    assert measure("gini")(np.array([0.5, 0.5]), np.array([1.0, 0.0])) == pytest.approx(0.375)


def test_cosine_euclidean_wasserstein():
    assert measure("cosine")(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    assert measure("cosine")(np.array([1.0, 1.0]), np.array([1.0, 0.0])) == pytest.approx(1 - 1 / math.sqrt(2))
    assert math.isnan(measure("cosine")(np.zeros(2), np.ones(2)))
    assert measure("euclidean")(np.array([0.0, 0.0]), np.array([3.0, 4.0])) == pytest.approx(5.0)
    # values are treated as 1-D samples: a shift of every sample by 5 costs 5
    assert measure("wasserstein")(np.array([0.0, 1.0, 3.0]), np.array([5.0, 6.0, 8.0])) == pytest.approx(5.0)
    assert measure("wasserstein")(np.array([0.0, 1.0]), np.array([1.0, 0.0])) == pytest.approx(0.0)


# ---- representation ----------------------------------------------------------------------------
def test_representation_is_sample_weighted_and_uniform_when_empty():
    reps = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert representation([0, 1], reps, np.array([3, 1])) == pytest.approx([0.75, 0.25])
    assert representation([1], reps, np.array([3, 1])) == pytest.approx([0.0, 1.0])
    assert representation([], np.zeros((2, 3)), np.array([1, 1])) == pytest.approx([1 / 3] * 3)


# ---- groupings -----------------------------------------------------------------------------------
def test_greedy_builds_superclients_covering_all_classes():
    reps = _onehot([0, 0, 1, 1, 2, 2], 3)
    g = group("greedy", reps, np.full(6, 10), "kl", 30, 3, seed=0, num_classes=3)
    # uniform ref: all tie -> 0; then a class-1 client (2 before 3), then class 2 (4)
    assert g == [[0, 2, 4], [1, 3, 5]]
    for m in ("gini", "cosine", "euclidean"):
        assert group("greedy", reps, np.full(6, 10), m, 30, 3, 0, 3) == [[0, 2, 4], [1, 3, 5]], m


def test_greedy_zero_floor_falls_back_to_first_remaining():
    reps = _onehot([0, 0, 1, 1], 10)  # N_C = 10: every second pick has 1 - KL <= 0
    sizes = np.full(4, 10)
    assert group("greedy", reps, sizes, "kl", 20, 2, 0, 10) == [[0, 2], [1, 3]]
    assert group("greedy", reps, sizes, "kl", 20, 2, 0, 10, zero_floor=True) == [[0, 1], [2, 3]]


def test_random_is_the_seeded_permutation_filled_in_order():
    perm = [int(k) for k in generator(5, "grouping/random").permutation(6)]
    g = group("random", None, np.full(6, 10), "kl", 20, 5, seed=5, num_classes=3)
    assert g == [perm[0:2], perm[2:4], perm[4:6]]
    assert group("random", None, np.full(6, 10), "kl", 20, 5, 5, 3) == g
    others = [group("random", None, np.full(6, 10), "kl", 20, 5, s, 3) for s in range(6, 12)]
    assert any(o != g for o in others)


def test_kmeans_draws_one_client_per_cluster_popping_from_the_end():
    rng = np.random.default_rng(0)
    reps = _onehot([0, 0, 1, 1, 2, 2], 3) + 0.01 * rng.random((6, 3))
    g = group("kmeans", reps, np.full(6, 10), "kl", 30, 3, seed=1, num_classes=3)
    assert [sorted(s) for s in g] == [[1, 3, 5], [0, 2, 4]]
    assert group("kmeans", reps, np.full(6, 10), "kl", 30, 3, seed=1, num_classes=3) == g


def test_kmeans_with_fewer_clients_than_classes():
    g = group("kmeans", _onehot([0, 1], 10), np.full(2, 10), "kl", 20, 5, 0, num_classes=10)
    assert sorted(g[0]) == [0, 1] and len(g) == 1


def test_unknown_names_and_bad_limits_raise_config_errors():
    reps, sizes = _onehot([0, 1], 2), np.full(2, 10)
    assert GROUPINGS == ("random", "kmeans", "greedy")
    with pytest.raises(ConfigError, match=r"--param grouping=spectral"):
        group("spectral", reps, sizes, "kl", 10, 2, 0, 2)
    with pytest.raises(ConfigError, match=r"--param measure=foo"):
        group("greedy", reps, sizes, "foo", 10, 2, 0, 2)
    with pytest.raises(ConfigError, match=r"--param min_samples=0"):
        group("greedy", reps, sizes, "kl", 0, 2, 0, 2)
    with pytest.raises(ConfigError, match=r"--param max_clients=0"):
        group("greedy", reps, sizes, "kl", 10, 0, 0, 2)


# ---- leftover handling -------------------------------------------------------------------------------
def _id_order(sizes: list[int], min_samples: int, max_clients: int) -> list[list[int]]:
    """Greedy on identical reps: every score ties, so clients are taken in id order."""
    return group("greedy", np.ones((len(sizes), 2)), np.array(sizes), "cosine", min_samples, max_clients, 0, 2)


def test_open_superclient_is_kept_when_it_reached_min_samples():
    assert _id_order([50, 50, 60, 40, 30, 80], 100, 4) == [[0, 1], [2, 3], [4, 5]]


def test_open_superclient_below_min_samples_is_dissolved_smallest_first_skipping_full_ones():
    # closed: B=[0,1,2] (100 samples, 3 clients), A=[3] (150), C=[4] (120); open [5,6,7,8] is full (4 = max)
    # but has 4 < 100 samples -> dissolved; targets by samples: B(100), C(120), A(150); pop 8, 7, 6, 5:
    # 8 -> B (now full), 7 -> C, 6 -> A, 5 -> B? full, skipped -> C
    g = _id_order([40, 30, 30, 150, 120, 1, 1, 1, 1], 100, 4)
    assert g == [[0, 1, 2, 8], [3, 6], [4, 7, 5]]
    assert sorted(k for s in g for k in s) == list(range(9))


def test_dissolving_needs_room_else_config_error():
    # closed [0], [1] (max 1 client each); open [2] below 100 samples: ceil(3 / 2) = 2 > 1
    with pytest.raises(ConfigError, match=r"--param min_samples=100.*--param max_clients=1.*smaller min_samples"):
        _id_order([100, 1, 1], 100, 1)
    with pytest.raises(ConfigError, match=r"larger max_clients"):
        _id_order([10, 10], 100, 5)  # no closed superclient at all
    assert _id_order([10, 10], 20, 5) == [[0, 1]]


# ---- statistics ----------------------------------------------------------------------------------------
def test_superclient_stats_numbers():
    hist = np.array([[10, 0, 0], [0, 5, 0], [0, 0, 20], [5, 5, 5]])
    s = superclient_stats([[0, 1, 2], [3], [0, 1]], hist)
    assert s["num_superclients"] == 3
    assert s["balance_ratio"] == pytest.approx([0.25, 1.0, 0.0])
    assert s["covered_classes"] == pytest.approx([1.0, 1.0, 2 / 3])
    assert s["balance_ratio_mean"] == pytest.approx(1.25 / 3)
    assert s["balance_ratio_std"] == pytest.approx(np.std([0.25, 1.0, 0.0]))
    assert s["covered_classes_mean"] == pytest.approx((2 + 2 / 3) / 3)
    assert s["clients_mean"] == pytest.approx(2.0) and s["clients_std"] == pytest.approx(math.sqrt(2 / 3))
    assert s["samples_mean"] == pytest.approx(65 / 3) and s["samples_std"] == pytest.approx(np.std([35, 15, 15]))


# ---- property on realistic data ---------------------------------------------------------------------------
def _digits_like(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """100 one-class clients (client k has class k // 10), noisy confidence reps, 18 samples each."""
    rng = np.random.default_rng(seed)
    labels = np.arange(100) // 10
    reps = 0.7 * np.eye(10)[labels] + 0.3 * rng.dirichlet(np.ones(10), size=100)
    sizes = np.full(100, 18)
    return reps / reps.sum(axis=1, keepdims=True), sizes, np.eye(10)[labels] * 18


def test_greedy_kl_covers_clearly_more_classes_than_random():
    reps, sizes, hist = _digits_like()
    cov = {name: superclient_stats(group(name, reps, sizes, "kl", 180, 11, 3, 10), hist)["covered_classes_mean"]
           for name in ("greedy", "random")}
    assert cov["greedy"] >= 0.95
    assert cov["greedy"] - cov["random"] >= 0.2


def test_zero_floor_degenerates_to_id_order_on_sharp_one_class_clients():
    labels = np.arange(100) // 10
    reps, sizes, hist = np.eye(10)[labels], np.full(100, 18), np.eye(10)[labels] * 18
    true = superclient_stats(group("greedy", reps, sizes, "kl", 180, 11, 0, 10), hist)
    quirk = superclient_stats(group("greedy", reps, sizes, "kl", 180, 11, 0, 10, zero_floor=True), hist)
    assert true["covered_classes_mean"] == 1.0 and true["balance_ratio_mean"] == 1.0
    assert quirk["covered_classes_mean"] == pytest.approx(0.1)  # 1 - KL <= 0 after the first pick: id order


def test_vectorized_measures_equal_the_per_pair_ones():
    """The greedy grouping scores every remaining client at once (measures.MANY); each vector
    score equals the per-pair measure to the last few bits."""
    from fednet.algorithms.grouping import measures

    g = np.random.default_rng(3)
    xs = g.dirichlet(np.full(10, 0.3), 200)
    xs[:5, :3] = 0.0  # zero entries: 0 log 0 = 0
    xs[7] = 0.0  # a zero vector: cosine is nan
    r = g.dirichlet(np.full(10, 1.0))
    for name, many in measures.MANY.items():
        one = measures.measure(name)
        want = np.array([one(r, x) for x in xs])
        got = many(r, xs)
        assert np.allclose(got, want, rtol=1e-12, atol=1e-15, equal_nan=True), name
