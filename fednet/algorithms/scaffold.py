"""SCAFFOLD. Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020. Spec: docs/algorithms.md §3.3. Option II (the paper's cheaper update) by default;
--param option=1 selects option I, the FedSeq repository's full local gradient at the server model."""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fednet.algorithms.common import round_metrics, task_lr
from fednet.algorithms.contract import ClientContext, ClientUpdate, Model, ServerState
from fednet.algorithms.fedavg import FedAvg
from fednet.algorithms.layout import Layout
from fednet.algorithms.updates import local_sgd, trainable
from fednet.models.arrays import clone_arrays, load_arrays, state_arrays
from fednet.training import hooks
from fednet.training.flops import charge
from fednet.training.local import batches
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

C = "c:"    # server control, sent with the model
DC = "dc:"  # a client's control change, sent back with its model


@dataclass
class ScaffoldState(ServerState):
    """The global model and the server control c (one entry per trainable parameter)."""

    c: Model = field(default_factory=dict)


@dataclass
class ScaffoldClientState:
    """The client control c_k: one tensor per trainable parameter (None before the first task)."""

    scaffold_c: list[torch.Tensor] | None = None


class Scaffold(FedAvg):
    """Server keeps c; each client keeps c_k in its own state; global step size 1."""

    State = ScaffoldState

    def init_state(self, init: Arrays) -> ScaffoldState:
        """Global model and c = 0 for every trainable parameter."""
        return ScaffoldState(model=dict(init),
                             c={k: np.zeros_like(init[k]) for k in init if k in self.trainable})

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """Model plus server control in every task."""
        arrays = dict(self.state.model)
        arrays.update({C + k: v for k, v in self.state.c.items()})
        return [self.new_task(rnd, [c.cid], arrays, self.task_body(rnd, c))
                for c in self.select(rnd, clients)]

    def result_layout(self, task: Task) -> Layout:
        """The model and a control change per server control entry."""
        return {**self.layout, **{DC + k: self.layout[k] for k in self.state.c}}

    def fold(self, r: Result) -> None:
        """The model weighted by samples; the control changes delta c_k summed (both checked
        before either is added, so a bad result changes neither)."""
        model = {k: v for k, v in r.arrays.items() if not k.startswith(DC)}
        dc = {k[len(DC):]: v for k, v in r.arrays.items() if k.startswith(DC)}
        if set(dc) != set(self.state.c):
            raise ValueError(f"control changes for {sorted(set(dc) ^ set(self.state.c))[:3]} do not "
                             "match the server control")
        self.sum_of("model").check(model, r.num_examples)
        self.sum_of("dc").check(dc, 1.0)
        self.sum_of("model").add(model, r.num_examples, key=r.cid)
        self.sum_of("dc").add(dc, 1.0, key=r.cid)

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """x = weighted mean of y_k; c += (1/K) sum of delta c_k (K = all clients)."""
        ok, dropped, sums = self.take_round(results)
        if ok:
            self.state.model = sums["model"].result()
            K = self.cfg.clients
            dc = sums["dc"].sums()
            c = self.state.c
            for k in c:
                c[k] = (c[k] + dc[k] / K).astype(c[k].dtype)
        return round_metrics(ok, failures, dropped)


class ScaffoldClient(ClientUpdate):
    """Corrected local SGD; the client control c_k is this client's state."""

    State = ScaffoldClientState

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Corrected local SGD; returns y and delta c_k."""
        model = {k: v for k, v in task.arrays.items() if not k.startswith(C)}
        load_arrays(ctx.model, model)
        names = [n for n, p in ctx.model.named_parameters() if p.requires_grad]
        c = [torch.from_numpy(np.array(task.arrays[C + n])).to(ctx.device) for n in names]
        params = trainable(ctx)
        if ctx.state.scaffold_c is None:
            ctx.state.scaffold_c = [torch.zeros_like(p) for p in params]
        c_k = ctx.state.scaffold_c
        x = [p.detach().clone() for p in params]
        body = local_sgd(ctx, task, [hooks.control_variate(c, c_k)], load=False)
        if self.p.option == 2:
            lr = task_lr(ctx, task)
            scale = 1.0 / (max(body["steps"], 1) * lr)
            new = [ck - ci + (xi - p.detach()) * scale for ck, ci, xi, p in zip(c_k, c, x, params)]
        else:
            new = _full_gradient(ctx, x, task)
        delta = {DC + n: (nw - old).cpu().numpy() for n, nw, old in zip(names, new, c_k)}
        ctx.state.scaffold_c = new
        out = dict(state_arrays(ctx.model))
        out.update(delta)
        return out, body


def _full_gradient(ctx: ClientContext, x: list[torch.Tensor], task: Task) -> list[torch.Tensor]:
    """Option I: mean over the minibatches of E epochs of grad f_k(x; batch), at the server model."""
    params = trainable(ctx)
    trained = clone_arrays(state_arrays(ctx.model))  # buffers too: BN statistics must not move
    with torch.no_grad():
        for p, xi in zip(params, x):
            p.copy_(xi)
    acc = [torch.zeros_like(p) for p in params]
    n = 0
    g = ctx.batch_generator(task.round, "scaffold-grad")
    for _ in range(int(task.body.get("epochs", ctx.cfg.train.epochs))):
        for idx in batches(len(ctx.y), ctx.cfg.train.batch_size, g):
            ctx.model.zero_grad(set_to_none=True)
            xb = ctx.x[idx]
            charge(ctx.model, xb)
            ctx.loss(ctx.model(xb), ctx.y[idx]).backward()
            for a, p in zip(acc, params):
                assert p.grad is not None, "a trainable parameter has a gradient after backward"
                a.add_(p.grad)
            n += 1
    load_arrays(ctx.model, trained)
    return [a / max(n, 1) for a in acc]
