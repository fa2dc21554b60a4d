"""The server's dispatch loop without clients: every send fails at once (ROUTER_MANDATORY)."""
from __future__ import annotations

from fednet.server.app import ZmqServer
from fednet.transport.channels import sub_frame
from fednet.core.session import Session
from fednet.types import Failure, Task
from tests.conftest import small_config


def _server(**net) -> ZmqServer:
    return ZmqServer(Session(small_config(clients=3, net=net), quiet=True, write=False))


def test_thousands_of_unreachable_tasks_fail_without_recursion():
    srv = _server()
    try:
        tasks = [Task(i + 1, 0, [i % 3]) for i in range(3000)]
        seen = []
        results, failures = srv.run_round(0, tasks, lambda done: seen.append(done) or [])
        assert results == [] and len(failures) == 3000 == len(seen)
        assert all(f.reason == "client unreachable" for f in failures)
        assert not srv._pending and not srv._queue
    finally:
        srv.close()


def test_follow_ups_of_failures_are_sent_through_the_window_and_the_state_is_reset():
    srv = _server(max_inflight=2)
    try:
        made = []

        def follow(done):
            assert isinstance(done, Failure)
            if done.task_id < 100:  # each failure releases one more task, up to 5 in all
                nxt = Task(done.task_id + 100, 0, [0])
                made.append(nxt)
                return [nxt] if len(made) <= 2 else []
            return []
        results, failures = srv.run_round(0, [Task(1, 0, [0]), Task(2, 0, [1]), Task(3, 0, [2])],
                                          follow)
        assert sorted(f.task_id for f in failures) == [1, 2, 3, 101, 102]
        assert srv._on_reply is None and not srv._queue and not srv._pending
    finally:
        srv.close()


def test_a_reconnect_with_its_welcome_token_takes_its_id_over_at_once():
    """Plaintext `fednet server`: client 0's new connection is refused "already connected" while
    the old one looks alive, unless it brings the token its WELCOME gave (a reconnect before the
    server saw the old connection close); a wrong token changes nothing."""
    from fednet.server.conns import Connections, Identity

    conns = Connections(Identity())
    conns.bind(0, b"old", None)
    assert conns.check_claim(0, b"new", None, None, None) == "client 0 is already connected"
    assert conns.check_claim(0, b"new", None, None, None, b"x" * 16) == (
        "client 0 is already connected")
    assert conns.check_claim(0, b"new", None, None, None, conns.token(0)) == ""
    assert conns.token(0) != conns.token(1)
    assert Connections(Identity()).token(0) != conns.token(0)  # each server start its own


def test_messages_queued_before_a_connection_closed_revive_nothing():
    """The monitor's DISCONNECTED can be read before libzmq's queue of that connection is
    drained (a flood under load): its later messages, even a hello that binds the id again,
    leave the client lost, so that it is declared gone after the grace time."""
    from fednet.server.conns import Connections, Identity

    conns = Connections(Identity())
    r1, r2 = b"\x00conn1" + sub_frame(1), b"\x00conn2" + sub_frame(2)  # connection + envelope
    conns.seen(r1, 7)
    conns.bind(1, r1, None)
    conns.disconnected(7)
    assert 1 in conns.lost
    conns.seen(r1, 7)  # queued before the close
    conns.bind(1, r1, None)  # a queued hello, welcomed again
    assert 1 in conns.lost and conns.gone(-1.0) == [1]
    conns.seen(r2, 7)  # a new connection on the reused fd is alive
    conns.bind(2, r2, None)
    assert 2 not in conns.lost


def test_a_closed_process_is_remembered_once_for_all_its_clients():
    """A process's clients share one connection: its close is one record however many clients
    it ran (a record per client made the close of a million-client run quadratic), and every
    one of its routes stays closed, past CLOSED_KEPT of them."""
    from fednet.server.conns import CLOSED_KEPT, Connections, Identity

    conns = Connections(Identity())
    n = CLOSED_KEPT + 5
    routes = [b"\x00proc" + sub_frame(c) for c in range(n)]
    for c, r in enumerate(routes):
        conns.seen(r, 9)
        conns.bind(c, r, None)
    conns.disconnected(9)
    assert list(conns.closed) == [b"\x00proc"] and len(conns.lost) == n
    conns.seen(routes[0], 9)  # the oldest route's queued message revives nothing
    conns.bind(0, routes[0], None)
    assert 0 in conns.lost


def test_gone_returns_the_clients_lost_longer_than_the_grace(monkeypatch):
    """`gone` reads the lost clients in the order they were lost and stops at the first one
    still within its grace (it runs every poll: a scan of them all was O(population))."""
    from fednet.server import conns as C

    now = [100.0]
    monkeypatch.setattr(C.time, "monotonic", lambda: now[0])
    conns = C.Connections(C.Identity())
    for cid, at in ((5, 100.0), (2, 101.0), (9, 103.0)):
        now[0] = at
        conns.lost.setdefault(cid, C.time.monotonic())
    now[0] = 103.5
    assert conns.gone(1.0) == [5, 2] and conns.gone(3.0) == [5] and conns.gone(5.0) == []
    conns.lost.pop(5)
    now[0] = 105.0
    conns.lost.setdefault(5, C.time.monotonic())  # lost again: the youngest now
    assert conns.gone(1.0) == [2, 9]


def _state(conns):
    return (conns.route_of, conns.cid_of, conns.key_of, conns.released, conns.route_fd,
            conns.fd_routes, conns.lost, conns.binds)


def test_a_batch_binds_its_clients_as_one_by_one_does():
    """bind_batch leaves the state that seen + bind per client leave: in bulk for a first
    registration, one by one when a client is already bound, lost or released, or the
    connection closed."""
    import numpy as np

    from fednet.server.conns import Connections, Identity
    from fednet.transport.channels import sub_frames

    ids = list(range(3, 40))
    routes = [b"\x00p" + f for f in sub_frames(np.array(ids, np.int64))]
    assert routes == [b"\x00p" + sub_frame(c) for c in ids]

    def prepared(case):
        conns = Connections(Identity())
        if case == "bound":
            conns.seen(b"\x00q" + sub_frame(7), 4)
            conns.bind(7, b"\x00q" + sub_frame(7), "k")
        elif case == "lost":
            conns.lost[9] = 1.0
        elif case == "released":
            conns.released[routes[2]] = 5
        elif case == "closed":
            conns.closed[b"\x00p"] = None
        return conns

    for case in ("fresh", "bound", "lost", "released", "closed"):
        bulk, single = prepared(case), prepared(case)
        bulk.bind_batch(ids, routes, "key", 6)
        for c, r in zip(ids, routes):
            single.seen(r, 6)
            single.bind(c, r, "key")
        lost = dict(single.lost)
        assert _state(bulk)[:6] == _state(single)[:6] and bulk.binds == single.binds, case
        assert set(bulk.lost) == set(lost), case
