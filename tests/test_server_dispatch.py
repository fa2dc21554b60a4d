"""The server's dispatch loop without clients: every send fails at once (ROUTER_MANDATORY)."""
from __future__ import annotations

import numpy as np

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
        assert not srv.tasks.pending and not srv.tasks.queue
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
        assert srv.tasks.on_reply is None and not srv.tasks.queue and not srv.tasks.pending
    finally:
        srv.close()


def test_a_reconnect_with_its_welcome_token_takes_its_ids_over_at_once():
    """Plaintext `fednet server`: a new connection is refused "already connected" for ids the
    old one holds while it looks alive, unless it brings the token that connection's WELCOME
    gave (a reconnect before the server saw the old connection close), alone or as a process;
    a wrong token, or another connection's, changes nothing."""
    from fednet.server.conns import Connections, Identity

    conns = Connections(Identity(), 6)
    conns.bind(np.arange(3), b"\x00old", None, -1)  # a process of clients 0-2
    _bind(conns, 4, b"\x00other" + sub_frame(4))  # another one's client 4
    tok, new, one = conns.token(0), b"\x00new", np.array([0], np.int64)
    assert tok == conns.token(2) != conns.token(4)  # one per connection, not per client
    assert conns.check_claim(one, new, None, None, None) == "client 0 is already connected"
    assert conns.check_claim(one, new, None, None, None, b"x" * 16) == (
        "client 0 is already connected")
    assert conns.check_claim(one, new, None, None, None, conns.token(4)) == (
        "client 0 is already connected")
    assert conns.check_claim(one, new, None, None, None, tok) == ""
    assert conns.check_claim(np.arange(3), new, None, None, None, tok) == ""
    assert conns.check_claim(np.arange(3), new, None, None, None) == (
        "client 0 is already connected")
    assert conns.check_claim(np.arange(5), new, None, None, None, tok) == (
        "client 4 is already connected")  # the token is not client 4's connection's
    assert conns.check_claim(np.array([3, 5]), new, None, None, None) == ""
    again = Connections(Identity(), 6)
    again.bind(np.arange(3), b"\x00old", None, -1)
    assert again.token(0) != tok  # each server start its own


def _bind(conns, cid: int, route: bytes) -> None:
    """Client cid's READY(hellos) on `route` (connection + its envelope) accepted."""
    conns.bind(np.array([cid], np.int64), route[:-4], None, -1)


def test_messages_queued_before_a_connection_closed_revive_nothing():
    """The monitor's DISCONNECTED can be read before libzmq's queue of that connection is
    drained (a flood under load): its later messages, even a hello that binds the id again,
    leave the client lost, so that it is declared gone after the grace time."""
    from fednet.server.conns import Connections, Identity

    conns = Connections(Identity(), 4)
    r1, r2 = b"\x00conn1" + sub_frame(1), b"\x00conn2" + sub_frame(2)  # connection + envelope
    conns.seen(r1, 7)
    _bind(conns, 1, r1)
    conns.disconnected(7)
    assert conns.is_lost(1)
    conns.seen(r1, 7)  # queued before the close
    _bind(conns, 1, r1)  # a queued hello, welcomed again
    assert conns.is_lost(1) and conns.gone(-1.0).tolist() == [1]
    conns.seen(r2, 7)  # a new connection on the reused fd is alive
    _bind(conns, 2, r2)
    assert not conns.is_lost(2) and conns.cid_of(r2) == 2 and conns.route_of(2) == r2


def test_a_closed_process_is_remembered_once_for_all_its_clients():
    """A process's clients share one connection: one record however many clients it ran (a
    record per client made the close of a million-client run quadratic), and every one of its
    routes stays closed, past CLOSED_KEPT of them."""
    import numpy as np

    from fednet.server.conns import CLOSED_KEPT, Connections, Identity

    n = CLOSED_KEPT + 5
    conns = Connections(Identity(), n)
    conns.bind(np.arange(n), b"\x00proc", None, 9)
    assert len(conns.links) == 1 and conns.cid_of(b"\x00proc" + sub_frame(n - 1)) == n - 1
    conns.disconnected(9)
    assert list(conns.closed) == [b"\x00proc"] and conns.lost_ids().size == n
    conns.seen(b"\x00proc" + sub_frame(0), 9)  # a queued message revives nothing
    _bind(conns, 0, b"\x00proc" + sub_frame(0))
    assert conns.is_lost(0) and conns.is_lost(n - 1)


