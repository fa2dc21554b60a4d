"""The pure algorithm interface: server-side configure/aggregate, client-side local update."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fednet import rng
from fednet.config import RunConfig, eval_mode
from fednet.types import Arrays, ClientInfo, Failure, Result, Task


@dataclass
class ClientContext:
    """Everything a local update may touch inside one client process."""

    cid: int
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    cfg: RunConfig
    device: torch.device
    state: dict[str, Any] = field(default_factory=dict)  # persists across rounds in this client
    test_x: torch.Tensor | None = None  # the test set this client evaluates on (personalized FL)
    test_y: torch.Tensor | None = None
    pooled: Any = None  # callable -> (x, y) of the whole training set (the centralized reference)
    augment: Any = None  # callable (batch, generator) -> batch, the dataset's train augmentation

    @property
    def num_examples(self) -> int:
        """Number of local training examples."""
        return int(len(self.y))

    def batch_generator(self, rnd: int, purpose: str = "batches") -> torch.Generator:
        """The seeded torch generator for this client's minibatch order in round rnd."""
        return torch.Generator().manual_seed(rng.int_seed(self.cfg.seed, purpose, rnd, self.cid))


@dataclass
class ServerInfo:
    """What the runtime tells a server-side algorithm about the run (never sent to clients)."""

    num_classes: int
    label_hist: np.ndarray | None = None       # K x N_C, for reports only (e.g. superclient quality)
    exemplars: tuple[np.ndarray, np.ndarray] | None = None  # public exemplar set (x, y)
    pretrain_init: Arrays | None = None        # a second random init (FedSeq's theta_pre)
    kinds: dict[str, str] = field(default_factory=dict)  # state name -> kind (u, v, mu, head, ...)
    matching: str = ""                          # Factorized-FL: the v used for similarity


