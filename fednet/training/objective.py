"""The task a model learns: its training loss and the metric reported as "accuracy".

Every loss and every test metric in fednet goes through an Objective: local training
(training/local.train), the server's test-set evaluation and the clients' own evaluation
(training/local.evaluate), and the algorithms that compute a loss themselves (SCAFFOLD's full
gradient, Per-FedAvg's meta steps) through `ctx.objective`. The default is classification:
cross-entropy and top-1 accuracy. A dataset chooses its objective by name (`Dataset.objective`);
a plugin that brings another task registers one with register_objective().
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fednet import plugins


class Objective:
    """A loss to minimise and a per-example score to report (higher is better)."""

    name = ""
    metric = "accuracy"  # what the score is called in reports (the accuracy columns)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean loss of a batch (what backward() runs on)."""
        raise NotImplementedError

    def loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        """The summed loss of a batch (evaluation adds these up)."""
        return float(self.loss(out, y)) * len(y)

    def score_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        """The summed per-example score of a batch (evaluation divides by the examples)."""
        raise NotImplementedError


class Classification(Objective):
    """Cross-entropy on logits; top-1 accuracy."""

    name = "classification"

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y)

    def loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        return float(F.cross_entropy(out, y, reduction="sum"))

    def score_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        return int((out.argmax(1) == y).sum())


CLASSIFICATION = Classification()
OBJECTIVES: dict[str, Objective] = {"classification": CLASSIFICATION}


def register_objective(objective: Objective) -> Objective:
    """Make an objective available by its name (a name registered twice is an error)."""
    if not objective.name or objective.name in OBJECTIVES:
        raise ValueError(f"objective {objective.name!r} has no name or is registered twice")
    OBJECTIVES[objective.name] = objective
    plugins.provide("objective", objective.name)
    return objective


def get_objective(name: str | None) -> Objective:
    """The objective called `name` (None or '' = classification)."""
    if not name:
        return CLASSIFICATION
    obj = OBJECTIVES.get(name)
    if obj is None:
        raise ValueError(f"objective {name!r} is not registered (known: {', '.join(OBJECTIVES)}); "
                         "the plugin that defines it must be loaded (--plugin)")
    return obj
