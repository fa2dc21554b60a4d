"""Clustered-FL. Sattler, Mueller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2020 (arXiv 1910.01991).
Spec: docs/algorithms.md §3.8; reference code: felisat/clustered-federated-learning (notebook).

All clients start in one cluster. Each participant trains E epochs from its cluster's model and
uploads its full update dW_k = W_after - W_before (every floating state entry). For every
cluster c with at least one update: when ||mean dW|| < eps1, max ||dW_k|| > eps2, |c| > 2 and
round >= warmup, c is bipartitioned by complete-linkage agglomerative clustering on the distance
1 - cos(dW_i, dW_j) (the notebook feeds -cos; complete linkage only uses the order, so the split
is the same). Then each (new) cluster's model += the unweighted mean of its members' updates.

Deviations from the reference notebook:
- the split maps the clustering's local indices back to global client ids (the notebook indexes
  its client list with the local ones, a bug once a second split happens);
- norms and cosines are over the trainable parameters (as the notebook's named_parameters);
  buffers travel in dW and are averaged but never decide a split;
- with partial participation only the participants' updates decide a split; members that sat the
  round out join the larger child (ties: the child holding the smaller id);
- the optimizer is the run's (--lr, --momentum, fresh each round); the notebook's per-round lr
  decay is --param lr_decay=0.99 (default 1: none), its momentum 0.9 is --momentum 0.9;
- personalized evaluation tests the model after local training (like every personalized
  algorithm here), not the post-aggregation cluster model.
Rounds are 0-based: warmup=20 (default) first allows a split in the 21st round, as `c_round > 20`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import numpy as np

from fednet.algorithms.common import round_metrics, usable
from fednet.algorithms.contract import ClientContext, ClientUpdate, Model, ServerState, Strategy
from fednet.algorithms.layout import Layout
from fednet.algorithms.updates import local_sgd
from fednet.models.arrays import clone_arrays, load_arrays, state_arrays
from fednet.types import Arrays, ClientInfo, Failure, Result, Task


@dataclass
class CFLState(ServerState):
    """The clusters (client ids), one model per cluster; `model` is the biggest cluster's."""

    clusters: list[list[int]] = field(default_factory=list)
    models: list[Model] = field(default_factory=list)


def _flat(update: Arrays, names: list[str]) -> np.ndarray:
    """The named entries of one update as one float64 vector."""
    return np.concatenate([update[n].ravel().astype(np.float64) for n in names])


