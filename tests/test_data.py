"""Tests of fednet.data: the digits dataset, client partitions and their statistics."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.data import (
    DATASETS,
    SCHEMES,
    client_indices,
    label_histogram,
    load_dataset,
    partition,
    partition_summary,
)
from fednet.errors import ConfigError

DIGITS_CLASS_SIZES = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _naive_dirichlet_std(labels: np.ndarray, k: int, alpha: float, seed: int) -> float:
    """Std of client sizes for one uncapped per-class Dirichlet draw (the baseline 2.3 improves on)."""
    rng = np.random.default_rng(seed)
    sizes = np.zeros(k)
    for c in np.unique(labels):
        n = int((labels == c).sum())
        cuts = np.floor(np.cumsum(rng.dirichlet(np.full(k, alpha))) * n).astype(int)[:-1]
        sizes += np.diff(np.concatenate(([0], cuts, [n])))
    return float(sizes.std())


def test_digits_has_1437_train_and_360_test_images_of_shape_1x8x8(digits):
    assert DATASETS == ("digits", "cifar10", "cifar100", "svhn", "synthetic-cifar10", "synthetic-cifar100")
    assert digits.train_x.shape == (1437, 1, 8, 8) and digits.test_x.shape == (360, 1, 8, 8)
    assert digits.train_x.dtype == np.float32 and digits.test_x.dtype == np.float32
    assert digits.train_y.dtype == np.int64 and digits.test_y.dtype == np.int64
    assert digits.num_classes == 10 and digits.input_shape == (1, 8, 8)


def test_digits_split_is_stratified_80_20(digits):
    train = np.bincount(digits.train_y, minlength=10)
    test = np.bincount(digits.test_y, minlength=10)
    assert (train + test).tolist() == DIGITS_CLASS_SIZES
    expected = np.array(DIGITS_CLASS_SIZES) * 0.2
    assert np.all(np.abs(test - expected) < 1.0)
    assert test.sum() == 360


def test_digits_train_split_is_standardized_with_train_statistics(digits):
    assert abs(float(digits.train_x.mean())) < 1e-5
    assert abs(float(digits.train_x.std()) - 1.0) < 1e-5
    # the test split uses the train statistics, so it is only roughly standardized
    assert abs(float(digits.test_x.mean())) < 0.1
    assert abs(float(digits.test_x.std()) - 1.0) < 0.1


def test_digits_load_is_cached_and_split_seed_is_fixed(digits):
    assert load_dataset("digits") is digits
    assert load_dataset("digits", split_seed=0) is digits
    other = load_dataset("digits", split_seed=1)
    assert other is not digits and other.test_x.shape == (360, 1, 8, 8)
    assert not np.array_equal(other.test_x, digits.test_x)


def test_unknown_dataset_is_a_config_error_naming_the_option_and_choices():
    with pytest.raises(ConfigError, match=r"--dataset 'mnist'.*digits"):
        load_dataset("mnist")


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "domain"])  # domain: test_data_domains.py
def test_partitions_are_deterministic_in_the_seed_and_differ_for_another(digits, scheme):
    a = partition(digits.train_y, 20, scheme, alpha=0.5, seed=3)
    b = partition(digits.train_y, 20, scheme, alpha=0.5, seed=3)
    c = partition(digits.train_y, 20, scheme, alpha=0.5, seed=4)
    assert len(a) == 20 and all(p.dtype == np.int64 for p in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("scheme,alpha", [("iid", 0.5), ("shards", 0.5), ("dirichlet", 0.5), ("dirichlet", 0.0)])
def test_partitions_cover_every_sample_exactly_once(digits, scheme, alpha):
    parts = partition(digits.train_y, 50, scheme, alpha=alpha, seed=0)
    joined = np.concatenate(parts)
    assert joined.size == np.unique(joined).size  # disjoint
    assert np.array_equal(np.sort(joined), np.arange(1437))  # complete


def test_iid_client_sizes_differ_by_at_most_one(digits):
    sizes = [len(p) for p in partition(digits.train_y, 50, "iid", seed=0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1437


@pytest.mark.parametrize("k,limit", [(10, 0.4), (50, 0.75)])
def test_dirichlet_sizes_stay_nearer_n_over_k_than_a_naive_draw(digits, k, limit):
    # measured (alpha 0.5, digits): K=10 capped std ~14 vs naive ~58; K=50 ~6.6 vs ~12.5. The cap is N/K,
    # so with few samples per client (K=50: ~29) it can only trim the largest clients.
    alpha = 0.5
    capped = [partition_summary(partition(digits.train_y, k, "dirichlet", alpha, seed=s), digits.train_y, 10)
              for s in range(3)]
    naive_std = float(np.mean([_naive_dirichlet_std(digits.train_y, k, alpha, seed=s) for s in range(50)]))
    capped_std = float(np.mean([s["std_size"] for s in capped]))
    assert all(s["mean_size"] == pytest.approx(1437 / k) for s in capped)
    assert capped_std < limit * naive_std


def test_smaller_alpha_gives_fewer_classes_per_client(digits):
    classes = {
        a: partition_summary(partition(digits.train_y, 50, "dirichlet", a, seed=0), digits.train_y, 10)[
            "mean_classes"
        ]
        for a in (0.0, 0.2, 0.5, 100.0)
    }
    assert classes[0.0] == 1.0
    assert classes[0.0] < classes[0.2] < classes[0.5] < classes[100.0]
    assert classes[100.0] > 9.5


def test_shards_with_100_clients_give_one_class_each_and_10_clients_per_class(digits):
    parts = partition(digits.train_y, 100, "shards", seed=0)
    held = [np.unique(digits.train_y[p]) for p in parts]
    assert all(h.size == 1 for h in held)
    owners = np.bincount([int(h[0]) for h in held], minlength=10)
    assert owners.tolist() == [10] * 10
    assert all(int(h[0]) == k % 10 for k, h in enumerate(held))
    sizes = [len(p) for p in parts]
    assert min(sizes) == 13 and max(sizes) == 15 and sum(sizes) == 1437  # each class split evenly by 10


def test_shards_with_fewer_clients_than_classes_use_every_sample(digits):
    parts = partition(digits.train_y, 3, "shards", seed=0)
    held = [set(np.unique(digits.train_y[p]).tolist()) for p in parts]
    assert held == [{0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8}]
    assert sum(len(p) for p in parts) == 1437


def test_alpha_zero_dirichlet_is_the_shards_scheme(digits):
    a = partition(digits.train_y, 30, "dirichlet", alpha=0.0, seed=5)
    b = partition(digits.train_y, 30, "shards", seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_too_many_clients_is_a_config_error_naming_the_limit(digits):
    with pytest.raises(ConfigError, match=r"--clients 2000 exceeds the 1437 training samples of "
                                          r"digits; use at most 1437"):
        partition(digits.train_y, 2000, "iid", dataset="digits")
    with pytest.raises(ConfigError, match="--clients must be at least 1"):
        partition(digits.train_y, 0, "iid")


def test_bad_alpha_and_unknown_scheme_are_config_errors(digits):
    with pytest.raises(ConfigError, match="--alpha must be"):
        partition(digits.train_y, 10, "dirichlet", alpha=-0.1)
    with pytest.raises(ConfigError, match="--alpha must be"):
        partition(digits.train_y, 10, "dirichlet", alpha=float("nan"))
    with pytest.raises(ConfigError, match=r"--partition 'pathological'.*iid, dirichlet, shards"):
        partition(digits.train_y, 10, "pathological")


def test_empty_clients_are_a_config_error_suggesting_fewer_clients_or_larger_alpha(digits):
    # 1437 shards clients: some class has fewer samples than its ~144 round-robin clients
    with pytest.raises(ConfigError, match=r"without samples.*fewer --clients or a larger --alpha"):
        partition(digits.train_y, 1437, "shards")


def test_client_indices_match_partition_and_are_cached(digits):
    parts = partition(digits.train_y, 40, "dirichlet", 0.5, seed=7)
    got = [client_indices(digits.train_y, 40, "dirichlet", 0.5, 7, cid) for cid in range(40)]
    assert all(np.array_equal(x, y) for x, y in zip(parts, got))
    again = client_indices(digits.train_y, 40, "dirichlet", 0.5, 7, 3)
    assert again is got[3] and not again.flags.writeable
    other_labels = digits.train_y[::-1].copy()  # same length, other labels: must not hit the cache
    assert not np.array_equal(client_indices(other_labels, 40, "dirichlet", 0.5, 7, 3), got[3])
    with pytest.raises(ConfigError, match="client id 40"):
        client_indices(digits.train_y, 40, "dirichlet", 0.5, 7, 40)


def test_label_histogram_counts_every_class():
    assert label_histogram(np.array([0, 2, 2, 3]), 5) == [1, 0, 2, 1, 0]
    with pytest.raises(ValueError):
        label_histogram(np.array([0, 5]), 5)


def test_partition_summary_reports_sizes_classes_and_balance():
    labels = np.array([0, 0, 1, 1, 1, 0, 1, 1])
    parts = [np.array([0, 1, 2]), np.array([3, 4]), np.array([5, 6, 7])]
    s = partition_summary(parts, labels, 2)
    assert (s["min_size"], s["max_size"], s["clients"], s["samples"]) == (2, 3, 3, 8)
    assert s["mean_size"] == pytest.approx(8 / 3)
    assert s["mean_classes"] == pytest.approx(5 / 3)  # 2, 1, 2 classes
    assert s["mean_balance"] == pytest.approx((0.5 + 0.0 + 0.5) / 3)


def test_client_data_from_server_indices_equals_its_own_partition():
    from fednet.config import RunConfig
    from fednet.data import load_dataset
    from fednet.data.client_data import client_data
    from fednet.data.partition import run_partition

    cfg = RunConfig().replace(clients=20)
    d = cfg.data.__class__(**{**cfg.data.__dict__, "partition": "dirichlet", "alpha": 0.3})
    ds = load_dataset("digits")
    parts = run_partition(ds, d, 20, 5)
    for cid in (0, 7, 19):
        own = client_data(ds, d, 20, 5, cid)
        sent = client_data(ds, d, 20, 5, cid, parts[cid].astype(np.int64))
        assert np.array_equal(own.x, sent.x) and np.array_equal(own.y, sent.y)
        assert np.array_equal(own.test_y, sent.test_y)


@pytest.mark.parametrize("bad, why", [
    (np.array([[1, 2]]), "1-D integer"),
    (np.array([0.5, 1.0]), "1-D integer"),
    (np.array([0, 1797]), r"outside the training set of \d+ samples"),
    (np.array([-1]), "outside the training set"),
])
def test_client_data_rejects_indices_that_do_not_fit_the_dataset(bad, why):
    from fednet.config import RunConfig
    from fednet.data import load_dataset
    from fednet.data.client_data import client_data
    from fednet.errors import ConfigError

    cfg = RunConfig()
    with pytest.raises(ConfigError, match=why):
        client_data(load_dataset("digits"), cfg.data, 10, 0, 0, bad)
