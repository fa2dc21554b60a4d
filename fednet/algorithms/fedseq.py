"""FedSeq. Zaccone, Rizzardi, Caldarola, Ciccone, Caputo, "Speeding up Heterogeneous Federated
Learning with Sequentially Trained Superclients", ICPR 2022. Spec: docs/algorithms.md §4.

Clients pre-train a shared random init; the server groups them into superclients of dissimilar
data (approximator + measure + grouping); each round a sample of superclients trains
sequentially: the model travels client to client along a ring route (peer-to-peer), the last
client returns it, and the server averages the superclient models by superclient size.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fednet import rng
from fednet.algorithms.aggregate import weighted_mean
from fednet.algorithms.base import Algorithm, ClientContext
from fednet.algorithms.fedavg import round_metrics, usable
from fednet.algorithms.grouping import approximators as approx
from fednet.algorithms.grouping import superclients as sc
from fednet.algorithms.local import local_sgd, rule_from_params
from fednet.config import RunConfig
from fednet.errors import ConfigError
from fednet.models.params import load_arrays, state_arrays
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

DEFAULTS: dict[str, Any] = {
    "approximator": "confidence", "measure": "kl", "grouping": "greedy", "pretrain_epochs": 40,
    "min_samples": 0, "max_clients": 11, "passes": 1, "superclient_fraction": 0.2, "local": "sgd",
    "zero_floor": False, "pca_variance": 0.9,
}


class FedSeq(Algorithm):
    """Superclients trained sequentially over peer-to-peer rings; weighted by superclient size."""

    name = "fedseq"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        p = self.checked_params(DEFAULTS, ("mu", "alpha", "clip", "official", "period"))
        self.p = p
        approx.check_combination(str(p["approximator"]), str(p["measure"]))
        self.local = rule_from_params(str(p["local"]), self.params)
        self.superclients: list[list[int]] = []
        self.sizes: dict[int, int] = {}
        self.task_sc: dict[int, int] = {}
        self.stats: dict[str, Any] = {}
        self.h: dict[str, np.ndarray] = {}

    # ---- grouping stage (round -1) ---------------------------------------------------------
    def setup_tasks(self, clients: list[ClientInfo]) -> list[Task]:
        """One pre-training task per client: the shared random init (+ exemplars once)."""
        self.sizes = {c.cid: c.num_examples for c in clients}
        if self.info.pretrain_init is None:
            raise ConfigError("fedseq needs a pre-training init from the runtime")
        arrays = dict(self.info.pretrain_init)
        if self.p["approximator"] == "confidence":
            if self.info.exemplars is None:
                raise ConfigError("fedseq with the confidence approximator needs an exemplar set "
                                  "(--exemplars J, J >= 1)")
            arrays["ex:x"], arrays["ex:y"] = self.info.exemplars
        body = {"epochs": int(self.p["pretrain_epochs"]), "lr": self.cfg.train.lr,
                "approximator": str(self.p["approximator"]), "classes": self.info.num_classes}
        out = []
        for c in sorted(clients, key=lambda c: c.cid):
            t = self.new_task(-1, [c.cid], arrays, body)
            t.kind = "pretrain"
            out.append(t)
        return out

    def setup_results(self, results: list[Result], failures: list[Failure]) -> dict[str, Any]:
        """Representations -> (PCA) -> superclients; returns the quality statistics."""
        ok = sorted(results, key=lambda r: r.cid)
        if not ok:
            raise ConfigError("fedseq: no client finished pre-training; see the client log")
        ids = [r.cid for r in ok]
        reps = np.stack([r.arrays["rep"].astype(np.float64) for r in ok])
        if str(self.p["approximator"]).startswith("clf"):
            reps = approx.pca_reduce(reps, float(self.p["pca_variance"]), self.cfg.seed)
        sizes = np.array([self.sizes.get(c, r.num_examples) for c, r in zip(ids, ok)])
        # default |D_S|min: room for about N_C clients, so a superclient can cover every class
        min_samples = int(self.p["min_samples"]) or int(0.9 * sizes.mean() * self.info.num_classes)
        groups = sc.group(str(self.p["grouping"]), reps, sizes, str(self.p["measure"]), min_samples,
                          int(self.p["max_clients"]), self.cfg.seed, self.info.num_classes,
                          bool(self.p["zero_floor"]))
        self.superclients = [sorted(ids[i] for i in g) for g in groups]
        stats: dict[str, Any] = {"superclients": len(self.superclients), "min_samples": min_samples,
                                 "failed_pretraining": [f.cid for f in failures]}
        if self.info.label_hist is not None:
            hist = np.stack([self.info.label_hist[c] for c in ids])
            stats.update(sc.superclient_stats(groups, hist))
        stats["groups"] = self.superclients
        self.stats = stats
        return stats

    def state_arrays(self) -> Arrays:
        """FedDyn's h when it runs inside the chains."""
        return {f"h/{k}": v for k, v in self.h.items()}

    def checkpoint(self) -> tuple[Arrays, dict[str, Any]]:
        """The model, h, and the superclients (grouping is not repeated on resume)."""
        arrays, meta = super().checkpoint()
        meta.update({"superclients": self.superclients, "sizes": {str(k): v for k, v in self.sizes.items()},
                     "stats": {k: v for k, v in self.stats.items() if k != "groups"}})
        return arrays, meta

    def restore_state(self, state: Arrays, meta: dict[str, Any]) -> None:
        """Superclients, sizes and h back from a checkpoint."""
        self.superclients = [list(map(int, g)) for g in meta.get("superclients", [])]
        self.sizes = {int(k): int(v) for k, v in meta.get("sizes", {}).items()}
        self.stats = dict(meta.get("stats", {}), groups=self.superclients)
        self.h = {k[2:]: v.astype(np.float64) for k, v in state.items() if k.startswith("h/")}

    # ---- rounds ------------------------------------------------------------------------------
    def sc_size(self, s: int) -> int:
        """|D_S|: samples of all members of superclient s."""
        return sum(self.sizes.get(c, 0) for c in self.superclients[s])

    def sample(self, rnd: int, alive: set[int]) -> list[int]:
        """max(floor(C * N_S), 1) superclients with a live member, seeded by round."""
        cand = [i for i, g in enumerate(self.superclients) if any(c in alive for c in g)]
        m = max(int(float(self.p["superclient_fraction"]) * len(self.superclients)), 1)
        if m >= len(cand):
            return cand
        pick = rng.generator(self.cfg.seed, "superclients", rnd).choice(len(cand), m, replace=False)
        return [cand[i] for i in sorted(pick)]

    def route(self, rnd: int, s: int, alive: set[int]) -> list[int]:
        """E_S passes over the live members, each pass in a fresh seeded order."""
        members = [c for c in self.superclients[s] if c in alive]
        out: list[int] = []
        for p in range(int(self.p["passes"])):
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

    def configure_round(self, rnd: int, clients: list[ClientInfo]) -> list[Task]:
        """One chain task per sampled superclient, all from the global model."""
        alive = {c.cid for c in clients}
        return [self.chain_task(rnd, s, self.global_arrays, alive) for s in self.sample(rnd, alive)]

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Weighted by superclient size (or FedDyn's server rule when local=feddyn)."""
        ok, dropped = usable(results)
        ok.sort(key=lambda r: self.task_sc[r.task_id])
        if ok:
            self.global_arrays = self.combine([r.arrays for r in ok],
                                              [self.sc_size(self.task_sc[r.task_id]) for r in ok])
        return round_metrics(ok, failures, dropped)

    def combine(self, models: list[Arrays], weights: list[float]) -> Arrays:
        """Weighted mean; with FedDyn inside the chain, the FedDyn server update (K = clients)."""
        if self.p["local"] != "feddyn":
            return weighted_mean(models, weights)
        alpha = float(self.params.get("alpha", 0.1))
        mean = weighted_mean(models, [1.0] * len(models))
        for k in self.trainable:
            h = self.h.setdefault(k, np.zeros_like(self.global_arrays[k], dtype=np.float64))
            h -= (alpha / self.cfg.clients) * sum(m[k].astype(np.float64) - self.global_arrays[k]
                                                  for m in models)
        return {k: (mean[k] - self.h[k] / alpha).astype(mean[k].dtype) if k in self.h else mean[k]
                for k in mean}

    # ---- client side -------------------------------------------------------------------------
    def client_update(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
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
