"""A model that takes longer to cross a link than the heartbeat timeout is not taken for a dead
peer: large arrays travel as 256 KiB frames, and ZeroMQ's heartbeats pass between frames. Both
ends run their liveness timers at SCALE times the defaults (config/liveness.py), the model is
sized to take twice the server's heartbeat timeout."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import zmq

from fednet.metrics.accounting import Ledger
from fednet.protocol import Message, MsgKind
from fednet.config.liveness import DEFAULT
from fednet.transport.channels import Channel, bind_router, connect_dealer

pytestmark = [pytest.mark.net, pytest.mark.slow]

RATE = 4_000_000  # bytes per second, client -> server
SCALE = 0.1
LIVE = DEFAULT.scaled(SCALE)


def _relay(target: tuple[str, int]) -> int:
    """A TCP relay on loopback that forwards at RATE towards `target` (full speed back)."""
    ls = socket.create_server(("127.0.0.1", 0))

    def pipe(a: socket.socket, b: socket.socket, slow: bool) -> None:
        try:
            while data := a.recv(16384):
                b.sendall(data)
                if slow:
                    time.sleep(len(data) / RATE)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        c, _ = ls.accept()
        u = socket.create_connection(target)
        threading.Thread(target=pipe, args=(c, u, True), daemon=True).start()
        threading.Thread(target=pipe, args=(u, c, False), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    return ls.getsockname()[1]


def test_a_transfer_longer_than_the_heartbeat_timeout_arrives():
    ctx = zmq.Context()
    server, endpoint = bind_router(ctx, "127.0.0.1", 0, live=LIVE)
    mon = server.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    port = _relay(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
    client = connect_dealer(ctx, f"tcp://127.0.0.1:{port}", live=LIVE)
    schan = Channel(server, Ledger(), "server", router=True)
    cchan = Channel(client, Ledger(), "c0000", router=False)
    timeout_s = LIVE.heartbeat_timeout_ms / 1000
    model = np.arange(int(2 * timeout_s * RATE) // 4, dtype=np.float32)  # twice the timeout
    body = {"n": 1, "body": {}}
    try:
        t0 = time.monotonic()
        cchan.send(Message(MsgKind.RESULT, "c0000", "r", 0, 1, 0.0, body, {"w": model}), "server")
        assert server.poll(30_000), "nothing arrived"
        took = time.monotonic() - t0
        got = schan.recv()
        assert got is not None and np.array_equal(got.msg.arrays["w"], model)
        assert took > 1.5 * timeout_s  # it really was slower than the timeout
        assert not mon.poll(0), "the connection was dropped as dead during the transfer"
    finally:
        server.disable_monitor()
        mon.close(0)
        client.close(0)
        server.close(0)
        ctx.term()
