"""FedAvg. McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017. Spec: ALGORITHMS.md section 3.1."""
from __future__ import annotations

from typing import Any

from fednet.algorithms.aggregate import weighted_mean
from fednet.algorithms.base import Algorithm, ClientContext, finite
from fednet.models.params import load_arrays, state_arrays
from fednet.training.local import train
from fednet.types import Arrays, Failure, Result, Task


class FedAvg(Algorithm):
    """Clients run E epochs of SGD from the global model; the server averages by sample count."""

    name = "fedavg"

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """theta = sum_k n_k theta_k / sum_k n_k over the usable results (sorted by client)."""
        usable = sorted((r for r in results if finite(r.arrays)), key=lambda r: r.cid)
        dropped = len(results) - len(usable)
        if usable:
            self.global_arrays = weighted_mean([r.arrays for r in usable],
                                               [r.num_examples for r in usable])
        loss = sum(r.body.get("loss", 0.0) * r.num_examples for r in usable)
        n = sum(r.num_examples for r in usable)
        return {"train_loss": loss / n if n else float("nan"), "results": len(usable),
                "failures": len(failures), "non_finite": dropped}

    def local_train(self, ctx: ClientContext, task: Task, **extra: Any) -> dict[str, Any]:
        """Load the task's model and run the configured local SGD; hooks/terms via extra."""
        load_arrays(ctx.model, task.arrays)
        t = ctx.cfg.train
        stats = train(ctx.model, ctx.x, ctx.y, epochs=int(task.body.get("epochs", t.epochs)),
                      batch_size=t.batch_size, lr=float(task.body.get("lr", t.lr)),
                      momentum=t.momentum, weight_decay=t.weight_decay,
                      generator=ctx.batch_generator(task.round), **extra)
        return {"loss": stats.loss, "samples": stats.samples, "steps": stats.steps}

    def client_update(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Plain local SGD; returns the whole model."""
        body = self.local_train(ctx, task)
        return state_arrays(ctx.model), body
