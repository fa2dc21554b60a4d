"""Datasets as normalized numpy arrays (N x C x H x W float32, int64 labels), loaded once per process.

digits is embedded (scikit-learn's CSV); cifar10, cifar100 and svhn are read by torchvision from --data-root
(see torchvision_sets.py; torchvision is imported only when one of them is loaded); synthetic-cifar10 and
synthetic-cifar100 are generated (synthetic.py; not CIFAR). All but digits go through the host's .npy cache
(cache.py): converted or generated once per host, then memory-mapped, so processes share one copy.
The naturally federated datasets (NATURAL: one user per client, natural.py) are synthetic-fedprox,
generated per client, and LEAF's femnist, shakespeare and sent140 (leaf.py).
"""
from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable

import numpy as np

from fednet import plugins
from fednet.data import test_split
from fednet.data.base import DATASETS, NATURAL, TEST_FRACTION, Dataset  # noqa: F401
from fednet.data.test_split import run_test_rows, run_test_split, split_exemplars  # noqa: F401
from fednet.errors import ConfigError
from fednet.rng import generator

_CACHE: dict[tuple[str, str | None, int], Dataset] = {}


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) index arrays; each class gives its share of ceil(test_fraction * N) test samples."""
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    n_test = math.ceil(test_fraction * labels.size)
    exact = counts * (n_test / labels.size)
    per_class = np.floor(exact).astype(np.int64)
    # Largest remainder, ties broken by class order, so the test quota sums to n_test exactly.
    short = n_test - int(per_class.sum())
    per_class[np.argsort(-(exact - per_class), kind="stable")[:short]] += 1
    rng = generator(seed, "data/split")
    test_parts = []
    for c, k in zip(classes, per_class):
        idx = np.flatnonzero(labels == c)
        test_parts.append(rng.permutation(idx)[:k])
    test = np.sort(np.concatenate(test_parts)).astype(np.int64)
    mask = np.ones(labels.size, dtype=bool)
    mask[test] = False
    return np.flatnonzero(mask).astype(np.int64), test


def _standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale both arrays with the scalar mean/std of the training array (float32 out)."""
    mean = float(train.mean(dtype=np.float64))
    std = float(train.std(dtype=np.float64)) or 1.0
    return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """(images 1797x64 float64, labels) of scikit-learn's embedded digits.

    Reads the CSV that scikit-learn ships, exactly as `sklearn.datasets.load_digits` does, without
    importing scikit-learn (0.8 s of start-up in every process); falls back to load_digits.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec and spec.submodule_search_locations:
        path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            data = np.loadtxt(path, delimiter=",")
            return data[:, :-1], data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    raw = load_digits()
    return np.asarray(raw.data, dtype=np.float64), np.asarray(raw.target, dtype=np.int64)


def _load_digits(data_root: str | None, download: bool, split_seed: int) -> Dataset:
    """sklearn's embedded 8x8 digits: x/16, stratified 80/20 split, train-standardized."""
    images, y = digits_raw()
    x = (images / 16.0).reshape(-1, 1, 8, 8)
    tr, te = stratified_split(y, TEST_FRACTION, split_seed)
    train_x, test_x = _standardize(x[tr], x[te])
    return Dataset(
        name="digits",
        train_x=np.ascontiguousarray(train_x),
        train_y=y[tr].copy(),
        test_x=np.ascontiguousarray(test_x),
        test_y=y[te].copy(),
        num_classes=10,
        input_shape=(1, 8, 8),
        class_names=tuple(str(i) for i in range(10)),
    )


CACHE_VERSION = 1
"""Part of every cache key of a converted dataset: bump it when a conversion changes."""


def _from_cache(name: str, key: str, data_root: str | None, make: Callable[[], Dataset]) -> Dataset:
    """The dataset from the host's .npy cache (cache.py), made by make() on a miss."""
    from fednet.data.cache import cached

    def build() -> tuple[dict[str, np.ndarray], dict]:
        ds = make()
        arrays = {"train_x": ds.train_x, "train_y": ds.train_y, "test_x": ds.test_x,
                  "test_y": ds.test_y}
        return arrays, {"num_classes": ds.num_classes, "input_shape": list(ds.input_shape),
                        "class_names": list(ds.class_names)}

    a, meta = cached(key, data_root, build)
    return Dataset(name=name, train_x=a["train_x"], train_y=a["train_y"], test_x=a["test_x"],
                   test_y=a["test_y"], num_classes=int(meta["num_classes"]),
                   input_shape=tuple(int(v) for v in meta["input_shape"]),
                   class_names=tuple(str(c) for c in meta["class_names"]))


