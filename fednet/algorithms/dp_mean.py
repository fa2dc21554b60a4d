"""DP-FedAvg's aggregate (docs/algorithms.md §11.2): the noised mean of the round's clipped
updates, with the interface of aggregate.StreamingMean that FedAvg and the FedOpt family read.

Each result is folded in as it arrives: its update against the round's model, u_k = theta_k -
theta_t (float64, every floating entry of the model), is clipped to l2 norm C and added with
weight 1 to exact (TwoSum) running sums, so the sum is the same for every arrival order. At the
round's end the mean is

    theta_t + (sum_k clip(u_k) + N(0, (z C)^2 I)) / D

with D the expected cohort (Poisson: q N) or the fixed cohort m, never the number of results
that came (a fixed denominator: one user's presence changes the sum by at most C). The noise is
drawn once, from the stream (seed, "dp-central", round). Entries that are not floating (BN
batch counters) are the server's own, never a client's. A plugin's mechanism (fednet.api.DPSpec)
brings its own noise in place of the Gaussian and may clip in l1.

PrivateRuleMean puts a robust rule between the clipping and the noise (--dp central with
--defense, a fixed cohort of m): each update clipped to C, the rule on the m rows (a result
that did not come counts as a zero row, as in the fixed-denominator mean), then Gaussian noise
of standard deviation z S / 2 on the rule's output, S its declared sensitivity (how far
replacing one of m rows of norm <= C moves it: DefenseSpec.sensitivity). The plain mean's S is
2C/m, which gives PrivateMean's z C / m: the same event for the accountant.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fednet.algorithms.aggregate import StreamingMean, flat
from fednet.privacy.mechanisms import clip, difference, floating, gaussian
from fednet.types import Arrays


class PrivateMean:
    """The round's noised mean of clipped updates (fed one result at a time)."""

    def __init__(self, ref: Arrays, bound: float, std: float, denom: float,
                 generator: Callable[[], np.random.Generator],
                 noise: Callable[..., Any] | None = None, norm: str = "l2") -> None:
        self.noise, self.norm = noise, norm  # (a plugin's mechanism: its noise and its norm)
        self.arrays = ref  # the round's model: dtypes, and the entries that are not floating
        self.ref = {n: np.asarray(ref[n], dtype=np.float64) for n in floating(ref)}
        self.bound, self.std, self.denom, self.generator = float(bound), float(std), denom, generator
        self.sum = StreamingMean()
        self.clipped = 0
        self.seconds = 0.0  # clipping and noise: what DP adds to the server's work
        self.fold_seconds = 0.0  # the exact sums (FedAvg's own work, on updates here)
        self._means: dict[str, np.ndarray] | None = None

    @property
    def weights(self) -> list[float]:
        """One weight of 1 per update folded in (FedAvg counts inputs with it)."""
        return self.sum.weights

    @property
    def count(self) -> int:
        """Updates folded in."""
        return self.sum.count

    def check(self, arrays: Mapping[str, np.ndarray]) -> None:
        """ValueError unless `arrays` has the round model's names and shapes."""
        if set(arrays) != set(self.arrays):
            raise ValueError("a result must hold the model's array names")
        for n, a in arrays.items():
            if np.shape(a) != np.shape(self.arrays[n]):
                raise ValueError(f"array {n!r} has shape {np.shape(a)}, expected "
                                 f"{np.shape(self.arrays[n])}")

    def add(self, arrays: Mapping[str, np.ndarray], weight: float = 1.0,
            key: float | None = None) -> None:
        """Fold one result in: its update, clipped, with weight 1 (`weight`, the sample count,
        is not used: every user counts once)."""
        t0 = time.perf_counter()
        self.check(arrays)
        update, _, was = clip(difference(arrays, self.ref), self.bound, self.norm)
        t1 = time.perf_counter()
        self.sum.add(update, 1.0, key=key)
        self.clipped += int(was)
        self.seconds += t1 - t0
        self.fold_seconds += time.perf_counter() - t1

    def mean64(self) -> dict[str, np.ndarray]:
        """theta_t + (the clipped sum + the noise) / D per floating entry, float64 (the noise
        is drawn at the first call)."""
        if self._means is None:
            t0 = time.perf_counter()
            sums = self.sum.sums()
            noise = self.drawn()
            self._means = {n: self.ref[n] + (sums[n] + noise[n]) / self.denom for n in self.ref}
            self.seconds += time.perf_counter() - t0
        return self._means

    def drawn(self) -> dict[str, np.ndarray]:
        """The round's noise, one float64 array per floating entry: the Gaussian, or a plugin
        mechanism's noise(shapes, scale, gen), checked."""
        shapes = {n: v.shape for n, v in self.ref.items()}
        if self.noise is None:
            return gaussian(shapes, self.std, self.generator())
        got = self.noise(shapes, self.std, self.generator())
        if not isinstance(got, dict) or set(got) != set(shapes):
            raise ValueError("a DP mechanism's noise must give one array per floating entry "
                             f"({', '.join(sorted(shapes))})")
        out = {n: np.asarray(got[n], dtype=np.float64) for n in sorted(shapes)}
        bad = [n for n in out if out[n].shape != shapes[n]]
        if bad:
            raise ValueError(f"a DP mechanism's noise for {bad[0]!r} has shape "
                             f"{out[bad[0]].shape}, expected {shapes[bad[0]]}")
        return out

    def result(self) -> Arrays:
        """The new model: the means in the model's dtypes; other entries the round model's."""
        if not self.count:
            raise ValueError("a private mean of no updates")
        m = self.mean64()
        return {n: (m[n].astype(a.dtype) if n in m else a) for n, a in self.arrays.items()}


