"""--secure: CURVE on every link, ZAP authentication; what a wire tap sees."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import zmq

from fednet.errors import FednetError
from fednet.models import build_model
from fednet.models.arrays import state_arrays
from fednet.server.main import run_zmq
from fednet.transport.security import add_key, init_keys, load_keys
from tests.conftest import small_config

pytestmark = [pytest.mark.net, pytest.mark.slow]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    init_keys(d)
    add_key(d, "client", "0-3")
    return d


@pytest.mark.parametrize("per_process", [1, 2], ids=["one per process", "two per process"])
def test_secure_fedseq_run_authenticates_server_and_peer_links(tmp_path, keys, per_process):
    """With two clients per process, one ZAP handler serves both clients' peer sockets."""
    p = {"min_samples": 1400, "max_clients": 4, "superclient_fraction": 1.0, "pretrain_epochs": 1}
    cfg = small_config(clients=4, rounds=2,
                       net={"secure": str(keys), "clients_per_process": per_process},
                       algo={"name": "fedseq", "params": p})
    s = run_zmq(cfg.replace(out=str(tmp_path)), quiet=True)
    assert s["status"] == "completed" and not s["failures"]
    assert s["bytes"]["client_to_client"] > 3 * 61_864


def _serve(cfg, out, box):
    try:
        box["summary"] = run_zmq(cfg.replace(out=str(out)), quiet=True, local_clients=False,
                                 on_listen=lambda ep: box.setdefault("endpoint", ep),
                                 join_key=os.environ["FEDNET_JOIN_KEY"])  # (plaintext: as
        # `fednet server`; the key is ignored under --secure)
    except FednetError as e:
        box["error"] = str(e)


def test_a_client_without_an_allowed_key_is_refused_and_gets_no_model(tmp_path, keys):
    cfg = small_config(clients=1, rounds=1, net={"secure": str(keys), "register_timeout": 4.0})
    box: dict = {}
    t = threading.Thread(target=_serve, args=(cfg, tmp_path, box))
    t.start()
    while "endpoint" not in box and t.is_alive():
        t.join(0.05)
    k = load_keys(keys, need_server_secret=False)
    ctx = zmq.Context()
    got = []
    for kind in ("plaintext", "unknown key"):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if kind == "unknown key":
            pub, sec = zmq.curve_keypair()
            s.curve_publickey, s.curve_secretkey, s.curve_serverkey = pub, sec, k.server_public
        s.connect(box["endpoint"])
        s.send_multipart([b"\x81\xa1v\x01"])  # anything: it must never reach the server
        got.append(s.poll(1500))
        s.close()
    ctx.term()
    t.join(30)
    assert got == [0, 0]                       # nothing came back: no WELCOME, no model
    assert "only 0 of 1 clients registered" in box.get("error", "")


class Tap:
    """A TCP relay that records every byte the server sends."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.seen = bytearray()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, True), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, record: bool) -> None:
        try:
            while chunk := a.recv(65536):
                if record:
                    self.seen += chunk
                b.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.mark.parametrize("secure", [False, True])
def test_a_wire_tap_sees_the_model_only_without_secure(tmp_path, keys, secure):
    net = {"secure": str(keys)} if secure else {}
    cfg = small_config(clients=2, rounds=1, net=net)
    box: dict = {}
    t = threading.Thread(target=_serve, args=(cfg, tmp_path / "run", box))
    t.start()
    while "endpoint" not in box and t.is_alive():
        t.join(0.05)
    tap = Tap(box["endpoint"])
    cmd = [sys.executable, "-m", "fednet.cli", "clients", "--connect", f"tcp://127.0.0.1:{tap.port}",
           "--ids", "0-1", "--timeout", "20"] + (["--secure", str(keys)] if secure else [])
    rc = subprocess.run(cmd, capture_output=True, timeout=120).returncode
    t.join(60)
    assert rc == 0 and box["summary"]["status"] == "completed"
    model = state_arrays(build_model("auto", 10, (1, 8, 8), dataset="digits", seed=cfg.seed))
    needle = np.ascontiguousarray(model["fc1.weight"]).tobytes()[:256]
    assert len(tap.seen) > 2 * 61_864
    assert (needle in bytes(tap.seen)) is (not secure)
