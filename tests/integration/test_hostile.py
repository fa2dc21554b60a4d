"""Hostile input to a live run: garbage and mutated frames at the server and at a client's peer
socket. Both keep running, count the rejections, and the run's result is unchanged."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from fednet.core.inproc import run_local
from fednet.protocol import Message, MsgKind, encode, proof
from fednet.server.main import run_zmq
from tests.conftest import small_config

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _frames(g: np.random.Generator, valid: list[bytes]) -> list[bytes]:
    """Random frames, or a valid message with flipped bytes, cut frames or absurd sizes."""
    kind = g.integers(4)
    if kind == 0:
        return [g.bytes(int(g.integers(0, 300))) for _ in range(int(g.integers(1, 4)))]
    frames = [bytearray(f) for f in valid]
    if kind == 1 and frames[0]:
        for _ in range(int(g.integers(1, 6))):
            frames[0][int(g.integers(len(frames[0])))] = int(g.integers(256))
    elif kind == 2:
        frames = frames[: int(g.integers(1, len(frames) + 1))]
        frames[-1] = frames[-1][: int(g.integers(0, len(frames[-1]) + 1))]
    else:
        frames.append(bytearray(g.bytes(64)))
    return [bytes(f) for f in frames]


RUN_KEY = b"h" * 32


def _fuzz(endpoint: str, n: int, seed: int, identity: bytes) -> None:
    """n garbage messages from a holder of the run key (the gate admits it: an insider, e.g. a
    client process gone wrong), with its own routing id."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.identity = identity
    s.plain_username, s.plain_password = b"fednet", proof.gate_password(RUN_KEY).encode()
    s.connect(endpoint)
    g = np.random.default_rng(seed)
    body = {"route": [0, 1], "hop": 1, "kind": "train", "body": {}, "mac": b"\0" * 16}
    valid = [bytes(f) for f in encode(Message(
        MsgKind.HANDOFF, "c0000", "r", 0, 1, 0.0, body, {"w": np.zeros(16, np.float32)}))]
    for _ in range(n):
        s.send_multipart(_frames(g, valid))
    s.close()


def test_garbage_at_server_and_peer_sockets_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(proof, "new_run_key", lambda: RUN_KEY)
    cfg = small_config(clients=3, rounds=4)
    ref = run_local(cfg.replace(out=str(tmp_path / "ref")), quiet=True)
    started = threading.Event()
    shooters: list[threading.Thread] = []

    def attack(session):
        session.handoffs = True  # the clients open peer sockets (only rings need them): shot too
        orig = session.algo.configure_round

        def configure_round(rnd, clients):
            if not started.is_set():  # registered: every peer endpoint is known now
                started.set()
                # (a forged *client* identity is only refused with --secure: CURVE + ZAP)
                targets = [(session_endpoint[0], b"intruder"), (session_endpoint[0], b"c0099")]
                targets += [(c.endpoint, f"mallory{c.cid}".encode()) for c in clients]
                for i, (ep, ident) in enumerate(targets):
                    t = threading.Thread(target=_fuzz, args=(ep, 1500, i, ident))
                    t.start()
                    shooters.append(t)
            return orig(rnd, clients)
        session.algo.configure_round = configure_round

    session_endpoint: list[str] = []
    s = run_zmq(cfg.replace(out=str(tmp_path / "run")), quiet=True, prepare=attack,
                on_listen=session_endpoint.append)
    for t in shooters:
        t.join(30)
    assert s["status"] == "completed" and not s["failures"]
    assert s["rejected_messages"] > 0 and s["client_rejected_messages"] > 0
    with np.load(tmp_path / "ref" / "final_model.npz") as a, \
            np.load(tmp_path / "run" / "final_model.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    assert s["final_accuracy"] == ref["final_accuracy"]
