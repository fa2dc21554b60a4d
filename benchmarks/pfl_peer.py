"""The same FedAvg job as plain_loop.py through pfl-research (Apple's simulator, `pip install
pfl`), an optional peer of bench_population.py: fednet's dataset, partition, client data and
model definitions, pfl's FederatedAveraging on its SimulatedBackend (one process), a central
SGD step of 1.0 (plain FedAvg), local SGD with fednet's training defaults. The cohort is drawn
by pfl's random user sampler over the population's ids. Prints one JSON line as plain_loop.py
does: seconds (after imports and data), the final accuracy on the run's test set, and each
round's seconds.

    python3 benchmarks/pfl_peer.py --clients 1000000 --fraction 0.001 --rounds 4 \\
        --dataset synthetic-fedprox
"""
from __future__ import annotations

import json
import math
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.hyperparam import NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402

from fednet.data.client_data import client_data  # noqa: E402
from fednet.models import build_model  # noqa: E402
from benchlib.plain import job_args, job_data  # noqa: E402


class Scored(torch.nn.Module):
    """fednet's model with the loss and metrics pfl's PyTorchModel asks of a module."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> dict:
        self.eval() if eval else self.train()
        with torch.no_grad():
            out = self(x)
        n = len(y)
        return {"loss": Weighted(float(F.cross_entropy(out, y, reduction="sum")), n),
                "accuracy": Weighted(float((out.argmax(1) == y).sum()), n)}


class Rounds(TrainingProcessCallback):
    """Each central iteration's end, and the test accuracy after the last one."""

    def __init__(self, tx: torch.Tensor, ty: torch.Tensor, start: float) -> None:
        self.tx, self.ty, self.start, self.ends, self.acc = tx, ty, start, [], 0.0

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        net = model._model  # (pfl's PyTorchModel keeps the module here)
        net.eval()
        with torch.no_grad():
            self.acc = float((net(self.tx).argmax(1) == self.ty).float().mean())
        self.ends.append(time.perf_counter() - self.start)
        return False, Metrics()


def main() -> None:
    a = job_args()
    torch.set_num_threads(1)
    np.random.seed(a.seed)  # pfl's random user sampler draws from numpy's global stream
    cfg, ds, parts, tx, ty = job_data(a)
    t = cfg.train
    torch.manual_seed(a.seed)
    net = Scored(build_model(a.model, ds.num_classes, ds.input_shape, dataset=a.dataset,
                             seed=a.seed))

    def user(uid: int) -> Dataset:
        cd = client_data(ds, cfg.data, a.clients, a.seed, int(uid), parts[uid])
        return Dataset((torch.from_numpy(cd.x), torch.from_numpy(np.ascontiguousarray(cd.y))),
                       user_id=str(uid), eval_kwargs={"eval": True})

    ids = np.arange(a.clients)
    fed = FederatedDataset(user, lambda: int(ids[np.random.randint(0, len(ids))]))
    model = PyTorchModel(
        net, local_optimizer_create=lambda params, lr: torch.optim.SGD(
            params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay),
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    per_round = max(1, math.ceil(a.fraction * a.clients))
    params = NNAlgorithmParams(central_num_iterations=a.rounds, evaluation_frequency=a.rounds + 1,
                               train_cohort_size=per_round, val_cohort_size=0)
    train = NNTrainHyperParams(local_num_epochs=t.epochs, local_learning_rate=t.lr,
                               local_batch_size=t.batch_size)
    t_start = time.perf_counter()
    rounds = Rounds(tx, ty, t_start)
    FederatedAveraging().run(algorithm_params=params, backend=SimulatedBackend(fed, None),
                             model=model, model_train_params=train, callbacks=[rounds])
    done = time.perf_counter()
    print(json.dumps({"loop_s": done - t_start, "process_s": done - T0, "accuracy": rounds.acc,
                      "clients_per_round": per_round,
                      "round_s": [b - a_ for a_, b in zip([0.0] + rounds.ends, rounds.ends)]}))


if __name__ == "__main__":
    main()
