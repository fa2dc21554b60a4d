"""Factorized-FL. Jeong and Hwang, "Factorized-FL: Personalized Federated Learning with Parameter
Factorization & Similarity Matching", NeurIPS 2022. Spec: docs/algorithms.md §5 and §7.15-§7.26.

Every layer is W = u v + mu. Clients keep v, mu and the head; they send u (every layer, plus the
BN affine terms and plain biases, 5.6) and the v of the layer before the classifier. The server
matches clients by the cosine similarity of those v and sends each client its own aggregate of u
over its most similar peers (softmax(eps * sim) weights, threshold tau, at least m_min peers).
Factorized-FL beta (`factorized_beta`) also aggregates v and mu with the same weights.
Ablations (--param matching=...): none (Factorized-FedAvg: sample-weighted average of everything
shared), random or worst (3 peers plus self). The L1 term on mu carries a gradient (the paper);
--param l1_detached=true mimics the official code, where it does not. Local gradients are clipped
to norm 5 (--param clip=0 turns it off): with a peer aggregate of u arriving over a client's own v,
the rank-1 layers otherwise blew up to NaN at digits-scale learning rates (measured: 4 of 20
domain clients by round 4 at lr 0.05, momentum 0.9); the paper's lr of 1e-3 trains too slowly here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import numpy as np

from fednet import rng
from fednet.algorithms.aggregate import weighted_mean
from fednet.algorithms.common import round_metrics, usable
from fednet.algorithms.contract import ClientContext, ClientUpdate, Model, ServerState, Strategy
from fednet.algorithms.layout import Layout
from fednet.algorithms.updates import local_sgd
from fednet.config import RunConfig
from fednet.errors import ConfigError
from fednet.models.factorized import l1_penalty
from fednet.models.arrays import load_arrays, state_arrays
from fednet.training.hooks import clip_norm
from fednet.training.optim import OptimizerState
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

SHARED = {"factorized": {"u", "norm", "dense"}, "factorized_beta": {"u", "v", "mu", "norm", "dense"}}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two flattened arrays (0 when either is all zeros)."""
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


@dataclass
class FactorizedState(ServerState):
    """The (initial) model, each client's latest upload and its sample count."""

    latest: dict[int, Model] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)


@dataclass
class FactorizedClientState(OptimizerState):
    """The client's optimizer (SGD's momentum, Adam's moments; its model is personal too:
    keeps_model)."""


