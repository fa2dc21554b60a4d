"""FedDyn. Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021.
Spec: docs/algorithms.md §3.4 (paper-correct rule by default; the FedSeq repository's variant with
--param official=true) and §7.9 (parameter explosion: clip with --param clip=30)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fednet.algorithms.common import round_metrics
from fednet.algorithms.catalog import DynParams
from fednet.algorithms.contract import Model, ServerState
from fednet.algorithms.fedavg import FedAvg, FedAvgClient
from fednet.algorithms.updates import Dyn, DynState
from fednet.config import RunConfig
from fednet.types import Arrays, Failure, Result


@dataclass
class FedDynState(ServerState):
    """The global model and h (float64, one entry per trainable parameter)."""

    h: Model = field(default_factory=dict)


def dyn_update(h: Arrays, alpha: float, K: int, drift: Arrays, mean: Arrays) -> Arrays:
    """h <- h - (alpha/K) drift (in place); the model mean - h/alpha on h's entries."""
    for k, hk in h.items():
        hk -= (alpha / K) * drift[k]
    return {k: (mean[k] - h[k] / alpha).astype(mean[k].dtype) if k in h else mean[k] for k in mean}


class FedDyn(FedAvg):
    """Server: h <- h - (alpha/K) sum_P (theta_k - theta_t); theta = mean_P theta_k - h/alpha."""

    State = FedDynState

    def init_state(self, init: Arrays) -> FedDynState:
        """Global model plus the server state h = 0 (trainable parameters only)."""
        return FedDynState(model=dict(init), h={k: np.zeros_like(v, dtype=np.float64)
                                                for k, v in init.items() if k in self.trainable})

    def fold(self, r: Result) -> None:
        """Uniform weights: every participant counts once; its drift theta_k - theta is summed
        apart (exactly, as the per-client differences, not as a difference of sums)."""
        model = self.state.model
        drift = {k: r.arrays[k].astype(np.float64) - model[k] for k in self.state.h
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
        h = self.state.h
        self.state.model = dyn_update(h, self.p.alpha, self.cfg.clients, sums["drift"].sums(),
                                      sums["model"].result())
        m = round_metrics(ok, failures, dropped)
        m["h_norm"] = float(np.sqrt(sum(float((x * x).sum()) for x in h.values())))
        return m


class FedDynClient(FedAvgClient):
    """SGD with FedDyn's linear and quadratic terms; g_k is this client's state."""

    State = DynState

    def __init__(self, cfg: RunConfig, params: DynParams) -> None:
        super().__init__(cfg, params)
        self.local = Dyn(params.alpha, params.clip, params.official)
