"""Local SGD training and evaluation on in-memory tensors."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# A gradient hook: called after backward, before the optimiser step, with the trainable params.
GradHook = Callable[[Sequence[torch.Tensor]], None]


@dataclass
class TrainStats:
    """What one local update did."""

    loss: float
    samples: int
    steps: int


class SGD:
    """Plain SGD (PyTorch semantics: d = g + wd*p; buf = m*buf + d; p -= lr*buf).

    Written out instead of torch.optim.SGD: the first torch.optim optimiser in a process imports
    torch._dynamo, 1.2 s and ~100 MB per client process; this loop costs neither.
    """

    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, state: dict[int, torch.Tensor] | None = None) -> None:
        self.params, self.lr, self.momentum, self.wd = list(params), lr, momentum, weight_decay
        self.buf: dict[int, torch.Tensor] = state if state is not None else {}

    def zero_grad(self) -> None:
        """Drop the gradients."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        for i, p in enumerate(self.params):
            d = p.grad
            if d is None:
                continue
            if self.wd:
                d = d.add(p, alpha=self.wd)
            if self.momentum:
                b = self.buf.get(i)
                if b is None:
                    b = self.buf[i] = d.clone()
                else:
                    b.mul_(self.momentum).add_(d)
                d = b
            p.add_(d, alpha=-self.lr)


def batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches of one epoch (the last one may be short)."""
    perm = torch.randperm(n, generator=generator)
    return list(perm.split(batch_size))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
          lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
          generator: torch.Generator, hooks: Sequence[GradHook] = (),
          loss_terms: Sequence[Callable[[], torch.Tensor]] = (),
          augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
          momentum_state: dict[int, torch.Tensor] | None = None) -> TrainStats:
    """`epochs` passes of minibatch SGD with a fresh optimiser; returns the mean training loss.

    `augment(batch, generator)` transforms each minibatch (seeded by the same generator);
    `momentum_state` keeps the momentum buffers across calls (a client's optimizer state).
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, state=momentum_state)
    total, samples, steps = 0.0, 0, 0
    for _ in range(epochs):
        for idx in batches(len(y), batch_size, generator):
            idx = idx.to(x.device)
            xb, yb = x[idx], y[idx]
            if augment is not None:
                xb = augment(xb, generator)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
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
    return TrainStats(total / max(samples, 1), samples, steps)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024
             ) -> tuple[float, float]:
    """(top-1 accuracy, mean cross-entropy) of model on (x, y)."""
    model.eval()
    correct, loss, n = 0, 0.0, len(y)
    for i in range(0, n, batch_size):
        out = model(x[i:i + batch_size])
        yb = y[i:i + batch_size]
        loss += float(F.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(1) == yb).sum())
    return correct / max(n, 1), loss / max(n, 1)
