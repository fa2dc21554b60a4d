"""Robust aggregation (--defense): the rules on a round's updates, and RobustMean, which takes
the place of FedAvg's streamed mean (algorithms/fedavg.py; the FedOpt family reads it too).

Every rule works on X, an (n, d) float64 matrix whose rows are the round's updates
Δ_i = θ_i − θ (the returned model minus the round's global model, every floating entry
flattened in name order), rows in client-id order, so the result does not depend on the order
of arrival. Spec: docs/algorithms.md §10.2.

    krum          the row with the least score s_i = Σ of its n − f − 2 smallest squared
                  distances to the other rows (Blanchard et al., NeurIPS 2017)
    multikrum     the plain mean of the m rows with the least scores
    bulyan        θ = n − 2f rows chosen by Krum one at a time among the rest, then per
                  coordinate the mean of the β = θ − 2f values closest to their median
                  (El Mhamdi et al., ICML 2018)
    median        the coordinate-wise median (Yin et al., ICML 2018)
    trimmed_mean  per coordinate, the mean after cutting the k largest and k smallest values,
                  k = f or ⌊β n⌋ (Yin et al., ICML 2018)
    norm_bound    each row scaled to norm at most M, then the sample-weighted mean (Sun et al.
                  2019)
    centered_clip v ← v + (1/n) Σ (x_i − v) min(1, τ / |x_i − v|), L times from v = the
                  previous round's aggregate, τ the median of the |x_i − v| unless given
                  (Karimireddy, He and Jaggi, ICML 2021)

Numpy only. Large matrices are worked through in column blocks (BLOCK), so the coordinate-wise
rules need a few blocks of scratch memory beside X, not copies of it.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednet.algorithms.aggregate import flat
from fednet.algorithms.robust_spec import (ByzantineCount, CenteredClipParams, MultiKrumParams,
                                           NormBoundParams, TrimmedMeanParams, assumed_f,
                                           byzantine_count, defense_spec)
from fednet.types import Arrays

log = logging.getLogger("fednet.server")

BLOCK = 1 << 16  # columns per block of the coordinate-wise rules


# ---- the rules -------------------------------------------------------------------------------


def sq_distances(x: np.ndarray) -> np.ndarray:
    """The n x n squared Euclidean distances between the rows (|a|^2 + |b|^2 - 2 a.b, one
    matrix product: O(n^2 d)), non-negative, zero on the diagonal."""
    g = x @ x.T
    sq = np.diag(g).copy()
    d = sq[:, None] + sq[None, :] - 2.0 * g
    np.maximum(d, 0.0, out=d)
    np.fill_diagonal(d, 0.0)
    return d


def krum_scores(d: np.ndarray, f: int) -> np.ndarray:
    """Each row's Krum score from its squared distances d: the sum of its max(1, n - f - 2)
    smallest distances to the other rows (at least one neighbour, as Flower)."""
    n = len(d)
    if n == 1:
        return np.zeros(1)
    k = min(max(1, n - f - 2), n - 1)
    others = d + np.diag(np.full(n, np.inf))
    return np.sort(others, axis=1)[:, :k].sum(axis=1)


def krum(x: np.ndarray, f: int) -> tuple[np.ndarray, list[int]]:
    """Krum: the row with the least score (the first one on a tie); (it, [its index])."""
    i = int(np.argmin(krum_scores(sq_distances(x), f)))
    return x[i].copy(), [i]


def multi_krum(x: np.ndarray, f: int, m: int) -> tuple[np.ndarray, list[int]]:
    """Multi-Krum: the plain mean of the m rows with the least scores (stable on ties)."""
    order = np.argsort(krum_scores(sq_distances(x), f), kind="stable")[:m]
    keep = sorted(int(i) for i in order)
    return x[keep].mean(axis=0), keep


def bulyan_select(d: np.ndarray, f: int) -> list[int]:
    """Bulyan's first stage: θ = n - 2f rows, each the Krum choice among those left."""
    left = list(range(len(d)))
    chosen: list[int] = []
    for _ in range(len(d) - 2 * f):
        sub = d[np.ix_(left, left)]
        pick = left[int(np.argmin(krum_scores(sub, f)))]
        chosen.append(pick)
        left.remove(pick)
    return chosen


