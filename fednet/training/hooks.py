"""Gradient hooks that turn plain SGD into FedProx, FedDyn or SCAFFOLD local updates.

Each hook runs after backward and before the optimiser step, adding the gradient of a
regulariser to p.grad in place (weight decay stays inside the optimiser).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from fednet.training.local import GradHook


@torch.no_grad()
def _add(params: Sequence[torch.Tensor], terms: Sequence[torch.Tensor]) -> None:
    for p, t in zip(params, terms):
        if p.grad is not None:
            p.grad.add_(t)


def prox(anchor: Sequence[torch.Tensor], mu: float) -> GradHook:
    """FedProx: gradient of (mu/2)||theta - anchor||^2, i.e. mu (theta - anchor)."""
    def hook(params: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, a in zip(params, anchor):
                if p.grad is not None:
                    p.grad.add_(p - a, alpha=mu)
    return hook


def dyn(anchor: Sequence[torch.Tensor], g: Sequence[torch.Tensor], alpha: float) -> GradHook:
    """FedDyn: gradient of -<g_k, theta> + (alpha/2)||theta - anchor||^2 = -g_k + alpha (theta - anchor)."""
    def hook(params: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, a, gk in zip(params, anchor, g):
                if p.grad is not None:
                    p.grad.add_(p - a, alpha=alpha).sub_(gk)
    return hook


def control_variate(c: Sequence[torch.Tensor], c_k: Sequence[torch.Tensor]) -> GradHook:
    """SCAFFOLD: the drift correction c - c_k."""
    diff = [a - b for a, b in zip(c, c_k)]
    return lambda params: _add(params, diff)


def clip_norm(max_norm: float) -> GradHook:
    """Clip the global gradient norm (FedDyn's safeguard against parameter explosion)."""
    def hook(params: Sequence[torch.Tensor]) -> None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
    return hook
