"""--clients-per-process auto (platform/packing.py): the rule for given cores, memory, devices."""
from __future__ import annotations

import pytest

from fednet.platform import packing
from fednet.platform.packing import MiB, Machine, choose, client_device_bytes

GiB = 1 << 30
GB = 10 ** 9
RESNET18_BYTES = 44_729_800          # fednet's resnet18 state for 10 classes (core/footprint.py)
CIFAR_SHARE_100 = 50_000 * 3 * 32 * 32 * 4 // 100  # float32 training set over 100 clients


def test_one_process_per_client_at_16_clients_on_2_cores():
    c = choose(16, Machine(cores=2, mem_available=22 * GiB))
    assert (c.per_process, c.processes, c.auto) == (1, 16, True)
    assert "one process per client" in c.reason and "2 cores" in c.reason


def test_beyond_8_processes_per_core_clients_are_grouped_8_processes_per_core():
    m = Machine(cores=2, mem_available=22 * GiB)
    assert choose(16, m).per_process == 1
    c = choose(100, m)  # beyond 8 per core: 8 processes per core, the clients shared evenly
    assert (c.per_process, c.processes) == (7, 15)
    assert c.reason == "auto: over 8 processes per core on 2 cores: grouped, 7.5 processes per " \
                       "core (at most 8)"
    c = choose(1000, m)
    assert (c.per_process, c.processes) == (63, 16)
    assert c.reason.endswith("grouped, 8 processes per core (at most 8)")
    c = choose(20, m)  # the count it makes, not the most it may make (issue 41 item 7)
    assert (c.per_process, c.processes) == (2, 10)
    assert c.line(20) == ("20 clients in 10 processes (2 clients per process): auto: over 8 "
                          "processes per core on 2 cores: grouped, 5 processes per core (at most 8)")
    assert choose(5000, m).processes == 16
    assert choose(128, Machine(cores=16, mem_available=64 * GiB)).per_process == 1


def test_memory_limits_the_processes():
    c = choose(1000, Machine(cores=64, mem_available=2 * GiB))  # half of 2 GiB / 32 MiB = 32
    assert (c.per_process, c.processes) == (32, 32)
    assert "available" in c.reason


def test_an_explicit_number_wins_and_real_time_keeps_one_per_client():
    m = Machine(cores=2, mem_available=22 * GiB)
    c = choose(1000, m, requested=3)
    assert (c.per_process, c.processes, c.auto) == (3, 334, False)
    assert choose(10, m, requested=10).processes == 1
    assert choose(1000, m, real_time=True).per_process == 1


