"""Each defense's aggregate equals Flower's implementation on the same inputs (issue 40).

tests/golden/flower_robust.json holds client models and what Flower's own functions
(flwr.server.strategy.aggregate: aggregate_krum, aggregate_bulyan, aggregate_median,
aggregate_trimmed_avg) returned for them, made by `python benchmarks/flower_reference.py
--write` in a venv with flwr (the file names the version). The fixture check always runs; where
flwr is installed, the second test recomputes Flower's answers on the spot. Centered clipping and
norm bounding have no Flower counterpart: tests/test_robust.py checks them by hand.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from fednet.algorithms import robust as R

ROOT = Path(__file__).resolve().parent.parent
DOC = json.loads((ROOT / "tests" / "golden" / "flower_robust.json").read_text())
TOL = 1e-12  # the same arithmetic up to the order of float64 sums


def ours(x: np.ndarray, c: dict) -> dict[str, np.ndarray]:
    f, keep = c["f"], c["keep"]
    return {"krum": R.krum(x, f)[0], "multikrum": R.multi_krum(x, f, keep)[0],
            "bulyan": R.bulyan(x, f)[0], "median": R.median(x),
            "trimmed_mean": R.trimmed_mean(x, int(c["cut"] * len(x)))}


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["name"] for c in DOC["cases"]])
def test_fixture_matches_flower(case):
    x = np.array(case["models"])
    got = ours(x, case)
    assert set(got) == set(case["flower"])
    for rule, want in case["flower"].items():
        assert np.allclose(got[rule], want, rtol=0, atol=TOL), rule
    # the attackers (the first rows, shifted far away) are kept out by every rule
    assert not np.allclose(got["krum"], x[0])


@pytest.mark.skipif(importlib.util.find_spec("flwr") is None,
                    reason="flwr is not installed (the fixture test above still compares with "
                           "Flower's stored answers)")
def test_live_flower():
    from tests.harness import bench

    mod = bench("flower_reference")
    for case in DOC["cases"]:
        shapes = [tuple(s) for s in case["shapes"]]
        models = []
        for row in case["models"]:
            row, arrays = np.array(row), []
            for s in shapes:
                k = int(np.prod(s))
                arrays.append(row[:k].reshape(s))
                row = row[k:]
            models.append(arrays)
        want = mod.flower(models, case["f"], case["keep"], case["cut"])
        got = ours(np.array(case["models"]), case)
        for rule in want:
            assert np.allclose(got[rule], want[rule], rtol=0, atol=TOL), rule
