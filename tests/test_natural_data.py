"""Naturally federated datasets (data/natural.py): synthetic-fedprox generated per client, and
LEAF's JSON files (femnist, shakespeare, sent140) with one user per client."""
from __future__ import annotations

import hashlib
import math
import subprocess
import sys
import time
import tracemalloc
import zlib

import numpy as np
import pytest

from fednet.config import DataConfig
from fednet.data import clear_cache, load_dataset, natural, run_partition
from fednet.data import synthetic_fedprox as sf
from fednet.data.client_data import client_data
from fednet.errors import ConfigError

SYN = DataConfig(dataset="synthetic-fedprox", partition="natural")


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def test_synthetic_golden_numbers():
    """The sizes and data of a few clients, pinned: a change to the generator must bump VERSION."""
    assert [sf.size(0, c) for c in range(6)] == [252, 54, 50, 153, 140, 196]
    x, y, tx, ty = sf.client_arrays(0, 0)
    assert (len(y), len(ty)) == (226, 26)  # int(0.9 * 252) train, the rest test
    assert x.shape == (226, 60) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.bincount(y, minlength=10).tolist() == [0, 0, 0, 100, 0, 0, 126, 0, 0, 0]
    assert round(float(x.astype(np.float64).sum()), 3) == -127.179
    assert (zlib.crc32(x.tobytes()), zlib.crc32(y.tobytes())) == (2492556959, 897828022)
    crc = 0  # clients 0..199, all four arrays (the labels' product runs on one BLAS thread)
    for c in range(200):
        for a in sf.client_arrays(0, c):
            crc = zlib.crc32(np.ascontiguousarray(a).tobytes(), crc)
    assert crc == 3506907054


def test_synthetic_data_depends_only_on_seed_and_client():
    a = sf.client_arrays(3, 17, 0.5, 0.5)
    assert _digest(*a) == _digest(*sf.client_arrays(3, 17, 0.5, 0.5))
    assert _digest(*a) != _digest(*sf.client_arrays(3, 18, 0.5, 0.5))
    assert _digest(*a) != _digest(*sf.client_arrays(4, 17, 0.5, 0.5))
    assert len(a[1]) == sf.train_size(3, 17)  # alpha and beta do not change the sizes


def test_synthetic_follows_the_model():
    """y = argmax(W_k x + b_k) is a function of x per client: a linear model fits one client;
    alpha = beta = 0 clients share their input mean's distribution, alpha = beta = 1 ones differ."""
    x, y, _, _ = sf.client_arrays(0, 12)  # 613 training samples
    feats = np.hstack([x.astype(np.float64), np.ones((len(x), 1))])
    onehot = np.eye(10)[y]
    w, *_ = np.linalg.lstsq(feats, onehot, rcond=None)
    assert (np.argmax(feats @ w, 1) == y).mean() > 0.75
    spread = [np.std([sf.client_arrays(1, c, a, a)[0].mean() for c in range(40)]) for a in (0, 1)]
    assert spread[0] < 0.5 * spread[1]
    # the variance of feature j falls as j^-1.2 around the client's mean
    var = x.astype(np.float64).var(axis=0)
    assert abs(var[0] - 1.0) < 0.2 and 60 ** -1.2 / 2 < var[59] < 2 * 60 ** -1.2


def test_alpha_changes_no_label_and_beta_moves_the_inputs():
    """u_k shifts every logit of client k alike (FedProx's definition), so alpha changes nothing;
    beta does."""
    for cid in range(5):
        a = sf.client_arrays(0, cid, 0.0, 1.0)
        b = sf.client_arrays(0, cid, 1.0, 1.0)
        assert all(np.array_equal(u, v) for u, v in zip(a, b))
    c = sf.client_arrays(0, 1, 1.0, 0.0)
    assert not np.array_equal(sf.client_arrays(0, 1, 1.0, 1.0)[0], c[0])


