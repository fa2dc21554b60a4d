"""Measures tau(r, x) between a superclient representation r and a candidate x (docs/algorithms.md §4.4)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fednet.algorithms.grouping.names import MEASURES, PROBABILITY_ONLY  # noqa: F401
from fednet.errors import ConfigError

Measure = Callable[[np.ndarray, np.ndarray], float]


def _vec(a: np.ndarray) -> np.ndarray:
    """a as a flat float64 vector."""
    return np.asarray(a, dtype=np.float64).ravel()


def gini(r: np.ndarray, x: np.ndarray) -> float:
    """Gini impurity of the unweighted midpoint m = (r + x) / 2: 1 - sum m^2."""
    m = (_vec(r) + _vec(x)) / 2.0
    return float(1.0 - np.sum(m * m))


def kl(r: np.ndarray, x: np.ndarray) -> float:
    """1 - KL(m || uniform) = 1 - sum m log(m N_C) with m = (r + x) / 2 and 0 log 0 = 0."""
    m = (_vec(r) + _vec(x)) / 2.0
    pos = m > 0
    return float(1.0 - np.sum(m[pos] * np.log(m[pos] * m.size)))


def cosine(r: np.ndarray, x: np.ndarray) -> float:
    """Cosine distance 1 - r.x / (|r| |x|) (nan when either vector is zero)."""
    r, x = _vec(r), _vec(x)
    den = float(np.linalg.norm(r) * np.linalg.norm(x))
    return float(1.0 - np.dot(r, x) / den) if den > 0 else float("nan")


def euclidean(r: np.ndarray, x: np.ndarray) -> float:
    """Euclidean distance |r - x|_2 (paper only; not in the official code)."""
    return float(np.linalg.norm(_vec(r) - _vec(x)))


def wasserstein(r: np.ndarray, x: np.ndarray) -> float:
    """scipy's 1-D Wasserstein distance with the vectors' entries taken as samples (as the official code)."""
    from scipy.stats import wasserstein_distance  # here: importing scipy.stats costs ~1 s per process

    return float(wasserstein_distance(_vec(r), _vec(x)))


def gini_many(r: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """gini(r, x) for every row x of xs at once."""
    m = (_vec(r)[None, :] + np.asarray(xs, dtype=np.float64)) / 2.0
    return 1.0 - np.sum(m * m, axis=1)


def kl_many(r: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """kl(r, x) for every row x of xs at once (0 log 0 = 0)."""
    m = (_vec(r)[None, :] + np.asarray(xs, dtype=np.float64)) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(m > 0, m * np.log(m * m.shape[1]), 0.0)
    return 1.0 - np.sum(t, axis=1)


def cosine_many(r: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """cosine(r, x) for every row x of xs at once (nan where either vector is zero)."""
    r, xs = _vec(r), np.asarray(xs, dtype=np.float64)
    den = np.linalg.norm(r) * np.linalg.norm(xs, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, 1.0 - (xs @ r) / den, np.nan)


def euclidean_many(r: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """euclidean(r, x) for every row x of xs at once."""
    return np.linalg.norm(np.asarray(xs, dtype=np.float64) - _vec(r)[None, :], axis=1)


MANY = {"kl": kl_many, "gini": gini_many, "cosine": cosine_many, "euclidean": euclidean_many}
"""Vectorized measures: the greedy grouping scores every remaining client in one call, so its
P picks cost O(P^2 d) arithmetic in numpy instead of P^2 / 2 Python calls (wasserstein, scipy's,
stays per pair)."""

_MEASURES: dict[str, Measure] = {
    "kl": kl, "gini": gini, "cosine": cosine, "euclidean": euclidean, "wasserstein": wasserstein,
}


def measure(name: str) -> Measure:
    """The measure function called name, or a ConfigError naming --param measure."""
    fn = _MEASURES.get(name)
    if fn is None:
        raise ConfigError(f"--param measure={name} is not known; choose one of: {', '.join(MEASURES)}")
    return fn
