"""FedSeq. Zaccone, Rizzardi, Caldarola, Ciccone, Caputo, "Speeding up Heterogeneous Federated
Learning with Sequentially Trained Superclients", ICPR 2022. Spec: docs/algorithms.md §4.

Clients pre-train a shared random init; the server groups them into superclients of dissimilar
data (approximator + measure + grouping); each round a sample of superclients trains
sequentially: the model travels client to client along a ring route (peer-to-peer), the last
client returns it, and the server averages the superclient models by superclient size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fednet import rng
from fednet.algorithms.aggregate import weighted_mean
from fednet.algorithms.catalog import FedSeqParams
from fednet.algorithms.common import round_metrics, usable
from fednet.algorithms.contract import ClientContext, ClientUpdate, Model, ServerState, StagedStrategy
from fednet.algorithms.feddyn import dyn_update
from fednet.algorithms.grouping import approximators as approx
from fednet.algorithms.layout import Layout
from fednet.algorithms.grouping import superclients as sc
from fednet.algorithms.updates import DynState, local_sgd, rule
from fednet.config import RunConfig
from fednet.errors import ConfigError
from fednet.models.arrays import load_arrays, state_arrays
from fednet.types import Arrays, ClientInfo, Failure, Result, Task


@dataclass
class FedSeqState(ServerState):
    """The model, the superclients (from the setup stage), the clients' sample counts, the
    grouping statistics, and FedDyn's h when it runs inside the chains."""

    superclients: list[list[int]] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    h: Model = field(default_factory=dict)


