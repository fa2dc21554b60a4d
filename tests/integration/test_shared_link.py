"""The clients of one process share one server connection (client/link.py): the server sees one
connection for all of them, each message's envelope names its client, and a connection speaks
only for the ids it registered (proven, or first come under plaintext `fednet server`)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from fednet.client.host import Host
from fednet.core.session import Session
from fednet.data.partition import part_size
from fednet.protocol import Message, MsgKind, decode, encode
from fednet.server.app import ZmqServer
from fednet.transport.channels import sub_frame
from fednet.types import client_name
from tests.conftest import small_config

pytestmark = [pytest.mark.net]


def _server(clients: int) -> ZmqServer:
    return ZmqServer(Session(small_config(clients=clients), quiet=True, write=False))


def _serve_host(host: Host, codes: list[int]) -> threading.Thread:
    def main() -> None:
        host.register(30)
        codes.append(host.serve())
    t = threading.Thread(target=main, daemon=True)
    t.start()
    return t


def test_four_clients_of_one_process_register_over_one_connection():
    srv = _server(4)
    srv.s.ledger.keep_entries = True
    host = Host([0, 1, 2, 3], srv.endpoint)
    codes: list[int] = []
    t = _serve_host(host, codes)
    try:
        srv.wait_for_clients(4, 30)
        kinds = [e.kind for e in srv.s.ledger.entries]  # one message each way per step
        assert (kinds.count("READY"), kinds.count("WELCOME")) == (2, 1), kinds
        assert [srv.clients[c].num_examples for c in range(4)] == [len(srv.s.parts[c]) for c in range(4)]
        assert sorted(srv.clients) == [0, 1, 2, 3]
        assert len(srv.conns.on_fd) == 1 and len(srv.conns.links) == 1  # one TCP connection
        routes = [srv.conns.route_of(c) for c in range(4)]
        assert len({r[:-4] for r in routes}) == 1  # one connection id ...
        assert {r[-4:] for r in routes} == {sub_frame(c) for c in range(4)}
        srv.shutdown()
        t.join(10)
        byes = srv.fates.byes()
        assert codes == [0] and set(byes) == {0, 1, 2, 3}  # each client's own BYE
        # one BYE for the process: its clients' ledgers added up, kept with the first id
        assert byes[0]["control"] > 0 and all(byes[c] == {} for c in (1, 2, 3))
    finally:
        srv.close()
        host.close()


def _dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _send(s: zmq.Socket, envelope: int, msg: Message) -> None:
    s.send_multipart([sub_frame(envelope)] + [bytes(f) for f in encode(msg)])


def _hello(cid: int, sender: int | None = None) -> Message:
    return Message(MsgKind.READY, client_name(cid if sender is None else sender),
                   body={"phase": "hellos", "device": "cpu"},
                   arrays={"cids": np.array([cid], np.int64)})


def _ready(srv: ZmqServer, cid: int) -> Message:
    n = part_size(srv.s.parts, cid)  # the server's own count
    return Message(MsgKind.READY, client_name(cid), srv.s.run_id, body={"phase": "readys"},
                   arrays={"cids": np.array([cid], np.int64), "n": np.array([n], np.int64)})


def _pump(srv: ZmqServer, until=None, seconds: float = 1.0) -> None:
    """The server reads for `seconds` (up to 10 s, and no longer once `until()` holds)."""
    end = time.monotonic() + (seconds if until is None else 10.0)
    while time.monotonic() < end and not (until is not None and until()):
        srv._poll_once(0.05)


def _refused(srv: ZmqServer, before: int) -> bool:
    return srv.chan.rejects.total > before


def test_a_connection_speaks_only_for_the_ids_it_registered():
    """Plaintext `fednet server` (first come): connection A registers client 0. It cannot
    speak for client 1 by changing the envelope, nor register client 3 in client 2's envelope;
    connection B cannot speak for client 0 with client 0's envelope; messages without an
    envelope are nobody's."""
    srv = _server(4)
    ctx = zmq.Context()
    a, b = _dealer(ctx, srv.endpoint), _dealer(ctx, srv.endpoint)
    try:
        _send(a, 0, _hello(0))
        _pump(srv, lambda: srv.conns.route_of(0) is not None)
        assert srv.conns.route_of(0)[-4:] == sub_frame(0)
        assert a.poll(2000) and a.recv_multipart()[0] == sub_frame(0)  # WELCOME, enveloped
        before = srv.chan.rejects.total
        _send(a, 1, _ready(srv, 1))  # another id's envelope
        _send(a, 2, _hello(3))  # an envelope that is not the id it claims
        _send(a, 3, _hello(3, sender=2))  # a sender that is not the id it claims
        _send(b, 0, _ready(srv, 0))
        b.send_multipart([bytes(f) for f in encode(_hello(2))])  # no envelope at all
        b.send_multipart([b"\0\0\0"] + [bytes(f) for f in encode(_hello(2))])  # a cut one
        _pump(srv, lambda: srv.chan.rejects.total - before >= 6)
        _pump(srv, seconds=0.2)  # and nothing else
        assert srv.chan.rejects.total - before == 6
        assert srv.conns.route_of(1) is None and srv.conns.route_of(3) is None
        assert srv.conns.route_of(2) is None and not srv.clients  # no READY(readys) was taken
        _send(a, 0, _ready(srv, 0))
        _pump(srv, lambda: bool(srv.clients))
        assert list(srv.clients) == [0]  # the registered pair itself still works
    finally:
        a.close()
        b.close()
        ctx.term()
        srv.close()


