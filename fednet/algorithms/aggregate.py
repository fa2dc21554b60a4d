"""Weighted averaging of model arrays, streamed and independent of the order of the inputs.

The server folds each result into a running sum as it arrives and lets the message's memory go,
so peak server memory does not grow with the number of clients per round. Arrival order differs
between runs and runtimes, yet the average should not: a plain float sum depends on the order of
its terms. `StreamingMean` therefore keeps each sum as an unevaluated pair hi + lo of float64
arrays updated with Knuth's error-free TwoSum: hi + lo is the exact sum of the terms w_i*a_i
(each product rounded once, to float64, the same way whatever the order) as long as lo's own
additions are exact. The result, float64(hi + lo) / sum(w), cast to the input dtype, is then the
same for every order.

lo's additions are exact while, per coordinate, the terms span less than about 2^44 / K in
magnitude (K terms; 1.8e10 for K = 1000), which model parameters of one coordinate across clients
do in practice. Beyond that (say 1e-32 next to 1.0) the sum is still accurate to about 2^-100
relative, but it can differ between orders in its last bit, and so can the float32 result.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from fednet.types import Arrays


CHUNK = 1 << 14  # elements per step: the scratch buffers stay in the CPU cache


def two_sum_into(hi: np.ndarray, lo: np.ndarray, x: np.ndarray, weight: float = 1.0) -> None:
    """hi + lo += weight * x exactly (Knuth's TwoSum: hi takes the rounded sum, lo the rounding
    error); weight * x is rounded once, to float64. Works through cache-sized chunks with
    preallocated scratch space, so it costs no allocation per input."""
    h, lo_, xf = hi.reshape(-1), lo.reshape(-1), x.reshape(-1)
    n = h.size
    buf = np.empty((3, min(n, CHUNK)), dtype=np.float64)
    for i in range(0, n, CHUNK):
        j = min(n, i + CHUNK)
        m = j - i
        p, s, t = buf[0, :m], buf[1, :m], buf[2, :m]
        hh, ll = h[i:j], lo_[i:j]
        np.multiply(xf[i:j], weight, out=p, dtype=np.float64)
        np.add(hh, p, out=s)             # s = fl(hi + p)
        np.subtract(s, hh, out=t)        # bb = s - hi
        np.subtract(p, t, out=p)         # p - bb
        np.subtract(s, t, out=t)         # s - bb
        np.subtract(hh, t, out=t)        # hi - (s - bb)
        np.add(t, p, out=t)              # the rounding error of hi + p
        np.add(ll, t, out=ll)
        hh[...] = s


class StreamingMean:
    """sum_i w_i a_i / sum_i w_i per array name, fed one input at a time.

    Floating arrays are averaged; other dtypes (integer counters) are taken from the first input.
    Memory: two float64 arrays per floating input array, whatever the number of inputs.
    """

    def __init__(self) -> None:
        self.hi: dict[str, np.ndarray] = {}  # views of one flat float64 buffer each (_layout)
        self.lo: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.other: Arrays = {}
        self.other_key: float = math.inf
        self.weights: list[float] = []
        self._flat: tuple[np.ndarray, np.ndarray] | None = None  # (hi, lo), every floating array
        self._runs: list[tuple[list[str], int, int]] = []  # (names, start, end) in the buffers
        self._scratch = np.empty(0, dtype=np.float64)

    @property
    def count(self) -> int:
        """Inputs added so far."""
        return len(self.weights)

    def check(self, arrays: Mapping[str, np.ndarray], weight: float) -> float:
        """ValueError if the input does not fit the inputs so far (names, shapes, floating or
        not) or its weight is invalid; returns the weight as a float. Changes nothing."""
        w = float(weight)
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weights must be finite and non-negative (got {weight})")
        if self.weights and set(arrays) != set(self.dtypes):
            raise ValueError("every input must hold the same array names")
        for name, a in arrays.items():
            a = np.asarray(a)
            if self.weights and (a.dtype.kind == "f") != (name in self.hi):
                raise ValueError(f"array {name!r} is {a.dtype} here, {self.dtypes[name]} before")
            if name in self.hi and a.shape != self.hi[name].shape:
                raise ValueError(f"array {name!r} has shape {a.shape}, expected "
                                 f"{self.hi[name].shape}")
        return w

    def add(self, arrays: Mapping[str, np.ndarray], weight: float, key: float | None = None
            ) -> None:
        """Fold one input in; it is not referenced afterwards (the caller may free it).

        Non-floating arrays are kept from the input with the smallest `key` (e.g. the client id;
        default: the order of arrival), so they do not depend on arrival order either.
        """
        w = self.check(arrays, weight)
        arrays = {name: np.asarray(a) for name, a in arrays.items()}
        k = float(len(self.weights) if key is None else key)
        keep_other = k < self.other_key
        if keep_other:
            self.other_key = k
        for name, a in arrays.items():
            if a.dtype.kind != "f":
                if keep_other:
                    self.other[name] = np.array(a, copy=True)
                self.dtypes.setdefault(name, a.dtype)
            elif self._flat is None:
                self.dtypes[name] = a.dtype
        if self._flat is None:
            self._layout({n: a.shape for n, a in arrays.items() if a.dtype.kind == "f"})
        self._fold(arrays, w)
        self.weights.append(w)

    def _layout(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """The floating arrays' sums, one after another in two flat buffers (hi[name] and
        lo[name] are views), and the runs of consecutive small arrays (CHUNK elements at most
        together) that _fold adds in one TwoSum."""
        sizes = [math.prod(s) for s in shapes.values()]
        hi, lo = np.zeros(sum(sizes), dtype=np.float64), np.zeros(sum(sizes), dtype=np.float64)
        self._flat, at = (hi, lo), 0
        for (name, shape), n in zip(shapes.items(), sizes):
            self.hi[name], self.lo[name] = hi[at:at + n].reshape(shape), lo[at:at + n].reshape(shape)
            run = self._runs[-1] if self._runs else None
            if run is not None and run[2] - run[1] + n <= CHUNK:  # (never after a big one)
                self._runs[-1] = (run[0] + [name], run[1], at + n)
            else:
                self._runs.append(([name], at, at + n))
            at += n
        self._scratch = np.empty(min(CHUNK, at), dtype=np.float64)

    def _fold(self, arrays: Mapping[str, np.ndarray], w: float) -> None:
        """hi + lo += w * arrays: a run of several small arrays gathered (exactly, to float64)
        into the scratch buffer and added at once; the same arithmetic per element as adding
        each array on its own, with a tenth of the numpy calls for a small model's many arrays."""
        assert self._flat is not None
        hi, lo = self._flat
        for names, i, j in self._runs:
            if len(names) == 1:
                two_sum_into(hi[i:j], lo[i:j], arrays[names[0]], w)
            else:
                x = self._scratch[:j - i]
                np.concatenate([arrays[n].reshape(-1) for n in names], out=x)
                two_sum_into(hi[i:j], lo[i:j], x, w)

    def sums(self) -> dict[str, np.ndarray]:
        """The weighted sums, float64 (each the correctly rounded value of the exact sum)."""
        return {name: self.hi[name] + self.lo[name] for name in self.hi}

    def mean64(self) -> dict[str, np.ndarray]:
        """The weighted means of the floating arrays, float64: (hi + lo) / fsum(weights)."""
        total = math.fsum(self.weights)
        return {name: (self.hi[name] + self.lo[name]) / total for name in self.hi}

    def result(self) -> Arrays:
        """The weighted mean, each array in its input dtype."""
        if not self.weights:
            raise ValueError("weighted mean of no inputs")
        total = math.fsum(self.weights)
        if total <= 0:
            raise ValueError("weighted_mean weights must sum to a positive number")
        out: Arrays = {}
        for name, dt in self.dtypes.items():
            if name in self.hi:
                out[name] = ((self.hi[name] + self.lo[name]) / total).astype(dt)
            else:
                out[name] = self.other[name]
        return out


