"""Helpers that several algorithms (and the round driver) share: result checks and metrics."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fednet.algorithms.contract import ClientContext
from fednet.types import Arrays, Failure, Result


def finite(arrays: Arrays) -> bool:
    """True when every floating array is free of NaN and inf."""
    return all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")


def usable(results: list[Result]) -> tuple[list[Result], int]:
    """Results with finite arrays, ordered by client id; and how many were dropped."""
    ok = sorted((r for r in results if finite(r.arrays)), key=lambda r: r.cid)
    return ok, len(results) - len(ok)


def round_metrics(ok: list[Result], failures: list[Failure], dropped: int) -> dict[str, float]:
    """Sample-weighted training loss (an exact sum: the same for any order) and result counts."""
    n = sum(r.num_examples for r in ok)
    loss = math.fsum(float(r.body.get("loss", 0.0)) * r.num_examples for r in ok)
    return {"train_loss": loss / n if n else float("nan"), "results": len(ok),
            "failures": len(failures), "non_finite": dropped}


def evaluate_own(ctx: ClientContext) -> dict[str, float]:
    """This client's current model on its own test split."""
    from fednet.training.local import evaluate

    assert ctx.test_x is not None and ctx.test_y is not None
    acc, loss = evaluate(ctx.model, ctx.test_x, ctx.test_y, objective=ctx.objective)
    return {"accuracy": acc, "test_loss": loss}


def client_accuracy(results: Sequence[Result]) -> tuple[float, float, dict[str, float]]:
    """Mean (and spread) of the accuracies that clients reported for their own models."""
    accs = [float(r.body["accuracy"]) for r in results if "accuracy" in r.body]
    losses = [float(r.body.get("test_loss", 0.0)) for r in results if "accuracy" in r.body]
    if not accs:
        return float("nan"), float("nan"), {}
    mean = sum(accs) / len(accs)
    std = (sum((a - mean) ** 2 for a in accs) / len(accs)) ** 0.5
    return mean, sum(losses) / len(losses), {"acc_std": std, "acc_min": min(accs),
                                             "acc_max": max(accs)}