def test_synthetic_sizes_follow_fedprox_lognormal():
    from statistics import NormalDist

    sizes = np.array([sf.size(5, c) for c in range(4000)])
    assert sizes.min() >= sf.MIN_SIZE and sizes.max() <= sf.MAX_SIZE
    # quantiles of int(lognormal(4, 2)) + 50, within 2.5 points of their levels
    for q in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99):
        at = int(math.exp(4 + 2 * NormalDist().inv_cdf(q))) + 50
        assert abs((sizes <= at).mean() - q) < 0.025, q
    # int(lognormal(4, 2)) + 50: median e^4 + 50, log-spread 2
    assert abs(np.median(sizes) - (math.exp(4) + 50)) < 12
    body = sizes[(sizes > 60) & (sizes < sf.MAX_SIZE)] - 50
    assert abs(np.log(body).mean() - 4.69) < 0.15  # E[log x | x > 10] of lognormal(4, 2)
    assert 4 <= int((sizes == sf.MAX_SIZE).sum()) <= 40  # P(cap) = 0.47%: ~19 of 4000


def test_every_clients_size_at_once_is_each_ones_size():
    """sizes (numpy) equals size (scalar libm) client by client, the rounding fix-up included;
    a natural partition's sizes and part_sizes read it, and name an id out of range."""
    from fednet.data.partition import part_sizes

    for seed in (0, 3, 2**40 + 7):
        ids = np.arange(200_000, dtype=np.int64) * 37 + seed % 1000
        assert np.array_equal(sf.sizes(seed, ids), [sf.size(seed, c) for c in ids.tolist()])
        assert np.array_equal(sf.train_sizes(seed, ids[:5000]),
                              [sf.train_size(seed, c) for c in ids[:5000].tolist()])
    parts = run_partition(load_dataset("synthetic-fedprox"), SYN, 1000, 4)
    ids = np.array([0, 999, 17, 17], np.int64)
    assert part_sizes(parts, ids).tolist() == [len(parts[c]) for c in ids.tolist()]
    with pytest.raises(ConfigError, match="1000 is outside 0..999"):
        part_sizes(parts, np.array([3, 1000], np.int64))
    plain = [np.arange(k) for k in (3, 0, 5)]
    assert part_sizes(plain, np.array([2, 0, 1], np.int64)).tolist() == [5, 3, 0]


