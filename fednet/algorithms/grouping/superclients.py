"""Superclient builders phi_rand / phi_kmeans / phi_greedy and their quality statistics
(docs/algorithms.md §4.5, §4.10)."""
from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable

import numpy as np

from fednet import opcount
from fednet.algorithms.grouping.measures import MANY
from fednet.algorithms.grouping.measures import measure as get_measure
from fednet.algorithms.grouping.names import GROUPINGS  # noqa: F401
from fednet.errors import ConfigError
from fednet.rng import generator


TIE_TOL = 1e-12
"""Greedy scores closer than this (relative to max(1, |best|)) are ties: summation order must not break them."""

Picker = Callable[[list[int]], int]

GREEDY_PASSES = {"kl": 10, "gini": 6, "cosine": 4, "euclidean": 5}
"""The server's work of a greedy pick (charged to the open count, opcount: the setup stage's
server work, core/rounds.setup), element operations ("stream") per value of the remaining
clients' representations it scores (R d; and 2 d a member for the superclient's
representation): the fancy-indexed copy and the measure's vectorized passes. Measured with
_greedy's picks over K = 1500 x d = 100 and K = 800 x d = 400 Dirichlet representations, its CPU
seconds at the stream rate of the same minutes (secagg/rates.py, 2.0e9/s), twice: kl 9.7-10.6,
gini 5.8-6.7, cosine 3.6-4.2, euclidean 4.7-5.6 (at 66bdfdc; not at run time)."""
WASSERSTEIN = (14_000, 250)
"""And wasserstein's, scipy's call per pair: stream operations per pair and per value of it,
fitted to the same timings at K = 200 x d = 100 (38,955 a pair) and K = 150 x d = 400
(113,078)."""
KMEANS_PASSES = 6
"""KMeans (lloyd, n_init runs): stream operations per client x cluster x value, per iteration of
its best run, times n_init: measured 4.3-10.9 (5.3-5.8 at K = 1500, d = 100) in the timings
above (sklearn's threads: CPU seconds)."""


def pick_work(measure: str, remaining: int, d: int, members: int) -> dict[str, float]:
    """A greedy pick's work (GREEDY_PASSES, WASSERSTEIN)."""
    if measure in GREEDY_PASSES:
        scored = float(GREEDY_PASSES[measure] * remaining * d)
    else:
        per_pair, per_value = WASSERSTEIN
        scored = float(remaining * (per_pair + per_value * d))
    return {"stream": scored + 2.0 * members * d}


