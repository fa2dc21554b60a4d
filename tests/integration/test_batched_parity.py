"""--batch-clients under both runtimes (issue 56 item 2): fednet local and fednet launch agree
bit for bit in batched mode, although a launch client process holds other blocks than local's
(here 3 clients a process, blocks of 4 in local): a client's bits do not depend on its block
(tests/test_batched_runtime.py)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import small_config
from tests.harness import assert_agree, final_model, run_both

pytestmark = [pytest.mark.net, pytest.mark.slow]


@pytest.mark.parametrize("algo, params", [("fedavg", {}), ("fedprox", {"mu": 0.1})])
def test_local_and_launch_agree_bit_for_bit_batched(tmp_path, algo, params):
    cfg = small_config(clients=10, rounds=2, latency={"preset": "hetero"},
                       algo={"name": algo, "params": params},
                       train={"batch_clients": 4, "momentum": 0.5},
                       net={"clients_per_process": 3})
    a, b, ma, mb = run_both(tmp_path, cfg)
    assert b["status"] == "completed" and not b["failures"]
    assert_agree(a, b, ma, mb)  # model, ledger, messages, simulated time
    assert a["sim_time_s"] > 0 and a["final_accuracy"] == b["final_accuracy"]
    plain = cfg.replace(**{"train.batch_clients": 0, "out": str(tmp_path / "plain")})
    from fednet.core.inproc import run_local

    c = run_local(plain, quiet=True)
    assert c["bytes"] == a["bytes"] and c["sim_time_s"] == a["sim_time_s"]
    plain_model = final_model(tmp_path / "plain")
    assert any(not np.array_equal(plain_model[k], ma[k]) for k in ma), "local did not batch"
