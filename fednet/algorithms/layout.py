"""What a result must hold, and the check of every result against it on arrival.

A result's arrays are what a client chose to send, so the server never learns their names,
shapes or dtypes from the results themselves (not from the first to arrive either): each
Strategy declares the layout a result of a task must have (`Strategy.result_layout`, by default
the layout of the model the server built at setup), and the runtime checks every result against
it before anything reads it (core/replies.accept_reply). A result that does not fit is its
client's failure with a one-line reason naming the array (expected against got); it never
reaches an aggregate, so it can neither stop the server nor change the model's dtype.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]
"""Array name -> (shape, dtype) that a result must carry, exactly these names."""


def layout_of(arrays: Mapping[str, np.ndarray]) -> Layout:
    """The layout of `arrays` (the server's own: a model, a control variate)."""
    return {n: (tuple(np.shape(a)), np.asarray(a).dtype) for n, a in arrays.items()}


def _describe(shape: tuple[int, ...], dtype: np.dtype) -> str:
    return f"{np.dtype(dtype).name} {tuple(shape)}"


def _names(names: set[str], limit: int = 3) -> str:
    shown = sorted(names)[:limit]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(repr(n[:60]) for n in shown) + more


def mismatch(expected: Layout, arrays: Mapping[str, np.ndarray]) -> str | None:
    """Why `arrays` do not fit `expected` (the first difference, one line), or None."""
    if len(arrays) != len(expected) or not all(n in arrays for n in expected):
        missing = set(expected) - set(arrays)  # (the same names, the common case: no sets)
        if missing:
            return f"array(s) {_names(missing)} missing"
        extra = set(arrays) - set(expected)
        if extra:
            return f"unexpected array(s) {_names(extra)}"
    for name, (shape, dtype) in expected.items():
        a = arrays[name]
        if not isinstance(a, np.ndarray):
            a = np.asarray(a)
        got_shape, got_dtype = a.shape, a.dtype
        if got_shape != tuple(shape) or got_dtype != dtype:
            return (f"array {name[:60]!r}: expected {_describe(shape, dtype)}, got "
                    f"{_describe(got_shape, got_dtype)}")
    return None


NON_FINITE = "holds NaN or inf"
"""Part of the reason of every result refused for non-finite values (core/verdict.py reads it)."""


def _finite(a: np.ndarray) -> bool:
    """No NaN and no inf in `a`, in one pass and without a mask the size of `a`: a float32 (or
    float16) sum in float64 cannot overflow, so it is finite exactly when every value is."""
    if a.dtype.kind != "f":
        return True
    if a.dtype.itemsize <= 4:
        return math.isfinite(a.sum(dtype=np.float64))  # (a float64 scalar: no ufunc call)
    return bool(np.isfinite(a).all())


GROUP = 1 << 13
"""Elements at most of the consecutive small float arrays that _all_finite sums at once."""


def _all_finite(arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether no array holds NaN or inf: consecutive float32 (or float16) arrays of GROUP
    elements at most together are gathered exactly into float64 and summed at once (a sum of
    finite ones cannot overflow either: one numpy reduction instead of one per array of a small
    model's many); the others as _finite reads them."""
    group: list[np.ndarray] = []
    n = 0
    for x in arrays.values():
        a = np.asarray(x)
        if a.dtype.kind != "f" or a.dtype.itemsize > 4 or a.size > GROUP:
            if not _finite(a):
                return False
            continue
        if n + a.size > GROUP:
            if not _group_finite(group, n):
                return False
            group, n = [], 0
        group.append(a)
        n += a.size
    return _group_finite(group, n)


def _group_finite(group: list[np.ndarray], n: int) -> bool:
    if len(group) < 2:
        return all(_finite(a) for a in group)
    buf = np.empty(n, dtype=np.float64)
    np.concatenate([a.reshape(-1) for a in group], out=buf)
    return math.isfinite(buf.sum())


def non_finite(arrays: Mapping[str, np.ndarray]) -> str | None:
    """Why `arrays` cannot be aggregated: the first floating array with NaN or inf, or None."""
    if _all_finite(arrays):
        return None
    bad = next((n for n, a in arrays.items() if not _finite(np.asarray(a))), None)
    return None if bad is None else f"array {bad[:60]!r} {NON_FINITE}"


def proven_finite(vetted: tuple | None, arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether `arrays` are, object for object, the arrays the server itself vetted (`vetted`:
    Result.vetted, set by core/replies.accept_reply once vet found no NaN or inf): then
    non_finite(arrays) is None without reading them again."""
    if vetted is None or len(vetted) != len(arrays):
        return False
    return all(a is b for a, b in zip(vetted, arrays.values()))


def vet(expected: Layout | None, arrays: Mapping[str, np.ndarray], num_examples: int,
        examples: int | None = None) -> str | None:
    """Why a result cannot be used, or None: its layout (`expected`; None: the strategy declares
    none), its sample count (`examples`: what the server's own partition gave its client; a
    count that differs would reweigh the aggregate), and NaN or inf in its arrays."""
    if examples is not None and num_examples != examples:
        return (f"its sample count n = {num_examples}, but the server assigned this client "
                f"{examples} examples")
    if num_examples < 1:
        return f"its sample count n = {num_examples} cannot weigh it (n >= 1 expected)"
    return (None if expected is None else mismatch(expected, arrays)) or non_finite(arrays)