def test_100_clients_on_two_24_gb_cards_fit():
    """`fednet launch --clients 100 --gpus 0,1` on CIFAR-sized data: one process per client
    would need 50 CUDA contexts per card (50 x 768 MiB = 37.5 GiB > 24 GB)."""
    m = Machine(cores=16, mem_available=64 * GiB, device_bytes=(24 * GB, 24 * GB))
    for model_bytes in (RESNET18_BYTES, 3_200_000):  # ResNet-18, a FedSeq-sized CNN
        per_client = client_device_bytes(model_bytes, CIFAR_SHARE_100)
        c = choose(100, m, gpus=(0, 1), per_client_device=per_client)
        procs_per_card = -(-c.processes // 2)
        clients_per_card = min(100, procs_per_card * c.per_process)
        need = procs_per_card * (packing.CUDA_CONTEXT_BYTES + packing.DEVICE_WORKSPACE_BYTES) \
            + clients_per_card * per_client
        assert need <= 0.9 * 24 * GB
        assert c.per_process > 1 and "CUDA context" in c.reason
        # the smallest such number: one fewer client per process would not fit
        k = c.per_process - 1
        procs = -(-100 // k)
        less = -(-procs // 2) * (packing.CUDA_CONTEXT_BYTES + packing.DEVICE_WORKSPACE_BYTES) \
            + min(100, -(-procs // 2) * k) * per_client
        assert less > 0.9 * 24 * GB
    resnet = choose(100, m, gpus=(0, 1),
                    per_client_device=client_device_bytes(RESNET18_BYTES, CIFAR_SHARE_100))
    assert (resnet.per_process, resnet.processes) == (4, 25)


def test_a_large_device_keeps_one_process_per_client():
    m = Machine(cores=16, mem_available=120 * GiB, device_bytes=(141 * GB,))
    c = choose(100, m, gpus=(0,),
               per_client_device=client_device_bytes(RESNET18_BYTES, CIFAR_SHARE_100))
    assert (c.per_process, c.processes) == (1, 100)


def test_device_rule_says_when_nothing_fits():
    m = Machine(cores=16, mem_available=64 * GiB, device_bytes=(2 * GB,))
    c = choose(100, m, gpus=(0,), per_client_device=100 * MiB)
    assert c.per_process == 100 and "does not fit" in c.reason


def test_model_bytes_of_resnet18_on_the_meta_device():
    from fednet.config import RunConfig
    from fednet.core.footprint import model_bytes

    cfg = RunConfig(clients=100)
    assert model_bytes(cfg) == 61_864  # the digits CNN: the bytes the ledger counts per model
    cfg = cfg.replace(**{"train.model": "resnet18"})
    assert model_bytes(cfg) == RESNET18_BYTES


@pytest.mark.parametrize("text,want", [("auto", 0), ("AUTO", 0), ("1", 1), ("12", 12)])
def test_option_accepts_auto_or_a_number(text, want):
    from fednet.cli.options_extra import PerProcess

    assert PerProcess().convert(text, None, None) == want


@pytest.mark.parametrize("text", ["0", "-1", "two", ""])
def test_option_refuses_anything_else(text):
    import click

    from fednet.cli.options_extra import PerProcess

    with pytest.raises(click.BadParameter, match="auto or a number"):
        PerProcess().convert(text, None, None)


@pytest.mark.slow
@pytest.mark.net
def test_launch_records_what_auto_chose(tmp_path, monkeypatch):
    """A real launch: the summary says how the clients were grouped and why; 128 clients on a
    machine seen as 1 core (8 processes at most) run as 8 processes of 16 clients."""
    from fednet.server.main import run_zmq
    from tests.conftest import small_config

    monkeypatch.setattr(packing.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(packing, "mem_available", lambda: 16 << 30)
    s = run_zmq(small_config(clients=128, rounds=1, out=str(tmp_path / "a")), quiet=True)
    got = s["clients_per_process"]
    assert (got["per_process"], got["processes"], got["auto"]) == (16, 8, True)
    assert got["reason"] == ("auto: over 8 processes per core on 1 core: grouped, 8 processes "
                             "per core (at most 8)")
    assert s["status"] == "completed" and s["clients"] == 128
    s = run_zmq(small_config(clients=3, rounds=1, out=str(tmp_path / "b"),
                             net={"clients_per_process": 2}), quiet=True)
    assert s["clients_per_process"] == {"per_process": 2, "processes": 2, "auto": False,
                                        "reason": "--clients-per-process 2 as given"}


def test_a_big_model_makes_each_process_count_for_more_memory():
    """ResNet-18 on a 2-core machine with 2 GiB available: a process keeps ~3 models of heap
    beyond its clients' own, so 16 clients share processes; the digits CNN changes nothing."""
    m = Machine(cores=2, mem_available=2 * GiB)
    assert choose(16, m, model_bytes=61_864).per_process == 1
    c = choose(16, m, model_bytes=RESNET18_BYTES)
    per = packing.PROCESS_BYTES + packing.HOST_MODEL_COPIES * RESNET18_BYTES
    assert c.processes == -(-16 // c.per_process) and c.processes <= 1 * GiB // per
    assert c.per_process == 3 and "fit half of the 2.0 GiB" in c.reason


def test_auto_keeps_every_process_within_its_open_files_limit():
    """50,000 clients on 2 cores would be 16 processes of 3,125 (25,064 files each) against a
    limit of 20,000: auto makes more, smaller processes instead."""
    from fednet.platform.proc import FILES_PER_CLIENT, FILES_RESERVE

    c = choose(50_000, Machine(cores=2, mem_available=20 << 30, files=20_000))
    assert FILES_PER_CLIENT * c.per_process + FILES_RESERVE <= 20_000
    assert c.per_process * c.processes >= 50_000 and c.processes == 21
    assert "open-files limit of 20000" in c.reason
    assert choose(10_000, Machine(cores=2, mem_available=20 << 30, files=20_000)).processes == 16


def test_the_server_refuses_more_client_processes_than_its_open_files_limit(monkeypatch):
    import resource

    from fednet.errors import ConfigError
    from fednet.platform import proc

    monkeypatch.setattr(resource, "getrlimit", lambda _: (20_000, 20_000))
    # the clients of a process share one connection: a million clients in 16 processes fit
    proc.check_server_connections(1_000_000, 62_500, launch=True)
    proc.check_server_connections(1_000_000, 0, launch=True)  # auto packs far below
    with pytest.raises(ConfigError, match=r"--clients-per-process: .* 50000 here, and needs "
                                          r"about 50256 open files; the limit is 20000 \(hard "
                                          r"limit 20000"):
        proc.check_server_connections(50_000, 1, launch=True)
    warned = proc.check_server_connections(50_000, 0, launch=False)  # fednet server: a warning
    assert "if every client host runs one process per client" in warned


def test_a_device_listed_twice_is_two_slots_sharing_its_memory():
    two = Machine(cores=16, mem_available=100 << 30, device_bytes=(24 << 30, 24 << 30))
    per_client = 150 * MiB
    b = choose(100, two, 0, (0, 0), per_client)
    c = choose(100, two, 0, (0, 1), per_client)
    # both slots' processes and all 100 clients on device 0 fit 90% of it
    assert b.processes * (packing.CUDA_CONTEXT_BYTES + packing.DEVICE_WORKSPACE_BYTES) \
        + 100 * per_client <= 0.9 * (24 << 30)
    assert c.per_process < b.per_process  # two real devices hold more processes


def test_batched_runs_use_one_process_a_core_but_the_servers(monkeypatch):
    """--batch-clients: a process trains the tasks it holds in blocks, so auto makes as few
    processes as keep the cores busy (cores - 1, the server's aside), within the memory limit;
    per_process_choice asks for it only when the algorithm batches."""
    from fednet.server.main import per_process_choice
    from tests.conftest import small_config

    m = Machine(cores=2, mem_available=22 * GiB)
    c = choose(1_000_000, m, batched=True, handoffs=False)  # (FedAvg hands no model over)
    assert (c.per_process, c.processes) == (1_000_000, 1)
    assert c.reason == ("auto: --batch-clients: 2 cores, one process a core but the server's, "
                        "each training its clients' tasks in large blocks")
    assert choose(100, Machine(cores=16, mem_available=64 * GiB), batched=True).processes == 15
    assert choose(1000, Machine(cores=64, mem_available=1 * GiB), batched=True).processes == 16
    assert choose(100, m, requested=10, batched=True).processes == 10  # a number still wins
    monkeypatch.setattr(packing.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(packing, "mem_available", lambda: 16 << 30)
    for algo, batch, procs in (("fedavg", 100, 1), ("fedavg", 0, 15), ("scaffold", 100, 15)):
        cfg = small_config(clients=100, algo={"name": algo}, train={"batch_clients": batch})
        assert per_process_choice(cfg).processes == procs, (algo, batch)
