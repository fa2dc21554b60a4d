"""A client process's ids as columns (client/table.py) and its registration from arrays
(client/enroll.py): membership and rows as a dict of the ids would give them, the idle and
stopped columns, and the READY(hellos|readys) and BYE a process sends, equal to what the per-id
loops of the old Host sent for the same WELCOME and SHUTDOWN (no server, no socket traffic:
each message is captured where the client would send it)."""
from __future__ import annotations

import resource

import numpy as np
import pytest

from fednet.client import app
from fednet.client.host import Host, max_sockets
from fednet.client.table import ids_text
from fednet.client.table import IdIndex, IdTable
from fednet.config.settings import from_dict
from fednet.core.executor import natural_examples
from fednet.data import load_dataset, run_partition
from fednet.network import latency
from fednet.protocol import Message, MsgKind
from fednet.protocol.codec import encode
from fednet.transport.channels import sub_frame


@pytest.mark.parametrize("ids", [range(5, 12), [5, 6, 7, 8], [9, 2, 40, 7, 3], [3, 8, 20], [4]])
def test_rows_are_what_a_dict_of_the_ids_gives(ids):
    index, rows = IdIndex(ids), {c: i for i, c in enumerate(ids)}
    probe = np.arange(-3, 45, dtype=np.int64)
    assert index.rows(probe).tolist() == [rows.get(c, -1) for c in probe.tolist()]
    assert [index.row(c) for c in range(-3, 45)] == [rows.get(c, -1) for c in range(-3, 45)]
    assert [c in index for c in range(-3, 45)] == [c in rows for c in range(-3, 45)]
    assert index.ids().tolist() == list(ids) and index.sorted_ids().tolist() == sorted(ids)
    assert len(index) == len(ids) and index.text() == ids_text(list(ids))
    assert (index.keys is None) == (list(ids) == list(range(ids[0], ids[0] + len(ids))))


def test_ids_text_names_ranges_and_lists_as_before():
    assert ids_text(range(0, 625_000)) == "0-624999" and ids_text([7]) == "7"
    assert ids_text([3, 1, 2]) == "3,1,2"
    assert ids_text(list(range(0, 40, 2))) == "0,2,4,6,8,10,12,14,16,18,..."


def test_repeated_ids_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        IdIndex([3, 1, 3])


def test_idle_and_stopped_columns():
    t = IdTable(range(100, 110))
    assert t.first == 100 and t.n_idle == 0 and not t.is_idle(101)
    t.make_idle(np.arange(1, 10))
    t.set_idle(105, False)
    t.set_idle(105, False)  # twice: counted once
    t.set_idle(999, True)  # not ours: nothing
    assert t.n_idle == 8 and t.idle_ids().tolist() == [101, 102, 103, 104, 106, 107, 108, 109]
    t.stop_idle(np.array([100, 102, 105, 109, 109, 4242], np.int64))  # only idle ones of ours
    assert t.n_stopped == 2 and t.n_idle == 6 and not t.is_idle(102)
    assert t.take_stopped().tolist() == [102, 109]
    assert t.n_stopped == 0 and t.take_stopped().size == 0


def test_the_socket_limit_follows_the_open_files_not_the_ids():
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert max_sockets(3) == 1023
    assert max_sockets(625_000) == max(1023, min(8 * 625_000 + 64, files))


def _welcome(cfg, cids, parts=None):
    arrays = {"cids": np.asarray(cids, np.int64),
              "client_profiles": latency.to_array([latency.Profile()] * len(cids))}
    if parts is not None:
        ps = [np.asarray(parts[c], np.int64) for c in cids]
        arrays["indices"] = np.concatenate(ps)
        arrays["offsets"] = np.concatenate([[0], np.cumsum([len(p) for p in ps])]).astype(np.int64)
    return Message(MsgKind.WELCOME, "server", "r", body={"config": cfg.to_dict(), "run_id": "r",
                                                         "peers": False}, arrays=arrays)


