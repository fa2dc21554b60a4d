"""Stand-Alone: every client trains only its own model on its own data (no model ever travels).
The lower bound of personalized FL (docs/algorithms.md §3.5). Clients start from the shared seeded
initialisation that they build locally, and report their own test accuracy each round. --clip
(off by default) clips the local gradient norm, as Factorized-FL's and pFedPara's clients do: on
their backbones Stand-Alone is a fair lower bound only when it trains the way their clients do."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fednet.algorithms.contract import ClientContext, ClientUpdate, Strategy
from fednet.algorithms.layout import Layout
from fednet.algorithms.updates import local_sgd
from fednet.config import RunConfig
from fednet.training.hooks import clip_norm
from fednet.types import Arrays, ClientInfo, Failure, Result, Task


class StandAlone(Strategy):
    """Tasks carry no arrays; each client trains its persistent model."""

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, params)
        self.eval_clients = True  # there is no global model to evaluate

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """Every selected client; no model in the task."""
        clip = {"clip": self.p.clip} if self.p.clip > 0 else {}
        return [self.new_task(rnd, [c.cid], {}, {**self.task_body(rnd, c), **clip})
                for c in self.select(rnd, clients)]

    def result_layout(self, task: Task) -> Layout:
        """No arrays: the model stays with its client."""
        return {}

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Nothing to aggregate."""
        n = sum(r.num_examples for r in results)
        loss = sum(float(r.body.get("loss", 0.0)) * r.num_examples for r in results)
        return {"train_loss": loss / n if n else float("nan"), "results": len(results),
                "failures": len(failures)}


class StandAloneClient(ClientUpdate):
    """Each client's model is its own and persists between rounds."""

    keeps_model = True

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Continue training the model this client holds (its gradient clipped: body `clip`)."""
        clip = float(task.body.get("clip", 0.0))
        return {}, local_sgd(ctx, task, [clip_norm(clip)] if clip > 0 else [], load=False)
