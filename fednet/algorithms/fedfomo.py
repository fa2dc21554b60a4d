"""FedFOMO. Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First Order
Model Optimization", ICLR 2021. Spec: docs/algorithms.md §3.9; reference code: NVlabs/FedFomo.

The server keeps every client's latest model and an affinity vector p_i per client (p_i[i] = 0.1,
others 0). Each round client i downloads M = --param m models of other clients that have uploaded
one, picked slot by slot epsilon-greedily on p_i (eps = 0.3 - 0.05 round, clipped at 0; greedy
picks take the highest affinity, ties broken by a seeded random key). The client scores each
candidate on its fixed, seeded 20 % validation split:
    w_n = (L_i(theta_b) - L_i(theta_n)) / ||theta_n - theta_b||        (theta_b: the baseline)
keeps the positive w_n, normalises them, sets theta_i = theta_b + sum_n w_n (theta_n - theta_b)
(theta_b when none is positive), trains E epochs on the other 80 % and uploads its model and the
raw w (array "fomo:w"); the server adds w_n / |sum_m w_m| to p_i[n]. Before anyone has uploaded,
clients simply train their (initial) model.

Paper behaviour is the default: the baseline theta_b is the client's current model. Official-code
options: --param baseline=first_model (the client's model before its first training is theta_b,
and its current model joins the candidates); --param norm=l1 (the official default, used here
too) or l2; the distance is over trainable parameters, the update over every floating entry.
Deviation: a candidate at distance 0 scores w = 0 (the official code would divide by zero).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fednet import rng
from fednet.algorithms.aggregate import weighted_mean
from fednet.algorithms.common import round_metrics, usable
from fednet.algorithms.contract import ClientContext, ClientUpdate, Model, ServerState, Strategy
from fednet.algorithms.layout import Layout
from fednet.algorithms.updates import local_sgd
from fednet.models.arrays import clone_arrays, load_arrays, state_arrays
from fednet.training.local import evaluate
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

W_KEY = "fomo:w"


def epsilon(rnd: int, start: float = 0.3, decay: float = 0.05) -> float:
    """The exploration probability of round rnd: max(start - decay * rnd, 0)."""
    return max(start - decay * rnd, 0.0)


def fomo_weights(base_loss: float, losses: list[float], dists: list[float]) -> np.ndarray:
    """w_n = (L(theta_b) - L(theta_n)) / ||theta_n - theta_b|| (0 where the distance is 0)."""
    return np.array([(base_loss - loss) / d if d > 0 else 0.0 for loss, d in zip(losses, dists)])


def mix_weights(w: np.ndarray) -> np.ndarray:
    """Only the positive weights, normalised to sum 1 (all zero when none is positive)."""
    pos = np.where(w > 0, w, 0.0)
    total = float(pos.sum())
    return pos / total if total > 0 else pos


def affinity_step(w: np.ndarray) -> np.ndarray:
    """The increments p_i[n] += w_n / |sum_m w_m| (the official 1e-9 floor on the divisor)."""
    norm = abs(float(np.sum(w)))
    return w / (norm if norm >= 1e-9 else norm + 1e-9)


@dataclass
class FedFomoState(ServerState):
    """The affinities p (K x K), each client's latest model and its sample count."""

    affinity: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    latest: dict[int, Model] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)


@dataclass
class FedFomoClientState:
    """The fixed (train, validation) index split, and theta_b for --param baseline=first_model
    (the client's model itself is personal: keeps_model)."""

    fomo_split: tuple[torch.Tensor, ...] | None = None
    fomo_first: Model | None = None


