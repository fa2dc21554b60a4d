"""The plain PyTorch FedAvg round that the benchmarks time fednet against (plain_loop.py on CPU,
gpu_children.py on a device): each client trains a copy of the global model with
torch.optim.SGD, and the new global model is the sample-weighted mean, summed in float64.

It does the rounds `fednet local` does, to float rounding (tests/test_plain_loop.py): the same
cohort each round (fednet's own draw: `cohorts`, the algorithm's Strategy.select), each client's
minibatch order and augmentation from its own seeded generator as a fednet client's
(`batch_generator`: ClientContext.batch_generator's seed, rng.int_seed(seed, "batches", round,
client)), the run's augmentation (--augment auto: FedSeq's crop and flip on the 32x32 sets), the
same initial model, data, test set and training settings (RunConfig's defaults). fednet's own
pure functions say WHICH clients and WHAT data; the training, the averaging and the test are
this module's plain PyTorch (no fednet runtime, executor or batching)."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def batch_generator(seed: int, rnd: int, cid: int) -> torch.Generator:
    """Client `cid`'s generator of round `rnd`: its minibatch order and augmentation draws, seeded
    as a fednet client's (algorithms/contract.ClientContext.batch_generator)."""
    from fednet import rng

    return torch.Generator().manual_seed(rng.int_seed(seed, "batches", rnd, cid))


def fedavg_round(model: torch.nn.Module, global_state: dict[str, torch.Tensor],
                 clients: Iterable[tuple[int, torch.Tensor, torch.Tensor]], t: Any, seed: int,
                 rnd: int, augment: Augment | None = None) -> dict[str, torch.Tensor]:
    """Round `rnd` over `clients` ((cid, x, y) each, x and y on the model's device) with the
    training settings `t` (lr, momentum, weight_decay, epochs, batch_size) and the run's `seed`;
    `augment(batch, generator)` transforms each minibatch (None: none). Returns the new global
    state and leaves it loaded in `model`. A floating entry is the sample-weighted mean (summed
    in float64), any other (an integer counter) the first client's, as fednet's StreamingMean."""
    sums = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()
            if v.is_floating_point()}
    other: dict[str, torch.Tensor] = {}
    total = 0
    for cid, x, y in clients:
        model.load_state_dict(global_state)
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum,
                              weight_decay=t.weight_decay)
        gen = batch_generator(seed, rnd, cid)
        model.train()
        for _ in range(t.epochs):
            for b in torch.randperm(len(y), generator=gen).split(t.batch_size):
                b = b.to(y.device)
                xb = x[b] if augment is None else augment(x[b], gen)
                opt.zero_grad()
                F.cross_entropy(model(xb), y[b]).backward()
                opt.step()
        n = len(y)
        total += n
        for k, v in model.state_dict().items():
            if k in sums:
                sums[k] += n * v.double()
            elif k not in other:
                other[k] = v.clone()
    new = {k: (sums[k] / max(total, 1)).to(v.dtype) if k in sums else other.get(k, v)
           for k, v in global_state.items()}
    model.load_state_dict(new)
    return new


def cohorts(cfg: Any) -> Callable[[int], list[int]]:
    """rnd -> the ids of round rnd's clients, ascending: fednet's own draw for the run `cfg`
    (its algorithm's Strategy.select over the whole population, as `fednet local`'s roster:
    max(floor(fraction x clients), 1) clients, uniformly without replacement, seeded by
    (seed, round)). Costs what the loop's former numpy choice did: one draw, and a record for
    each client drawn."""
    from fednet import algorithms
    from fednet.types import ClientInfo, Roster

    strategy = algorithms.build(cfg)
    roster = Roster(np.arange(cfg.clients, dtype=np.int64), lambda cid: ClientInfo(cid, 0))
    return lambda rnd: [c.cid for c in strategy.select(rnd, roster)]


def augment_of(cfg: Any) -> Augment | None:
    """The run's train-time augmentation (--augment, "auto": the dataset's default), as a fednet
    client applies it; None for none."""
    from fednet.data.augment import augmentation, identity

    fn = augmentation(cfg.train.augment, cfg.data.dataset)
    return None if fn is identity else fn


def job_args(doc: str | None = None, argv: list[str] | None = None) -> argparse.Namespace:
    """The options of a plain job (plain_loop.py, pfl_peer.py): the same FedAvg job as fednet's."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=None, help="local epochs (default: fednet's)")
    return ap.parse_args(argv)


def job_data(a: argparse.Namespace) -> tuple[Any, Any, Any, torch.Tensor, torch.Tensor]:
    """(config, dataset, partition, test x, test y) of the job, as fednet builds them: its
    defaults with the job's dataset, clients, fraction, model, seed (and epochs), one user per
    client for a natural dataset, the run's held-out test set."""
    from fednet.config import RunConfig
    from fednet.data import load_dataset, natural, run_partition, run_test_split
    from fednet.data.datasets import NATURAL

    cfg = RunConfig(clients=a.clients, seed=a.seed).replace(**{
        "data.dataset": a.dataset, "algo.fraction": a.fraction, "train.model": a.model})
    if a.dataset in NATURAL:  # one user per client, as `fednet --dataset` sets it
        cfg = cfg.replace(**{"data.partition": "natural"})
    if a.epochs is not None:
        cfg = cfg.replace(**{"train.epochs": a.epochs})
    ds = load_dataset(a.dataset)
    parts = run_partition(ds, cfg.data, a.clients, a.seed)
    full = natural.test_dataset(ds, cfg.data, a.clients, a.seed)  # natural: the run's held-out set
    test, _ = run_test_split(full, cfg.data.exemplars, a.seed)
    return cfg, ds, parts, torch.from_numpy(test.test_x), torch.from_numpy(test.test_y)