class Algorithm:
    """Base class: holds the global model arrays; subclasses override the hooks they change.

    Server side: `setup(init)`, `configure_round`, `aggregate_round`, `eval_arrays`.
    Client side: `client_update`. No method touches sockets, files or clocks.
    """

    name = "base"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.params: dict[str, Any] = dict(cfg.algo.params)
        self.global_arrays: Arrays = {}
        self.trainable: set[str] = set()  # names of trainable parameters (set by the runtime)
        self.eval_clients = eval_mode(cfg) == "clients"  # clients report their own accuracy
        self.info = ServerInfo(num_classes=0)
        self._next_task = 0

    def checked_params(self, defaults: dict[str, Any], also: Sequence[str] = ()) -> dict[str, Any]:
        """defaults updated by --param values; an unknown name is a ConfigError that lists the known."""
        unknown = set(self.params) - set(defaults) - set(also)
        if unknown:
            from fednet.errors import ConfigError
            known = ", ".join(sorted(defaults)) or "none"
            raise ConfigError(f"--param {sorted(unknown)[0]} is not a {self.cfg.algo.name} parameter "
                              f"(it takes: {known}); drop it or choose the algorithm it belongs to")
        return {**defaults, **self.params}

    # ---- server side -------------------------------------------------------------------
    def setup(self, init: Arrays, trainable: set[str] | None = None) -> None:
        """Receive the initial global model and the names of its trainable parameters."""
        self.global_arrays = dict(init)
        self.trainable = set(trainable) if trainable is not None else {
            k for k, v in init.items() if v.dtype.kind == "f"}

    def bind(self, info: ServerInfo) -> None:
        """Receive the run's server-side facts (number of classes, exemplars, ...)."""
        self.info = info

    def setup_tasks(self, clients: Sequence[ClientInfo]) -> list[Task]:
        """Tasks of a stage before round 0 (e.g. FedSeq's pre-training); none by default."""
        return []

    def setup_results(self, results: list[Result], failures: list[Failure]) -> dict[str, Any]:
        """Consume the setup stage's results; returns statistics for the summary."""
        return {}

    def rounds_per_step(self) -> int:
        """Logical rounds that one driver step covers (FedSeqInter: its aggregation period)."""
        return 1

    def follow_up(self, done: Result | Failure) -> list[Task]:
        """Tasks released by one arrival, sent at once (asynchronous pipelines); none by default."""
        return []

    def absorb(self, done: Result | Failure) -> None:
        """Called by the runtime for every reply as it arrives. Streaming algorithms fold the
        result into the round's running sums here and drop its arrays, so the server never holds
        more than one client's model at a time; the rest keep results for aggregate_round."""

    def interim_points(self) -> list[tuple[int, Arrays, float, dict[str, Any]]]:
        """(round, model, simulated time, metrics) to evaluate inside a multi-round step."""
        return []

    def select(self, rnd: int, clients: Sequence[ClientInfo]) -> list[ClientInfo]:
        """max(floor(fraction * K), 1) clients, uniformly without replacement, seeded by round."""
        ordered = sorted(clients, key=lambda c: c.cid)
        m = max(int(self.cfg.algo.fraction * len(ordered)), 1)
        if m >= len(ordered):
            return ordered
        pick = rng.generator(self.cfg.seed, "select", rnd).choice(len(ordered), m, replace=False)
        return [ordered[i] for i in sorted(pick)]

    def task_body(self, rnd: int, client: ClientInfo) -> dict[str, Any]:
        """Scalar instructions sent with each task (local epochs, lr, ...)."""
        t = self.cfg.train
        body: dict[str, Any] = {"epochs": t.epochs, "lr": t.lr}
        if self.eval_clients:
            body["evaluate"] = True
        return body

    def new_task(self, rnd: int, route: list[int], arrays: Arrays, body: dict[str, Any],
                 task_id: int | None = None) -> Task:
        """A task with a fresh id (or `task_id`, reserved with reserve_ids)."""
        if task_id is None:
            self._next_task += 1
            task_id = self._next_task
        return Task(task_id=task_id, round=rnd, route=route, arrays=arrays, body=body)

    def reserve_ids(self, n: int) -> int:
        """Reserve n task ids; returns the first. Tasks created in arrival order get ids fixed in
        advance this way, so message sizes (msgpack ints) do not depend on timing."""
        first = self._next_task + 1
        self._next_task += n
        return first

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """One task per selected client carrying the global model."""
        return [self.new_task(rnd, [c.cid], self.global_arrays, self.task_body(rnd, c))
                for c in self.select(rnd, clients)]

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Fold the round's results into the global model; return metrics to log."""
        raise NotImplementedError

    def eval_arrays(self) -> Arrays:
        """The model the server evaluates after each round."""
        return self.global_arrays

    def state_arrays(self) -> Arrays:
        """Server-side algorithm state beyond the model (for checkpoints)."""
        return {}

    resumable = True  # False where the server holds per-client state that is not checkpointed

    def checkpoint(self) -> tuple[Arrays, dict[str, Any]]:
        """(arrays, JSON state) that restore() turns back into this server-side state."""
        arrays = {f"model/{k}": v for k, v in self.global_arrays.items()}
        arrays.update({f"state/{k}": v for k, v in self.state_arrays().items()})
        return arrays, {"next_task": self._next_task}

    def restore(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        """Inverse of checkpoint()."""
        self.global_arrays = {k[6:]: v for k, v in arrays.items() if k.startswith("model/")}
        self.restore_state({k[6:]: v for k, v in arrays.items() if k.startswith("state/")}, meta)
        self._next_task = int(meta.get("next_task", 0))

    def restore_state(self, state: Arrays, meta: dict[str, Any]) -> None:
        """Algorithm-specific part of restore() (state_arrays() came back as `state`)."""

    # ---- client side -------------------------------------------------------------------
    def client_update(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Run the local update for `task`; return (arrays to send, scalar body)."""
        raise NotImplementedError


def evaluate_own(ctx: ClientContext) -> dict[str, float]:
    """This client's current model on its own test split."""
    from fednet.training.local import evaluate

    assert ctx.test_x is not None and ctx.test_y is not None
    acc, loss = evaluate(ctx.model, ctx.test_x, ctx.test_y)
    return {"accuracy": acc, "test_loss": loss}


def client_accuracy(results: Sequence[Result]) -> tuple[float, float, dict[str, float]]:
    """Mean (and spread) of the accuracies that clients reported for their own models."""
    accs = [float(r.body["accuracy"]) for r in results if "accuracy" in r.body]
    losses = [float(r.body.get("test_loss", 0.0)) for r in results if "accuracy" in r.body]
    if not accs:
        return float("nan"), float("nan"), {}
    mean = sum(accs) / len(accs)
    std = (sum((a - mean) ** 2 for a in accs) / len(accs)) ** 0.5
    return mean, sum(losses) / len(losses), {"acc_std": std, "acc_min": min(accs),
                                             "acc_max": max(accs)}


def finite(arrays: Arrays) -> bool:
    """True when every floating array is free of NaN and inf."""
    return all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")