class PrivateRuleMean(PrivateMean):
    """The round's robust aggregate of clipped updates, noised (see the module's docstring).
    `rule(x)` gives (the aggregate update, row metrics, why it refused: '' when it did not) of
    the m x d float64 rows x; `std`: z S / 2."""

    def __init__(self, ref: Arrays, bound: float, std: float, m: int,
                 generator: Callable[[], np.random.Generator],
                 rule: Callable[[np.ndarray], tuple[np.ndarray | None, dict[str, float], str]]
                 ) -> None:
        super().__init__(ref, bound, std, float(m), generator)
        self.m, self.rule = int(m), rule
        self.rows: dict[float, np.ndarray] = {}
        self.metrics: dict[str, float] = {}
        self.why = ""

    @property
    def count(self) -> int:
        return len(self.rows)

    @property
    def weights(self) -> list[float]:
        return [1.0] * len(self.rows)

    def add(self, arrays: Mapping[str, np.ndarray], weight: float = 1.0,
            key: float | None = None) -> None:
        """Keep one result's clipped update (a row: its floating entries in name order)."""
        t0 = time.perf_counter()
        self.check(arrays)
        update, _, was = clip(difference(arrays, self.ref), self.bound)
        self.rows[float(len(self.rows) if key is None else key)] = flat(update, sorted(update))
        self.clipped += int(was)
        self.seconds += time.perf_counter() - t0

    def mean64(self) -> dict[str, np.ndarray]:
        """theta_t + rule(the m rows) + the noise per floating entry (a refused round: theta_t
        plus the noise; the accountant counts every round)."""
        if self._means is None:
            t0 = time.perf_counter()
            size = sum(v.size for v in self.ref.values())
            x = np.zeros((max(self.m, len(self.rows)), size))
            for i, k in enumerate(sorted(self.rows)):  # client-id order; missing ones: 0
                x[i] = self.rows[k]
            agg, self.metrics, self.why = self.rule(x)
            vec = np.zeros(size) if agg is None else np.asarray(agg, dtype=np.float64)
            noise, out, at = self.drawn(), {}, 0
            for n in sorted(self.ref):
                v = self.ref[n]
                out[n] = v + vec[at:at + v.size].reshape(v.shape) + noise[n]
                at += v.size
            self._means = out
            self.seconds += time.perf_counter() - t0
        return self._means
