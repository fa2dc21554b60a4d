"""Helpers that several algorithms (and the round driver) share: result checks and metrics."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fednet.algorithms.contract import ClientContext
from fednet.types import Arrays, Failure, Result, Task


def task_lr(ctx: ClientContext, task: Task) -> float:
    """The learning rate a task asks for (its body's `lr`: the server's schedule, e.g. CFL's
    decay or centralized's cosine), else the run's --lr: the one place a client reads it."""
    return float(task.body.get("lr", ctx.cfg.train.lr))


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


LABEL_SKEW = ("shards", "dirichlet")
"""Partitions whose clients see different label distributions: a client's own score weighs the
test set by its training labels (docs/algorithms.md §0.3, Evaluation)."""


def evaluate_own(ctx: ClientContext) -> dict[str, float]:
    """This client's current model on its own test distribution.

    With a label-skewed partition (shards, dirichlet) the test set is weighed by the client's
    training label frequencies: score = sum_c p_c * score_c, with score_c the score on the test
    examples of class c (the expected score on test data drawn like the client's own data; a
    client that holds one class is scored on that class). Other partitions: the client's test
    split as it is (the whole test set for iid, its domain's part for domain).
    """
    from fednet.training.local import evaluate

    assert ctx.test_x is not None and ctx.test_y is not None
    if ctx.cfg.data.partition not in LABEL_SKEW or ctx.y.dtype.is_floating_point:
        acc, loss = evaluate(ctx.model, ctx.test_x, ctx.test_y, objective=ctx.objective)
        return {"accuracy": acc, "test_loss": loss}
    labels, counts = torch.unique(ctx.y, return_counts=True)
    acc = loss = 0.0
    weight = 0
    for c, k in zip(labels.tolist(), counts.tolist()):
        at = (ctx.test_y == c).nonzero().flatten()
        if len(at):  # a class with no test example cannot be scored: left out of the weights
            a, l_ = evaluate(ctx.model, ctx.test_x[at], ctx.test_y[at], objective=ctx.objective)
            acc, loss, weight = acc + k * a, loss + k * l_, weight + k
    if not weight:  # none of its classes is in the test set: the whole test set, as for iid
        acc, loss = evaluate(ctx.model, ctx.test_x, ctx.test_y, objective=ctx.objective)
        return {"accuracy": acc, "test_loss": loss}
    return {"accuracy": acc / weight, "test_loss": loss / weight}


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