def _old_readys(welcome_cids, ours, count):
    """What the old Host.on_welcome sent: the WELCOME's ids of this process, each with its
    examples, in id order."""
    ids = [c for c in welcome_cids if c in set(ours)]
    order = np.argsort(np.array(ids))
    return np.array(ids, np.int64)[order], np.array([count(c) for c in ids], np.int64)[order]


@pytest.fixture
def sent(monkeypatch):
    out: list[Message] = []
    monkeypatch.setattr(app.Client, "send", lambda self, msg, track=False: out.append(msg) or 0)
    return out


def _host(ids):
    return Host(ids, "tcp://127.0.0.1:9")  # never reached: every send is captured


def test_a_partitioned_welcome_answers_one_readys_and_leaves_the_rest_idle(sent):
    cfg = from_dict({"clients": 20, "seed": 3})
    parts = run_partition(load_dataset("digits"), cfg.data, cfg.clients, cfg.seed)
    host = _host(range(10, 16))
    try:
        welcome_cids = [15, 11, 3, 10, 12, 13, 14]  # unsorted, and one id of another process
        host.enroll.on_welcome(_welcome(cfg, welcome_cids, parts))
        (readys,) = sent
        want = _old_readys(welcome_cids, range(10, 16), lambda c: len(parts[c]))
        assert readys.kind == MsgKind.READY and readys.body == {"phase": "readys"}
        assert readys.sender == "c0010"
        assert np.array_equal(readys.arrays["cids"], want[0]) and readys.arrays["cids"].dtype == np.int64
        assert np.array_equal(readys.arrays["n"], want[1]) and readys.arrays["n"].dtype == np.int64
        t = host.enroll.table
        assert t.idle_ids().tolist() == [11, 12, 13, 14, 15] and list(host.by_cid) == [10]
        c = host.materialize(sub_frame(12))  # a task for an idle client builds it
        assert c is not None and c.cid == 12 and c.registered and not t.is_idle(12)
        assert c.trainer.profile == latency.Profile()
        assert host.materialize(sub_frame(3)) is None and host.materialize(sub_frame(10)) is None
        host.live[c] = None
        assert host._retirable(c)
        host.enroll.on_welcome(_welcome(cfg, [13], parts))  # one client's WELCOME (one by one)
        assert not host._retirable(c)  # its row is gone: it could not be rebuilt when idle
        host.enroll.on_welcome(_welcome(cfg, welcome_cids, parts))
        host.retire(c)
        assert t.is_idle(12) and 12 not in host.by_cid
    finally:
        host.close()


def test_shutdown_of_idle_ids_is_one_bye_and_the_first_client_stops_with_the_rest(sent):
    cfg = from_dict({"clients": 20, "seed": 3})
    parts = run_partition(load_dataset("digits"), cfg.data, cfg.clients, cfg.seed)
    host = _host(range(10, 16))
    try:
        host.enroll.on_welcome(_welcome(cfg, list(range(10, 16)), parts))
        sent.clear()
        shutdown = Message(MsgKind.SHUTDOWN, "server", "r", arrays={"cids": np.array([13, 11, 99])})
        host.enroll.on_shutdown(shutdown)
        assert not host.first.stopping and host.enroll.table.n_stopped == 2
        host.together([], [])
        (bye,) = sent
        assert bye.kind == MsgKind.BYE and bye.arrays["cids"].tolist() == [11, 13]
        assert host.enroll.table.idle_ids().tolist() == [12, 14, 15]
        sent.clear()
        host.enroll.on_shutdown(Message(MsgKind.SHUTDOWN, "server", "r",
                                        arrays={"cids": np.arange(10, 16)}))
        assert host.first.stopping and host.first in host.attention
        host.together([host.first], [])
        (bye,) = sent
        assert bye.arrays["cids"].tolist() == [10, 12, 14, 15] and bye.sender == "c0010"
        assert host.enroll.table.n_idle == 0 and host.first.server.sub not in host.routes
        sent.clear()
        host.enroll.on_shutdown(Message(MsgKind.SHUTDOWN, "server", "r",
                                        arrays={"cids": np.array([1.5])}))  # unreadable
        host.together([], [])
        assert sent == []
    finally:
        host.close()


