"""What one connection can do to the server, over a real socket (issue 36, item 6): a reply it
cannot read ends its client's task at once (not at --round-timeout); a connection that holds no
client id has nothing but a bounded registration read (its other messages are never joined into
memory); a second live claim of an id is refused and named; a client's READY cannot set its
own weight; random envelopes write a handful of log lines, not one per message."""
from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import pytest
import zmq

from fednet.config.liveness import DEFAULT
from fednet.core.session import Session
from fednet.data.partition import part_size
from fednet.protocol import Message, MsgKind, decode, encode
from fednet.server.app import ZmqServer
from fednet.transport.channels import sub_frame
from fednet.types import Task, client_name
from tests.conftest import small_config

pytestmark = pytest.mark.net


@pytest.fixture
def server():
    cfg = small_config(clients=3, net={"round_timeout": 120},
                       liveness=DEFAULT.scaled(0.25).to_dict())  # a hello per route in 0.5 s
    srv = ZmqServer(Session(cfg, quiet=True, write=False))
    yield srv
    srv.close()


def _dealer(srv: ZmqServer) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(srv.endpoint)
    return s


def _send(s: zmq.Socket, cid: int, msg: Message, cut: int = 0) -> None:
    frames = [bytes(f) for f in encode(msg)]
    if cut:
        frames[-1] = frames[-1][:-cut]
    s.send_multipart([sub_frame(cid)] + frames)


def _recv(s: zmq.Socket, srv: ZmqServer, timeout_s: float = 5.0) -> Message:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        srv._poll_once(0.02)
        if s.poll(10):
            return decode(s.recv_multipart()[1:])
    raise AssertionError("no answer from the server")


def _hello(cid: int) -> Message:
    return Message(MsgKind.READY, client_name(cid), "", body={"phase": "hellos"},
                   arrays={"cids": np.array([cid], np.int64)})


def _ready(cid: int, n: int) -> Message:
    return Message(MsgKind.READY, client_name(cid), "", body={"phase": "readys"},
                   arrays={"cids": np.array([cid], np.int64), "n": np.array([n], np.int64)})


def _register(srv: ZmqServer, cid: int, n: int | None = None) -> zmq.Socket:
    s = _dealer(srv)
    _send(s, cid, _hello(cid))
    got = _recv(s, srv)
    assert got.kind == MsgKind.WELCOME, got
    want = part_size(srv.s.parts, cid)
    _send(s, cid, _ready(cid, want if n is None else n))
    for _ in range(20):
        srv._poll_once(0.02)
    return s


def test_a_reply_the_server_cannot_read_ends_its_task_at_once(server):
    s = _register(server, 0)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(
        r=server.run_round(0, [Task(1, 0, [0], {"w": np.zeros(4, np.float32)})])))
    t0 = time.monotonic()
    t.start()
    while not s.poll(10) and time.monotonic() - t0 < 10:
        pass
    task = decode(s.recv_multipart()[1:])
    reply = Message(MsgKind.RESULT, "c0000", server.s.run_id, 0, task.task_id, 1.0,
                    {"n": part_size(server.s.parts, 0), "body": {}},
                    {"w": np.zeros(100_000, np.float32)})
    _send(s, 0, reply, cut=10)  # its last array frame cut short: undecodable
    t.join(30)
    results, failures = out["r"]
    assert not results and len(failures) == 1
    assert "client 0's reply could not be read" in failures[0].reason
    assert time.monotonic() - t0 < 20, "the round waited for --round-timeout"
    s.close()


def test_a_connection_without_a_client_id_has_nothing_joined(server, caplog):
    """Finished messages of 1 MiB from connections that registered nothing: refused unread,
    counted as rejected bytes, a few log lines for thousands of messages."""
    import psutil

    me = psutil.Process()
    socks = [_dealer(server) for _ in range(40)]
    for _ in range(20):
        server._poll_once(0.01)
    big = Message(MsgKind.RESULT, "c0000", server.s.run_id, 0, 1, 1.0, {"n": 5, "body": {}},
                  {"w": np.zeros(1 << 18, np.float32)})  # 1 MiB
    frames = [bytes(f) for f in encode(big)]
    before = me.memory_info().rss
    peak = before
    with caplog.at_level(logging.WARNING, logger="fednet"):
        for k in range(1, 5):
            for s in socks:
                s.send_multipart([os.urandom(4)] + frames)
            deadline = time.monotonic() + 10
            while (server.s.ledger.totals()["rejected_messages"] < 40 * k
                   and time.monotonic() < deadline):
                server._poll_once(0.01)
                peak = max(peak, me.memory_info().rss)
        for _ in range(20):  # nothing more arrives
            server._poll_once(0.01)
    tot = server.s.ledger.totals()
    assert tot["rejected_messages"] == 160
    assert tot["rejected"] == 160 * sum(map(len, frames))
    assert tot["client_to_server"] == 0
    assert (peak - before) / 2**20 < 120
    lines = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert 1 <= len(lines) <= 2, len(lines)  # lumped: not one per connection, envelope or message
    for s in socks:
        s.close()


def test_a_second_live_claim_of_an_id_is_refused_and_named(server):
    a = _register(server, 1)
    b = _dealer(server)
    _send(b, 1, _hello(1))
    got = _recv(b, server)
    assert got.kind == MsgKind.REJECT and "client 1 is already connected" in got.body["reason"]
    assert "answers" not in got.body  # the claim had no nonce
    claim = _hello(1)
    claim.body["nonce"] = nonce = os.urandom(16)
    time.sleep(server.s.cfg.liveness.hello_every_s)  # one hello per route in that time
    _send(b, 1, claim)
    got = _recv(b, server)
    assert got.kind == MsgKind.REJECT and got.body["answers"] == nonce  # which claim it refuses
    assert server.conns.route_of(1)[-4:] == sub_frame(1) and 1 in server.clients
    a.close()
    b.close()


def test_a_ready_that_claims_another_weight_is_refused(server):
    s = _dealer(server)
    _send(s, 2, _hello(2))
    assert _recv(s, server).kind == MsgKind.WELCOME
    _send(s, 2, _ready(2, 1 << 40))
    got = _recv(s, server)
    assert got.kind == MsgKind.REJECT and "the server's partition gave it" in got.body["reason"]
    assert 2 not in server.clients
    s.close()