def closest_mean(s: np.ndarray, beta: int) -> np.ndarray:
    """Per coordinate, the mean of the beta values of the rows of s closest to their median
    (stable on ties: the lower row first)."""
    out = np.empty(s.shape[1])
    for a in range(0, s.shape[1], BLOCK):
        b = min(a + BLOCK, s.shape[1])
        blk = np.ascontiguousarray(s[:, a:b].T)  # a coordinate's values side by side: 5x faster
        med = np.median(blk, axis=1)
        order = np.argsort(np.abs(blk - med[:, None]), axis=1, kind="stable")[:, :beta]
        out[a:b] = np.add.reduce(np.take_along_axis(blk, order, axis=1).T, axis=0) / beta
    return out


def bulyan(x: np.ndarray, f: int) -> tuple[np.ndarray, list[int]]:
    """Bulyan over Krum: (the aggregate, the θ rows chosen, in the order chosen)."""
    chosen = bulyan_select(sq_distances(x), f)
    beta = len(chosen) - 2 * f
    return closest_mean(x[sorted(chosen)], beta), chosen


def median(x: np.ndarray) -> np.ndarray:
    """The coordinate-wise median (the mean of the two middle values for even n)."""
    out = np.empty(x.shape[1])
    for a in range(0, x.shape[1], BLOCK):
        b = min(a + BLOCK, x.shape[1])
        out[a:b] = np.median(x[:, a:b], axis=0)
    return out


def trimmed_mean(x: np.ndarray, k: int) -> np.ndarray:
    """The coordinate-wise mean without the k largest and the k smallest values."""
    n = len(x)
    if not 0 <= 2 * k < n:
        raise ValueError(f"a trimmed mean of {n} values cannot cut {k} from each end")
    out = np.empty(x.shape[1])
    for a in range(0, x.shape[1], BLOCK):
        b = min(a + BLOCK, x.shape[1])
        part = np.partition(x[:, a:b], (k, n - k - 1), axis=0) if k else x[:, a:b]
        out[a:b] = part[k:n - k].mean(axis=0)
    return out


