"""GPU pinning: round-robin assignment, clear errors, and a real CUDA run when one exists."""
from __future__ import annotations

import pytest
import torch

from fednet.errors import ConfigError
from fednet.platform.gpus import check_gpus, device_for, parse_gpus
from fednet.launch.spawn import client_specs


def test_round_robin_assignment():
    assert [device_for(i, (0, 1)) for i in range(5)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert [device_for(i, (3,)) for i in range(2)] == ["cuda:3", "cuda:3"]
    assert device_for(7, ()) == "cpu"
    specs = client_specs(4, "tcp://127.0.0.1:1", (0, 1), 1)
    assert [s["device"] for s in specs] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]


def test_parse_gpus():
    assert parse_gpus("0,1") == (0, 1)
    assert parse_gpus("") == () and parse_gpus(None) == ()
    assert parse_gpus("0,0") == (0, 0)  # two slots on device 0
    for bad in ("x", "-1", "0,-1"):
        with pytest.raises(ConfigError, match="--gpus"):
            parse_gpus(bad)


def test_missing_gpu_fails_at_once_with_a_clear_message():
    with pytest.raises(ConfigError, match="no CUDA device is visible"):
        check_gpus((0,), available=0)
    with pytest.raises(ConfigError, match="device 2 does not exist .* 2 CUDA device"):
        check_gpus((0, 2), available=2)
    check_gpus((0, 1), available=2)
    check_gpus((), available=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_client_trains_on_cuda(tmp_path):
    from fednet.core.inproc import run_local
    from tests.conftest import small_config

    s = run_local(small_config(gpus=[0], out=str(tmp_path)), quiet=True)
    assert set(s["devices"]) == {"cuda:0"}
    assert s["final_accuracy"] > 0.3


def test_clients_per_process_groups_consecutive_ids_and_pins_processes_round_robin():
    specs = client_specs(7, "tcp://127.0.0.1:1", (0, 1), 1, per_process=3)
    assert [s["cids"] for s in specs] == [range(0, 3), range(3, 6), range(6, 7)]
    assert [s["device"] for s in specs] == ["cuda:0", "cuda:1", "cuda:0"]
    one = client_specs(3, "tcp://127.0.0.1:1", (), 1, ids=[5, 9, 11])
    assert [(s["cids"], s["device"]) for s in one] == [([5], "cpu"), ([9], "cpu"), ([11], "cpu")]
