"""--batch-clients (issue 56 items 1-3): a round's clients trained in blocks by the runtime.

What is checked: each batched algorithm's run equals its unbatched run to float32 rounding
(RTOL of each array's largest magnitude; measured about 1e-7 after two rounds) with the same
bytes, messages, simulated time and client compute to the last bit; a block's client updates
equal each client's rule alone to RTOL; a client's bits do not depend on its block (what lets
fednet local and fednet launch agree bit for bit); the block rule (client-id order, one device
a block); and the one console note of an algorithm that cannot batch. fednet local == fednet
launch in batched mode is tests/integration/test_batched_parity.py.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fednet.algorithms import updates
from fednet.algorithms.contract import ClientContext
from fednet.algorithms.updates import Plain, Prox, take_ahead, train_ahead
from fednet.config import RunConfig
from fednet.core.batching import blocks, note
from fednet.core.inproc import run_local
from fednet.models import build_model
from fednet.models.arrays import state_arrays
from fednet.platform.gpus import device_for
from fednet.training.flops import metered
from fednet.types import Task
from tests.conftest import small_config

RTOL = 1e-5

BATCHED = [("fedavg", {}), ("fedprox", {"mu": 0.1}), ("fedavgm", {}), ("fedadam", {}),
           ("fedyogi", {}), ("fedadagrad", {}), ("fedasync", {}), ("fedbuff", {"buffer": 3})]


def _model(out) -> dict[str, np.ndarray]:
    with np.load(out / "final_model.npz") as z:
        return {k: z[k] for k in z.files}


def _run(tmp_path, name: str, algo: str, params: dict, n: int, **over):
    cfg = small_config(clients=8, rounds=2, latency={"preset": "hetero"},
                       algo={"name": algo, "params": params},
                       train={"batch_clients": n, "momentum": 0.5}, **over)
    out = tmp_path / name
    summary = run_local(cfg.replace(out=str(out)), quiet=True)
    assert summary["status"] == "completed", summary.get("error")
    return summary, _model(out)


def _rows(out) -> list[dict]:
    import json

    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algo, params", BATCHED, ids=[a for a, _ in BATCHED])
def test_batched_run_equals_unbatched(tmp_path, algo, params):
    """Each batched algorithm: the final model within RTOL (not bitwise: the batch's kernels
    round differently), the bytes, messages, simulated time and client compute identical."""
    a, ma = _run(tmp_path, "plain", algo, params, 0)
    b, mb = _run(tmp_path, "batched", algo, params, 3)
    assert a["bytes"] == b["bytes"] and a["messages"] == b["messages"]
    assert a["sim_time_s"] == b["sim_time_s"] > 0
    ra, rb = _rows(tmp_path / "plain"), _rows(tmp_path / "batched")
    keys = ("sim_s", "client_compute_s", "client_epochs", "samples")
    assert [{k: r.get(k) for k in keys} for r in ra] == [{k: r.get(k) for k in keys} for r in rb]
    moved = False
    for k in ma:
        scale = max(float(np.abs(ma[k]).max()), 1e-12)
        assert float(np.abs(ma[k] - mb[k]).max()) <= RTOL * scale, k
        moved |= not np.array_equal(ma[k], mb[k])
    assert moved, "the batched run should round differently (was it batched at all?)"


def test_local_dp_clipping_composes(tmp_path):
    """DP-FedAvg's client (--dp-mode local: the update clipped and noised after training) takes
    the block's training like FedAvg's: same bytes and time, the model within RTOL."""
    dp = {"dp": {"mode": "local", "clip": 1.0, "noise": 0.1}}
    a, ma = _run(tmp_path, "plain", "fedavg", {}, 0, **dp)
    b, mb = _run(tmp_path, "batched", "fedavg", {}, 4, **dp)
    assert a["bytes"] == b["bytes"] and a["sim_time_s"] == b["sim_time_s"]
    for k in ma:
        assert float(np.abs(ma[k] - mb[k]).max()) <= RTOL * float(np.abs(ma[k]).max()), k


# ---- a block's updates, directly ------------------------------------------------------------
SHAPES = {"digits_cnn": (1, 8, 8), "mclr": (60,),  # mclr: training/batched's closed-form step
          "fedseq_cnn": (3, 32, 32)}  # with synthetic-cifar10's augmentation (FedSeq's crop, flip)
AUGMENTED = {"fedseq_cnn": "synthetic-cifar10"}


def _clients(n: int, cfg: RunConfig, name: str = "digits_cnn"):
    model = build_model(name, 10, SHAPES[name], seed=0)
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(9 + 7 * i, *SHAPES[name], generator=g),
             torch.randint(0, 10, (9 + 7 * i,), generator=g)) for i in range(n)]
    arrays = state_arrays(copy.deepcopy(model))
    tasks = [Task(task_id=100 + i, round=2, route=[i], arrays=arrays) for i in range(n)]
    from fednet.core.executor import _augment

    aug = _augment("auto", AUGMENTED[name]) if name in AUGMENTED else None  # one per process
    ctxs = [ClientContext(i, model, x, y, cfg, torch.device("cpu"), augment=aug) for i, (x, y) in
            enumerate(data)]  # one working model, shared, as stateless clients share it
    return model, ctxs, tasks


def _taken(ctx: ClientContext, task: Task, mu: float) -> tuple[dict, dict, int]:
    from fednet.models.arrays import load_arrays

    load_arrays(ctx.model, task.arrays)
    with metered() as m:
        body = take_ahead(ctx, task, mu)
    assert body is not None
    return body, {n: p.detach().clone() for n, p in ctx.model.named_parameters()}, m.flops


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("mu", [0.0, 0.1], ids=["fedavg", "fedprox"])
def test_a_block_taken_equals_each_rule_alone(mu, name):
    """train_ahead then take_ahead: each client's model within RTOL of its rule alone, its body's
    steps and samples exact and its loss within RTOL, and its task's meter charged exactly the
    FLOPs the plain loop charges."""
    cfg = RunConfig(seed=3).replace(**{"train.epochs": 2, "train.momentum": 0.5})
    model, ctxs, tasks = _clients(4, cfg, name)
    rules = [Prox(mu) if mu else Plain() for _ in ctxs]
    assert train_ahead(ctxs, tasks, rules) == ""
    for ctx, task, r in zip(ctxs, tasks, rules):
        body, got, flops = _taken(ctx, task, mu)
        alone = ClientContext(ctx.cid, copy.deepcopy(model), ctx.x, ctx.y, cfg, ctx.device,
                              augment=ctx.augment)
        with metered() as m:
            want = r.run(alone, task)
        assert flops == m.flops > 0
        assert (body["steps"], body["samples"]) == (want["steps"], want["samples"])
        assert abs(body["loss"] - want["loss"]) <= RTOL * abs(want["loss"])
        for n, p in alone.model.named_parameters():
            assert float((got[n] - p.detach()).abs().max()) <= RTOL * float(p.detach().abs().max()), n
    assert not updates._AHEAD


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_clients_bits_do_not_depend_on_its_block(name):
    """The same client trained in blocks of 1 (beside a copy of itself), 2, 3 and 6, at
    different places, with different neighbours: identical bits. fednet launch's processes
    hold other blocks than fednet local's and still agree with it bit for bit."""
    cfg = RunConfig(seed=3).replace(**{"train.momentum": 0.5})
    _, ctxs, tasks = _clients(6, cfg, name)
    seen = []
    for ids in ([2], [2, 0], [1, 2, 5], [5, 4, 3, 2, 1, 0], [2, 3]):
        assert train_ahead([ctxs[i] for i in ids], [tasks[i] for i in ids],
                           [Plain() for _ in ids]) == ""
        seen.append(_taken(ctxs[2], tasks[2], 0.0))
        updates.forget_ahead()
    for body, params, flops in seen[1:]:
        assert body == seen[0][0] and flops == seen[0][2]
        assert all(torch.equal(params[n], seen[0][1][n]) for n in params)


