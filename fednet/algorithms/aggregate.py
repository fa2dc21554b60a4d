"""Weighted averaging of model arrays (deterministic order, float64 accumulation)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fednet.types import Arrays


def weighted_mean(arrays: Sequence[Arrays], weights: Sequence[float]) -> Arrays:
    """sum_i w_i a_i / sum_i w_i per name; integer arrays are taken from the first input.

    Callers pass inputs in a fixed order (by client id) so the result does not depend on
    arrival order; accumulation is in float64 and cast back to each array's dtype.
    """
    if not arrays:
        raise ValueError("weighted_mean needs at least one input")
    w = np.asarray(weights, dtype=np.float64)
    total = float(w.sum())
    if total <= 0:
        raise ValueError("weighted_mean weights must sum to a positive number")
    w = w / total
    out: Arrays = {}
    for name, first in arrays[0].items():
        if first.dtype.kind != "f":
            out[name] = np.array(first, copy=True)
            continue
        acc = np.zeros(first.shape, dtype=np.float64)
        for wi, a in zip(w, arrays):
            acc += wi * a[name]
        out[name] = acc.astype(first.dtype)
    return out
