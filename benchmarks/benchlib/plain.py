"""The plain PyTorch FedAvg round that the benchmarks time fednet against (plain_loop.py on CPU,
gpu_children.py on a device): each client trains a copy of the global model with SGD, and the
new global model is the sample-weighted mean, summed in float64."""
from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F


def fedavg_round(model: torch.nn.Module, global_state: dict[str, torch.Tensor],
                 clients: Iterable[tuple[torch.Tensor, torch.Tensor]], t: Any,
                 gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One round over `clients` ((x, y) each, on the model's device) with the training settings
    `t` (lr, momentum, weight_decay, epochs, batch_size); returns the new global state and
    leaves it loaded in `model`."""
    sums = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
    total = 0
    for x, y in clients:
        model.load_state_dict(global_state)
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum,
                              weight_decay=t.weight_decay)
        model.train()
        for _ in range(t.epochs):
            for b in torch.randperm(len(y), generator=gen).split(t.batch_size):
                b = b.to(y.device)
                opt.zero_grad()
                F.cross_entropy(model(x[b]), y[b]).backward()
                opt.step()
        n = len(y)
        total += n
        for k, v in model.state_dict().items():
            sums[k] += n * v.double()
    new = {k: (s / max(total, 1)).to(global_state[k].dtype) for k, s in sums.items()}
    model.load_state_dict(new)
    return new


def job_args(doc: str | None = None) -> argparse.Namespace:
    """The options of a plain job (plain_loop.py, pfl_peer.py): the same FedAvg job as fednet's."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=None, help="local epochs (default: fednet's)")
    return ap.parse_args()


def job_data(a: argparse.Namespace) -> tuple[Any, Any, Any, torch.Tensor, torch.Tensor]:
    """(config, dataset, partition, test x, test y) of the job, as fednet builds them: its
    defaults, one user per client for a natural dataset, the run's held-out test set."""
    from fednet.config import RunConfig
    from fednet.data import load_dataset, natural, run_partition, run_test_split
    from fednet.data.datasets import NATURAL

    cfg = RunConfig(clients=a.clients, seed=a.seed)
    if a.dataset in NATURAL:  # one user per client, as `fednet --dataset` sets it
        cfg = cfg.replace(**{"data.dataset": a.dataset, "data.partition": "natural"})
    if a.epochs is not None:
        cfg = cfg.replace(**{"train.epochs": a.epochs})
    ds = load_dataset(a.dataset)
    parts = run_partition(ds, cfg.data, a.clients, a.seed)
    full = natural.test_dataset(ds, cfg.data, a.clients, a.seed)  # natural: the run's held-out set
    test, _ = run_test_split(full, cfg.data.exemplars, a.seed)
    return cfg, ds, parts, torch.from_numpy(test.test_x), torch.from_numpy(test.test_y)
