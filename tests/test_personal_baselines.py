"""Clustered-FL, FedFOMO and Per-FedAvg: golden numbers on toy clients and end-to-end runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fednet.network import latency
from fednet.algorithms import build, build_client
from fednet.algorithms.contract import ClientContext
from fednet.algorithms.fedfomo import W_KEY, affinity_step, epsilon, fomo_weights, mix_weights
from fednet.core.executor import Executor
from fednet.errors import ConfigError
from fednet.core.inproc import run_local
from fednet.models.arrays import clone_arrays, load_arrays, state_arrays
from fednet.training.local import batches, evaluate, train
from fednet.types import ClientInfo, Result, Task
from tests.conftest import small_config


# ---- Clustered-FL ----------------------------------------------------------------------------
def _cfl(clients=7, warmup=2):
    algo = build(small_config(clients=clients, algo={"name": "cfl", "params": {"warmup": warmup}}))
    algo.setup({"w": np.zeros(3, np.float32), "n": np.zeros((), np.int64)})
    algo.state.clusters = [[0, 2], [1, 3, 4, 5, 6]]
    algo.state.models = [{"w": np.full(3, 10.0, np.float32), "n": np.zeros((), np.int64)},
                   {"w": np.zeros(3, np.float32), "n": np.zeros((), np.int64)}]
    return algo


def _opposite_updates(scale=1.0):
    """Clients 1, 4 push along +d, clients 3, 5 along -d (norm ~2, mean norm ~0)."""
    d = np.array([2.0, 0.0, 0.0])
    up = {1: d + [0, 0.1, 0], 4: d + [0, 0, 0.1], 3: -d + [0, 0.1, 0], 5: -d + [0, 0, 0.2]}
    return {k: {"w": (scale * v).astype(np.float32)} for k, v in up.items()}


def test_cfl_splits_opposite_updates_into_two_clusters_with_global_ids():
    algo = _cfl()
    up = _opposite_updates()
    m = algo.step(2, up)
    # local indices of the split would be [0, 2] and [1, 3]; the clusters hold global ids, and
    # the member that sat the round out (6) joins the larger child (a tie: the one holding 1)
    assert algo.state.clusters == [[0, 2], [1, 4, 6], [3, 5]]
    assert m["clusters"] == 3 and m["splits"] == 1
    np.testing.assert_allclose(algo.state.models[0]["w"], [10, 10, 10])  # no update: unchanged
    np.testing.assert_allclose(algo.state.models[1]["w"], (up[1]["w"] + up[4]["w"]) / 2, rtol=1e-6)
    np.testing.assert_allclose(algo.state.models[2]["w"], (up[3]["w"] + up[5]["w"]) / 2, rtol=1e-6)
    assert m["mean_update_norm"] == pytest.approx(np.linalg.norm([0, 0.05, 0.075]), rel=1e-5)
    assert algo.cluster_of(6) == 1


def test_cfl_does_not_split_before_warmup_or_when_updates_are_small():
    algo = _cfl()
    up = _opposite_updates()
    m = algo.step(1, up)                      # round 1 < warmup 2
    assert algo.state.clusters == [[0, 2], [1, 3, 4, 5, 6]] and m["splits"] == 0
    mean = np.mean([u["w"] for u in up.values()], axis=0)
    np.testing.assert_allclose(algo.state.models[1]["w"], mean, rtol=1e-6, atol=1e-7)
    small = _cfl()
    assert small.step(5, _opposite_updates(0.5))["splits"] == 0   # max norm 1.0 < eps2 = 1.6
    with pytest.raises(ConfigError, match="--param eps1"):
        build(small_config(algo={"name": "cfl", "params": {"eps1": -1}}))


def test_cfl_client_uploads_its_update_and_the_server_adds_the_mean():
    cfg = small_config(clients=3, algo={"name": "cfl"})
    ex = Executor(0, cfg, latency.profiles(cfg.latency, 3, cfg.seed)[0])
    algo = build(cfg)
    init = clone_arrays(state_arrays(ex.ctx.model))
    algo.setup(init)
    dw, body = ex.update.run(ex.ctx, Task(1, 0, [0], init, {"epochs": 1, "lr": 0.1}))
    after = state_arrays(ex.ctx.model)
    for k in init:
        np.testing.assert_allclose(dw[k], after[k] - init[k], atol=1e-7)
    algo.aggregate_round(0, [Result(1, 0, 0, dw, body, ex.num_examples)], [])
    np.testing.assert_allclose(algo.state.models[0]["fc3.weight"], after["fc3.weight"], atol=1e-6)


# ---- FedFOMO ---------------------------------------------------------------------------------
def test_fedfomo_weights_affinity_and_epsilon_golden_numbers():
    w = fomo_weights(1.0, [0.5, 1.5, 0.8, 0.9], [2.0, 1.0, 0.4, 0.0])
    np.testing.assert_allclose(w, [0.25, -0.5, 0.5, 0.0])          # distance 0 scores 0
    np.testing.assert_allclose(mix_weights(w), [1 / 3, 0, 2 / 3, 0])  # only positive, sum 1
    np.testing.assert_allclose(affinity_step(w), [1.0, -2.0, 2.0, 0.0])  # w / |sum w| = w / 0.25
    assert mix_weights(np.array([-1.0, 0.0])).sum() == 0
    assert [epsilon(r) for r in (0, 1, 2, 5, 6, 9)] == pytest.approx([0.3, 0.25, 0.2, 0.05, 0, 0])
    algo = build(small_config(clients=4, algo={"name": "fedfomo", "params": {"m": 2}}))
    algo.setup({"w": np.zeros(2, np.float32)})
    rs = [Result(1, 0, 0, {"w": np.ones(2, np.float32), W_KEY: w[:2]}, {"candidates": [2, 3]}, 10)]
    algo.aggregate_round(0, rs, [])
    np.testing.assert_allclose(algo.state.affinity[0], [0.1, 0, 1.0, -2.0])  # / |0.25 - 0.5|
    assert set(algo.state.latest[0]) == {"w"}


def test_fedfomo_greedy_choice_and_download_of_m_models():
    algo = build(small_config(clients=5, algo={"name": "fedfomo", "params": {"m": 2}}))
    model = {"a": np.zeros((4, 5), np.float32), "b": np.zeros(5, np.float32)}
    algo.setup(model)
    algo.state.latest = {k: clone_arrays(model) for k in range(5)}
    algo.state.affinity[0] = [0.1, 0.5, -1.0, 0.7, 0.2]
    assert algo.candidates(10, 0) == [3, 1]              # eps = 0 from round 6: the top two
    assert algo.candidates(0, 0) == algo.candidates(0, 0)  # seeded
    tasks = algo.configure_round(1, [ClientInfo(k, 10) for k in range(5)])
    per_model = sum(a.nbytes for a in model.values())
    for t in tasks:
        assert len(t.body["candidates"]) == 2 and t.cid not in t.body["candidates"]
        assert sum(a.nbytes for a in t.arrays.values()) == 2 * per_model


def test_fedfomo_client_mixes_only_positive_candidates_by_normalised_weights():
    cfg = small_config(clients=3, algo={"name": "fedfomo", "params": {"norm": "l2"}})
    ex = Executor(0, cfg, latency.profiles(cfg.latency, 3, cfg.seed)[0])
    ctx, algo = ex.ctx, ex.update
    own = clone_arrays(state_arrays(ctx.model))
    tr, va = algo.split(ctx)
    assert len(va) == round(0.2 * ctx.num_examples) and not set(tr.tolist()) & set(va.tolist())
    train(ctx.model, ctx.x, ctx.y, epochs=2, batch_size=16, lr=0.1,
          generator=torch.Generator().manual_seed(1))
    good = clone_arrays(state_arrays(ctx.model))
    half = {k: own[k] + 0.5 * (good[k] - own[k]) for k in own}
    rs = np.random.default_rng(0)
    bad = {k: own[k] + rs.normal(0, 0.5, own[k].shape).astype(np.float32) for k in own}
    load_arrays(ctx.model, own)
    cands = [good, bad, half]

    def loss(a):
        load_arrays(ctx.model, a)
        return evaluate(ctx.model, ctx.x[va], ctx.y[va])[1]

    base = loss(own)
    dist = [np.sqrt(sum(((c[k].astype(np.float64) - own[k]) ** 2).sum() for k in own))
            for c in cands]
    want = np.array([(base - loss(c)) / d for c, d in zip(cands, dist)])
    assert want[0] > 0 and want[2] > 0 and want[1] < 0
    load_arrays(ctx.model, own)
    arrays = {f"m{k}:{n}": a for k, c in zip([1, 2, 3], cands) for n, a in c.items()}
    out, body = algo.run(ctx, Task(1, 1, [0], arrays,
                                 {"epochs": 0, "lr": 0.1, "candidates": [1, 2, 3]}))
    np.testing.assert_allclose(out[W_KEY], want, rtol=1e-4)
    assert body["mixed"] == 2
    mix = want.clip(0) / want.clip(0).sum()
    for k in own:  # epochs=0: the upload is the mixed model itself
        expect = own[k] + mix[0] * (good[k] - own[k]) + mix[2] * (half[k] - own[k])
        np.testing.assert_allclose(out[k], expect, rtol=1e-5, atol=1e-6)


# ---- Per-FedAvg ------------------------------------------------------------------------------
def _toy(params, wd=0.01):
    cfg = small_config(clients=2, train={"batch_size": 2, "weight_decay": wd},
                       algo={"name": "perfedavg", "params": params})
    torch.manual_seed(0)
    model = nn.Linear(2, 3, bias=False)
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0], [-1.5, 0.5], [2.0, 1.0]])
    y = torch.tensor([0, 2, 1, 2])
    return build_client(cfg), ClientContext(0, model, x, y, cfg, torch.device("cpu"))


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _grad(W, x, y, wd):
    """d/dW of mean CE(W x) + (wd/2)||W||^2 for a bias-free linear layer."""
    p = _softmax(x @ W.T)
    p[np.arange(len(y)), y] -= 1
    return p.T @ x / len(y) + wd * W


def _hvp(W, x, V, wd):
    """Hessian of the same loss times V: mean over samples of (diag(p) - p p^T) (V x) x^T."""
    p = _softmax(x @ W.T)
    out = np.zeros_like(W)
    for pi, xi in zip(p, x):
        out += np.outer((np.diag(pi) - np.outer(pi, pi)) @ (V @ xi), xi)
    return out / len(x) + wd * V


def test_perfedavg_first_order_step_equals_a_hand_computation():
    a, b, wd = 0.1, 0.05, 0.01
    algo, ctx = _toy({"alpha": a, "beta": b}, wd)
    W = ctx.model.weight.detach().numpy().astype(np.float64).copy()
    x, y = ctx.x.numpy().astype(np.float64), ctx.y.numpy()
    d1, d2 = [0, 1], [2, 3]
    algo.meta_step(ctx, torch.tensor(d1), torch.tensor(d2))
    Wp = W - a * _grad(W, x[d1], y[d1], wd)
    want = W - b * _grad(Wp, x[d2], y[d2], wd)           # applied to theta, not theta'
    np.testing.assert_allclose(ctx.model.weight.detach().numpy(), want, rtol=1e-5, atol=1e-7)
    # the whole client update: one pair per epoch of two batches, then the personalization step
    algo, ctx = _toy({"alpha": a, "beta": b}, wd)
    bl = batches(4, 2, ctx.batch_generator(0))
    up, body = algo.run(ctx, Task(1, 0, [0], {"weight": W.astype(np.float32)},
                                 {"epochs": 1, "evaluate": True}))
    d1, d2 = bl[0].tolist(), bl[1].tolist()
    want = W - b * _grad(W - a * _grad(W, x[d1], y[d1], wd), x[d2], y[d2], wd)
    np.testing.assert_allclose(up["weight"], want, rtol=1e-5, atol=1e-7)
    assert body["steps"] == 1
    g = ctx.batch_generator(0, "perfedavg/personalize")
    pb = torch.randperm(4, generator=g)[:2].tolist()
    personal = want - a * _grad(want, x[pb], y[pb], wd)
    np.testing.assert_allclose(ctx.model.weight.detach().numpy(), personal, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("hvp", ["autograd", "fd"])
def test_perfedavg_hessian_free_step_matches_the_hand_hvp_and_differs_from_first_order(hvp):
    a, b, wd = 0.5, 0.1, 0.01
    algo, ctx = _toy({"alpha": a, "beta": b, "hf": "true", "hvp": hvp}, wd)
    W = ctx.model.weight.detach().numpy().astype(np.float64).copy()
    x, y = ctx.x.numpy().astype(np.float64), ctx.y.numpy()
    d1, d2, d3 = [0, 1], [2, 3], [1, 3]
    algo.meta_step(ctx, torch.tensor(d1), torch.tensor(d2), torch.tensor(d3))
    g = _grad(W - a * _grad(W, x[d1], y[d1], wd), x[d2], y[d2], wd)
    want = W - b * (g - a * _hvp(W, x[d3], g, wd))
    fo = W - b * g
    got = ctx.model.weight.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 if hvp == "fd" else 1e-7)
    assert np.abs(got - fo).max() > 1e-4


# ---- end to end ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params", [("cfl", {}), ("fedfomo", {"m": 1}), ("perfedavg", {}),
                                         ("perfedavg", {"hf": True})])
def test_personal_baselines_run_end_to_end_on_permuted_digits(name, params):
    held = {}

    def prepare(session):
        session.ledger.keep_entries = True
        held["s"] = session

    cfg = small_config(clients=3, rounds=2, algo={"name": name, "params": params},
                       data={"permute": True})
    summary = run_local(cfg, quiet=True, write=False, prepare=prepare)
    assert summary["status"] == "completed"
    assert summary["final_accuracy"] is not None and 0.0 <= summary["final_accuracy"] <= 1.0
    s = held["s"]
    rows = s.history.rows
    assert all("acc_min" in r for r in rows)      # clients reported their own accuracy
    model_bytes = sum(a.nbytes for a in s.evaluator.initial.values())
    down = [[e.tensor_bytes for e in s.ledger.entries if e.kind == "TASK" and e.round == r]
            for r in (0, 1)]
    if name == "cfl":
        assert [r["clusters"] for r in rows] == [1, 1]         # warmup 20: no split yet
    if name == "fedfomo":   # nobody has a model in round 0; then m = 1 model per client
        assert down == [[0, 0, 0], [model_bytes] * 3]
    else:
        assert down == [[model_bytes] * 3] * 2
