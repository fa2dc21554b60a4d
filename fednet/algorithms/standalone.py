"""Stand-Alone: every client trains only its own model on its own data (no model ever travels).
The lower bound of personalized FL (ALGORITHMS.md 3.5). Clients start from the shared seeded
initialisation that they build locally, and report their test accuracy each round."""
from __future__ import annotations

from typing import Any

from fednet.algorithms.base import Algorithm, ClientContext
from fednet.algorithms.local import local_sgd
from fednet.config import RunConfig
from fednet.training.local import evaluate
from fednet.types import Arrays, ClientInfo, Failure, Result, Task


def client_accuracy(results: list[Result]) -> tuple[float, float, dict[str, float]]:
    """Mean and spread of the accuracies the clients reported (personalized evaluation)."""
    accs = [float(r.body["accuracy"]) for r in results if "accuracy" in r.body]
    losses = [float(r.body.get("test_loss", 0.0)) for r in results if "accuracy" in r.body]
    if not accs:
        return float("nan"), float("nan"), {}
    mean = sum(accs) / len(accs)
    std = (sum((a - mean) ** 2 for a in accs) / len(accs)) ** 0.5
    return mean, sum(losses) / len(losses), {"acc_std": std, "acc_min": min(accs), "acc_max": max(accs)}


def evaluate_own(ctx: ClientContext) -> dict[str, float]:
    """This client's model on its test set."""
    assert ctx.test_x is not None and ctx.test_y is not None
    acc, loss = evaluate(ctx.model, ctx.test_x, ctx.test_y)
    return {"accuracy": acc, "test_loss": loss}


class StandAlone(Algorithm):
    """Tasks carry no arrays; each client trains its persistent model and reports its accuracy."""

    name = "standalone"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.personalized = True
        self.last: tuple[float, float, dict[str, float]] = (float("nan"), float("nan"), {})

    def configure_round(self, rnd: int, clients: list[ClientInfo]) -> list[Task]:
        """Every client, every round (fraction still applies); no model in the task."""
        return [self.new_task(rnd, [c.cid], {}, self.task_body(rnd, c))
                for c in self.select(rnd, clients)]

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Nothing to aggregate: collect the reported accuracies."""
        self.last = client_accuracy(results)
        n = sum(r.num_examples for r in results)
        loss = sum(float(r.body.get("loss", 0.0)) * r.num_examples for r in results)
        return {"train_loss": loss / n if n else float("nan"), "results": len(results),
                "failures": len(failures), **self.last[2]}

    def client_accuracy(self) -> tuple[float, float]:
        """(mean client accuracy, mean client test loss) of the last round."""
        return self.last[0], self.last[1]

    def client_update(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Continue training the model this process holds, then evaluate it."""
        body = local_sgd(ctx, task, load=False)
        body.update(evaluate_own(ctx))
        return {}, body