def scenario_params(cfg: RunConfig, p: Any) -> Any:
    """docs/algorithms.md §5.4's per-scenario defaults, where --param did not set a value."""
    scenario: dict[str, Any] = {}
    if cfg.data.partition == "domain":
        scenario = {"tau": 0.95, "eps": 20.0, "min_peers": 4}
    elif cfg.data.permute:
        scenario = {"min_peers": max(1, cfg.clients // 2)}
    return dataclasses.replace(p, **{k: v for k, v in scenario.items() if k not in cfg.algo.params})


class Factorized(Strategy):
    """Personalized aggregation of the shared factors by similarity of the matching v."""

    State = FactorizedState
    variant = "factorized"  # which kinds travel: SHARED[variant] (FactorizedBeta: v and mu too)

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, scenario_params(cfg, params))
        self.shared_kinds = SHARED[self.variant]
        self.matched: dict[int, list[int]] = {}  # client -> its peers, within a round

    def shared(self) -> list[str]:
        """State names that travel (by kind; never the head, never BN running statistics)."""
        kinds = self.info.kinds
        if not kinds or "u" not in kinds.values():
            raise ConfigError(f"--algo {self.cfg.algo.name} needs a factorized model (--model "
                              "factorized_digits or factorized_resnet9, or auto)")
        return [n for n, k in kinds.items() if k in self.shared_kinds]

    def _weights(self, k: int) -> list[tuple[int, float]]:
        """(peer, weight) pairs for client k's aggregate (section 5.4 and the ablations)."""
        latest, sizes = self.state.latest, self.state.sizes
        peers = sorted(latest)
        if self.p.matching == "none":
            tot = sum(sizes[j] for j in peers)
            return [(j, sizes[j] / tot) for j in peers]
        z = self.info.matching
        sims = {j: (1.0 if j == k else cosine(latest[k][z], latest[j][z])) for j in peers}
        if self.p.matching in ("random", "worst"):
            others = [j for j in peers if j != k]
            m = min(self.p.peers, len(others))
            if self.p.matching == "random":
                pick = rng.generator(self.cfg.seed, "random-matching", len(self.matched), k)
                chosen = [others[i] for i in sorted(pick.choice(len(others), m, replace=False))]
            else:
                chosen = sorted(others, key=lambda j: (sims[j], j))[:m]
            group = [k] + chosen
        else:
            order = sorted(peers, key=lambda j: (-sims[j], j))
            n = sum(1 for j in peers if sims[j] >= self.p.tau)
            n = max(n, self.p.min_peers or len(peers), 1)
            group = order[:n]
        e = np.array([self.p.eps * sims[j] for j in group])
        w = np.exp(e - e.max())
        w = w / w.sum()
        return list(zip(group, w.tolist()))

    def personalized(self, k: int) -> Arrays:
        """Client k's shared arrays: its similarity-weighted aggregate (init before any upload)."""
        names = self.shared()
        latest = self.state.latest
        if not latest:
            return {n: self.state.model[n] for n in names}
        if k not in latest:  # never uploaded: the sample-weighted average of all stored
            peers = sorted(latest)
            return weighted_mean([{n: latest[j][n] for n in names} for j in peers],
                                 [self.state.sizes[j] for j in peers])
        pw = self._weights(k)
        self.matched[k] = [j for j, _ in pw]
        return weighted_mean([{n: latest[j][n] for n in names} for j, _ in pw],
                             [w for _, w in pw])

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """One task per selected client with its own personalized aggregate."""
        self.matched = {}
        body_extra = {"lambda": self.p.lambda_sparsity, "l1_detached": self.p.l1_detached,
                      "clip": self.p.clip,
                      "upload": sorted(set(self.shared()) | {self.info.matching})}
        return [self.new_task(rnd, [c.cid], self.personalized(c.cid),
                              {**self.task_body(rnd, c), **body_extra})
                for c in self.select(rnd, clients)]

    def result_layout(self, task: Task) -> Layout:
        """The entries the task asked for (body `upload`), as the model holds them."""
        return {n: self.layout[n] for n in task.body["upload"]}

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Store each client's latest upload; the aggregation is per client, next round."""
        ok, dropped = usable(results)
        for r in ok:
            self.state.latest[r.cid] = r.arrays
            self.state.sizes[r.cid] = r.num_examples
        m = round_metrics(ok, failures, dropped)
        if self.matched:
            m["peers_mean"] = float(np.mean([len(v) for v in self.matched.values()]))
        return m


class FactorizedBeta(Factorized):
    """Factorized-FL beta: v and mu are shared as well as u (docs/algorithms.md §5.5)."""

    variant = "factorized_beta"


class FactorizedClient(ClientUpdate):
    """Trains its personal factorized model; only the shared factors are loaded and sent."""

    State = FactorizedClientState
    keeps_model = True

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Load the shared factors, train with the L1 term on mu (optimizer kept), upload."""
        load_arrays(ctx.model, task.arrays, strict=False)
        lam = float(task.body.get("lambda", 0.0))
        detach = bool(task.body.get("l1_detached", False))
        terms = [lambda: lam * l1_penalty(ctx.model, detach=detach)] if lam > 0 else []
        clip = float(task.body.get("clip", 0.0))
        hooks_ = [clip_norm(clip)] if clip > 0 else []
        body = local_sgd(ctx, task, hooks_, load=False, loss_terms=terms, keep_optimizer=True)
        state = state_arrays(ctx.model)
        return {n: state[n] for n in task.body["upload"]}, body