class FedSeq(StagedStrategy):
    """Superclients trained sequentially over peer-to-peer rings; weighted by superclient size."""

    State = FedSeqState
    wants_pretrain_init = True

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, params)
        self.task_sc: dict[int, int] = {}  # task id -> superclient, within a round

    def init_state(self, init: Arrays) -> FedSeqState:
        """The model; with FedDyn in the chains, h = 0 for the trainable parameters."""
        h = {k: np.zeros_like(v, dtype=np.float64) for k, v in init.items()
             if k in self.trainable} if self.p.local == "feddyn" else {}
        return FedSeqState(model=dict(init), h=h)

    # ---- grouping stage (round -1) ---------------------------------------------------------
    def setup_tasks(self, clients: Sequence[ClientInfo]) -> list[Task]:
        """One pre-training task per client: the shared random init (+ exemplars once)."""
        self.state.sizes = {c.cid: c.num_examples for c in clients}
        if self.info.pretrain_init is None:
            raise ConfigError("fedseq needs a pre-training init from the runtime")
        arrays = dict(self.info.pretrain_init)
        if self.p.approximator == "confidence":
            if self.info.exemplars is None:
                raise ConfigError("fedseq with the confidence approximator needs an exemplar set "
                                  "(--exemplars J, J >= 1)")
            arrays["ex:x"], arrays["ex:y"] = self.info.exemplars
        body = {"epochs": self.p.pretrain_epochs, "lr": self.cfg.train.lr,
                "approximator": self.p.approximator, "classes": self.info.num_classes}
        out = []
        for c in sorted(clients, key=lambda c: c.cid):
            t = self.new_task(-1, [c.cid], arrays, body)
            t.kind = "pretrain"
            out.append(t)
        return out

    def result_layout(self, task: Task) -> Layout:
        """Pre-training: the client's representation, float64, of the approximator's size."""
        if task.kind != "pretrain":
            return self.layout
        size = approx.vector_size(self.p.approximator, self.info.num_classes, self.info.linears)
        return {"rep": ((size,), np.dtype(np.float64))}

    def setup_results(self, results: list[Result], failures: list[Failure]) -> dict[str, Any]:
        """Representations -> (PCA) -> superclients; returns the quality statistics."""
        ok = sorted(results, key=lambda r: r.cid)
        if not ok:
            raise ConfigError("fedseq: no client finished pre-training; see the client log")
        p, st = self.p, self.state
        ids = [r.cid for r in ok]
        reps = np.stack([r.arrays["rep"].astype(np.float64) for r in ok])
        if p.approximator.startswith("clf"):
            reps = approx.pca_reduce(reps, p.pca_variance, self.cfg.seed)
        sizes = np.array([st.sizes.get(c, r.num_examples) for c, r in zip(ids, ok)])
        # default |D_S|min: room for about N_C clients, so a superclient can cover every class;
        # at most every pre-trained client's data (few clients, or many offline at the start)
        min_samples = p.min_samples or min(int(0.9 * sizes.mean() * self.info.num_classes),
                                           int(sizes.sum()))
        groups = sc.group(p.grouping, reps, sizes, p.measure, min_samples, p.max_clients,
                          self.cfg.seed, self.info.num_classes, p.zero_floor)
        st.superclients = [sorted(ids[i] for i in g) for g in groups]
        stats: dict[str, Any] = {"superclients": len(st.superclients), "min_samples": min_samples,
                                 "failed_pretraining": [f.cid for f in failures]}
        if self.info.label_hist is not None:
            hist = np.stack([self.info.label_hist[c] for c in ids])
            stats.update(sc.superclient_stats(groups, hist))
        stats["groups"] = st.superclients
        st.stats = stats
        return stats

    # ---- rounds ------------------------------------------------------------------------------
    def sc_size(self, s: int) -> int:
        """|D_S|: samples of all members of superclient s."""
        return sum(self.state.sizes.get(c, 0) for c in self.state.superclients[s])

    def sample(self, rnd: int, alive: set[int]) -> list[int]:
        """max(floor(C * N_S), 1) superclients with a live member, seeded by round."""
        groups = self.state.superclients
        cand = [i for i, g in enumerate(groups) if any(c in alive for c in g)]
        m = self.picks(max(int(self.p.superclient_fraction * len(groups)), 1), len(cand))
        if m >= len(cand):
            return cand
        pick = rng.generator(self.cfg.seed, "superclients", rnd).choice(len(cand), m, replace=False)
        return [cand[i] for i in sorted(pick)]

    def route(self, rnd: int, s: int, alive: set[int]) -> list[int]:
        """E_S passes over the live members, each pass in a fresh seeded order."""
        members = [c for c in self.state.superclients[s] if c in alive]
        out: list[int] = []
        for p in range(self.p.passes):
            order = rng.generator(self.cfg.seed, "chain", rnd, s * 1000 + p).permutation(len(members))
            out += [members[i] for i in order]
        return out

    def chain_task(self, rnd: int, s: int, arrays: Arrays, alive: set[int],
                   task_id: int | None = None) -> Task:
        """The task that sends `arrays` around superclient s."""
        body = {"epochs": self.cfg.train.epochs, "lr": self.cfg.train.lr}
        t = self.new_task(rnd, self.route(rnd, s, alive), arrays, body, task_id)
        self.task_sc[t.task_id] = s
        return t

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """One chain task per sampled superclient, all from the global model."""
        alive = {c.cid for c in clients}
        return [self.chain_task(rnd, s, self.state.model, alive) for s in self.sample(rnd, alive)]

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Weighted by superclient size (or FedDyn's server rule when local=feddyn)."""
        ok, dropped = usable(results)
        ok.sort(key=lambda r: self.task_sc[r.task_id])
        if ok:
            self.state.model = self.combine([r.arrays for r in ok],
                                            [self.sc_size(self.task_sc[r.task_id]) for r in ok])
        return round_metrics(ok, failures, dropped)

    def combine(self, models: list[Arrays], weights: list[float]) -> Arrays:
        """Weighted mean; with FedDyn inside the chain, the FedDyn server update (K = clients)."""
        if self.p.local != "feddyn":
            return weighted_mean(models, weights)
        mean = weighted_mean(models, [1.0] * len(models))
        g = self.state.model
        drift = {k: sum(m[k].astype(np.float64) - g[k] for m in models) for k in self.state.h}
        return dyn_update(self.state.h, self.p.alpha, self.cfg.clients, drift, mean)


class FedSeqClient(ClientUpdate):
    """Pre-training (a representation for the grouping), then hops of the chains (local rule)."""

    State = DynState  # FedDyn's g_k, used when --local feddyn

    def __init__(self, cfg: RunConfig, params: FedSeqParams) -> None:
        super().__init__(cfg, params)
        self.local = rule(params.local, params)

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Pre-training (representation only) or one hop of a chain (local rule)."""
        if task.kind == "pretrain":
            return self._pretrain(ctx, task)
        body = self.local.run(ctx, task)
        return state_arrays(ctx.model), body

    def _pretrain(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        model = {k: v for k, v in task.arrays.items() if not k.startswith("ex:")}
        load_arrays(ctx.model, model)
        stats = local_sgd(ctx, Task(task.task_id, -1, task.route, model, task.body), load=False)
        kind = str(task.body["approximator"])
        if kind == "confidence":
            ex_x = torch.from_numpy(np.array(task.arrays["ex:x"])).to(ctx.device)
            ex_y = torch.from_numpy(np.array(task.arrays["ex:y"])).to(ctx.device)
            rep = approx.confidence_vector(ctx.model, ex_x, ex_y, int(task.body["classes"]))
        else:
            rep = approx.classifier_vector(ctx.model, kind.removeprefix("clf_"))
        return {"rep": np.asarray(rep, dtype=np.float64)}, stats
