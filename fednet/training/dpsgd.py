"""DP-SGD inside one client (Abadi et al. 2016) through Opacus: docs/algorithms.md §11.4.

Each step samples the client's examples by Poisson sampling at rate q = 1/ceil(n/B) (the
accountant's assumption, as Opacus's DPDataLoader: ceil(n/B) steps an epoch, an expected batch
of q*n), Opacus computes the per-example gradients (GradSampleModule's hooks, removed after the
update: a working model may be shared by the process's clients) and its DPOptimizer clips each
to --dp-sgd-clip, adds N(0, (z C)^2) to their sum and divides by the expected batch; fednet's own
optimizer (training/optim.py: momentum, weight decay, Adam) then steps on that gradient, after
the hooks of the local rule (FedProx's term: a function of the model alone). The batches come
from the client's seeded generator, the noise from (seed, "dp-sgd-noise", round, client).

On the clock (docs/usage.md, "Client compute"): each batch is charged its FLOPs through the
per-example path (training/flops.py's "dpsgd" mode: Opacus's per-example gradients and their
clipping, as FlopCounterMode counts them), and each step its noise, one Gaussian draw per
trained parameter value (fednet/opcount.py's "noise", at the client's noise_per_s): counted
from the model and the step count, never timed.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fednet.data.augment import Augment
from fednet import opcount
from fednet.data.views import Examples
from fednet.privacy import require
from fednet.privacy.plan import sgd_steps
from fednet.training import flops, interrupt
from fednet.training.local import GradHook, TrainStats
from fednet.training.objective import CLASSIFICATION, Objective
from fednet.training.optim import Optimizer, OptimSpec


class _Params:
    """What Opacus's DPOptimizer reads of the optimizer it wraps (its parameter groups); the
    step itself is fednet's (torch.optim's classes would import torch._dynamo: 1.2 s)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.param_groups = [{"params": params}]
        self.state: dict[Any, Any] = {}
        self.defaults: dict[str, Any] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


def check_model(model: nn.Module) -> str:
    """Why Opacus cannot compute this model's per-example gradients ('' when it can)."""
    opacus = require("opacus", "--dp-sgd-noise")
    errors = opacus.validators.ModuleValidator.validate(model, strict=False)
    return "; ".join(str(e) for e in errors[:3])


def train_private(model: nn.Module, x: Examples, y: torch.Tensor, *, epochs: int,
                  batch_size: int, spec: OptimSpec, generator: torch.Generator,
                  noise_generator: torch.Generator, noise: float, clip: float,
                  hooks: Sequence[GradHook] = (),
                  augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
                  objective: Objective = CLASSIFICATION) -> TrainStats:
    """`epochs` passes of DP-SGD over (x, y); returns the mean training loss (of the sampled
    batches: the client keeps it)."""
    opacus = require("opacus", "--dp-sgd-noise")
    n = len(y)
    q, steps = sgd_steps(n, batch_size)
    model.train()
    flops.template(model)  # the clock's copy of the model, made before Opacus hooks it
    gsm = opacus.GradSampleModule(model, loss_reduction="mean")
    try:
        with warnings.catch_warnings():  # torch's note on Opacus's hooks of a first layer
            warnings.filterwarnings("ignore", "Full backward hook is firing")
            return _steps(gsm, model, x, y, epochs * steps, q, spec, generator, noise_generator,
                          noise, clip, hooks, augment, objective)
    finally:
        gsm.to_standard_module()  # hooks and per-example attributes removed


def _steps(gsm: nn.Module, model: nn.Module, x: Examples, y: torch.Tensor, count: int,
           q: float, spec: OptimSpec, generator: torch.Generator,
           noise_generator: torch.Generator, noise: float, clip: float,
           hooks: Sequence[GradHook], augment: Augment | None, objective: Objective) -> TrainStats:
    """`count` DP-SGD steps (train_private): Poisson batch, per-example gradients, Opacus's
    clipping and noise, the local rule's hooks, fednet's optimizer step."""
    from opacus.optimizers import DPOptimizer

    n = len(y)
    params = [p for p in model.parameters() if p.requires_grad]
    dp = DPOptimizer(_Params(params), noise_multiplier=noise,  # type: ignore[arg-type]  # duck-typed
                     max_grad_norm=clip, expected_batch_size=max(q * n, 1e-12),
                     generator=noise_generator)
    opt = Optimizer(params, spec)
    draws = {"noise": float(sum(p.numel() for p in params))} if noise > 0 else {}
    total, samples = 0.0, 0
    for _ in range(count):
        interrupt.poll()  # between two batches: the run's end, a lost server
        opcount.charge(draws)  # the step's Gaussian noise, one draw a parameter (pre_step)
        idx = torch.nonzero(torch.rand(n, generator=generator) < q).squeeze(1).to(x.device)
        dp.zero_grad()
        if len(idx):
            xb, yb = x[idx], y[idx]
            if augment is not None:
                xb = augment(xb, generator)
            flops.charge(model, xb, "dpsgd")  # per-example gradients and clipping, counted
            loss = objective.loss(gsm(xb), yb)
            loss.backward()
            total += float(loss.detach()) * len(idx)
            samples += len(idx)
        else:  # an empty batch: the step is the noise alone
            for p in params:
                p.grad_sample = torch.zeros(  # type: ignore[attr-defined]  # (Opacus's)
                    (0, *p.shape), dtype=p.dtype, device=p.device)
        dp.pre_step()
        for h in hooks:
            h(params)
        opt.step()
    dp.zero_grad()
    return TrainStats(total / max(samples, 1), samples, count)
