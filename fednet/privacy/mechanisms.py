"""The arithmetic of the user-level mechanisms (docs/algorithms.md §11), on named float64 arrays.

Everything is deterministic for given inputs and a seeded numpy Generator (fednet.rng), so the
noise of `fednet local` and `fednet launch` is the same to the last bit; the order of the names
(sorted) fixes the order of the draws. The Gaussian samples are numpy's (PCG64 and its ziggurat
normal), not a sampler hardened against floating-point attacks (Mironov 2012; docs §11.6).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

Arrays64 = dict[str, np.ndarray]


def floating(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The names of the floating arrays, sorted (what a mechanism clips and noises)."""
    return sorted(n for n, a in arrays.items() if np.asarray(a).dtype.kind == "f")


def difference(arrays: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> Arrays64:
    """arrays - ref per floating name of ref, in float64 (an update against its start)."""
    return {n: np.subtract(arrays[n], ref[n], dtype=np.float64) for n in sorted(ref)}


def l2_norm(update: Mapping[str, np.ndarray]) -> float:
    """The l2 norm of all the arrays together (sorted names, float64). numpy's own loop
    (einsum), not BLAS: OpenBLAS's threads made a dot product of 30,000 values cost from 4 us
    to 4 ms on a loaded machine, and a threaded sum need not round alike in every process."""
    total = 0.0
    for n in sorted(update):
        v = update[n].reshape(-1)
        total += float(np.einsum("i,i->", v, v))
    return math.sqrt(total)


def l1_norm(update: Mapping[str, np.ndarray]) -> float:
    """The l1 norm of all the arrays together (sorted names, float64, numpy's own sums)."""
    return float(sum(float(np.abs(update[n]).sum()) for n in sorted(update)))


def clip(update: Arrays64, bound: float, norm_kind: str = "l2") -> tuple[Arrays64, float, bool]:
    """(update scaled to norm at most `bound`, its norm before, whether it was scaled): each
    value times min(1, bound / norm), once, in float64 (in place: `update` is the caller's to
    give away); the l2 norm, or the l1 norm (norm_kind "l1": a Laplace mechanism's)."""
    norm = l1_norm(update) if norm_kind == "l1" else l2_norm(update)
    if norm <= bound:
        return update, norm, False
    factor = bound / norm
    return {n: np.multiply(v, factor, out=v) for n, v in update.items()}, norm, True


def gaussian(shapes: Mapping[str, tuple[int, ...]], std: float, gen: np.random.Generator
             ) -> Arrays64:
    """Independent N(0, std^2) values shaped like `shapes`, drawn in sorted name order."""
    return {n: gen.standard_normal(shapes[n]) * std for n in sorted(shapes)}


def next_clip(bound: float, unclipped: float, quantile: float, lr: float) -> float:
    """Andrew et al. 2021's geometric update: C <- C exp(-lr (b - quantile)), b the (noised)
    fraction of updates that were not clipped."""
    return float(bound * math.exp(-lr * (unclipped - quantile)))


def privatize(arrays: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], bound: float,
              std: float, gen: np.random.Generator) -> tuple[dict[str, np.ndarray], float, bool]:
    """Local DP of one update: ref + clip(arrays - ref, bound) + N(0, std^2), each floating array
    in its own dtype (other arrays as they are); also (its norm, whether it was clipped)."""
    update, norm, clipped = clip(difference(arrays, ref), bound)
    noise = gaussian({n: v.shape for n, v in update.items()}, std, gen)
    out = dict(arrays)
    for n in sorted(update):
        dt = np.asarray(arrays[n]).dtype
        out[n] = (ref[n] + update[n] + noise[n]).astype(dt)
    return out, norm, clipped


def clip_problem(dp: Any, clip: float, adaptive: bool, rounds_done: int,
                 row: Mapping[str, Any] | None) -> str:
    """Why a checkpoint's clip norm is not the run's (one line), or '': --dp-clip without
    adaptive clipping (and before the first round); with it, next_clip of the clip the last
    round used and its noised unclipped fraction, both in that round's `row` (None, or a row
    without them: a checkpoint of an older fednet, not checked)."""
    if not adaptive or rounds_done == 0:
        want, why = float(dp.clip), f"--dp-clip {dp.clip:g}"
    elif row is None or not isinstance(row.get("dp_clip"), float):
        return ""
    elif isinstance(row.get("dp_unclipped"), float):
        want = next_clip(row["dp_clip"], row["dp_unclipped"], dp.quantile, dp.clip_lr)
        why = (f"what round {rounds_done}'s row gives (clip {row['dp_clip']:.6g}, unclipped "
               f"fraction {row['dp_unclipped']:.6g})")
    else:
        want, why = float(row["dp_clip"]), f"round {rounds_done}'s clip (its row)"
    if math.isclose(clip, want, rel_tol=1e-9):
        return ""
    return f"algo.dp.clip is {clip:.6g}, the run's clip norm is {want:.6g}: {why}"
