"""Server optimizers for the FedAvg family: FedAvgM, FedAdam, FedYogi, FedAdagrad.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (Algorithm 2); FedAvgM: Hsu et al.,
"Measuring the Effects of Non-Identical Data Distribution", 2019. Spec: docs/algorithms.md §3.11.
Clients run FedAvg's local update; the server treats Δ_t = (sample-weighted mean of the returned
models) − x_t as a pseudo-gradient and steps with its own optimizer, per trainable entry:

    FedAvgM     m_t = β m_{t−1} + Δ_t                           x_{t+1} = x_t + η m_t
    FedAdagrad  m_t = β1 m_{t−1} + (1 − β1) Δ_t,  v_t = v_{t−1} + Δ_t²
    FedYogi     m_t as above,  v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)
    FedAdam     m_t as above,  v_t = β2 v_{t−1} + (1 − β2) Δ_t²
                                                  x_{t+1} = x_t + η m_t / (√v_t + τ)

with m_{−1} = 0 and v_{−1} = τ² (the paper's v_{−1} ≥ τ²), no bias correction (as the paper).
Buffers (BN statistics, counters) take FedAvg's average. m and v are float64 state fields
(checkpointed by name like the model); the arithmetic is float64, the model keeps its dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednet.algorithms import robust_spec
from fednet.algorithms.contract import Model, ServerState
from fednet.algorithms.fedavg import FedAvg
from fednet.types import Arrays


@dataclass
class FedOptState(ServerState):
    """The global model plus the server optimizer's moments, per trainable entry."""

    m: Model = field(default_factory=dict)  # first moment (FedAvgM: the momentum buffer)
    v: Model = field(default_factory=dict)  # second moment (not FedAvgM)


@dataclass
class CenteredFedOptState(FedOptState):
    """FedOptState under --defense centered_clip: the last aggregate update (flattened)."""

    center: np.ndarray | None = None


def server_step(rule: str, x: np.ndarray, avg: np.ndarray, m: np.ndarray, v: np.ndarray | None,
                p: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One server step of `rule` on float64 arrays: (x_{t+1}, m_t, v_t)."""
    d = avg - x
    if rule == "fedavgm":
        m = p.server_momentum * m + d
        return x + p.server_lr * m, m, None
    assert v is not None
    m = p.beta1 * m + (1.0 - p.beta1) * d
    d2 = d * d
    if rule == "fedadagrad":
        v = v + d2
    elif rule == "fedyogi":
        v = v - (1.0 - p.beta2) * d2 * np.sign(v - d2)
    elif rule == "fedadam":
        v = p.beta2 * v + (1.0 - p.beta2) * d2
    else:
        raise ValueError(f"unknown server rule {rule!r}")
    return x + p.server_lr * m / (np.sqrt(v) + p.tau), m, v


class FedOpt(FedAvg):
    """FedAvg's streamed average, then a server optimizer step: `rule` of the subclass (FedAvgM,
    FedAdam, FedYogi, FedAdagrad), whatever name the algorithm is registered under."""

    State = FedOptState
    rule = ""

    def init_state(self, init: Arrays) -> FedOptState:
        """m = 0 and v = τ² for every trainable floating entry."""
        rule = self.rule
        if not rule:
            raise TypeError("FedOpt has no server rule of its own: register FedAvgM, FedAdam, "
                            "FedYogi or FedAdagrad (fednet.algorithms.fedopt)")
        names = sorted(n for n in self.trainable if init[n].dtype.kind == "f")
        m = {n: np.zeros(init[n].shape, np.float64) for n in names}
        v = {} if rule == "fedavgm" else {n: np.full(init[n].shape, self.p.tau ** 2, np.float64)
                                          for n in names}
        centered = bool(self.defense) and robust_spec.defense_spec(self.defense).keeps_center
        cls = CenteredFedOptState if centered else FedOptState
        return cls(model=dict(init), m=m, v=v)

    def step(self, mean: Any, metrics: dict[str, Any]) -> None:
        """Δ_t from the exact weighted mean (float64), then the rule's step on each entry."""
        # (mean: a PrivateMean under --dp central, the noised mean)
        new = mean.result()  # buffers (and the dtypes) as FedAvg
        avg64 = mean.mean64()  # the exact weighted mean, or the defense's new model (float64)
        st, rule = self.state, self.rule
        norm = 0.0
        for n in st.m:
            x = st.model[n].astype(np.float64)
            avg = avg64[n]
            x1, st.m[n], v = server_step(rule, x, avg, st.m[n], st.v.get(n), self.p)
            if v is not None:
                st.v[n] = v
            norm += float(np.sum((avg - x) ** 2))
            new[n] = x1.astype(st.model[n].dtype)
        st.model = new
        metrics["delta_norm"] = math.sqrt(norm)

    def resume_problem(self, st: FedOptState, rounds_done: int, participants: Any,
                       last_row: dict[str, Any] | None) -> tuple[str, str] | None:
        """Why checkpointed moments cannot go on ('npz', one line), or None: m (and v but for
        FedAvgM) hold every trainable floating entry, and v > 0 everywhere (it starts at τ² and
        every rule keeps it positive: Adam and Adagrad add squares to a positive v, Yogi moves
        v by at most (1 − β2) Δ² toward Δ²); the values are finite (checkpoint.load). The
        pieces' checks (differential privacy's) come first (FedAvg.resume_problem)."""
        why = super().resume_problem(st, rounds_done, participants, last_row)
        if why:
            return why
        names = sorted(n for n in self.trainable if st.model[n].dtype.kind == "f")
        for what, moments in (("m", st.m), ("v", st.v)):
            if what == "v" and self.rule == "fedavgm":
                if moments:
                    return "npz", "arrays 'state/v/...': FedAvgM keeps no second moment"
                continue
            if sorted(moments) != names:
                missing = sorted(set(names) - set(moments))
                return "npz", (f"the server optimizer's {what} must hold every trainable "
                               f"floating entry of the model ('state/{what}/{missing[0]}' is "
                               "missing)" if missing else f"arrays 'state/{what}/...' do not "
                               "match the trainable entries")
        for n in sorted(st.v):
            if not (st.v[n] > 0).all():
                return "npz", (f"array 'state/v/{n}': the second moment must be above 0 "
                               f"everywhere (it starts at tau^2 = {self.p.tau ** 2:g}); got "
                               f"{float(st.v[n].min()):g}")
        return None


class FedAvgM(FedOpt):
    """Server momentum (Hsu et al. 2019)."""

    rule = "fedavgm"


class FedAdam(FedOpt):
    """Adaptive server optimizer, Adam (Reddi et al. 2021)."""

    rule = "fedadam"


class FedYogi(FedOpt):
    """Adaptive server optimizer, Yogi (Reddi et al. 2021)."""

    rule = "fedyogi"


class FedAdagrad(FedOpt):
    """Adaptive server optimizer, Adagrad (Reddi et al. 2021)."""

    rule = "fedadagrad"