class FedFomo(Strategy):
    """Per-client first-order model mixing over downloaded peer models."""

    State = FedFomoState

    def init_state(self, init: Arrays) -> FedFomoState:
        """No uploads yet; p_i[i] = self_weight, 0 elsewhere."""
        affinity = np.zeros((self.cfg.clients, self.cfg.clients))
        np.fill_diagonal(affinity, self.p.self_weight)
        return FedFomoState(model=dict(init), affinity=affinity)

    def candidates(self, rnd: int, cid: int) -> list[int]:
        """Up to m other clients with a stored model, chosen epsilon-greedily on p_cid."""
        pool = [k for k in sorted(self.state.latest) if k != cid]
        m = self.p.m
        if len(pool) <= m:
            return pool
        g = rng.generator(self.cfg.seed, "fedfomo/select", rnd, cid)
        aff = self.state.affinity[cid, pool]
        top = [pool[i] for i in np.lexsort((g.random(len(pool)), aff))[::-1]]  # random ties
        shuffled = [pool[i] for i in g.permutation(len(pool))]
        eps = epsilon(rnd, self.p.eps, self.p.eps_decay)
        chosen: list[int] = []
        while len(chosen) < m:
            src = shuffled if g.random() < eps else top
            k = src.pop(0)
            if k not in chosen:
                chosen.append(k)
        return chosen

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """Each selected client gets its candidates' latest models (its own stays with it)."""
        tasks = []
        for c in self.select(rnd, clients):
            cands = self.candidates(rnd, c.cid)
            arrays = {f"m{k}:{n}": a for k in cands for n, a in self.state.latest[k].items()}
            tasks.append(self.new_task(rnd, [c.cid], arrays,
                                       {**self.task_body(rnd, c), "candidates": cands}))
        return tasks

    def result_layout(self, task: Task) -> Layout:
        """The client's model, and its weights w over the candidates (and itself, with
        baseline=first_model) when it had any."""
        cands = len(task.body.get("candidates", []))
        if not cands:
            return self.layout
        w = cands + (self.p.baseline == "first_model")
        return {**self.layout, W_KEY: ((w,), np.dtype(np.float64))}

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Store each upload; update the uploader's affinities from its reported w."""
        ok, dropped = usable(results)
        st = self.state
        for r in ok:
            st.latest[r.cid] = {n: a for n, a in r.arrays.items() if n != W_KEY}
            st.sizes[r.cid] = r.num_examples
            cands = [int(k) for k in r.body.get("candidates", [])]
            if cands and W_KEY in r.arrays:
                st.affinity[r.cid, cands] += affinity_step(r.arrays[W_KEY].astype(np.float64))
        m = round_metrics(ok, failures, dropped)
        mixed = [float(r.body["mixed"]) for r in ok if "mixed" in r.body]
        if mixed:
            m["mixed_mean"] = float(np.mean(mixed))
        return m

    def eval_arrays(self) -> Arrays:
        """No global model exists: the sample-weighted mean of the stored client models."""
        st = self.state
        if not st.latest:
            return st.model
        ks = sorted(st.latest)
        return weighted_mean([st.latest[k] for k in ks], [st.sizes[k] for k in ks])


class FedFomoClient(ClientUpdate):
    """Scores the downloaded peers on a validation split, mixes, trains its personal model."""

    State = FedFomoClientState
    keeps_model = True

    def split(self, ctx: ClientContext) -> tuple[torch.Tensor, ...]:
        """(train, validation) indices of this client's data: fixed and seeded."""
        if ctx.state.fomo_split is None:
            n = ctx.num_examples
            n_train = min(max(int(round((1 - self.p.val_fraction) * n)), 1), max(n - 1, 1))
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(
                rng.int_seed(self.cfg.seed, "fedfomo/val", -1, ctx.cid)))
            ctx.state.fomo_split = (perm[:n_train].sort().values, perm[n_train:].sort().values)
        return ctx.state.fomo_split

    def distance(self, a: Arrays, b: Arrays, names: list[str]) -> float:
        """||a - b|| over the named entries, L1 or L2."""
        if self.p.norm == "l1":
            return float(sum(np.abs(a[n].astype(np.float64) - b[n]).sum() for n in names))
        return float(np.sqrt(sum(((a[n].astype(np.float64) - b[n]) ** 2).sum() for n in names)))

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Score the candidates on the validation split, mix, train on the rest, upload."""
        tr, va = self.split(ctx)
        first = self.p.baseline == "first_model"
        if first and ctx.state.fomo_first is None:
            ctx.state.fomo_first = clone_arrays(state_arrays(ctx.model))
        cands = [int(k) for k in task.body.get("candidates", [])]
        models = [{n[len(f"m{k}:"):]: a for n, a in task.arrays.items() if n.startswith(f"m{k}:")}
                  for k in cands]
        w = np.zeros(0)
        mixed = 0
        if cands:
            own = clone_arrays(state_arrays(ctx.model))
            base = ctx.state.fomo_first if first else own
            if first:  # the official candidate set includes self
                cands, models = cands + [ctx.cid], models + [own]
            names = [n for n, p in ctx.model.named_parameters() if p.requires_grad]
            xv, yv = ctx.x[va], ctx.y[va]

            def val_loss(arrays: Arrays) -> float:
                load_arrays(ctx.model, arrays)
                return evaluate(ctx.model, xv, yv, objective=ctx.objective)[1]

            base_loss = val_loss(base)
            losses = [val_loss(mdl) for mdl in models]
            w = fomo_weights(base_loss, losses, [self.distance(mdl, base, names) for mdl in models])
            mix = mix_weights(w)
            mixed = int((mix > 0).sum())
            new = {n: (a.astype(np.float64) + sum(mix[j] * (models[j][n] - a)
                                                  for j in range(len(models)) if mix[j] > 0)
                       ).astype(a.dtype) if a.dtype.kind == "f" else a
                   for n, a in base.items()}
            load_arrays(ctx.model, new)
        sub = dataclasses.replace(ctx, x=ctx.x[tr], y=ctx.y[tr])
        body = local_sgd(sub, task, load=False)
        out = dict(clone_arrays(state_arrays(ctx.model)))
        if cands:
            out[W_KEY] = w.astype(np.float64)
        return out, {**body, "candidates": cands, "mixed": mixed}