def _torchvision_loader(name: str) -> Callable[[str | None, bool, int], Dataset]:
    """A loader that imports torchvision_sets (and so torchvision) only on a cache miss; official
    split, no seed."""

    def load(data_root: str | None, download: bool, split_seed: int) -> Dataset:
        from fednet.data.torchvision_sets import load_torchvision

        return _from_cache(name, f"{name}-v{CACHE_VERSION}", data_root,
                           lambda: load_torchvision(name, data_root, download))

    return load


def _synthetic_loader(name: str) -> Callable[[str | None, bool, int], Dataset]:
    """Generated once per host (synthetic.py), then mapped from the cache; fixed seed."""

    def load(data_root: str | None, download: bool, split_seed: int) -> Dataset:
        from fednet.data import synthetic

        def make() -> Dataset:
            a = synthetic.generate(name)
            k = synthetic.SYNTHETIC[name]
            return Dataset(name=name, train_x=a["train_x"], train_y=a["train_y"], test_x=a["test_x"],
                           test_y=a["test_y"], num_classes=k, input_shape=(3, 32, 32),
                           class_names=tuple(str(i) for i in range(k)))

        return _from_cache(name, f"{name}-s{synthetic.SEED}-v{synthetic.VERSION}", data_root, make)

    return load


def _natural_loader(name: str) -> Callable[[str | None, bool, int], Dataset]:
    """synthetic-fedprox (nothing to load: its clients generate their data) or LEAF's files."""

    def load(data_root: str | None, download: bool, split_seed: int) -> Dataset:
        from fednet.data import leaf, synthetic_fedprox

        if name == synthetic_fedprox.NAME:
            return synthetic_fedprox.dataset()
        return leaf.load(name, data_root, download)

    return load


_LOADERS: dict[str, Callable[[str | None, bool, int], Dataset]] = {
    "digits": _load_digits,
    **{n: _torchvision_loader(n) for n in ("cifar10", "cifar100", "svhn")},
    **{n: _synthetic_loader(n) for n in ("synthetic-cifar10", "synthetic-cifar100")},
    **{n: _natural_loader(n) for n in NATURAL},
}


PLUGIN_DATASETS: list[str] = []
"""Datasets that plugins registered (register_dataset; fednet/plugins/__init__.py), in order."""
DEFAULT_MODELS: dict[str, str] = {}
"""A plugin dataset -> the model --model auto builds for it."""


def register_dataset(name: str, loader: Callable[[str | None, bool, int], Dataset], *,
                     model: str = "") -> None:
    """Make `--dataset NAME` load loader(data_root, download, split_seed) -> Dataset (normalized
    float32 N x C x H x W arrays and int64 labels; a plugin's dataset). model: the model that
    --model auto builds for it (the loader's `default_model` attribute does the same)."""
    if name in _LOADERS and name not in PLUGIN_DATASETS:
        raise ValueError(f"dataset {name!r} is registered twice")
    _LOADERS[name] = loader
    if name not in PLUGIN_DATASETS:
        PLUGIN_DATASETS.append(name)
    model = model or getattr(loader, "default_model", "")
    if model:
        DEFAULT_MODELS[name] = model
    plugins.provide("dataset", name)


def dataset_names() -> tuple[str, ...]:
    """Every name --dataset accepts (built-in, then plugins)."""
    return DATASETS + NATURAL + tuple(PLUGIN_DATASETS)


def load_dataset(
    name: str, data_root: str | None = None, download: bool = False, split_seed: int = 0
) -> Dataset:
    """Load (once per process, cached by name, root and split seed) the named dataset; do not mutate the result."""
    loader = _LOADERS.get(name)
    if loader is None:
        raise ConfigError(
            f"--dataset {name!r} is not known; choose one of: {', '.join(dataset_names())}"
        )
    root = None if name == "digits" or not data_root else os.path.abspath(os.path.expanduser(data_root))
    key = (name, root, int(split_seed) if name == "digits" else 0)  # official splits ignore the seed
    ds = _CACHE.get(key)
    if ds is None:
        ds = loader(data_root, download, int(split_seed))
        _CACHE[key] = ds
    return ds


def clear_cache() -> None:
    """Forget every loaded dataset and test split (tests; freeing memory)."""
    _CACHE.clear()
    test_split.clear()


plugins.attach("dataset", register_dataset)  # installed dataset plugins (entry points), lazily
