"""A client process whose handshake the server refused (a wrong join key or run key): libzmq
drops the DEALER's pipe until a reconnect, so a send has no connection to queue on. Such a
send waited forever (a `fednet clients` with a wrong key hung past its --timeout whenever its
first hello came after the refusal); now it is given up within the link's recheck time, and
registration ends with the error that names the key."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from fednet.client.host import Host
from fednet.config.liveness import DEFAULT
from fednet.errors import ConfigError
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import gate_password, new_run_key
from fednet.transport import gate
from fednet.transport.channels import bind_router


@pytest.fixture
def gated_server():
    ctx = zmq.Context()
    guard = gate.Gate(ctx, gate_password(new_run_key()))
    sock, endpoint = bind_router(ctx, "127.0.0.1", 0, setup=gate.server)
    yield endpoint
    sock.close(0)
    guard.stop()
    ctx.term()


def _refused(host: Host) -> None:
    deadline = time.monotonic() + 10
    while not host.link.denied and time.monotonic() < deadline:
        host.link.watch()
        time.sleep(0.02)
    assert host.link.denied, "the server never refused the handshake"
    time.sleep(0.3)  # libzmq dropped the pipe: the next send has nowhere to go


def _hellos_in(host: Host, limit_s: float) -> bool:
    """Whether a READY(hellos) returned within limit_s (it runs in a thread: a send that waits
    forever must fail this test, not hang it)."""
    t = threading.Thread(target=host.enroll.hellos, args=(np.array([0, 1], np.int64),),
                         daemon=True)
    t.start()
    t.join(limit_s)
    return not t.is_alive()


def test_a_send_after_a_refused_handshake_is_given_up_not_waited_for(gated_server):
    """Without the bound, about one send in three after a refusal waited (30 s and more, until a
    reconnect that may never come); four processes' hellos each return within the recheck time
    (1 s) and a little more."""
    for i in range(4):
        host = Host([0, 1], gated_server, run_key=new_run_key(), liveness=DEFAULT)
        _refused(host)
        if not _hellos_in(host, 3.0):
            pytest.fail("a READY(hellos) after a refused handshake waited for a connection")
        try:
            if i == 0:  # and registration ends with the error that names the key
                t0 = time.monotonic()
                with pytest.raises(ConfigError, match="refused this host at the handshake"):
                    host.register(1.0)
                assert time.monotonic() - t0 < 5
        finally:
            host.close()


@pytest.fixture
def plain_server():
    ctx = zmq.Context()
    sock, endpoint = bind_router(ctx, "127.0.0.1", 0)
    yield endpoint
    sock.close(0)
    ctx.term()


def test_a_send_with_no_connection_waits_for_the_link_and_no_longer(plain_server):
    """A link with no pipe at all (disconnected: every send finds no connection): the send is
    tried again while a connection may still come, given up once the handshake was refused,
    or after lost_timeout without one; nothing is counted for a message not sent."""
    host = Host([0], plain_server, liveness=DEFAULT.scaled(0.2))  # recheck every 0.2 s
    try:
        link, c = host.link, host.first
        link.sock.disconnect(plain_server)
        link.lost_timeout = 1.0
        msg = lambda: Message(MsgKind.HEARTBEAT, c.name)  # noqa: E731
        t0, sent = time.monotonic(), []
        t = threading.Thread(target=lambda: sent.append(c.send(msg())), daemon=True)
        t.start()
        t.join(5.0)
        if t.is_alive():  # (the host is left open: closing it would wait for that send)
            host = None
            pytest.fail("a send with no connection waited for one past lost_timeout")
        assert sent == [0] and 1.0 <= time.monotonic() - t0 < 2.0  # retried, then given up
        link.denied = True
        t0 = time.monotonic()
        assert c.send(msg()) == 0
        assert time.monotonic() - t0 < 0.6  # one recheck
        assert c.ledger.totals()["client_to_server"] == 0
    finally:
        if host is not None:
            host.close()
