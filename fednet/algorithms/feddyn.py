"""FedDyn. Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021.
Spec: docs/algorithms.md §3.4 (paper-correct rule by default; the FedSeq repository's variant with
--param official=true) and §7.9 (parameter explosion: clip with --param clip=30)."""
from __future__ import annotations

import numpy as np

from fednet.algorithms.fedavg import FedAvg, round_metrics
from fednet.algorithms.local import Dyn
from fednet.config import RunConfig
from fednet.types import Arrays, Failure, Result


class FedDyn(FedAvg):
    """Server: h <- h - (alpha/K) sum_P (theta_k - theta_t); theta = mean_P theta_k - h/alpha."""

    name = "feddyn"
    PARAMS = {"alpha": 0.1, "clip": 0.0, "official": False}

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.alpha = float(self.params.get("alpha", 0.1))
        if self.alpha <= 0:
            from fednet.errors import ConfigError
            raise ConfigError(f"--param alpha must be positive for feddyn (got {self.alpha})")
        self.local = Dyn(self.alpha, float(self.params.get("clip", 0.0)),
                         bool(self.params.get("official", False)))
        self.h: Arrays = {}

    def setup(self, init: Arrays, trainable: set[str] | None = None) -> None:
        """Global model plus the server state h = 0 (trainable parameters only)."""
        super().setup(init, trainable)
        self.h = {k: np.zeros_like(v, dtype=np.float64) for k, v in init.items() if k in self.trainable}

    def fold(self, r: Result) -> None:
        """Uniform weights: every participant counts once; its drift theta_k - theta is summed
        apart (exactly, as the per-client differences, not as a difference of sums)."""
        drift = {k: r.arrays[k].astype(np.float64) - self.global_arrays[k] for k in self.h
                 if k in r.arrays}
        self.sum_of("model").check(r.arrays, 1.0)
        self.sum_of("drift").check(drift, 1.0)
        self.sum_of("model").add(r.arrays, 1.0, key=r.cid)
        self.sum_of("drift").add(drift, 1.0, key=r.cid)

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Uniform mean of the participants plus the h-correction (K = all clients)."""
        ok, dropped, sums = self.take_round(results)
        if not ok:
            return round_metrics(ok, failures, dropped)
        K = self.cfg.clients
        mean, drift = sums["model"].result(), sums["drift"].sums()
        for k, h in self.h.items():
            h -= (self.alpha / K) * drift[k]
        self.global_arrays = {k: (mean[k] - self.h[k] / self.alpha).astype(mean[k].dtype)
                              if k in self.h else mean[k] for k in mean}
        m = round_metrics(ok, failures, dropped)
        m["h_norm"] = float(np.sqrt(sum(float((h * h).sum()) for h in self.h.values())))
        return m

    def state_arrays(self) -> Arrays:
        """h, for checkpoints."""
        return {f"h/{k}": v for k, v in self.h.items()}

    def restore_state(self, state: Arrays, meta: dict) -> None:
        """h back from a checkpoint."""
        self.h = {k[2:]: v.astype(np.float64) for k, v in state.items() if k.startswith("h/")}
