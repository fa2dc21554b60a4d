"""Per-FedAvg. Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020. Spec: docs/algorithms.md §3.10.

Clients minimise F_k(theta) = f_k(theta - alpha grad f_k(theta)). Each local step takes two
minibatches D, D' of one shuffled epoch (E epochs worth of pairs per round):
    theta' = theta - alpha grad f(theta; D)
    FO (default):        g = grad f(theta'; D')
    HF (--param hf=true): g = (I - alpha H f(theta; D'')) grad f(theta'; D'), D'' a third,
                          independently drawn batch; the Hessian-vector product by double
                          backprop (--param hvp=autograd) or central differences (hvp=fd)
    theta <- theta - beta g                 (from theta, not theta', unlike PFLlib's shortcut)
alpha (0.01) and beta (0.005) replace --lr; the run's weight decay is part of f (its gradient
wd theta, its Hessian wd I); no momentum. The server is FedAvg (sample-weighted). Personalized
evaluation: after computing its upload (the un-personalized theta) the client takes one SGD step
of size alpha on one seeded local batch, and the executor tests that personalized model.
Deviation: a client with a single batch per epoch uses it as both D and D'; an odd last batch of an
epoch is not used.
"""
from __future__ import annotations

from typing import Any

import torch

from fednet.algorithms.contract import ClientContext, ClientUpdate
from fednet.algorithms.updates import trainable
from fednet.models.arrays import clone_arrays, load_arrays, state_arrays
from fednet.training.flops import charge
from fednet.training.local import batches
from fednet.types import Arrays, Task


class PerFedAvgClient(ClientUpdate):
    """MAML-style (first-order or Hessian-free) local steps; the server is FedAvg's."""

    def _grad(self, ctx: ClientContext, idx: torch.Tensor, create_graph: bool = False
              ) -> tuple[list[torch.Tensor], float]:
        """grad of the loss (batch idx) + (wd/2)||theta||^2 at the model's current parameters."""
        params = trainable(ctx)
        xb = ctx.x[idx]
        if not create_graph:  # (with a graph: _hvp charges the whole product)
            charge(ctx.model, xb)
        loss = ctx.loss(ctx.model(xb), ctx.y[idx])
        grads = torch.autograd.grad(loss, params, create_graph=create_graph)
        wd = ctx.cfg.train.weight_decay
        ps = params if create_graph else [p.detach() for p in params]
        return [g + wd * p if wd else g for g, p in zip(grads, ps)], float(loss.detach())

    def _hvp(self, ctx: ClientContext, idx: torch.Tensor, v: list[torch.Tensor]
             ) -> list[torch.Tensor]:
        """H f(theta; idx) v at the model's current parameters."""
        params = trainable(ctx)
        if self.p.hvp == "autograd":
            charge(ctx.model, ctx.x[idx], "hvp")
            grads, _ = self._grad(ctx, idx, create_graph=True)
            terms = [(g * vi).sum() for g, vi in zip(grads, v)]
            dot = sum(terms[1:], terms[0])  # (as sum(terms) adds them, but a tensor from the start)
            return [h.detach() for h in torch.autograd.grad(dot, params)]
        d = self.p.fd_delta
        with torch.no_grad():
            for p, vi in zip(params, v):
                p.add_(vi, alpha=d)
        plus, _ = self._grad(ctx, idx)
        with torch.no_grad():
            for p, vi in zip(params, v):
                p.add_(vi, alpha=-2 * d)
        minus, _ = self._grad(ctx, idx)
        with torch.no_grad():
            for p, vi in zip(params, v):
                p.add_(vi, alpha=d)
        return [(a - b) / (2 * d) for a, b in zip(plus, minus)]

    def meta_step(self, ctx: ClientContext, d1: torch.Tensor, d2: torch.Tensor,
                  d3: torch.Tensor | None = None) -> float:
        """One Per-FedAvg step on batches D = d1, D' = d2 (and D'' = d3 for HF); in place."""
        params = trainable(ctx)
        theta = [p.detach().clone() for p in params]
        g1, loss = self._grad(ctx, d1)
        with torch.no_grad():
            for p, g in zip(params, g1):
                p.sub_(g, alpha=self.p.alpha)                  # theta'
        g2, _ = self._grad(ctx, d2)
        with torch.no_grad():
            for p, t in zip(params, theta):
                p.copy_(t)                                   # back to theta
        if self.p.hf:
            hv = self._hvp(ctx, d3 if d3 is not None else d2, g2)
            g2 = [g - self.p.alpha * h for g, h in zip(g2, hv)]
        with torch.no_grad():
            for p, g in zip(params, g2):
                p.sub_(g, alpha=self.p.beta)
        return loss

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """E epochs of meta steps from the global model; upload theta, then personalize."""
        load_arrays(ctx.model, task.arrays)
        ctx.model.train()
        n, bs = ctx.num_examples, ctx.cfg.train.batch_size
        gen = ctx.batch_generator(task.round)
        hgen = ctx.batch_generator(task.round, "perfedavg/hessian")
        total, steps, samples, seen = 0.0, 0, 0, 0
        for _ in range(int(task.body.get("epochs", ctx.cfg.train.epochs))):
            bl = [b.to(ctx.x.device) for b in batches(n, bs, gen)]
            pairs = list(zip(bl[0::2], bl[1::2])) or [(bl[0], bl[0])]
            for d1, d2 in pairs:
                d3 = torch.randperm(n, generator=hgen)[:bs].to(ctx.x.device) if self.p.hf else None
                total += self.meta_step(ctx, d1, d2, d3) * len(d1)
                seen += len(d1)
                samples += len(d1) + len(d2) + (len(d3) if d3 is not None else 0)
                steps += 1
        upload = clone_arrays(state_arrays(ctx.model))
        body: dict[str, Any] = {"loss": total / max(seen, 1), "samples": samples, "steps": steps}
        if task.body.get("evaluate"):
            self.personalize(ctx, task.round)
        return upload, body

    def personalize(self, ctx: ClientContext, rnd: int) -> None:
        """One SGD step of size alpha on one seeded local training batch (in place)."""
        ctx.model.train()
        g = ctx.batch_generator(rnd, "perfedavg/personalize")
        idx = torch.randperm(ctx.num_examples, generator=g)[:ctx.cfg.train.batch_size]
        grads, _ = self._grad(ctx, idx.to(ctx.x.device))
        with torch.no_grad():
            for p, gr in zip(trainable(ctx), grads):
                p.sub_(gr, alpha=self.p.alpha)
