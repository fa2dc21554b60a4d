"""A malicious client inside its executor (algorithms/attack_client.py): the colluders' honest
updates it computes are bit for bit the ones they compute themselves, and what it sends keeps the
honest layout, dtypes and sample count."""
from __future__ import annotations

import numpy as np

from fednet.algorithms import attack_client as AC
from fednet.algorithms import robust_spec as S
from fednet.core.executor import Executor
from fednet.models.arrays import state_arrays
from fednet.network import latency
from fednet.types import Task
from tests.conftest import small_config


def _executor(cfg, cid):
    return Executor(cid, cfg, latency.profiles(cfg.latency, cfg.clients, cfg.seed)[cid],
                    files=False)


def _task(ex, cid):
    arrays = {k: np.array(a, copy=True) for k, a in state_arrays(ex._initial()).items()}
    return Task(1, 0, [cid], arrays, {"epochs": 1, "lr": 0.1})


def test_colluders_honest_updates_are_their_own_and_forgery_keeps_the_layout():
    cfg = small_config(clients=6, attack={"name": "alie", "malicious": "ids:1,4"})
    assert S.malicious_ids(cfg) == [1, 4]
    bad, other = _executor(cfg, 1), _executor(cfg, 4)
    assert bad.attack is not None and _executor(cfg, 0).attack is None
    t = _task(bad, 1)
    received = AC.snapshot(t.arrays)
    simulated = AC.honest_update(bad, 4, t, received)
    own, _ = other.update.run(other.ctx, _task(other, 4))
    assert all(np.array_equal(simulated[k], own[k]) for k in own)
    honest, body = bad.update.run(bad.ctx, t)
    honest = {k: np.array(a, copy=True) for k, a in honest.items()}
    sent = bad.attack.forge(bad, t, honest, received)
    assert {k: (a.shape, a.dtype) for k, a in sent.items()} == \
        {k: (a.shape, a.dtype) for k, a in honest.items()}
    assert all(np.isfinite(a).all() for a in sent.values())
    assert any(not np.array_equal(sent[k], honest[k]) for k in honest)
    assert bad.num_examples == len(bad.ctx.y)  # the partition's count, as the server expects


def test_poisoned_data_keeps_its_size():
    cfg = small_config(clients=6, attack={"name": "labelflip", "malicious": "ids:2"})
    honest_y = _executor(small_config(clients=6), 2).ctx.y
    ex = _executor(cfg, 2)
    assert ex.ctx.y.tolist() == (9 - honest_y).tolist()
    cfg = small_config(clients=6, attack={"name": "backdoor", "malicious": "ids:2",
                                          "params": {"poison": 0.5}})
    ex = _executor(cfg, 2)
    assert len(ex.ctx.y) == len(honest_y) and int((ex.ctx.y == 0).sum()) >= len(honest_y) // 2
