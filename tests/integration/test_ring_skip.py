"""Who may hand a ring's model to a peer, over real peer sockets: its predecessor; with
--dead-peer skip also any earlier member of the route (the holder alone can tell that the peers
between were unreachable), whose tag names the hop it skips to; never a sender without the peer
key, nor one that is not on the route. A dead peer's closed port is skipped without waiting."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from fednet.client.peers import PeerChainBroken, Peers
from fednet.metrics.accounting import Ledger
from fednet.protocol.proof import handoff_tag
from fednet.types import Task, client_name
from fednet.core.wire import handoff_message, result_message, task_message

pytestmark = [pytest.mark.net]

KEY = b"k" * 32
RUN = "run-1"


def _peers(cid: int, dead_peer: str, key: bytes | None = KEY) -> Peers:
    p = Peers(zmq.Context.instance(), client_name(cid), "127.0.0.1", Ledger(), peer_key=key)
    p.run_id, p.dead_peer, p.ack_timeout, p.retries = RUN, dead_peer, 1.0, 2
    p.listen()  # as a client of a ring algorithm does at WELCOME
    return p


def _task(route, endpoints, hop):
    t = Task(7, 3, list(route), {"w": np.ones(64, np.float32)}, {}, hop=hop)
    msg = task_message(t, RUN)
    msg.body["endpoints"] = list(endpoints)
    return t, msg


def _collect(receiver: Peers) -> tuple[list, object]:
    """(got, pump): pump() serves the receiver's peer socket, appending each hand-off it
    accepts to got (the sender calls it while it waits for the acknowledgement)."""
    got: list = []

    def pump() -> None:
        while receiver.sock.poll(0):
            r = receiver.receive()
            if r is not None:
                got.append(r[0])
    return got, pump


def _send(sender: Peers, receiver: Peers, route, to_hop: int, key: bytes | None = KEY):
    """sender (at its index on route, or 0) hands the model to route[to_hop] = receiver; the
    receiver's peer socket is served meanwhile. (accepted by the receiver, acknowledged)."""
    me = int(sender.me[1:])
    hop = route.index(me) if me in route else 0
    endpoints = ["tcp://127.0.0.1:1"] * len(route)
    endpoints[to_hop] = receiver.endpoint
    t, msg = _task(route, endpoints, hop)
    reply = result_message(me, t, t.arrays, {}, 10, 1.0, RUN)
    got, pump = _collect(receiver)
    sender.pump = pump
    tag = handoff_tag(key, RUN, t.round, t.task_id, to_hop, sender.me)
    handoff = handoff_message(msg, reply, to_hop, tag)
    ok = sender._send_acked(receiver.endpoint, receiver.me, handoff)
    pump()
    return got, ok


@pytest.mark.parametrize("dead_peer", ["skip", "server"])
def test_an_earlier_route_member_may_skip_only_under_dead_peer_skip(dead_peer):
    a, b = _peers(0, dead_peer), _peers(3, dead_peer)
    try:
        got, ok = _send(a, b, [0, 1, 2, 3], 3)  # skips 1 and 2, which are alive: not checkable
        if dead_peer == "skip":
            assert ok and [m.body["hop"] for m in got] == [3] and m_sender(got) == ["c0000"]
            assert b.chan.rejects.counts == {}
        else:
            assert not ok and got == []
            assert sum(b.chan.rejects.counts.values()) == 2  # both attempts refused
        got, ok = _send(_peers(2, dead_peer), b, [0, 1, 2, 3], 3)  # the predecessor: always
        assert ok and m_sender(got) == ["c0002"]
    finally:
        a.close(), b.close()


def m_sender(msgs):
    return [m.sender for m in msgs]


@pytest.mark.parametrize("case", ["wrong key", "not on the route", "a later member"])
def test_a_skip_without_the_peer_key_or_from_off_the_route_is_refused(case):
    b = _peers(3, "skip")
    sender = _peers(5 if case == "not on the route" else 0, "skip")
    route = [0, 1, 2, 3, 4] if case != "a later member" else [4, 3, 0]
    to_hop = route.index(3)
    try:
        got, ok = _send(sender, b, route, to_hop, b"x" * 32 if case == "wrong key" else KEY)
        assert not ok and got == [] and sum(b.chan.rejects.counts.values()) == 2
    finally:
        sender.close(), b.close()


def test_a_closed_peer_port_is_skipped_at_once_and_the_next_peer_gets_the_model():
    a, c = _peers(0, "skip"), _peers(2, "skip")
    a.ack_timeout = 5.0  # a closed port must not cost it: retries x 5 s = 10 s; a busy CI is slow
    dead = _peers(1, "skip")
    dead_endpoint = dead.endpoint
    dead.close()  # nothing listens there any more: a killed peer
    try:
        route = [0, 1, 2]
        t, msg = _task(route, ["", dead_endpoint, c.endpoint], 0)
        reply = result_message(0, t, t.arrays, {}, 10, 1.0, RUN)
        got, a.pump = _collect(c)
        t0 = time.monotonic()
        a.handoff(1, msg, reply)
        took = time.monotonic() - t0
        assert a.last_to_hop == 2 and a.last_peer_bytes > 256
        assert took < a.ack_timeout  # not even one ack_timeout for the closed port
        a.pump()
        assert [m.body["hop"] for m in got] == [2]
        a.dead_peer = "server"  # the same dead peer: the model returns to the server
        with pytest.raises(PeerChainBroken):
            a.handoff(1, msg, reply)
    finally:
        a.close(), c.close()
