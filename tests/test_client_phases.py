"""server/phases.ClientTable without a socket or a Session: each client's phase read from the
books that keep its state (connections, hellos, registrations, tasks out, fates), through a
client's whole life and at ten million ids."""
from __future__ import annotations

import numpy as np

from fednet.server.book import ClientBook
from fednet.server.conns import Connections, Identity
from fednet.server.fates import Fates
from fednet.server.phases import ClientTable, Phase
from fednet.server.tasks import TaskBook
from fednet.types import ClientInfo, Task

FD = 7


def _table(n):
    conns = Connections(Identity(), n)
    book = ClientBook(n, lambda c: 10 + c)
    tasks = TaskBook(0, 0, lambda c: c, lambda t: None)
    said = np.zeros(n, bool)
    return ClientTable(book, conns, Fates(n), said, tasks)


def _hello(t, ids, conn=b"conn-a"):
    ids = np.array(ids, np.int64)
    t.conns.bind(ids, conn, None, FD)
    t.said[ids] = True
    return ids


def test_a_client_goes_through_every_phase_in_order():
    t = _table(4)
    assert t.phase(2) is Phase.ABSENT and t.census() == {"absent": 4}
    ids = _hello(t, [1, 2])
    assert t.phase(2) is Phase.WELCOMED and t.phase(0) is Phase.ABSENT
    t.book.add_process(ids, "cpu", 42, "h")
    assert t.phase(2) is Phase.READY
    t.tasks.start([Task(1, 0, [2, 1])], None)
    t.tasks.fill()
    assert t.phase(2) is Phase.BUSY and t.phase(1) is Phase.READY  # 2 holds the ring's model
    t.tasks.handed(1, 1)
    assert t.phase(2) is Phase.READY and t.phase(1) is Phase.BUSY
    t.tasks.answered(1)
    t.tasks.pending.clear()
    t.conns.disconnected(FD)  # the process's connection closed: both clients on it
    assert t.phase(1) is Phase.LOST and t.phase(2) is Phase.LOST
    assert t.missing(np.arange(4)) == "ids 0, 3 never registered"  # lost ones are registered
    t.conns.seen(b"conn-a" + b"\x00" * 4, FD)  # a closed connection revives nothing
    assert t.phase(1) is Phase.LOST
    gone = t.conns.gone(0.0)
    t.conns.release(gone)
    t.fates.die(gone, "connection lost", 3, shutting_down=False)
    assert t.phase(1) is Phase.DEAD and t.census() == {"absent": 2, "dead": 2}
    again = _hello(t, [1], b"conn-b")  # it registered again on a new connection
    t.fates.revive(again)
    t.book[1] = ClientInfo(1, 11, "cpu", "tcp://h:1", 43, "h")
    assert t.phase(1) is Phase.READY and t.phase(2) is Phase.DEAD
    t.fates.bye(again, {})
    assert t.phase(1) is Phase.LEFT
    t.fates.die(again, "exit code 0", 5, shutting_down=True)
    assert t.phase(1) is Phase.EXITED
    assert t.census() == {"absent": 2, "exited": 1, "dead": 1}


def test_missing_clients_are_named_by_phase():
    t = _table(30)
    _hello(t, range(0, 20))
    t.book.add_process(np.arange(0, 15), "cpu", 1, "h")
    dead = np.array([29], np.int64)
    t.fates.die(dead, "exit code 9", 0, shutting_down=False)
    assert t.missing(np.arange(30)) == (
        "ids 20, 21, 22, 23, 24, 25, 26, 27 (and 1 more) never registered; "
        "ids 15, 16, 17, 18, 19 welcomed but not ready; id 29 died")
    assert t.missing(np.arange(15)) == ""


def test_ten_million_clients_phases_are_a_few_array_passes():
    n = 10_000_000
    t = _table(n)
    _hello(t, np.arange(0, n, 2))
    t.book.add_process(np.arange(0, n, 4), "cpu", 1, "h")
    t.fates.die(np.arange(1, n, 10), "exit code 1", 0, shutting_down=False)
    assert t.census() == {"absent": 4_000_000, "welcomed": 2_500_000, "ready": 2_500_000,
                          "dead": 1_000_000}
