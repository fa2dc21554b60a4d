"""pFedPara. Hyeon-Woo, Ye-Bin, Oh, "FedPara: Low-Rank Hadamard Product for Communication-Efficient
Federated Learning", ICLR 2022 (the personalized variant). Spec: docs/algorithms.md §3.7.

Each layer is W = (X1 Y1^T) * (X2 Y2^T + 1): the global factors (and biases, BN affine terms)
travel and are averaged by sample count; the local factors and the head never leave the client.
Local gradients are clipped to norm 5 (--param clip=0: off): the Hadamard product of two
low-rank factors diverged at SGD learning rates >= 0.05 on digits without it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fednet.algorithms.aggregate import weighted_mean
from fednet.algorithms.common import round_metrics, usable
from fednet.algorithms.contract import ClientContext, ClientUpdate, Strategy
from fednet.algorithms.layout import Layout
from fednet.algorithms.updates import local_sgd
from fednet.errors import ConfigError
from fednet.models.arrays import load_arrays, state_arrays
from fednet.training.hooks import clip_norm
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

SHARED_KINDS = {"global", "dense", "norm"}


class PFedPara(Strategy):
    """FedAvg over the global factors only; local factors stay personal."""

    def shared(self) -> list[str]:
        """The state names that travel (selected by kind)."""
        kinds = self.info.kinds
        if "global" not in kinds.values():
            raise ConfigError("--algo pfedpara needs a FedPara model (--model pfedpara_digits or auto)")
        return [n for n, k in kinds.items() if k in SHARED_KINDS]

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """The global factors to every selected client."""
        arrays = {n: self.state.model[n] for n in self.shared()}
        body = {"upload": self.shared(), "clip": self.p.clip}
        return [self.new_task(rnd, [c.cid], arrays, {**self.task_body(rnd, c), **body})
                for c in self.select(rnd, clients)]

    def result_layout(self, task: Task) -> Layout:
        """The entries the task asked for (body `upload`), as the model holds them."""
        return {n: self.layout[n] for n in task.body["upload"]}

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Sample-weighted average of the uploaded global factors."""
        ok, dropped = usable(results)
        if ok:
            avg = weighted_mean([r.arrays for r in ok], [r.num_examples for r in ok])
            self.state.model = {**self.state.model, **avg}
        return round_metrics(ok, failures, dropped)


class PFedParaClient(ClientUpdate):
    """Trains its personal FedPara model; the global factors come and go."""

    keeps_model = True

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Load the global factors over the personal model, train, send the global factors."""
        load_arrays(ctx.model, task.arrays, strict=False)
        clip = float(task.body.get("clip", 0.0))
        body = local_sgd(ctx, task, [clip_norm(clip)] if clip > 0 else [], load=False)
        state = state_arrays(ctx.model)
        return {n: state[n] for n in task.body["upload"]}, body