def norm_bound(x: np.ndarray, w: np.ndarray, bound: float) -> tuple[np.ndarray, float]:
    """Every row scaled to norm <= M (M = bound, or the median row norm for 0), then the
    w-weighted mean; (it, M)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    m = float(bound) if bound > 0 else float(np.median(norms))
    scale = np.minimum(1.0, m / np.where(norms > 0, norms, 1.0))
    return (w * scale) @ x / w.sum(), m


def centered_clip(x: np.ndarray, center: np.ndarray, radius: float, iters: int
                  ) -> tuple[np.ndarray, float]:
    """Centered clipping: L iterations of v <- v + mean_i (x_i - v) min(1, tau / |x_i - v|);
    (v, the last iteration's tau).

    tau is `radius`, or for 0 (the default) the median of the distances |x_i - v| at each
    iteration: on the scale of the round's updates, as norm bounding's M (and for the same
    reason: with fewer than half of the results Byzantine, the median distance is an honest
    one). Karimireddy, He and Jaggi's analysis (ICML 2021, Theorem III) sets tau from the honest
    updates' spread around the current center, not a constant; their experiments fix it per
    task (the official code's CIFAR-10 runs: tau = 100, L = 1, tuned over 0.1 to 1000). A
    constant tau is in the units of one model's updates: fednet's old default of 10 clipped
    nothing on digits' updates (norms 2-5) and let one update of 1e30 move the aggregate by
    tau / n = 1.25 every round. With the median, an outlier moves it by at most the median
    distance / n, and the honest updates within the median pass unchanged."""
    v = np.array(center, dtype=np.float64, copy=True)
    tau = float(radius)
    for _ in range(iters):
        diff = x - v
        norms = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        tau = float(radius) if radius > 0 else float(np.median(norms))
        scale = np.minimum(1.0, tau / np.where(norms > 0, norms, 1.0))
        v = v + (scale @ diff) / len(x)
    return v, tau


def center_problem(center: np.ndarray, model: Arrays) -> str:
    """Why a checkpointed centered-clipping center cannot be the next round's (one line), or
    '': it is the last aggregate update, one finite float64 per floating value of the model."""
    size = sum(int(a.size) for a in model.values() if a.dtype.kind == "f")
    if center.ndim != 1 or center.dtype != np.float64 or center.size != size:
        return (f"the centered-clipping center has shape {center.shape} and dtype {center.dtype};"
                f" it is one float64 per floating value of the model ({size})")
    if not np.isfinite(center).all():
        return "the centered-clipping center holds NaN or inf"
    return ""


# ---- one round --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """A round's robust aggregate (None: refused) and what to log about it."""

    update: np.ndarray | None
    metrics: dict[str, float] = field(default_factory=dict)
    chosen: list[int] = field(default_factory=list)  # row indices a selecting rule kept
    why: str = ""  # a refusal's reason (the round's round_failed)


def one_blas_thread() -> Any:
    """A context in which numpy's BLAS runs one thread (threadpoolctl, which scikit-learn
    brings): the n x n products of Krum and Bulyan ran 20 times slower with OpenBLAS's threads
    on a loaded 2-core machine (0.04 s against 0.8 s for 100 x 155,000), and one thread gives
    the same sums in every process."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency of scikit-learn, which fednet needs
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def apply(name: str, p: Any, share: float, x: np.ndarray, w: np.ndarray,
          center: np.ndarray | None = None) -> Outcome:
    """The defense `name` (typed parameters p) on the round's updates x, weights w; refused
    (update None, one warning) when the round has fewer results than its assumption needs."""
    with one_blas_thread():
        return _apply(name, p, share, x, w, center)


def _apply(name: str, p: Any, share: float, x: np.ndarray, w: np.ndarray,
           center: np.ndarray | None) -> Outcome:
    """The registered defense `name` (algorithms/seam.py: a built-in rule below, or a
    plugin's) on the round, refused when n cannot hold its assumption on f."""
    spec, n = defense_spec(name), len(x)
    f = byzantine_count(assumed_f(spec, p), share, n)
    need = int(spec.least(f))
    if n < need:
        return Outcome(None, {"robust_refused": 1.0}, why=(
            f"--defense {name} refused the round: {n} results cannot hold its assumption of "
            f"f = {f} Byzantine ones (it needs n >= {need}); the model stays as it was"))
    agg, chosen, m = spec.run(x, w, f, p, center)
    agg = np.asarray(agg, dtype=np.float64)
    if agg.shape != (x.shape[1],):
        raise ValueError(f"--defense {name} gave an update of shape {agg.shape}; the round's "
                         f"updates have {x.shape[1]} values")
    return Outcome(agg, {**({"robust_f": float(f)} if spec.uses_f else {}), **m}, list(chosen))


# ---- the built-in rules (registered in robust_spec.py): (update, chosen rows, row metrics) ---

RuleOut = tuple[np.ndarray, list[int], dict[str, float]]
Center = np.ndarray | None


def rule_krum(x: np.ndarray, w: np.ndarray, f: int, p: ByzantineCount, center: Center) -> RuleOut:
    return (*krum(x, f), {})


def rule_multikrum(x: np.ndarray, w: np.ndarray, f: int, p: MultiKrumParams, center: Center) -> RuleOut:
    return (*multi_krum(x, f, p.keep or len(x) - f), {})


def rule_bulyan(x: np.ndarray, w: np.ndarray, f: int, p: ByzantineCount, center: Center) -> RuleOut:
    return (*bulyan(x, f), {})


def rule_median(x: np.ndarray, w: np.ndarray, f: int, p: ByzantineCount, center: Center) -> RuleOut:
    return median(x), [], {}


def rule_trimmed_mean(x: np.ndarray, w: np.ndarray, f: int, p: TrimmedMeanParams, center: Center) -> RuleOut:
    return trimmed_mean(x, f if p.trim < 0 else int(p.trim * len(x))), [], {}


def rule_norm_bound(x: np.ndarray, w: np.ndarray, f: int, p: NormBoundParams, center: Center) -> RuleOut:
    agg, bound = norm_bound(x, w, p.bound)
    return agg, [], {"robust_bound": bound}


def rule_centered_clip(x: np.ndarray, w: np.ndarray, f: int, p: CenteredClipParams, center: Center) -> RuleOut:
    zero = np.zeros(x.shape[1]) if center is None or center.size != x.shape[1] else center
    agg, radius = centered_clip(x, zero, p.radius, p.iters)
    return agg, [], {"robust_radius": radius}


# ---- in place of FedAvg's mean ----------------------------------------------------------------


class RobustMean:
    """A round's results kept by client id and aggregated by the defense when asked: what
    FedAvg's fold adds to and what FedAvg and FedOpt read (result, mean64, weights)."""

    def __init__(self, name: str, p: Any, share: float, model: Arrays,
                 center: np.ndarray | None = None, malicious: frozenset[int] = frozenset()
                 ) -> None:
        self.name, self.p, self.share, self.model = name, p, share, model
        self.center, self.malicious = center, malicious
        self.kept: dict[float, tuple[Arrays, float]] = {}
        self.weights: list[float] = []
        self._done: tuple[Arrays, dict[str, np.ndarray]] | None = None
        self.outcome: Outcome | None = None

    @property
    def count(self) -> int:
        return len(self.kept)

    def add(self, arrays: Arrays, weight: float, key: float | None = None) -> None:
        """Keep one result (its arrays are referenced, not copied)."""
        k = float(len(self.kept) if key is None else key)
        self.kept[k] = (dict(arrays), float(weight))
        self.weights.append(float(weight))

    def floats(self) -> list[str]:
        """The floating entries, in name order: the coordinates of an update."""
        return sorted(n for n, a in self.model.items() if a.dtype.kind == "f")

    def _run(self) -> tuple[Arrays, dict[str, np.ndarray]]:
        if self._done is not None:
            return self._done
        if not self.kept:
            raise ValueError("robust aggregation of no inputs")
        keys = sorted(self.kept)
        names = self.floats()
        base = flat(self.model, names)
        x = np.empty((len(keys), base.size))
        for row, k in enumerate(keys):
            arrays = self.kept[k][0]
            x[row] = flat(arrays, names)
        x -= base
        w = np.array([self.kept[k][1] for k in keys])
        self.outcome = apply(self.name, self.p, self.share, x, w, self.center)
        if self.outcome.chosen and self.malicious:
            kept = [int(keys[i]) for i in self.outcome.chosen]
            self.outcome.metrics["malicious_kept"] = float(
                sum(c in self.malicious for c in kept))
        upd = self.outcome.update if self.outcome.update is not None else np.zeros(base.size)
        new = base + upd
        out, out64, at = {}, {}, 0
        first = self.kept[keys[0]][0]
        for n, a in self.model.items():
            if a.dtype.kind != "f":
                out[n] = np.array(first[n], copy=True)
        for n in names:
            size = self.model[n].size
            out64[n] = new[at:at + size].reshape(self.model[n].shape)
            out[n] = out64[n].astype(self.model[n].dtype)
            at += size
        self._done = ({n: out[n] for n in self.model}, out64)
        return self._done

    @property
    def refused(self) -> bool:
        """True when the defense refused the round (too few results for its assumption)."""
        self._run()
        return self.outcome is not None and self.outcome.update is None

    def result(self) -> Arrays:
        """The new model: the global model plus the robust aggregate, in its dtypes."""
        return self._run()[0]

    def mean64(self) -> dict[str, np.ndarray]:
        """The new model's floating entries in float64 (FedOpt's pseudo-gradient reads them)."""
        return self._run()[1]

    def update(self) -> np.ndarray | None:
        """The aggregate update (flattened), or None when refused."""
        self._run()
        return None if self.outcome is None else self.outcome.update

