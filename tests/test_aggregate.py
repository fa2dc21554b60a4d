"""Streamed weighted averaging: exact sums, so the result never depends on arrival order."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fednet.algorithms.aggregate import StreamingMean, weighted_mean


def _inputs(k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    # magnitudes spread over 6 decades per coordinate: plain float sums depend on the order
    arrays = [{"w": (rng.standard_normal(300) * 10.0 ** rng.integers(-3, 3, 300)).astype(np.float32),
               "b": rng.standard_normal((4, 5)).astype(np.float32)} for _ in range(k)]
    return arrays, [int(n) for n in rng.integers(1, 400, k)]


def _streamed(arrays, weights):
    acc = StreamingMean()
    for a, w in zip(arrays, weights):
        acc.add(a, w)
    return acc.result()


def test_the_mean_is_bit_identical_for_every_arrival_order():
    arrays, weights = _inputs(200)
    ref = _streamed(arrays, weights)
    np.testing.assert_allclose(ref["w"], weighted_mean(arrays, weights)["w"], rtol=1e-6, atol=1e-6)
    rng = np.random.default_rng(1)
    naive_differs = False
    for _ in range(5):
        order = rng.permutation(len(arrays))
        got = _streamed([arrays[i] for i in order], [weights[i] for i in order])
        for k in ref:
            assert np.array_equal(got[k], ref[k])
        naive = sum(arrays[i]["w"].astype(np.float64) * weights[i] for i in order)
        naive_ref = sum(a["w"].astype(np.float64) * w for a, w in zip(arrays, weights))
        naive_differs |= not np.array_equal(naive, naive_ref)
    assert naive_differs  # the inputs are hard enough that a plain sum would not be


def test_the_sum_is_the_correctly_rounded_exact_sum():
    arrays, weights = _inputs(50, seed=3)
    acc = StreamingMean()
    for a, w in zip(arrays, weights):
        acc.add(a, w)
    s = acc.sums()["w"]
    for j in range(0, 300, 7):
        exact = math.fsum(float(np.float64(a["w"][j]) * w) for a, w in zip(arrays, weights))
        assert s[j] == exact
    total = math.fsum(weights)
    expect = np.array([math.fsum(float(np.float64(a["w"][j]) * w) for a, w in zip(arrays, weights))
                       for j in range(300)]) / total
    assert np.array_equal(acc.result()["w"], expect.astype(np.float32))


def test_non_integer_weights_and_integer_arrays():
    a = {"w": np.array([1.0, 3.0], np.float32), "n": np.array(5, np.int64)}
    b = {"w": np.array([2.0, 5.0], np.float32), "n": np.array(9, np.int64)}
    out = _streamed([a, b], [0.25, 0.75])
    np.testing.assert_allclose(out["w"], [1.75, 4.5])
    assert out["w"].dtype == np.float32 and int(out["n"]) == 5
    assert np.array_equal(_streamed([b, a], [0.75, 0.25])["w"], out["w"])
    np.testing.assert_allclose(weighted_mean([a, b], [0.25, 0.75])["w"], [1.75, 4.5])


@pytest.mark.parametrize("bad, match", [
    (lambda acc: acc.add({"w": np.zeros(3, np.float32)}, 1), "shape"),
    (lambda acc: acc.add({"x": np.zeros(2, np.float32)}, 1), "same array names"),
    (lambda acc: acc.add({"w": np.zeros(2, np.float32)}, -1), "non-negative"),
    (lambda acc: acc.add({"w": np.zeros(2, np.float32)}, float("nan")), "finite"),
])
def test_inputs_that_do_not_fit_are_refused(bad, match):
    acc = StreamingMean()
    acc.add({"w": np.ones(2, np.float32)}, 2)
    with pytest.raises(ValueError, match=match):
        bad(acc)
    assert acc.count == 1 and np.array_equal(acc.result()["w"], [1.0, 1.0])


def test_empty_and_zero_weight_means_are_errors():
    with pytest.raises(ValueError):
        weighted_mean([], [])
    with pytest.raises(ValueError, match="positive"):
        weighted_mean([{"w": np.ones(2, np.float32)}], [0])
    with pytest.raises(ValueError, match="no inputs"):
        StreamingMean().result()
    acc = StreamingMean()
    acc.add({"w": np.ones(2, np.float32)}, 0)
    with pytest.raises(ValueError, match="positive"):
        acc.result()


def test_integer_arrays_come_from_the_smallest_key_whatever_the_order():
    a = {"w": np.ones(1, np.float32), "n": np.array(5, np.int64)}
    b = {"w": np.ones(1, np.float32), "n": np.array(9, np.int64)}
    for order in ([(a, 3), (b, 1)], [(b, 1), (a, 3)]):
        acc = StreamingMean()
        for arrays, cid in order:
            acc.add(arrays, 1, key=cid)
        assert int(acc.result()["n"]) == 9


def test_small_arrays_added_together_give_what_each_added_alone_gives():
    """StreamingMean adds a run of consecutive small arrays in one TwoSum (gathered to float64):
    the sums must be those of adding each array on its own (two_sum_into per array), bit for
    bit, around arrays too big to gather, a 0-d one, float16 and an integer counter."""
    from fednet.algorithms.aggregate import CHUNK, two_sum_into

    rng = np.random.default_rng(5)
    shapes = {"conv": (16, 1, 3, 3), "bias": (16,), "big": (CHUNK + 9,), "scale": (),
              "fc": (32, 64), "steps": (3,), "half": (7,), "tail": (CHUNK // 2, 2), "out": (5,)}
    acc = StreamingMean()
    hi = {n: np.zeros(s) for n, s in shapes.items() if n != "steps"}
    lo = {n: np.zeros(s) for n, s in shapes.items() if n != "steps"}
    for k in range(12):
        arrays = {n: (rng.standard_normal(s) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
                  for n, s in shapes.items()}
        arrays["steps"] = rng.integers(0, 9, 3)
        arrays["half"] = arrays["half"].astype(np.float16)
        w = float(rng.integers(1, 50))
        acc.add(arrays, w, key=k)
        for n in hi:
            two_sum_into(hi[n], lo[n], arrays[n], w)
    assert any(len(names) > 1 for names, _, _ in acc._runs)  # the gathered path ran
    sums = acc.sums()
    for n in hi:
        assert sums[n].shape == shapes[n] and sums[n].tobytes() == (hi[n] + lo[n]).tobytes(), n