def weighted_mean(arrays: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> Arrays:
    """sum_i w_i a_i / sum_i w_i per name over a list given in a fixed order (callers sort it, e.g.
    by client id); integer arrays are taken from the first input. float64 accumulation, cast back
    to each array's dtype. Several times faster than StreamingMean for many small arrays (one
    numpy operation per input and array); use StreamingMean for results in arrival order."""
    if not arrays:
        raise ValueError("weighted_mean needs at least one input")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(arrays),):
        raise ValueError(f"{len(arrays)} inputs but {w.size} weights")
    total = float(w.sum())
    if not math.isfinite(total) or total <= 0 or (w < 0).any():
        raise ValueError("weighted_mean weights must be non-negative and sum to a positive number")
    w = w / total
    out: Arrays = {}
    for name, first in arrays[0].items():
        first = np.asarray(first)
        if first.dtype.kind != "f":
            out[name] = np.array(first, copy=True)
            continue
        acc = np.zeros(first.shape, dtype=np.float64)
        for wi, a in zip(w, arrays):
            acc += wi * a[name]
        out[name] = acc.astype(first.dtype)
    return out


def flat(arrays: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """The entries `names` of `arrays` as one float64 vector, in that order (an update's
    coordinates, as the robust rules, the attacks and central DP's rule read them)."""
    return np.concatenate([np.asarray(arrays[n], np.float64).ravel() for n in names])
