"""Clients of one process whose algorithm keeps no model between tasks share one working model
(core/executor.share_working_models, enabled by client/host for several clients per process);
clients with personal models keep their own. End to end, tests/integration/test_parity.py
(--clients-per-process 3, FedAvg and FedSeqInter) checks that results stay bit-identical."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.network import latency
from fednet.core.executor import Executor, share_working_models
from fednet.models import state_arrays
from tests.conftest import small_config


@pytest.fixture
def shared():
    share_working_models()
    try:
        yield
    finally:
        share_working_models(False)


def _executors(cfg):
    profiles = latency.profiles(cfg.latency, cfg.clients, cfg.seed)
    return [Executor(c, cfg, profiles[c], files=False) for c in range(3)]


def test_stateless_clients_share_one_working_model(shared):
    exs = _executors(small_config(clients=3))
    assert exs[0].ctx.model is exs[1].ctx.model is exs[2].ctx.model
    own = _executors(small_config(clients=3, seed=5))  # another model: its own working model
    assert own[0].ctx.model is own[1].ctx.model and own[0].ctx.model is not exs[0].ctx.model
    share_working_models(False)
    alone = _executors(small_config(clients=3))  # sharing off: one model per client again
    assert alone[0].ctx.model is not alone[1].ctx.model
    a, b = state_arrays(alone[0].ctx.model), state_arrays(exs[0].ctx.model)
    assert all(np.array_equal(a[k], b[k]) for k in a)  # the same seeded initial weights


def test_personal_models_are_never_shared(shared):
    exs = _executors(small_config(clients=3, algo={"name": "standalone"}))
    assert len({id(e.ctx.model) for e in exs}) == 3
    ws = [e.ctx.model.state_dict() for e in exs]
    assert not any(np.shares_memory(ws[0][k].numpy(), ws[1][k].numpy()) for k in ws[0])
