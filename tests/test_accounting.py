"""Byte accounting: one round's recorded bytes equal the arithmetic from model and header sizes."""
from __future__ import annotations

import numpy as np

from fednet.core.inproc import InprocDispatcher
from fednet.metrics.accounting import Ledger, direction
from fednet.models import build_model, num_params
from fednet.protocol import Message, MsgKind, encode
from fednet.core.session import Session
from fednet.types import client_name
from tests.conftest import small_config


def _header_len(msg: Message) -> int:
    return len(encode(msg)[0])


def test_directions():
    assert direction("server", "c0001") == "server_to_client"
    assert direction("c0001", "server") == "client_to_server"
    assert direction("c0001", "c0002") == "client_to_client"


def test_ledger_separates_control_from_traffic():
    led = Ledger()
    led.record(0, "TASK", "server", "c0000", 100, 1000, 1000)
    led.record(0, "READY", "c0000", "server", 50, 0, 0)
    led.record(1, "HANDOFF", "c0000", "c0001", 90, 1000, 1000)
    led.record(1, "REJECT", "server", "unknown", 70, 0, 0)  # an answer to someone's mistake
    t = led.totals()
    assert t == {"server_to_client": 1100, "client_to_server": 0, "client_to_client": 1090,
                 "tensor_bytes": 2000, "header_bytes": 190, "messages": 2, "control": 50,
                 "control_messages": 1, "rejected": 0, "rejected_messages": 0,
                 "rejects_sent": 70, "rejects_sent_messages": 1}
    assert led.round_totals(1)["client_to_client"] == 1090
    # the run's messages: the READY is control traffic, the REJECT an answer apart
    assert led.messages == 2


def test_one_round_bytes_equal_model_size_times_messages_plus_headers():
    cfg = small_config(clients=4, rounds=1)
    s = Session(cfg, quiet=True, write=False)
    disp = InprocDispatcher(s)
    clients = disp.alive_clients()
    s.driver.run(disp)
    model_bytes = 4 * num_params(build_model("auto", 10, (1, 8, 8)))
    assert model_bytes == 4 * 15_466
    arr = s.algo.global_arrays
    # Every header rebuilt independently from what the message must carry.
    h_task = [_header_len(Message(MsgKind.TASK, "server", s.run_id, 0, c.cid + 1, 0.0,
                                  {"route": [c.cid], "hop": 0, "kind": "train",
                                   "body": {"epochs": 1, "lr": 0.1}}, arr)) for c in clients]
    bs, ep = cfg.train.batch_size, cfg.train.epochs
    h_res = [_header_len(Message(MsgKind.RESULT, client_name(c.cid), s.run_id, 0, c.cid + 1, 0.0,
                                 {"n": c.num_examples,
                                  "body": {"loss": 0.0, "samples": ep * c.num_examples,
                                           "steps": ep * -(-c.num_examples // bs)}}, arr))
             for c in clients]
    tot = s.ledger.round_totals(0)
    assert tot["server_to_client"] == sum(h_task) + 4 * model_bytes
    assert tot["client_to_server"] == sum(h_res) + 4 * model_bytes
    assert tot["tensor_bytes"] == 2 * 4 * model_bytes
    assert tot["header_bytes"] == sum(h_task) + sum(h_res)
    assert s.ledger.messages == 8  # 4 tasks + 4 results, nothing else in-process


def test_header_length_does_not_depend_on_times_or_losses():
    arr = {"w": np.zeros(3, np.float32)}
    def m(t, loss):
        return Message(MsgKind.RESULT, client_name(0), "r" * 32, 0, 1, t,
                       {"n": 5, "body": {"loss": loss, "samples": 5, "steps": 1}}, arr)
    assert _header_len(m(0.0, 0.5)) == _header_len(m(1234.5, 2.25)) == _header_len(m(1e-9, 1e9))
