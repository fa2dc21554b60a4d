"""FedNova. Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020.

Client k runs its local optimizer for tau_k steps and reports a_k, the norm of its step weights
(tau_k for plain SGD; with momentum rho: (tau_k - rho (1 - rho^tau_k) / (1 - rho)) / (1 - rho)).
The server averages the normalized updates, d = sum_k p_k (x - x_k) / a_k with p_k = n_k / n,
and moves by tau_eff = sum_k p_k a_k along it: x <- x - tau_eff d (with global momentum gmf:
buf <- gmf buf + tau_eff d; x <- x - buf). Clients that take more steps no longer pull the model
further: FedAvg's objective inconsistency is removed.
"""
from dataclasses import dataclass, field

import numpy as np

from fednet.api import (ClientUpdate, Model, ServerState, Strategy, local_sgd, round_metrics,
                        state_arrays, usable)


@dataclass
class FedNovaState(ServerState):
    """The model and the global momentum buffer (checkpointed by fednet like the model)."""

    buf: Model = field(default_factory=dict)


class FedNova(Strategy):
    """Server half: normalized averaging."""

    State = FedNovaState

    def aggregate_round(self, rnd, results, failures):
        ok, dropped = usable(results)  # finite results, sorted by client id: any arrival order
        if ok:
            n = sum(r.num_examples for r in ok)
            p = [r.num_examples / n for r in ok]
            tau_eff = sum(pk * r.body["a"] for pk, r in zip(p, ok))
            x, new = self.state.model, {}
            for name, v in x.items():
                if name not in self.trainable:  # buffers (BN statistics): plain average
                    new[name] = sum(pk * r.arrays[name] for pk, r in zip(p, ok)).astype(v.dtype) \
                        if v.dtype.kind == "f" else ok[0].arrays[name]
                    continue
                d = sum(pk * (v.astype(np.float64) - r.arrays[name]) / r.body["a"]
                        for pk, r in zip(p, ok))
                step = tau_eff * d
                if self.p.gmf:
                    step = self.p.gmf * self.state.buf.get(name, 0.0) + step
                    self.state.buf[name] = step
                new[name] = (v - step).astype(v.dtype)
            self.state.model = new
        return round_metrics(ok, failures, dropped)


class FedNovaClient(ClientUpdate):
    """Client half: the run's local optimizer from the received model; reports a_k."""

    def run(self, ctx, task):
        body = local_sgd(ctx, task)  # loads task.arrays, trains with --optimizer and the loss
        rho, tau = ctx.cfg.train.momentum, body["steps"]
        body["a"] = float(tau if rho == 0 else (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho))
        return state_arrays(ctx.model), body