def representation(members: list[int], reps: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Sample-weighted mean of the members' reps; uniform 1/d for an empty superclient."""
    reps = np.asarray(reps, dtype=np.float64)
    d = reps.shape[1]
    if not members:
        return np.full(d, 1.0 / d)
    w = np.asarray(sizes, dtype=np.float64)[list(members)]
    if w.sum() <= 0:  # all members empty: fall back to the plain mean
        w = np.ones_like(w)
    return (w / w.sum()) @ reps[list(members)]


def _fill(pick: Picker, n: int, sizes: np.ndarray, min_samples: int, max_clients: int) -> list[list[int]]:
    """The common loop: add pick(S) while |D_S| < min_samples and |S| < max_clients, then leftover handling."""
    closed: list[list[int]] = []
    cur: list[int] = []
    left = n
    while left:
        if sum(int(sizes[k]) for k in cur) < min_samples and len(cur) < max_clients:
            cur.append(pick(cur))
            left -= 1
        else:
            closed.append(cur)
            cur = []
    return _leftovers(closed, cur, sizes, min_samples, max_clients, n)


def _leftovers(closed: list[list[int]], cur: list[int], sizes: np.ndarray, min_samples: int,
               max_clients: int, n: int) -> list[list[int]]:
    """Keep the open superclient if it reached min_samples, else hand its clients to the smallest closed ones."""
    if not cur:
        return closed
    if sum(int(sizes[k]) for k in cur) >= min_samples:
        return closed + [cur]
    if not closed or math.ceil(n / len(closed)) > max_clients:
        raise ConfigError(
            f"--param min_samples={min_samples} with --param max_clients={max_clients} cannot place all {n} "
            f"clients ({len(closed)} closed superclients); use a smaller min_samples or a larger max_clients")
    targets = sorted((s for s in closed if len(s) < max_clients), key=lambda s: sum(int(sizes[k]) for k in s))
    for s in itertools.cycle(targets):
        if len(s) < max_clients:
            s.append(cur.pop())  # the official code pops from the end of the open superclient
        if not cur:
            break
    return closed


def _random(n: int, seed: int) -> Picker:
    """Clients in a seeded random order."""
    order = [int(k) for k in generator(seed, "grouping/random").permutation(n)]
    opcount.charge({"stream": float(n)})  # (the permutation)
    return lambda _cur: order.pop(0)


def _kmeans(reps: np.ndarray, num_classes: int, seed: int) -> Picker:
    """One client from each KMeans cluster in turn (cycle continues across superclients, pop from the end)."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    k = max(1, min(int(num_classes), reps.shape[0]))
    state = int(generator(seed, "grouping/kmeans").integers(0, 2**31 - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # duplicate points: fewer distinct clusters
        fit = KMeans(n_clusters=k, random_state=state, n_init=10).fit(reps)
    labels = fit.labels_
    opcount.charge({"stream": float(KMEANS_PASSES * reps.shape[0] * k * reps.shape[1] * 10
                                    * int(fit.n_iter_))})  # (the server's: KMEANS_PASSES)
    clusters: list[list[int]] = [[] for _ in range(k)]
    for i, lab in enumerate(labels):
        clusters[int(lab)].append(i)
    it = itertools.cycle(clusters)

    def pick(_cur: list[int]) -> int:
        g = next(it)
        while not g:
            g = next(it)
        return g.pop()
    return pick


def _greedy(reps: np.ndarray, sizes: np.ndarray, measure: str, zero_floor: bool) -> Picker:
    """The remaining client (id order) maximising tau(representation(S), rep_j)."""
    tau, many = get_measure(measure), MANY.get(measure)
    remaining = list(range(reps.shape[0]))

    def pick(cur: list[int]) -> int:
        opcount.charge(pick_work(measure, len(remaining), reps.shape[1], len(cur)))
        r = representation(cur, reps, sizes)
        if many is not None:  # every remaining client scored in one numpy call
            vals = np.asarray(many(r, reps[remaining]), dtype=np.float64)
        else:
            vals = np.array([tau(r, reps[j]) for j in remaining], dtype=np.float64)
        vals[np.isnan(vals)] = -np.inf
        if zero_floor:  # official quirk: running best starts at 0 with strict '>'
            best, idx = 0.0, 0
            for i, v in enumerate(vals):
                if v > best + TIE_TOL * max(1.0, abs(best)):
                    best, idx = v, i
        else:  # true argmax; values within TIE_TOL of the max tie and go to the lowest remaining id
            top = vals.max()
            idx = int(np.flatnonzero(vals >= top - TIE_TOL * max(1.0, abs(top)))[0]) if np.isfinite(top) else 0
        return remaining.pop(idx)
    return pick


def _matrix(reps: np.ndarray | None, n: int, measure: str) -> np.ndarray:
    """reps as the n x d float64 matrix the groupings but random read."""
    get_measure(measure)  # fail early on a typo even where the measure is unused (kmeans)
    matrix = np.asarray(reps, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != n:
        raise ValueError(f"reps must be a {n} x d matrix, got shape {matrix.shape}")
    return matrix


def group(name: str, reps: np.ndarray | None, sizes: np.ndarray, measure: str, min_samples: int,
          max_clients: int, seed: int, num_classes: int, zero_floor: bool = False) -> list[list[int]]:
    """Client indices (0..K-1) of each superclient built by grouping `name` (docs/algorithms.md §4.5)."""
    if name not in GROUPINGS:
        raise ConfigError(f"--param grouping={name} is not known; choose one of: {', '.join(GROUPINGS)}")
    if int(min_samples) < 1:
        raise ConfigError(f"--param min_samples={min_samples} must be at least 1 (samples per superclient)")
    if int(max_clients) < 1:
        raise ConfigError(f"--param max_clients={max_clients} must be at least 1 (clients per superclient)")
    sizes = np.asarray(sizes, dtype=np.int64).ravel()
    n = sizes.size
    matrix = None if name == "random" else _matrix(reps, n, measure)
    if n == 0:
        return []
    if matrix is None:
        pick = _random(n, seed)
    elif name == "kmeans":
        pick = _kmeans(matrix, num_classes, seed)
    else:
        pick = _greedy(matrix, sizes, measure, zero_floor)
    return _fill(pick, n, sizes, int(min_samples), int(max_clients))


def _mean_std(v: list[float]) -> tuple[float, float]:
    """Mean and population std (0, 0 for an empty list)."""
    return (float(np.mean(v)), float(np.std(v))) if v else (0.0, 0.0)


def superclient_stats(groups: list[list[int]], label_hist: np.ndarray) -> dict:
    """Balance ratio and covered classes per superclient plus size statistics (docs/algorithms.md §4.10)."""
    hist = np.asarray(label_hist, dtype=np.float64)
    balance: list[float] = []
    covered: list[float] = []
    for g in groups:
        nc = hist[list(g)].sum(axis=0) if g else np.zeros(hist.shape[1])
        balance.append(float(nc.min() / nc.max()) if nc.min() > 0 else 0.0)
        covered.append(float(np.mean(nc > 0)))
    clients = [float(len(g)) for g in groups]
    samples = [float(hist[list(g)].sum()) if g else 0.0 for g in groups]
    out: dict = {"num_superclients": len(groups), "balance_ratio": balance, "covered_classes": covered}
    for key, vals in (("balance_ratio", balance), ("covered_classes", covered),
                      ("clients", clients), ("samples", samples)):
        out[f"{key}_mean"], out[f"{key}_std"] = _mean_std(vals)
    return out
