"""A hand-off's HOP_DONE may reach the server after the task's RESULT (they travel on different
connections): its bytes still count, once."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from fednet.protocol import MsgKind
from fednet.server.main import run_zmq
from tests.conftest import final_model, same_arrays, small_config

pytestmark = [pytest.mark.net, pytest.mark.slow]

KEYS = ("server_to_client", "client_to_server", "client_to_client", "tensor_bytes")
FEDSEQ = {"min_samples": 1400, "max_clients": 4, "superclient_fraction": 1.0, "pretrain_epochs": 1}


def test_a_hop_done_after_the_result_is_counted_once(tmp_path, monkeypatch):
    from fednet.client.app import Client
    from fednet.client.host import run_host

    held: list = []
    orig = Client._send_server

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
    monkeypatch.setattr(Client, "_send_server", late_hop_done)
    cfg = small_config(clients=4, rounds=2, algo={"name": "fedseq", "params": FEDSEQ})
    ref, ref_model = final_model(cfg, tmp_path, "ref")
    box: dict = {}

    def serve():
        box["summary"] = run_zmq(cfg.replace(out=str(tmp_path / "run")), quiet=True,
                                 local_clients=False,
                                 on_listen=lambda ep: box.setdefault("endpoint", ep))
    t = threading.Thread(target=serve)
    t.start()
    while "endpoint" not in box and t.is_alive():
        t.join(0.05)
    code = run_host([0, 1, 2, 3], box["endpoint"], register_timeout=30)
    t.join(120)
    s = box["summary"]
    assert code == 0 and s["status"] == "completed" and not s["failures"]
    assert s["bytes"]["client_to_client"] > 0
    assert {k: s["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}
    assert s["rejected_messages"] > 0  # the duplicates
    with np.load(tmp_path / "run" / "final_model.npz", allow_pickle=False) as z:
        assert same_arrays(ref_model, {k: z[k] for k in z.files})
