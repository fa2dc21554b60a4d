"""FedProx, SCAFFOLD, FedDyn, Stand-Alone and centralized: equivalences and golden numbers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fednet.network import latency
from fednet.algorithms import build
from fednet.core.executor import Executor
from fednet.core.inproc import InprocDispatcher, run_local
from fednet.models.arrays import clone_arrays, state_arrays
from fednet.core.session import Session
from fednet.types import Result, Task
from tests.conftest import run_for_model, same_arrays, small_config


def test_fedprox_with_mu_zero_equals_fedavg(tmp_path):
    _, avg = run_for_model(small_config(), tmp_path, "avg")
    _, prox = run_for_model(small_config(algo={"name": "fedprox", "params": {"mu": 0.0}}), tmp_path, "p0")
    _, prox1 = run_for_model(small_config(algo={"name": "fedprox", "params": {"mu": 1.0}}), tmp_path, "p1")
    assert same_arrays(avg, prox)
    assert not same_arrays(avg, prox1)


def test_scaffold_with_zero_controls_equals_fedavg_in_its_first_round(tmp_path):
    s_avg, avg = run_for_model(small_config(rounds=1), tmp_path, "avg")
    s_sc, sc = run_for_model(small_config(rounds=1, algo={"name": "scaffold"}), tmp_path, "sc")
    assert same_arrays(avg, sc)
    # the control variates double the downlink: model + c, and the uplink: model + delta c
    assert s_sc["bytes"]["tensor_bytes"] == 2 * s_avg["bytes"]["tensor_bytes"]


def _executors(cfg):
    prof = latency.profiles(cfg.latency, cfg.clients, cfg.seed)
    return [Executor(c, cfg, prof[c]) for c in range(cfg.clients)]


def _task(arrays, rnd=0, epochs=1):
    return Task(1, rnd, [0], arrays, {"epochs": epochs, "lr": 0.1})


@pytest.mark.parametrize("option", [1, 2])
def test_scaffold_one_step_controls_are_the_gradient_at_the_server_model(option):
    cfg = small_config(clients=2, train={"batch_size": 1000, "epochs": 1, "weight_decay": 0.0},
                       algo={"name": "scaffold", "params": {"option": option}})
    ex = _executors(cfg)[0]
    algo = build(cfg)
    init = clone_arrays(state_arrays(ex.ctx.model))
    algo.setup(init)
    arrays = dict(init, **{"c:" + k: np.zeros_like(v) for k, v in init.items()})
    out, body = ex.update.run(ex.ctx, _task(arrays))
    assert body["steps"] == 1
    model = ex.ctx.model
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    model.zero_grad()
    F.cross_entropy(model(ex.ctx.x), ex.ctx.y).backward()  # one full batch: grad at x
    for n, p in model.named_parameters():
        np.testing.assert_allclose(out["dc:" + n], p.grad.numpy(), rtol=1e-4, atol=1e-6)
    # server: c += (1/K) sum dc over participants, K = all clients
    algo.aggregate_round(0, [Result(1, 0, 0, out, body, ex.num_examples)], [])
    np.testing.assert_allclose(algo.state.c["fc3.weight"], out["dc:fc3.weight"] / 2, rtol=1e-6)


def test_fedprox_client_matches_an_autograd_reference():
    mu = 0.5
    cfg = small_config(clients=2, train={"epochs": 2, "batch_size": 8},
                       algo={"name": "fedprox", "params": {"mu": mu}})
    ex = _executors(cfg)[1]  # its client half (ex.update) is FedProx's
    init = clone_arrays(state_arrays(ex.ctx.model))
    out, _ = ex.update.run(ex.ctx, _task(init, epochs=2))
    model = ex.ctx.model
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    anchor = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=cfg.train.weight_decay)
    g = ex.ctx.batch_generator(0)
    for _ in range(2):
        for idx in torch.randperm(len(ex.ctx.y), generator=g).split(8):
            opt.zero_grad()
            prox = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
            (F.cross_entropy(model(ex.ctx.x[idx]), ex.ctx.y[idx]) + mu / 2 * prox).backward()
            opt.step()
    for k, v in state_arrays(model).items():
        np.testing.assert_allclose(out[k], v, rtol=1e-4, atol=1e-6)


def test_feddyn_client_gradient_and_state_match_the_paper_rule():
    alpha = 0.3
    cfg = small_config(clients=2, train={"epochs": 1, "batch_size": 8},
                       algo={"name": "feddyn", "params": {"alpha": alpha}})
    ex = _executors(cfg)[0]
    init = clone_arrays(state_arrays(ex.ctx.model))
    ex.update.run(ex.ctx, _task(init))              # round 0: g_k = -alpha (theta_1 - init)
    after0 = clone_arrays(state_arrays(ex.ctx.model))
    g = [gk.clone() for gk in ex.ctx.state.feddyn_g]
    for gk, (n, _) in zip(g, ex.ctx.model.named_parameters()):
        np.testing.assert_allclose(gk.numpy(), -alpha * (after0[n] - init[n]), rtol=1e-5, atol=1e-7)
    out, _ = ex.update.run(ex.ctx, _task(after0, rnd=1))  # round 1 uses that g_k
    model = ex.ctx.model
    model.load_state_dict({k: torch.from_numpy(v) for k, v in after0.items()})
    anchor = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=cfg.train.weight_decay)
    for idx in torch.randperm(len(ex.ctx.y), generator=ex.ctx.batch_generator(1)).split(8):
        opt.zero_grad()
        lin = sum((gk * p).sum() for gk, p in zip(g, model.parameters()))
        quad = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
        (F.cross_entropy(model(ex.ctx.x[idx]), ex.ctx.y[idx]) - lin + alpha / 2 * quad).backward()
        opt.step()
    for k, v in state_arrays(model).items():
        np.testing.assert_allclose(out[k], v, rtol=1e-4, atol=1e-6)


def test_feddyn_server_golden_numbers():
    cfg = small_config(clients=4, algo={"name": "feddyn", "params": {"alpha": 0.5}})
    algo = build(cfg)
    algo.setup({"w": np.array([1.0, 0.0], np.float32)})
    rs = [Result(1, 0, 0, {"w": np.array([3.0, 2.0], np.float32)}, {}, 10),
          Result(2, 0, 1, {"w": np.array([1.0, -2.0], np.float32)}, {}, 90)]
    algo.aggregate_round(0, rs, [])
    # h = -(0.5/4) * ((2,2) + (0,-2)) = (-0.25, 0); theta = mean (2, 0) - h/0.5 = (2.5, 0)
    np.testing.assert_allclose(algo.state.h["w"], [-0.25, 0.0])
    np.testing.assert_allclose(algo.global_arrays["w"], [2.5, 0.0])


def test_divergence_is_detected_and_reported_not_a_crash(tmp_path):
    cfg = small_config(rounds=5, train={"lr": 1e4}, algo={"name": "feddyn"})
    s = run_local(cfg.replace(out=str(tmp_path / "boom")), quiet=True)
    assert s["status"] == "diverged"
    assert s["rounds"] < 5
    assert (tmp_path / "boom" / "summary.json").exists()


def test_standalone_sends_no_tensors_and_reports_mean_client_accuracy():
    cfg = small_config(clients=3, rounds=3, algo={"name": "standalone"})
    s = Session(cfg, quiet=True, write=False)
    s.driver.run(InprocDispatcher(s))
    assert s.ledger.totals()["tensor_bytes"] == 0
    rows = s.history.rows
    assert len({r["accuracy"] for r in rows}) > 1      # models persist and improve
    assert rows[-1]["acc_min"] <= rows[-1]["accuracy"] <= rows[-1]["acc_max"]


def test_centralized_trains_one_model_on_the_pooled_data_with_cosine_lr():
    cfg = small_config(clients=4, rounds=4, algo={"name": "centralized"})
    s = Session(cfg, quiet=True, write=False)
    s.driver.run(InprocDispatcher(s))
    rows = s.history.rows
    assert [r["results"] for r in rows] == [1, 1, 1, 1]
    lrs = [r["lr"] for r in rows]
    assert lrs == pytest.approx([0.1 * 0.5 * (1 + math.cos(math.pi * t / 4)) for t in range(4)])
    assert rows[-1]["accuracy"] > 0.8