def _hellos(cids, dtype=np.int64) -> Message:
    return Message(MsgKind.READY, client_name(int(cids[0])), body={"phase": "hellos"},
                   arrays={"cids": np.array(cids, dtype=dtype)})


def test_a_process_batch_claims_only_ids_it_may():
    """READY(hellos) under plaintext `fednet server`: a batch naming an id another connection
    holds is refused whole, as are a wrong envelope, a wrong dtype, a repeated or out-of-range
    id; an accepted batch binds each id on its own envelope, and READY(readys) is taken only
    for ids bound on that connection."""
    srv = _server(4)
    ctx = zmq.Context()
    a, b = _dealer(ctx, srv.endpoint), _dealer(ctx, srv.endpoint)
    try:
        _send(a, 1, _hello(1))
        _pump(srv, lambda: srv.conns.route_of(1) is not None)
        before = srv.chan.rejects.total
        for env, msg in [(0, _hellos([0, 1, 2])), (2, _hellos([0, 2])),
                         (0, _hellos([0, 2], np.int32)), (0, _hellos([0, 0])),
                         (0, _hellos([0, 9]))]:
            _send(b, env, msg)
        _pump(srv, lambda: srv.chan.rejects.total - before >= 5)
        _pump(srv, seconds=0.2)  # and nothing else
        assert srv.chan.rejects.total - before == 5
        assert srv.conns.route_of(1)[-4:] == sub_frame(1) and srv.conns.route_of(0) is None
        got = []
        while len(got) < 5 and b.poll(2000):
            got.append(decode(b.recv_multipart()[1:]))
        assert [m.kind for m in got] == [MsgKind.REJECT] * 5
        assert "client 1 is already connected" in got[0].body["reason"]
        _send(b, 0, _hellos([0, 2]))
        _pump(srv, lambda: srv.conns.route_of(2) is not None)
        assert b.poll(2000)
        parts = b.recv_multipart()
        w = decode(parts[1:])
        assert parts[0] == sub_frame(0) and w.kind == MsgKind.WELCOME
        assert w.arrays["cids"].tolist() == [0, 2]
        off = w.arrays["offsets"].tolist()
        assert w.arrays["indices"][off[1]:off[2]].tolist() == srv.s.parts[2].tolist()
        assert {srv.conns.route_of(c) for c in (0, 2)} == {srv.conns.route_of(0)[:-4] + sub_frame(c)
                                                           for c in (0, 2)}
        n = {c: part_size(srv.s.parts, c) for c in range(4)}  # what the server's partition gave
        readys = {"cids": np.array([0, 1], np.int64), "n": np.array([n[0], n[1]], np.int64)}
        r = srv.chan.rejects.total
        _send(b, 0, Message(MsgKind.READY, client_name(0), srv.s.run_id,
                            body={"phase": "readys"}, arrays=readys))
        _pump(srv, lambda: _refused(srv, r))
        assert not srv.clients  # client 1 is not on this connection: the whole batch refused
        readys = {"cids": np.array([0, 2], np.int64), "n": np.array([n[0], n[2] + 1], np.int64)}
        r = srv.chan.rejects.total
        _send(b, 0, Message(MsgKind.READY, client_name(0), srv.s.run_id,
                            body={"phase": "readys"}, arrays=readys))
        _pump(srv, lambda: _refused(srv, r))
        assert not srv.clients  # a count other than the server's partition's: refused whole
        readys = {"cids": np.array([0, 2], np.int64), "n": np.array([n[0], n[2]], np.int64)}
        _send(b, 0, Message(MsgKind.READY, client_name(0), srv.s.run_id,
                            body={"phase": "readys"}, arrays=readys))
        _pump(srv, lambda: len(srv.clients) == 2)
        assert {c: i.num_examples for c, i in srv.clients.items()} == {0: n[0], 2: n[2]}
    finally:
        a.close()
        b.close()
        ctx.term()
        srv.close()
