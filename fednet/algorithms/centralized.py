"""The centralized reference (docs/algorithms.md §3.6): one model trained on the pooled training set,
SGD with cosine annealing over the run. It gives Acc_centr for "rounds to X% of centralized".
The pooled data never travels: the one worker (client 0) rebuilds it from the dataset locally."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fednet.algorithms.common import task_lr
from fednet.algorithms.contract import ClientContext, ClientUpdate, Strategy
from fednet.models.arrays import load_arrays, state_arrays
from fednet.training.local import train
from fednet.training.optim import spec_of
from fednet.types import Arrays, ClientInfo, Failure, Result, Task


class Centralized(Strategy):
    """Each round: E epochs over all training data at lr * (1 + cos(pi t / T)) / 2."""

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """One task, to the lowest-id live client."""
        worker = min(clients, key=lambda c: c.cid)
        lr = self.cfg.train.lr * 0.5 * (1 + math.cos(math.pi * rnd / self.cfg.rounds))
        return [self.new_task(rnd, [worker.cid], self.state.model,
                              {"epochs": self.cfg.train.epochs, "lr": lr})]

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """The worker's model becomes the model."""
        if results:
            self.state.model = results[0].arrays
        loss = float(results[0].body.get("loss", float("nan"))) if results else float("nan")
        return {"train_loss": loss, "results": len(results), "failures": len(failures),
                "lr": float(results[0].body.get("lr", 0.0)) if results else 0.0}


class CentralizedClient(ClientUpdate):
    """The one worker: trains on the pooled training set it rebuilds locally."""

    trains_on_pooled = True  # (the server bounds its reply's time by the pooled set's size)

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Train on the pooled training set."""
        load_arrays(ctx.model, task.arrays)
        x, y = ctx.pooled()
        t = ctx.cfg.train
        lr = task_lr(ctx, task)
        stats = train(ctx.model, x, y, epochs=int(task.body["epochs"]), batch_size=t.batch_size,
                      lr=lr, optim=spec_of(t), objective=ctx.objective,
                      generator=ctx.batch_generator(task.round, "centralized"), augment=ctx.augment)
        return state_arrays(ctx.model), {"loss": stats.loss, "samples": stats.samples,
                                         "steps": stats.steps, "lr": lr}
