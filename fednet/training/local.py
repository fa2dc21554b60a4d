"""Local training (any --optimizer) and evaluation on in-memory tensors, through an Objective."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fednet.data.views import Examples
from fednet.training import interrupt
from fednet.training.flops import charge
from fednet.training.objective import CLASSIFICATION, Objective
from fednet.training.optim import Optimizer, OptimizerState, OptimSpec

# A gradient hook: called after backward, before the optimiser step, with the trainable params.
GradHook = Callable[[Sequence[torch.Tensor]], None]


@dataclass
class TrainStats:
    """What one local update did."""

    loss: float
    samples: int
    steps: int


def batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches of one epoch (the last one may be short); a client that must
    stop stops here (training/interrupt.py)."""
    interrupt.poll()
    perm = torch.randperm(n, generator=generator)
    return list(perm.split(batch_size))


def train(model: nn.Module, x: Examples, y: torch.Tensor, *, epochs: int, batch_size: int,
          lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
          generator: torch.Generator, hooks: Sequence[GradHook] = (),
          loss_terms: Sequence[Callable[[], torch.Tensor]] = (),
          augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
          optim: OptimSpec | None = None, opt_state: OptimizerState | None = None,
          objective: Objective = CLASSIFICATION) -> TrainStats:
    """`epochs` passes of minibatch training; returns the mean training loss.

    The optimizer is `optim` (lr replaces its learning rate), or SGD with lr, momentum and
    weight_decay; `opt_state` keeps its memory across calls (a client's optimizer state; None:
    a fresh optimizer). `augment(batch, generator)` transforms each minibatch (seeded by the same
    generator). The loss is objective.loss plus the loss_terms.
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    spec = (OptimSpec("sgd", lr, momentum, weight_decay, nesterov=False) if optim is None
            else dataclasses.replace(optim, lr=float(lr)))
    opt = Optimizer(params, spec, opt_state)
    total, samples, steps = 0.0, 0, 0
    for _ in range(epochs):
        for idx in batches(len(y), batch_size, generator):
            interrupt.poll()  # between two batches: the run's end, a lost server
            idx = idx.to(x.device)
            xb, yb = x[idx], y.index_select(0, idx)  # (the same rows as y[idx], sooner)
            if augment is not None:
                xb = augment(xb, generator)
            charge(model, xb)  # the simulated clock's work (training/flops.py)
            opt.zero_grad()
            loss = objective.loss(model(xb), yb)
            full = loss
            for term in loss_terms:
                full = full + term()
            full.backward()
            for h in hooks:
                h(params)
            opt.step()
            total += float(loss.detach()) * len(yb)
            samples += len(yb)
            steps += 1
    opt.zero_grad()  # the last gradients: a model's worth of memory while the client waits
    return TrainStats(total / max(samples, 1), samples, steps)


@torch.no_grad()
def evaluate(model: nn.Module, x: Examples, y: torch.Tensor, batch_size: int = 1024,
             objective: Objective = CLASSIFICATION) -> tuple[float, float]:
    """(mean score, mean loss) of model on (x, y): top-1 accuracy and cross-entropy by default."""
    model.eval()
    correct, loss, n = 0, 0.0, len(y)
    for i in range(0, n, batch_size):
        xb = x[i:i + batch_size]
        charge(model, xb, "eval")
        out = model(xb)
        yb = y[i:i + batch_size]
        loss += objective.loss_sum(out, yb)
        correct += objective.score_sum(out, yb)  # type: ignore[assignment]  # (int, then float)
    return correct / max(n, 1), loss / max(n, 1)