def test_ids_given_out_of_order_register_sorted_and_count_natural_examples(sent):
    cfg = from_dict({"clients": 50, "seed": 1, "data": {"dataset": "synthetic-fedprox",
                                                         "partition": "natural"}})
    ids = [7, 3, 5, 9]
    host = _host(ids)
    try:
        assert host.first.cid == 7 and host.link.label == "clients 7,3,5,9"
        host.enroll.hellos(host.enroll.table.index.sorted_ids())
        host.enroll.on_welcome(_welcome(cfg, sorted(ids)))
        hellos, readys = sent
        assert hellos.body["phase"] == "hellos" and hellos.sender == "c0003"
        assert hellos.arrays["cids"].tolist() == [3, 5, 7, 9]
        sizes = dict(zip([3, 5, 7, 9], natural_examples(cfg, np.array([3, 5, 7, 9])).tolist()))
        want = _old_readys(sorted(ids), ids, sizes.__getitem__)
        assert np.array_equal(readys.arrays["cids"], want[0])
        assert np.array_equal(readys.arrays["n"], want[1])
        # client 3 spoke for the process, so it has an object; 5 and 9 are idle
        assert sorted(host.by_cid) == [3, 7] and host.enroll.table.idle_ids().tolist() == [5, 9]
    finally:
        host.close()


def _reject(reason, answers=None):
    body = {"reason": reason} if answers is None else {"reason": reason, "answers": answers}
    return encode(Message(MsgKind.REJECT, "server", body=body))


def test_a_late_reject_of_an_earlier_claim_changes_nothing(sent):
    """The link came back while a process of several waited for its WELCOME: it said its
    hellos again. The REJECT of the first claim (its old connection still held the ids) is
    void: the process keeps waiting on its second claim; the REJECT of that one makes each
    client claim alone, and a late REJECT of the batch then refuses no client."""
    host = _host(range(10, 13))
    try:
        enroll, first = host.enroll, host.first
        enroll.batching = True
        enroll.hellos(enroll.table.index.sorted_ids())
        enroll.hellos(enroll.table.index.sorted_ids())  # the link came back: said again
        old, new = (m.body["nonce"] for m in sent)
        assert old != new and all(len(n) == 16 for n in (old, new))
        host.deliver(first.server.sub, _reject("clients 10-12 are held by a live connection", old))
        assert enroll.batching and first.refused is None  # still waiting on the second claim
        host.deliver(first.server.sub, _reject("clients 10-12 are held by a live connection", new))
        assert not enroll.batching and enroll.refusal.startswith("clients 10-12")
        sent.clear()
        enroll.hellos(np.array([10], np.int64))  # client 10 claims alone (Enrollment.claim)
        host.deliver(first.server.sub, _reject("a late copy of the batch's", new))
        assert first.refused is None and host.enroll.settled == 0
        host.deliver(first.server.sub, _reject("client 10 is already connected", sent[0].body["nonce"]))
        assert first.refused == "client 10 is already connected" and host.enroll.settled == 1
        host.deliver(first.server.sub, _reject("a REJECT that names no claim refuses the client it reaches"))
        assert first.refused == "client 10 is already connected" and host.enroll.settled == 1
    finally:
        host.close()


def test_a_client_knows_no_host_and_returns_what_its_host_acts_on(sent):
    """Issue 57: a Client sends on the process's link and knows no Host; a TASK it reads comes
    back as an event its Host queues (the client is ready), and the link was built complete
    (where its messages go, what its log lines call the clients)."""
    host = _host(range(10, 13))
    try:
        c = host.first
        assert not hasattr(c, "host") and c.link is host.link
        assert host.link.deliver == host.deliver and host.link.label == "clients 10-12"
        task = encode(Message(MsgKind.TASK, "server", "r"), check=False)
        assert host.deliver(c.server.sub, task) and list(host.ready) == [c] and len(c.work) == 1
        assert not host.deliver(sub_frame(99), task)  # no client of this process
    finally:
        host.close()