def cosine_matrix(vecs: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarities of the rows (the notebook's 1e-12 guard for zero rows)."""
    norms = np.linalg.norm(vecs, axis=1)
    return (vecs @ vecs.T) / (np.outer(norms, norms) + 1e-12)


def bipartition(sim: np.ndarray) -> tuple[list[int], list[int]]:
    """Local indices of the two complete-linkage clusters under distance 1 - sim (index 0 first)."""
    from sklearn.cluster import AgglomerativeClustering

    dist = np.clip(1.0 - sim, 0.0, None)
    np.fill_diagonal(dist, 0.0)
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed",
                                     linkage="complete").fit(dist).labels_
    a = [i for i, lab in enumerate(labels) if lab == labels[0]]
    b = [i for i, lab in enumerate(labels) if lab != labels[0]]
    return a, b


class ClusteredFL(Strategy):
    """Per-cluster models; clusters split recursively when their members' updates disagree."""

    State = CFLState

    def result_layout(self, task: Task) -> Layout:
        """The update dW of every floating entry."""
        return {n: v for n, v in self.layout.items() if v[1].kind == "f"}

    def init_state(self, init: Arrays) -> CFLState:
        """All clients in one cluster, whose model is the initial one."""
        return CFLState(model=dict(init), clusters=[list(range(self.cfg.clients))],
                        models=[clone_arrays(init)])

    def cluster_of(self, cid: int) -> int:
        """Index of the cluster that holds client cid."""
        for i, members in enumerate(self.state.clusters):
            if cid in members:
                return i
        raise KeyError(f"client {cid} is in no cluster")

    def task_body(self, rnd: int, client: ClientInfo) -> dict[str, Any]:
        """The run's instructions, lr decayed by lr_decay per round (1: no decay)."""
        body = super().task_body(rnd, client)
        body["lr"] = float(body["lr"]) * self.p.lr_decay ** rnd
        return body

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """Each selected client gets its cluster's model."""
        return [self.new_task(rnd, [c.cid], self.state.models[self.cluster_of(c.cid)],
                              self.task_body(rnd, c)) for c in self.select(rnd, clients)]

    def _names(self, update: Arrays) -> list[str]:
        """The entries that decide splits: trainable floating ones, in upload order."""
        names = [n for n, a in update.items() if a.dtype.kind == "f" and n in self.trainable]
        return names or [n for n, a in update.items() if a.dtype.kind == "f"]

    def step(self, rnd: int, updates: dict[int, Arrays]) -> dict[str, float]:
        """Split where the criterion holds, then add each cluster's mean update (metrics: max)."""
        new_clusters: list[list[int]] = []
        new_models: list[Arrays] = []
        splits, mean_norms, max_norms = 0, [], []
        for members, model in zip(self.state.clusters, self.state.models):
            ids = [k for k in members if k in updates]
            if not ids:
                new_clusters.append(members)
                new_models.append(model)
                continue
            names = self._names(updates[ids[0]])
            vecs = np.stack([_flat(updates[k], names) for k in ids])
            mean_norm = float(np.linalg.norm(vecs.mean(axis=0)))
            max_norm = float(np.linalg.norm(vecs, axis=1).max())
            mean_norms.append(mean_norm)
            max_norms.append(max_norm)
            parts = [members]
            if (mean_norm < self.p.eps1 and max_norm > self.p.eps2 and len(ids) > 2
                    and rnd >= self.p.warmup):
                a, b = bipartition(cosine_matrix(vecs))
                ga, gb = [ids[i] for i in a], [ids[i] for i in b]  # local -> global ids
                rest = [k for k in members if k not in updates]
                big = ga if (len(ga), -min(ga)) >= (len(gb), -min(gb)) else gb
                big += rest
                parts = sorted((sorted(ga), sorted(gb)), key=min)
                splits += 1
            for part in parts:
                new_clusters.append(part)
                new_models.append(self._apply(model, [updates[k] for k in part if k in updates]))
        self.state.clusters, self.state.models = new_clusters, new_models
        return {"clusters": len(new_clusters), "splits": splits,
                "mean_update_norm": max(mean_norms, default=float("nan")),
                "max_update_norm": max(max_norms, default=float("nan"))}

    @staticmethod
    def _apply(model: Arrays, updates: list[Arrays]) -> Arrays:
        """model + unweighted mean of the updates (integer entries kept); a copy."""
        if not updates:
            return clone_arrays(model)
        out: Arrays = {}
        for n, a in model.items():
            if a.dtype.kind != "f" or n not in updates[0]:
                out[n] = np.array(a, copy=True)
                continue
            acc = np.zeros(a.shape, dtype=np.float64)
            for u in updates:
                acc += u[n]
            out[n] = (a.astype(np.float64) + acc / len(updates)).astype(a.dtype)
        return out

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Split and aggregate per cluster; the biggest cluster's model is the 'global' one."""
        ok, dropped = usable(results)
        metrics = self.step(rnd, {r.cid: r.arrays for r in ok})
        clusters = self.state.clusters
        big = max(range(len(clusters)), key=lambda i: (len(clusters[i]), -i))
        self.state.model = self.state.models[big]
        return {**round_metrics(ok, failures, dropped), **metrics}


class CFLClient(ClientUpdate):
    """Trains from its cluster's model and uploads its update dW."""

    sends_updates = True

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Train from the cluster's model; upload dW = W_after - W_before (floating entries)."""
        load_arrays(ctx.model, task.arrays)
        before = clone_arrays(state_arrays(ctx.model))
        body = local_sgd(ctx, task, load=False)
        after = state_arrays(ctx.model)
        dw = {n: (after[n] - before[n]).astype(before[n].dtype)
              for n in before if before[n].dtype.kind == "f"}
        return dw, body
