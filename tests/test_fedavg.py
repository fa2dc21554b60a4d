"""FedAvg on two or three toy clients: exact numbers, failures, selection."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fednet.network import latency
from fednet.algorithms import build
from fednet.algorithms.aggregate import weighted_mean
from fednet.core.executor import Executor
from fednet.models.arrays import clone_arrays, state_arrays
from fednet.protocol import decode, encode
from fednet.types import ClientInfo, Failure, Result
from fednet.core.wire import task_message
from tests.conftest import small_config


def test_weighted_mean_golden_numbers():
    a = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(5, np.int64)}
    b = {"w": np.array([4.0, 8.0], np.float32), "n": np.array(9, np.int64)}
    c = {"w": np.array([0.0, -1.0], np.float32), "n": np.array(1, np.int64)}
    out = weighted_mean([a, b, c], [1, 2, 1])
    np.testing.assert_allclose(out["w"], [(1 + 8 + 0) / 4, (2 + 16 - 1) / 4])
    assert out["w"].dtype == np.float32 and int(out["n"]) == 5  # integers: the first input's


def test_aggregate_weights_by_samples_and_skips_non_finite():
    algo = build(small_config())
    algo.setup({"w": np.zeros(2, np.float32)})
    rs = [Result(1, 0, 0, {"w": np.array([1.0, 1.0], np.float32)}, {"loss": 1.0}, 10),
          Result(2, 0, 1, {"w": np.array([4.0, 0.0], np.float32)}, {"loss": 2.0}, 30),
          Result(3, 0, 2, {"w": np.array([np.nan, 0.0], np.float32)}, {"loss": 9.0}, 50)]
    m = algo.aggregate_round(0, rs, [])
    np.testing.assert_allclose(algo.global_arrays["w"], [(10 + 120) / 40, 10 / 40])
    assert m["non_finite"] == 1 and m["results"] == 2
    assert m["train_loss"] == pytest.approx((10 * 1 + 30 * 2) / 40)


def test_all_failed_round_keeps_the_previous_model():
    algo = build(small_config())
    algo.setup({"w": np.array([3.0], np.float32)})
    algo.aggregate_round(0, [], [Failure(1, 0, 0, "client died")])
    assert algo.global_arrays["w"][0] == 3.0


def test_selection_is_seeded_and_sized_by_fraction():
    algo = build(small_config(algo={"fraction": 0.3}))
    clients = [ClientInfo(c, 10) for c in range(10)]
    s1 = [c.cid for c in algo.select(4, clients)]
    s2 = [c.cid for c in algo.select(4, clients)]
    assert s1 == s2 and len(s1) == 3
    assert any([c.cid for c in algo.select(r, clients)] != s1 for r in range(5, 10))


def _reference_round(cfg, init, executors):
    """Independent FedAvg round: torch.optim.SGD on each client's data, weighted average."""
    outs, ns = [], []
    for ex in executors:
        model = ex.ctx.model
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in init.items()})
        opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr,
                              weight_decay=cfg.train.weight_decay)
        g = ex.ctx.batch_generator(0)
        for _ in range(cfg.train.epochs):
            for idx in torch.randperm(len(ex.ctx.y), generator=g).split(cfg.train.batch_size):
                opt.zero_grad()
                F.cross_entropy(model(ex.ctx.x[idx]), ex.ctx.y[idx]).backward()
                opt.step()
        outs.append(clone_arrays(state_arrays(model)))
        ns.append(ex.num_examples)
    return {k: sum(n * o[k].astype(np.float64) for n, o in zip(ns, outs)) / sum(ns) for k in init}


def test_one_fedavg_round_matches_an_independent_reference():
    cfg = small_config(train={"epochs": 2})
    profiles = latency.profiles(cfg.latency, cfg.clients, cfg.seed)
    exs = [Executor(c, cfg, profiles[c]) for c in range(cfg.clients)]
    torch.manual_seed(0)
    init = clone_arrays(state_arrays(exs[0].ctx.model))
    algo = build(cfg)
    algo.setup(init)
    tasks = algo.configure_round(0, [ClientInfo(c, exs[c].num_examples) for c in range(3)])
    results = []
    for t in tasks:
        msg = task_message(t, "run")
        out = exs[t.cid].on_task(decode(encode(msg)), 0)
        r = decode(encode(out.reply))
        results.append(Result(r.task_id, 0, t.cid, clone_arrays(r.arrays), r.body["body"],
                              r.body["n"]))
    algo.aggregate_round(0, results, [])
    ref = _reference_round(cfg, init, exs)
    for k in init:
        np.testing.assert_allclose(algo.global_arrays[k], ref[k], rtol=1e-5, atol=1e-6)
    assert not np.allclose(algo.global_arrays["fc3.weight"], init["fc3.weight"])


def test_a_result_that_does_not_fit_the_model_is_dropped_not_fatal(caplog):
    import logging

    logger = logging.getLogger("fednet.server")  # fednet's loggers may not propagate to root
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="fednet.server")
    algo = build(small_config())
    algo.setup({"w": np.zeros(2, np.float32)})
    rs = [Result(1, 0, 0, {"w": np.array([1.0, 3.0], np.float32)}, {"loss": 1.0}, 10),
          Result(2, 0, 1, {"w": np.array([9.0, 9.0, 9.0], np.float32)}, {"loss": 1.0}, 10),
          Result(3, 0, 2, {"v": np.array([9.0, 9.0], np.float32)}, {"loss": 1.0}, 10)]
    m = algo.aggregate_round(0, rs, [])
    assert m["results"] == 1 and m["non_finite"] == 2
    np.testing.assert_array_equal(algo.global_arrays["w"], [1.0, 3.0])
    logger.removeHandler(caplog.handler)
    assert "result of client 1 dropped" in caplog.text and "result of client 2 dropped" in caplog.text


def test_round_metrics_do_not_depend_on_arrival_order():
    rng = np.random.default_rng(0)
    rs = [Result(i, 0, i, {"w": np.zeros(1, np.float32)}, {"loss": float(rng.random())},
                 int(rng.integers(1, 50))) for i in range(30)]
    losses = set()
    for seed in range(10):
        algo = build(small_config())
        algo.setup({"w": np.zeros(1, np.float32)})
        order = np.random.default_rng(seed).permutation(30)
        losses.add(algo.aggregate_round(0, [rs[i] for i in order], [])["train_loss"])
        rs = [Result(r.task_id, 0, r.cid, {"w": np.zeros(1, np.float32)}, r.body, r.num_examples)
              for r in rs]
    assert len(losses) == 1
