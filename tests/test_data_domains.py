"""Tests of the domain partition, per-client label permutations and FedSeq's exemplar split."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.data import (
    PERMUTABLE,
    SCHEMES,
    Dataset,
    client_indices,
    client_labels,
    domain_classes,
    domain_test_indices,
    label_permutation,
    load_dataset,
    partition,
    split_exemplars,
)
from fednet.data.domains import CIFAR100_DOMAINS
from fednet.errors import ConfigError
from tests.harness import CIFAR100_FINE


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_domain_is_a_scheme_and_permutation_a_flag():
    assert SCHEMES == ("iid", "dirichlet", "shards", "domain")
    assert PERMUTABLE is True


def test_digits_domain_gives_each_group_of_four_clients_two_digits_split_iid(digits):
    parts = partition(digits.train_y, 20, "domain", seed=1, dataset="digits")
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(1437))  # every sample exactly once
    for k, p in enumerate(parts):
        g = k // 4
        assert set(np.unique(digits.train_y[p]).tolist()) == {2 * g, 2 * g + 1}
    for g in range(5):
        sizes = [len(parts[k]) for k in range(4 * g, 4 * g + 4)]
        assert sum(sizes) == int(np.isin(digits.train_y, [2 * g, 2 * g + 1]).sum())
        assert max(sizes) - min(sizes) <= 1
    again = partition(digits.train_y, 20, "domain", seed=1, dataset="digits")
    other = partition(digits.train_y, 20, "domain", seed=2, dataset="digits")
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    cached = client_indices(digits.train_y, 20, "domain", 0.5, 1, 7, dataset="digits")
    assert np.array_equal(cached, parts[7])


def test_domain_needs_20_clients_and_a_supported_dataset(digits):
    with pytest.raises(ConfigError, match=r"--partition domain needs --clients 20 .*got 10"):
        partition(digits.train_y, 10, "domain", dataset="digits")
    with pytest.raises(ConfigError, match=r"defined for --dataset digits or cifar100, not .svhn."):
        partition(digits.train_y, 20, "domain", dataset="svhn")
    with pytest.raises(ConfigError, match="needs the dataset's fine-label names"):
        partition(digits.train_y, 20, "domain", dataset="cifar100")
    with pytest.raises(ConfigError, match="lack 'clock'"):
        domain_classes("cifar100", [f"c{i}" for i in range(100)])


def test_cifar100_domains_are_five_disjoint_groups_of_ten_fine_classes():
    groups = domain_classes("cifar100", CIFAR100_FINE)
    assert [len(g) for g in groups] == [10] * 5
    assert np.unique(np.concatenate(groups)).size == 50
    names = [[CIFAR100_FINE[i] for i in g] for g in groups]
    assert {"clock", "wardrobe"} <= set(names[0]) and {"apple", "plate"} <= set(names[1])
    assert {"rose", "willow_tree"} <= set(names[2]) and {"bus", "tractor"} <= set(names[3])
    assert {"bear", "kangaroo"} <= set(names[4])
    assert [d for d, _ in CIFAR100_DOMAINS] == ["household_objects", "fruits_and_foods", "trees_and_flowers",
                                                "transport", "animals"]


def test_cifar100_domain_partition_on_labels():
    labels = np.repeat(np.arange(100), 12)  # 12 samples of every fine class
    parts = partition(labels, 20, "domain", seed=0, dataset="cifar100", class_names=CIFAR100_FINE)
    groups = domain_classes("cifar100", CIFAR100_FINE)
    assert [len(p) for p in parts] == [30] * 20  # 10 classes x 12 samples / 4 clients
    for k, p in enumerate(parts):
        assert set(labels[p].tolist()) <= set(groups[k // 4].tolist())
    assert np.concatenate(parts).size == 600  # the 50 classes outside the domains are unused


def test_domain_test_indices_select_the_clients_two_digits(digits):
    idx = domain_test_indices(digits.test_y, 5, 20)  # client 5 is in group 1: digits 2 and 3
    assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    assert set(digits.test_y[idx].tolist()) == {2, 3}
    assert idx.size == int(np.isin(digits.test_y, [2, 3]).sum())
    labels = np.repeat(np.arange(100), 2)
    cifar = domain_test_indices(labels, 19, 20, dataset="cifar100", class_names=CIFAR100_FINE)
    assert cifar.size == 20 and {CIFAR100_FINE[c] for c in labels[cifar]} >= {"lion", "elephant"}
    with pytest.raises(ConfigError, match="--clients 20"):
        domain_test_indices(digits.test_y, 0, 10)
    with pytest.raises(ConfigError, match="client id 20"):
        domain_test_indices(digits.test_y, 20, 20)


def test_label_permutation_is_private_deterministic_and_relabels():
    perms = [label_permutation(10, 1234, k) for k in range(20)]
    assert all(p.dtype == np.int64 and sorted(p.tolist()) == list(range(10)) for p in perms)
    assert np.array_equal(label_permutation(10, 1234, 3), perms[3])
    assert len({tuple(p) for p in perms}) == 20  # different clients, different permutations
    assert not np.array_equal(label_permutation(10, 1, 3), perms[3])
    y = np.array([0, 1, 2, 9, 9])
    assert client_labels(y, perms[0]).tolist() == [perms[0][c] for c in y]
    inverse = np.argsort(perms[0])
    assert np.array_equal(client_labels(client_labels(y, perms[0]), inverse), y)
    with pytest.raises(ConfigError):
        label_permutation(0, 1, 0)


def test_split_exemplars_removes_j_random_test_images_per_class(digits):
    ex_x, ex_y, rest = split_exemplars(digits, 5, seed=2021)
    assert ex_x.shape == (50, 1, 8, 8) and ex_y.tolist() == [c for c in range(10) for _ in range(5)]
    assert rest.test_x.shape == (310, 1, 8, 8) and rest.test_y.size == 310
    assert rest.train_x is digits.train_x and digits.test_x.shape == (360, 1, 8, 8)  # original untouched
    assert np.bincount(rest.test_y).tolist() == (np.bincount(digits.test_y) - 5).tolist()
    rows = {r.tobytes() for r in digits.test_x}
    assert all(r.tobytes() in rows for r in ex_x)
    assert not ({r.tobytes() for r in ex_x} & {r.tobytes() for r in rest.test_x})  # removed, not copied
    again = split_exemplars(digits, 5, seed=2021)
    other = split_exemplars(digits, 5, seed=7)
    assert np.array_equal(again[0], ex_x) and not np.array_equal(other[0], ex_x)


def test_split_exemplars_rejects_bad_counts():
    ds = Dataset("tiny", np.zeros((2, 1, 8, 8), np.float32), np.array([0, 1]),
                 np.zeros((4, 1, 8, 8), np.float32), np.array([0, 0, 0, 1]), 2, (1, 8, 8))
    with pytest.raises(ConfigError, match=r"--exemplars 2 .*1 test images of class 1"):
        split_exemplars(ds, 2, 0)
    with pytest.raises(ConfigError, match="--exemplars 0"):
        split_exemplars(ds, 0, 0)
    _, y, rest = split_exemplars(ds, 1, 0)
    assert y.tolist() == [0, 1] and rest.test_y.tolist() == [0, 0]
