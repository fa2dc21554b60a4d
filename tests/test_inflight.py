"""How many tasks a client process is sent (server/inflight.py) and when it decodes them
(client/app.py), and glibc keeping freed memory for big models (platform/malloc.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import replace

import numpy as np
import pytest
import zmq

from fednet.client.host import Host
from fednet.metrics.accounting import Ledger
from fednet.platform.malloc import BIG_MODEL_BYTES
from fednet.protocol import Message, MsgKind
from fednet.server.inflight import (PROCESS_CAP, RESERVE_MODELS, RESERVE_SHARE, next_task,
                                     process_cap, reserve_bytes)
from fednet.transport.channels import Channel, Deferred
from fednet.types import Task
from fednet.core.wire import task_message
from tests.conftest import small_config


def _drain(queue, pending, max_inflight, cap, proc):
    sent = []
    while (t := next_task(queue, pending, max_inflight, cap, proc)) is not None:
        pending[t.task_id] = t
        sent.append(t.cid)
    return sent


def test_a_process_gets_at_most_its_cap_and_the_next_task_when_one_returns():
    queue = deque(Task(cid + 1, 0, [cid]) for cid in range(30))
    pending: dict[int, Task] = {}
    proc = lambda cid: cid // 10  # noqa: E731 - 3 processes of 10 clients
    assert _drain(queue, pending, 0, 2, proc) == [0, 1, 10, 11, 20, 21]  # queue order kept
    assert len(queue) == 24
    del pending[11 + 1]  # client 11's result is in: its process may take one more
    assert _drain(queue, pending, 0, 2, proc) == [12]
    del pending[0 + 1], pending[1 + 1]
    assert _drain(queue, pending, 0, 2, proc) == [2, 3]


def test_max_inflight_counts_every_task_and_no_cap_sends_in_order():
    queue = deque(Task(cid + 1, 0, [cid]) for cid in range(6))
    assert _drain(queue, {}, 4, 0, lambda c: c) == [0, 1, 2, 3]
    queue = deque(Task(cid + 1, 0, [cid]) for cid in range(6))
    assert _drain(queue, {}, 0, 0, lambda c: 0) == [0, 1, 2, 3, 4, 5]  # all at once


def test_the_cap_applies_to_big_models_under_the_defaults_only():
    cfg = small_config()
    assert process_cap(cfg, BIG_MODEL_BYTES) == PROCESS_CAP == 2
    assert process_cap(cfg, BIG_MODEL_BYTES - 1) == 0  # digits: every task at once, as before
    assert process_cap(replace(cfg, net=replace(cfg.net, max_inflight=8)), 1 << 30) == 0
    assert process_cap(replace(cfg, latency=replace(cfg.latency, real=True)), 1 << 30) == 0


def test_tasks_are_read_at_once_and_decoded_when_they_run_control_messages_at_once():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    host = Host([0], f"tcp://127.0.0.1:{port}")
    c = host.first
    try:
        host.enroll.hellos(np.array([0], np.int64))
        assert router.poll(5000)
        route, sub = router.recv_multipart()[:2]  # the connection, then the client's envelope
        route += sub
        chan = Channel(router, Ledger(), "server", router=True, enveloped=True)
        sent = 0
        for i in range(3):
            t = Task(i + 1, 0, [0], {"w": np.full(100_000, i, np.float32)})  # 2 frames each
            sent += chan.send(task_message(t, ""), "c0000", route=route)[0]
        chan.send(Message(MsgKind.SHUTDOWN, "server", arrays={"cids": np.array([0], np.int64)}),
                  "c0000", route=route)
        deadline = time.monotonic() + 5
        while not c.stopping and time.monotonic() < deadline:
            c.pump(100)
        assert c.stopping  # SHUTDOWN is seen at once, behind three queued tasks
        assert [type(m) for m, _ in c.work] == [Deferred] * 3  # none decoded yet
        assert c.ledger.totals().get("server_to_client", 0) < sent  # nor counted yet
        msg, _ = c.work[0]
        got = c._accepted(c.server.finish(msg))  # what _run_task does first
        assert (got.msg.kind, got.msg.task_id, float(got.msg.arrays["w"][0])) == (MsgKind.TASK,
                                                                                   1, 0.0)
        c.work.popleft()
        host.enroll.together([c], [])  # its BYE: the two tasks never run are decoded and
        assert not c.work  # counted before the totals go out
        assert c.ledger.totals()["server_to_client"] >= sent
    finally:
        host.close()
        router.close(0)
        ctx.term()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_big_model_process_joins_the_next_model_into_pages_already_mapped():
    """A 16 MiB array allocated, written and freed three times: with reuse_freed_memory the
    second and third take no new pages; with glibc's defaults they fault them in again."""
    code = """
import resource, sys
import numpy as np
from fednet.platform.malloc import reuse_freed_memory, BIG_MODEL_BYTES
assert not reuse_freed_memory(BIG_MODEL_BYTES - 1)
if sys.argv[1] == "reuse":
    assert reuse_freed_memory(BIG_MODEL_BYTES) and reuse_freed_memory(0)  # once is enough
faults = []
for _ in range(3):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(16 << 20, np.uint8)
    a[:] = 1
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    del a
print(*faults)
"""
    env = dict(os.environ, NUMPY_MADVISE_HUGEPAGE="0")  # 4 KiB pages: countable faults
    out = {}
    for mode in ("reuse", "default"):
        p = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                           env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        out[mode] = [int(x) for x in p.stdout.split()]
    pages = (16 << 20) // 4096
    assert out["reuse"][0] > pages // 2  # the first one is new memory either way
    assert max(out["reuse"][1:]) < pages // 20, out
    assert max(out["default"][1:]) > pages // 2, out  # what it saves


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_frames_zmq_receives_land_in_the_heap_reserved_before():
    """40 MiB received over TCP in 256 KiB frames (allocated by zmq's I/O thread, all held at
    once): after one_arena and reserve they take almost no new pages; without the reserve, or
    with it but with the I/O thread in a heap of its own (glibc's default), they fault them in."""
    code = """
import resource, sys, threading
import numpy as np, zmq
from fednet.platform import malloc
arena, reserve = sys.argv[1] == "1", sys.argv[2] == "1"
if arena:
    assert malloc.one_arena()
assert malloc.reserve(64 << 20) == 0  # freed memory is not kept yet: nothing to reserve
assert malloc.reuse_freed_memory(malloc.BIG_MODEL_BYTES)
ctx = zmq.Context()
rx = ctx.socket(zmq.PULL)
port = rx.bind_to_random_port("tcp://127.0.0.1")
tx = ctx.socket(zmq.PUSH)
tx.connect(f"tcp://127.0.0.1:{port}")
tx.send(b"hello"); rx.recv()  # the I/O thread has allocated (its arena is chosen) by now
if reserve:
    assert malloc.Reserve(64 << 20).join() >= 64 << 20
frame = np.ones(256 << 10, np.uint8)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
tx.send_multipart([frame] * 160, copy=False)
held = rx.recv_multipart(copy=False)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, len(held))
"""
    env = dict(os.environ, NUMPY_MADVISE_HUGEPAGE="0")
    out = {}
    for arena, reserve in (("1", "1"), ("1", "0"), ("0", "1")):
        p = subprocess.run([sys.executable, "-c", code, arena, reserve], capture_output=True,
                           text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        faults, frames = (int(x) for x in p.stdout.split())
        assert frames == 160
        out[arena + reserve] = faults
    pages = (40 << 20) // 4096
    assert out["11"] < pages // 10, out
    assert out["10"] > pages // 2, out  # no reserve: new pages
    assert out["01"] > pages // 2, out  # the I/O thread's own arena: the reserve is elsewhere


def test_the_server_reserves_room_for_the_results_out_at_once():
    cfg = small_config(clients=100)
    mb = 45_000_000
    assert reserve_bytes(cfg, BIG_MODEL_BYTES - 1, 1 << 40) == 0  # small models: nothing
    assert reserve_bytes(cfg, mb, 1 << 40) == RESERVE_MODELS * mb  # 100 out: at most 16
    net = replace(cfg.net, max_inflight=8)
    assert reserve_bytes(replace(cfg, net=net), mb, 1 << 40) == 8 * mb  # --max-inflight 8
    few = replace(cfg, algo=replace(cfg.algo, fraction=0.05))
    assert reserve_bytes(few, mb, 1 << 40) == 5 * mb  # 5 clients a round
    assert reserve_bytes(cfg, mb, 4 << 30) == int(RESERVE_SHARE * (4 << 30))  # memory share
