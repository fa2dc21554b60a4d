"""A hand-off's HOP_DONE may reach the server after the task's RESULT (they travel on different
connections): its bytes still count, once; and a BYE read after its client was released is
that client's own."""
from __future__ import annotations

import time

import numpy as np
import pytest

from fednet.protocol import Message, MsgKind
from tests.conftest import run_for_model, same_arrays, small_config
from tests.integration.conftest import serve_in_thread
from tests.harness import LEDGER_KEYS as KEYS

pytestmark = [pytest.mark.net, pytest.mark.slow]

FEDSEQ = {"min_samples": 1400, "max_clients": 4, "superclient_fraction": 1.0, "pretrain_epochs": 1}


def _fedseq_in_process_and_over_one_host(tmp_path):
    """FedSeq on 4 clients under fednet local (the reference: its summary and final model),
    then served to one client host of the 4 (its summary, which must have completed)."""
    from fednet.client.main import run_host

    cfg = small_config(clients=4, rounds=2, algo={"name": "fedseq", "params": FEDSEQ})
    ref, ref_model = run_for_model(cfg, tmp_path, "ref")
    t, box = serve_in_thread(cfg, tmp_path / "run")
    code = run_host([0, 1, 2, 3], box["endpoint"], register_timeout=30)
    t.join(120)
    s = box["summary"]
    assert code == 0 and s["status"] == "completed" and not s["failures"]
    return ref, ref_model, s


def test_a_hop_done_after_the_result_is_counted_once(tmp_path, monkeypatch):
    from fednet.client.app import Client

    held: list = []
    orig = Client.send

    def late_hop_done(self, msg, track=False):
        if msg.kind == MsgKind.HOP_DONE:  # hold it back until the chain's RESULT went out
            held.append((self, msg))
            return 0
        n = orig(self, msg, track)
        if msg.kind == MsgKind.RESULT:
            while held:
                c, m = held.pop(0)
                orig(c, m)
                orig(c, m)  # and once more: a duplicate must not count twice
        return n
    monkeypatch.setattr(Client, "send", late_hop_done)
    ref, ref_model, s = _fedseq_in_process_and_over_one_host(tmp_path)
    assert s["bytes"]["client_to_client"] > 0
    assert {k: s["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}
    assert s["messages"] == ref["messages"]  # each hand-off and its ack, as fednet local counts
    assert s["rejected_messages"] > 0  # the duplicates
    with np.load(tmp_path / "run" / "final_model.npz", allow_pickle=False) as z:
        assert same_arrays(ref_model, {k: z[k] for k in z.files})


def test_a_hand_off_report_that_lies_about_its_bytes_is_counted_as_the_server_sizes_it(
        tmp_path, monkeypatch):
    """The clients report each hand-off a hundred times bigger than it was: the server enters
    the HANDOFF and its acknowledgement at the sizes its own TASK and the model's layout give
    (server/hops.py), so the ledger is the in-process run's, every field and message."""
    from fednet.client.app import Client

    orig = Client.send

    def inflated(self, msg, track=False):
        if msg.kind == MsgKind.HOP_DONE:
            msg.body["peer_bytes"] *= 100
            msg.body["peer_tensor_bytes"] *= 100
        return orig(self, msg, track)
    monkeypatch.setattr(Client, "send", inflated)
    ref, _, s = _fedseq_in_process_and_over_one_host(tmp_path)
    got, want = s["bytes"], ref["bytes"]
    assert got["client_to_client"] == want["client_to_client"] > 0
    assert got["tensor_bytes"] == want["tensor_bytes"] and s["messages"] == ref["messages"]
    # only the HOP_DONEs themselves are bigger, as received: their inflated numbers (msgpack)
    grew = got["client_to_server"] - want["client_to_server"]
    assert grew == got["header_bytes"] - want["header_bytes"]
    hops = want["client_to_client"] and s["messages"] // 3  # (a bound: < 8 bytes per message)
    assert 0 < grew < 8 * hops


def test_a_bye_read_after_its_client_was_released_is_accepted(tmp_path, monkeypatch):
    """Under `fednet launch` the zygote may report a client's clean exit before the server has
    read the BYE that client queued: its connection is released first. That BYE is the client's
    own (the same connection, the same run): accepted, not counted as a rejection."""
    from fednet.client.main import run_host
    from fednet.server.app import ZmqServer

    def release_first(self, timeout_s=5.0):
        self.shutting_down = True
        for cid in list(self.clients):  # as if every exit were reported before its BYE is read
            self.send(cid, Message(MsgKind.SHUTDOWN, "server", self.s.run_id,
                                    arrays={"cids": np.array([cid], np.int64)}))
        time.sleep(0.5)  # the BYEs are queued by now
        ids = self.clients.ids()
        self.conns.release(ids)
        self.fates.die(ids, "process exited with code 0", self.round, True)
        before = self.fates.byes()
        end = time.monotonic() + 1.0
        while time.monotonic() < end and self.fates.bye_count() < len(self.clients):
            self._poll_once(0.05)  # what shutdown() and the close do: read what is queued
        box["byes"] = (before, self.fates.byes())
    monkeypatch.setattr(ZmqServer, "shutdown", release_first)
    cfg = small_config(clients=2, rounds=1)
    box: dict = {}
    t, served = serve_in_thread(cfg, tmp_path / "run")
    code = run_host([0, 1], served["endpoint"], register_timeout=30)
    t.join(60)
    s = served["summary"]
    assert code == 0 and s["status"] == "completed" and not s["failures"]
    before, after = box["byes"]
    assert before == {} and sorted(after) == [0, 1]  # read after the release, and accepted
    assert s["rejected_messages"] == 0 and s["bytes"]["rejected"] == 0