def test_a_result_that_started_elsewhere_is_not_taken():
    """take_ahead checks the model it is given against the block's start: another received
    model (or another mu) trains alone instead."""
    cfg = RunConfig(seed=3)
    _, ctxs, tasks = _clients(2, cfg)
    assert train_ahead(ctxs, tasks, [Plain(), Plain()]) == ""
    with torch.no_grad():
        next(ctxs[0].model.parameters()).add_(1.0)
    assert take_ahead(ctxs[0], tasks[0], 0.0) is None
    assert take_ahead(ctxs[1], tasks[1], 0.1) is None
    updates.forget_ahead()


# ---- the block rule ---------------------------------------------------------------------------
def _task(tid: int, cid: int, route: list[int] | None = None) -> Task:
    return Task(task_id=tid, round=0, route=route or [cid])


def test_blocks_in_client_id_order_one_device_each():
    """Star tasks only, sorted by client id, cut every `most`; with --gpus each block's clients
    are on one device (device_for: ids alternate between cuda:0 and cuda:1; nothing is placed,
    so this runs on the CPU)."""
    tasks = [_task(t, c) for t, c in enumerate([7, 3, 0, 5, 1, 4, 6, 2])] + \
        [_task(99, 8, [8, 9])]  # a ring: never batched
    cpu = blocks(tasks, 3, lambda c: "cpu")
    assert [[t.cid for t in b] for b in cpu] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    two = blocks(tasks, 3, lambda c: device_for(c, (0, 1)))
    assert [[t.cid for t in b] for b in two] == [[0, 2, 4], [6], [1, 3, 5], [7]]
    for b in two:
        assert len({device_for(t.cid, (0, 1)) for t in b}) == 1


def test_an_algorithm_that_cannot_batch_says_so_once():
    cfg = RunConfig().replace(**{"train.batch_clients": 8, "algo.name": "scaffold"})
    assert "scaffold" in note(cfg) and "one at a time" in note(cfg)
    assert note(cfg.replace(**{"algo.name": "fedavg"})) == ""
    assert note(cfg.replace(**{"train.batch_clients": 0})) == ""