def test_gone_returns_the_clients_of_connections_lost_longer_than_the_grace(monkeypatch):
    """`gone` reads the lost connections in the order they were lost and stops at the first one
    still within its grace (it runs every poll); what it returns leaves `lost`."""
    from fednet.server import conns as C

    now = [100.0]
    monkeypatch.setattr(C.time, "monotonic", lambda: now[0])
    conns = C.Connections(C.Identity(), 10)
    for fd, (cid, at) in enumerate(((5, 100.0), (2, 101.0), (9, 103.0))):
        route = b"\x00c%d" % cid + sub_frame(cid)
        conns.seen(route, fd)
        _bind(conns, cid, route)
        now[0] = at
        conns.disconnected(fd)
    now[0] = 103.5
    assert conns.gone(5.0).tolist() == [] and conns.gone(1.0).tolist() == [5, 2]
    assert conns.gone(1.0).tolist() == [] and conns.is_lost(9)
    now[0] = 105.0
    assert conns.gone(1.0).tolist() == [9] and not conns.lost


def test_after_the_server_itself_stalled_its_lost_clients_get_the_time_to_reconnect(monkeypatch):
    """A server that was frozen (SIGSTOP, a pause) finds its clients' links dropped because of
    it: none is gone before the clients' reconnect back-off has run out (settle_s), where a
    loss while the server kept asking is gone after the grace."""
    from fednet.server import conns as C

    now = [100.0]
    monkeypatch.setattr(C.time, "monotonic", lambda: now[0])
    for stalled, gone_at in ((False, 101.5), (True, 105.5)):
        now[0] = 100.0
        conns = C.Connections(C.Identity(), 4)
        conns.gone(1.0, 3.0, 5.0)  # the server asks as it runs
        _bind(conns, 1, b"\x00c1" + sub_frame(1))
        conns.seen(b"\x00c1" + sub_frame(1), 3)
        now[0] = 110.0 if stalled else 100.4  # the last ask was at 100.0
        conns.gone(1.0, 3.0, 5.0)
        conns.disconnected(3)  # read when the server runs again
        seen_gone = None
        for t in (100.5, 101.5, 103.0, 105.5, 116.0):
            now[0] = t + (10.0 if stalled else 0.0)
            if conns.gone(1.0, 3.0, 5.0).tolist() == [1] and seen_gone is None:
                seen_gone = t
        assert seen_gone == gone_at, (stalled, seen_gone)


def test_released_clients_are_found_by_route_and_a_send_failure_loses_the_connection():
    """A released (dead) client's route still names it for a late BYE, only on the connection
    it was released from; a failed send loses the whole connection (a process's clients)."""
    import numpy as np

    from fednet.server.conns import Connections, Identity

    conns = Connections(Identity(), 8)
    conns.bind(np.arange(2, 6), b"\x00p", "key", 3)
    assert conns.key_of(4) == "key" and conns.key_of(7) == ""
    conns.lose(3)
    assert all(conns.is_lost(c) for c in range(2, 6))
    conns.seen(b"\x00p" + sub_frame(2), 3)  # a message on it: alive after all
    assert not conns.lost
    conns.release(np.array([2, 3]))
    assert conns.cid_of(b"\x00p" + sub_frame(2)) is None
    assert conns.released_cid(b"\x00p" + sub_frame(2)) == 2
    assert conns.released_cid(b"\x00q" + sub_frame(2)) is None
    assert conns.released_cid(b"\x00p" + sub_frame(4)) is None  # still bound
    assert [g.tolist() for g in conns.groups(np.array([1, 4, 5]))] == [[4, 5], [1]]
    why = conns.check_claim(np.array([4, 6]), b"\x00r", None, None, None)
    assert why == "client 4 is already connected"
    assert conns.check_claim(np.array([2, 3, 6]), b"\x00r", None, None, None) == ""
