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
batch counters) are the server's own, never a client's.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from fednet.algorithms.aggregate import StreamingMean
from fednet.privacy.mechanisms import clip, difference, floating, gaussian
from fednet.types import Arrays


class PrivateMean:
    """The round's noised mean of clipped updates (fed one result at a time)."""

    def __init__(self, ref: Arrays, bound: float, std: float, denom: float,
                 generator: Callable[[], np.random.Generator]) -> None:
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
        update, _, was = clip(difference(arrays, self.ref), self.bound)
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
            noise = gaussian({n: v.shape for n, v in self.ref.items()}, self.std, self.generator())
            self._means = {n: self.ref[n] + (sums[n] + noise[n]) / self.denom for n in self.ref}
            self.seconds += time.perf_counter() - t0
        return self._means

    def result(self) -> Arrays:
        """The new model: the means in the model's dtypes; other entries the round model's."""
        if not self.count:
            raise ValueError("a private mean of no updates")
        m = self.mean64()
        return {n: (m[n].astype(a.dtype) if n in m else a) for n, a in self.arrays.items()}
