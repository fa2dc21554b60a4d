"""The plain PyTorch FedAvg round that the benchmarks time fednet against (plain_loop.py on CPU,
gpu_children.py on a device): each client trains a copy of the global model with SGD, and the
new global model is the sample-weighted mean, summed in float64."""
from __future__ import annotations

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