def test_a_client_is_the_same_in_another_process():
    here = _digest(*sf.client_arrays(2, 123_456))
    code = ("import hashlib, numpy as np; from fednet.data import synthetic_fedprox as sf\n"
            "h = hashlib.sha256()\n"
            "for a in sf.client_arrays(2, 123_456): h.update(np.ascontiguousarray(a).tobytes())\n"
            "print(h.hexdigest()[:16])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert there == here


def test_the_last_client_of_a_million_costs_its_own_size():
    ds = load_dataset("synthetic-fedprox")
    n = 1_000_000
    tracemalloc.start()
    t = time.perf_counter()
    parts = run_partition(ds, SYN, n, 0)
    cd = client_data(ds, SYN, n, 0, n - 1, parts[n - 1])
    took = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(parts) == n and len(cd.y) == sf.train_size(0, n - 1) == len(parts[n - 1])
    assert took < 0.5 and peak < 8 << 20  # O(its size): never O(population)
    t = time.perf_counter()
    stats, hists, label_hist = natural.summary(ds, SYN, n, 0)  # the first 100 clients only
    test = natural.test_dataset(ds, SYN, n, 0)
    assert time.perf_counter() - t < 2.0
    assert stats["clients"] == n and stats["described_clients"] == sf.TEST_CLIENTS
    assert label_hist is None and hists[5] is not None and hists[n - 1] is None
    assert len(test.test_y) == sum(sf.size(0, c) - sf.train_size(0, c) for c in range(100))


def test_the_server_test_set_is_the_held_out_part_of_the_first_clients():
    ds = load_dataset("synthetic-fedprox")
    test = natural.test_dataset(ds, SYN, 30, 0)
    parts = [sf.client_arrays(0, c) for c in range(30)]
    assert np.array_equal(test.test_x, np.concatenate([p[2] for p in parts]))
    assert np.array_equal(test.test_y, np.concatenate([p[3] for p in parts]))
    cd = client_data(ds, SYN, 30, 0, 4)  # a client tests its own model on its own held-out part
    assert np.array_equal(cd.test_x, parts[4][2]) and np.array_equal(cd.x, parts[4][0])
    stats, hists, label_hist = natural.summary(ds, SYN, 30, 0)
    assert label_hist.shape == (30, 10) and hists[4] == np.bincount(parts[4][1], minlength=10).tolist()
    assert stats["samples"] == sum(len(p[1]) for p in parts)


def test_natural_options_are_checked():
    ds = load_dataset("synthetic-fedprox")
    with pytest.raises(ConfigError, match="--partition iid does not apply"):
        run_partition(ds, DataConfig(dataset="synthetic-fedprox"), 10, 0)
    with pytest.raises(ConfigError, match="--synthetic-alpha must be"):
        run_partition(ds, DataConfig(dataset="synthetic-fedprox", partition="natural",
                                     synthetic_alpha=-1.0), 10, 0)
    with pytest.raises(ConfigError, match="--partition natural is for"):
        run_partition(load_dataset("digits"), DataConfig(partition="natural"), 10, 0)
    with pytest.raises(ConfigError, match="different data"):
        client_data(ds, SYN, 10, 0, 3, np.arange(3))
    perm = client_data(ds, DataConfig(dataset="synthetic-fedprox", partition="natural",
                                      permute=True), 10, 0, 3)
    plain = client_data(ds, SYN, 10, 0, 3)
    assert np.array_equal(perm.y, perm.permutation[plain.y])


def test_cli_takes_synthetic_settings_and_refuses_partitions():
    from fednet.cli.options import build_config

    cfg = build_config({"dataset": "synthetic-fedprox", "synthetic_alpha": 0.5,
                        "synthetic_beta": 0.5}, {})
    assert (cfg.data.partition, cfg.data.synthetic_alpha, cfg.data.synthetic_beta) == \
        ("natural", 0.5, 0.5)
    assert build_config({"dataset": "femnist"}, {}).data.partition == "natural"
    for bad, match in (({"partition": "dirichlet"}, "does not apply"),
                       ({"alpha": 0.3}, "--synthetic-alpha")):
        with pytest.raises(ConfigError, match=match):
            build_config({"dataset": "synthetic-fedprox", **bad}, {})
    from fednet.algorithms.checks import validate

    with pytest.raises(ConfigError, match="settings of --dataset synthetic-fedprox"):
        validate(build_config({"synthetic_alpha": 0.5}, {}))
    with pytest.raises(ConfigError, match="pooled training set"):
        validate(build_config({"dataset": "synthetic-fedprox", "algo": "centralized"}, {}))


def test_fedavg_learns_synthetic_above_chance(tmp_path):
    """FedAvg on synthetic-fedprox(1,1), 30 clients (FedProx's setting), 4 rounds: well above
    chance (10%) and above always answering the test set's most common class."""
    from fednet.core.inproc import run_local
    from tests.conftest import small_config

    cfg = small_config(clients=30, rounds=4, seed=0, data={"dataset": "synthetic-fedprox",
                                                   "partition": "natural"},
                       train={"epochs": 2, "batch_size": 10, "lr": 0.1}, out=str(tmp_path / "r"))
    s = run_local(cfg, quiet=True)
    test = natural.test_dataset(load_dataset("synthetic-fedprox"), cfg.data, 30, cfg.seed)
    majority = np.bincount(test.test_y).max() / len(test.test_y)
    assert s["status"] == "completed" and s["final_accuracy"] > max(0.4, majority + 0.15)
    assert s["partition"]["described_clients"] == 30


@pytest.fixture(autouse=True)
def _fresh():
    clear_cache()
    yield
    clear_cache()
