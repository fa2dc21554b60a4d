"""The run's test set: FedSeq's exemplars taken out of a dataset's test split, and the rows every
client evaluates on (docs/algorithms.md §2.1 and §2.6); computed once per process and dataset."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fednet.errors import ConfigError
from fednet.rng import generator

if TYPE_CHECKING:
    from fednet.data.base import Dataset


def _exemplar_rows(ds: Dataset, per_class: int, seed: int) -> np.ndarray:
    """Sorted-by-class test rows of FedSeq's exemplars (per_class of every class), or ConfigError."""
    per_class = int(per_class)
    counts = np.bincount(ds.test_y, minlength=ds.num_classes)
    if per_class < 1 or per_class > int(counts.min()):
        c = int(np.argmin(counts))
        raise ConfigError(
            f"--exemplars {per_class} is not usable: exemplars per class must be between 1 and the "
            f"{int(counts.min())} test images of class {c} of {ds.name}; choose a value in that range"
        )
    rng = generator(seed, "data/exemplars")
    return np.concatenate(
        [np.sort(rng.permutation(np.flatnonzero(ds.test_y == c))[:per_class]) for c in range(ds.num_classes)]
    ).astype(np.int64)


def split_exemplars(ds: Dataset, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray, Dataset]:
    """FedSeq's public exemplars (2.1, pitfall 14): per_class random test images of every class, removed.

    Returns (x, y) of the exemplars, ordered by class, and a copy of ds whose test set excludes them
    (remaining test images keep their order; the train arrays are shared, not copied).
    """
    picked = _exemplar_rows(ds, per_class, seed)
    keep = np.ones(ds.test_y.size, dtype=bool)
    keep[picked] = False
    rest = replace(ds, test_x=np.ascontiguousarray(ds.test_x[keep]), test_y=ds.test_y[keep].copy())
    return np.ascontiguousarray(ds.test_x[picked]), ds.test_y[picked].copy(), rest


def _exemplars_per_class(ds: Dataset, requested: int) -> int:
    """--exemplars: requested < 0 means 5 per class for digits, 10 for the 32x32 datasets; for a
    naturally federated dataset 10, or a tenth of its rarest class's test samples (0: none)."""
    if requested >= 0:
        return requested
    if getattr(ds, "natural", None) is not None:
        counts = np.bincount(ds.test_y, minlength=ds.num_classes)
        return int(min(10, counts.min() // 10)) if counts.size else 0
    return 5 if ds.name == "digits" else 10


# keyed by (id of the test labels, exemplars per class, seed); the value keeps the labels array
# itself, so a recycled id never matches
_SPLITS: dict[tuple[int, int, int], tuple[np.ndarray, Dataset, tuple[np.ndarray, np.ndarray]]] = {}
_ROWS: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def run_test_split(ds: Dataset, requested: int, seed: int
                   ) -> tuple[Dataset, tuple[np.ndarray, np.ndarray] | None]:
    """The test set every algorithm of a run evaluates on, and the exemplars taken out of it
    (computed once per process and dataset; do not mutate the result).

    requested < 0 means the default: 5 per class for digits, 10 for the 32x32 datasets
    (docs/algorithms.md §2.1 and §2.6); 0 keeps the whole test set and provides no exemplars.
    """
    j = _exemplars_per_class(ds, requested)
    if j == 0:
        return ds, None
    key = (id(ds.test_y), j, int(seed))
    hit = _SPLITS.get(key)
    if hit is None or hit[0] is not ds.test_y:
        x, y, rest = split_exemplars(ds, j, seed)
        hit = _SPLITS[key] = (ds.test_y, rest, (x, y))
    return hit[1], hit[2]


def run_test_rows(ds: Dataset, requested: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows of ds.test_x, their labels) of run_test_split's test set, without copying an image:
    what clients evaluate on, as an index view (computed once per process; do not mutate)."""
    j = _exemplars_per_class(ds, requested)
    key = (id(ds.test_y), j, int(seed))
    hit = _ROWS.get(key)
    if hit is None or hit[0] is not ds.test_y:
        keep = np.ones(ds.test_y.size, dtype=bool)
        if j:
            keep[_exemplar_rows(ds, j, seed)] = False
        rows = np.flatnonzero(keep).astype(np.int64)
        hit = _ROWS[key] = (ds.test_y, rows, ds.test_y[rows])
    return hit[1], hit[2]


def clear() -> None:
    """Forget every test split (datasets.clear_cache)."""
    _SPLITS.clear()
    _ROWS.clear()
