"""Local optimizers (--optimizer sgd|adam|adamw) on torch's functional kernels.

torch.optim's optimizer classes import torch._dynamo on their first step (1.2 s and ~100 MB per
client process); the functional kernels they call (torch.optim.sgd.sgd, torch.optim.adam.adam,
torch.optim.adamw.adamw) do not, so fednet drives those directly. `sgd` runs the same arithmetic
as fednet's former hand-written loop (d = g + wd*p; buf = m*buf + d; p -= lr*buf), bit for bit
(tests/test_optim.py).

What an optimizer keeps between steps lives in an OptimizerState. A fresh one per task is the
default (the optimizer starts afresh every round); a ClientUpdate whose State derives from
OptimizerState and that passes ctx.state keeps it across rounds, and checkpoints it with the rest
of its state (algorithms/state.py: tensor maps by trainable-parameter index and a JSON list).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.optim.adam import adam
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd

from fednet.config import OPTIMIZERS, TrainConfig


@dataclass
class OptimizerState:
    """An optimizer's memory, keyed by trainable-parameter index (the order of model.parameters()
    with requires_grad). SGD uses `momentum` (its buffer); Adam and AdamW use `momentum` (the
    first moment), `moment2` (the second) and `opt_steps` (steps taken, per parameter)."""

    momentum: dict[int, torch.Tensor] = field(default_factory=dict)
    moment2: dict[int, torch.Tensor] = field(default_factory=dict)
    opt_steps: list[int] = field(default_factory=list)


_DEFAULT = TrainConfig()  # the declared defaults (config/settings.py): their one source


@dataclass(frozen=True)
class OptimSpec:
    """Which optimizer and its hyper-parameters: the run's [train] section (spec_of), whose
    declarations give the defaults; nothing is restated here."""

    name: str = _DEFAULT.optimizer
    lr: float = _DEFAULT.lr
    momentum: float = _DEFAULT.momentum
    weight_decay: float = _DEFAULT.weight_decay
    nesterov: bool = _DEFAULT.nesterov
    beta1: float = _DEFAULT.beta1
    beta2: float = _DEFAULT.beta2
    eps: float = _DEFAULT.eps


def spec_of(t: TrainConfig, lr: float | None = None) -> OptimSpec:
    """The OptimSpec of a TrainConfig (lr overrides its learning rate, e.g. a task's)."""
    return OptimSpec(t.optimizer, float(t.lr if lr is None else lr), float(t.momentum),
                     float(t.weight_decay), bool(t.nesterov), float(t.beta1), float(t.beta2),
                     float(t.eps))


class Optimizer:
    """One optimizer over a fixed list of parameters; `state` persists what it must keep."""

    def __init__(self, params: Sequence[torch.Tensor], spec: OptimSpec,
                 state: OptimizerState | None = None) -> None:
        if spec.name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {spec.name!r}; choose one of {OPTIMIZERS}")
        self.params, self.spec = list(params), spec
        self.state = state if state is not None else OptimizerState()

    def zero_grad(self) -> None:
        """Drop the gradients."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient (the others are left alone)."""
        idx = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not idx:
            return
        ps = [self.params[i] for i in idx]
        grads = [p.grad for p in ps]
        s, st = self.spec, self.state
        if s.name == "sgd":
            bufs = [st.momentum.get(i) for i in idx]
            # foreach=False: the per-parameter loop on every device (the bit-identical path)
            # (a None buffer: sgd makes a new one; mypy reads torch's stubs otherwise)
            sgd(ps, grads, bufs, foreach=False, weight_decay=s.weight_decay,  # type: ignore[arg-type]  # grads: Tensor | None
                momentum=s.momentum, lr=s.lr, dampening=0.0, nesterov=s.nesterov, maximize=False)
            if s.momentum:
                st.momentum.update({i: b for i, b in zip(idx, bufs) if b is not None})
            return
        if len(st.opt_steps) < len(self.params):
            st.opt_steps.extend([0] * (len(self.params) - len(st.opt_steps)))
        m = [st.momentum.setdefault(i, torch.zeros_like(p)) for i, p in zip(idx, ps)]
        v = [st.moment2.setdefault(i, torch.zeros_like(p)) for i, p in zip(idx, ps)]
        steps = [torch.tensor(float(st.opt_steps[i])) for i in idx]  # CPU scalars, as torch.optim
        kernel = adamw if s.name == "adamw" else adam  # adamw: decoupled weight decay
        kernel(ps, grads, m, v, [], steps, amsgrad=False, beta1=s.beta1,  # type: ignore[arg-type]  # grads: Tensor | None
               beta2=s.beta2, lr=s.lr,
               weight_decay=s.weight_decay, eps=s.eps, maximize=False)
        for i, t in zip(idx, steps):
            st.opt_steps[i] = int(t.item())

