"""Generated wrong messages of every kind, and forged claims, against a live run.

Every message is refused: no process stops, the final model is bit-identical to an undisturbed
run, the accepted byte totals are the undisturbed run's, and each refused message is counted in
`rejected_messages` and `bytes.rejected` (exactly: what was sent is what was refused)."""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from fednet.server.main import run_zmq
from fednet.transport.security import add_key, init_keys, load_keys
from tests.conftest import run_for_model, same_arrays, small_config
from tests.fuzz_schema import frames_of, runtime_attacks, schema_attacks
from tests.harness import BYTE_KEYS as KEYS
from tests.integration.conftest import server_endpoint

pytestmark = [pytest.mark.net, pytest.mark.slow]

FEDSEQ = {"min_samples": 1400, "max_clients": 4, "superclient_fraction": 1.0, "pretrain_epochs": 1}


def handshake(sock: zmq.Socket, endpoint: str, timeout_s: float = 5.0) -> str:
    """Connect sock and wait for its handshake: 'ok', 'denied' (ZAP refused it) or 'timeout'."""
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                  | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
    sock.connect(endpoint)
    try:
        if not mon.poll(int(timeout_s * 1000)):
            return "timeout"
        ev = recv_monitor_message(mon)["event"]
        return "ok" if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED else "denied"
    finally:
        sock.disable_monitor()
        mon.close(0)


def knock_all(endpoint: str, idents: list[bytes], timeout_s: float = 3.0) -> list[str]:
    """One DEALER per routing id (b"": none) connecting to endpoint, all at once, each
    handshake's outcome ('ok', 'denied', 'timeout') within one shared deadline. At once, not
    one after another: a refused mechanism is often closed without an event the monitor sees
    (the greeting lost in the reset), so each such knock waits out the deadline, and 45 of them
    in a row held the run for 135 s."""
    ctx = zmq.Context.instance()
    events = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
    knocks = []
    for ident in idents:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if ident:
            s.identity = ident
        mon = s.get_monitor_socket(events)
        s.connect(endpoint)
        knocks.append((s, mon))
    deadline, out = time.monotonic() + timeout_s, []
    for _s, mon in knocks:
        if mon.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            ev = recv_monitor_message(mon)["event"]
            out.append("ok" if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED else "denied")
        else:
            out.append("timeout")
    for s, mon in knocks:
        s.disable_monitor()
        mon.close(0)
        s.close(0)
    return out


class Shooter:
    """Sends every generated attack to each target it can complete a handshake with; counts
    messages and bytes sent, and the targets whose handshake was refused."""

    def __init__(self, senders: tuple[str, ...] = ("c0000", "c0001", "c0003"),
                 gate: str | None = None) -> None:
        self.senders, self.gate = senders, gate  # gate: the run's PLAIN password (an insider)
        self.sent: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.denied: set[str] = set()

    def fire(self, target: str, endpoint: str, run_id: str, route: list[int],
             curve: tuple[bytes, bytes, bytes] | None = None) -> None:
        ctx = zmq.Context.instance()
        self.sent.setdefault(target, 0)
        self.bytes.setdefault(target, 0)
        for sender in self.senders:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 5000)
            if curve is not None:
                s.curve_publickey, s.curve_secretkey, s.curve_serverkey = curve
            elif self.gate is not None:
                s.plain_username, s.plain_password = b"fednet", self.gate.encode()
            if handshake(s, endpoint) != "ok":
                self.denied.add(target)
                s.close(0)
                continue
            batches = [f for _, f in schema_attacks(sender, run_id)]
            key = curve[0].decode() if curve is not None else ""
            for rid in ("", run_id):
                batches += [frames_of(m) for _, m in runtime_attacks(sender, rid, route, key)]
            for frames in batches:
                s.send_multipart(frames)
                self.sent[target] = self.sent.get(target, 0) + 1
                self.bytes[target] = self.bytes.get(target, 0) + sum(map(len, frames))
            s.close()  # linger: everything queued reaches the target


def _attack_when_registered(session, box, shooter: Shooter, curve_for=None) -> None:
    """Start the shooters at the first round, when every endpoint is known; wait for them
    before round 2 so every attack is in before the run ends."""
    orig = session.algo.configure_round
    threads: list[threading.Thread] = []

    def configure_round(rnd, clients):
        if not threads:
            targets = [("server", box["endpoint"], None)]
            targets += [(f"peer{c.cid}", c.endpoint, c.cid) for c in clients]
            for name, ep, cid in targets:
                curve = curve_for(name, cid) if curve_for else None
                t = threading.Thread(target=shooter.fire,
                                     args=(name, ep, session.run_id, [0, 1, 2, 3], curve))
                t.start()
                threads.append(t)
        elif rnd == 2:
            for t in threads:
                t.join(60)
        return orig(rnd, clients)
    session.algo.configure_round = configure_round


def _check(s, ref, ref_model, out: Path, shooter: Shooter) -> None:
    assert s["status"] == "completed" and not s["failures"], s["failures"]
    _, model = ref_model
    from numpy import load
    with load(out / "final_model.npz", allow_pickle=False) as z:
        assert same_arrays(model, {k: z[k] for k in z.files})
    assert {k: s["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}
    assert s["rejected_messages"] == shooter.sent["server"]
    assert s["bytes"]["rejected"] == shooter.bytes["server"]
    peers = sum(v for k, v in shooter.sent.items() if k.startswith("peer"))
    assert s["client_rejected_messages"] == peers
    assert s["client_rejected_bytes"] == sum(v for k, v in shooter.bytes.items()
                                             if k.startswith("peer"))
    assert all(code == 0 for code in s.get("client_exit_codes", {}).values())


RUN_KEY = b"k" * 32


def test_generated_wrong_messages_change_nothing_under_launch(tmp_path, caplog, monkeypatch):
    """Plaintext `fednet launch`, attacked by a holder of the run key (an insider: the gate
    admits it): every kind wrong in every field, unproven hellos for real ids, stale results,
    forged hand-offs at every peer socket."""
    from fednet.protocol import proof

    monkeypatch.setattr(proof, "new_run_key", lambda: RUN_KEY)
    cfg = small_config(clients=4, rounds=3, algo={"name": "fedseq", "params": FEDSEQ})
    ref = run_for_model(cfg, tmp_path, "ref")
    box: dict = {}
    shooter = Shooter(gate=proof.gate_password(RUN_KEY))
    s = run_zmq(cfg.replace(out=str(tmp_path / "run")), quiet=True,
                prepare=lambda session: _attack_when_registered(session, box, shooter),
                on_listen=lambda ep: box.setdefault("endpoint", ep))
    assert shooter.sent["server"] > 1000 and len(shooter.sent) == 5 and not shooter.denied
    _check(s, ref[0], ref, tmp_path / "run", shooter)
    # every refusal came from the schema or an explicit rule, none from a handler that raised
    assert not [r for r in caplog.records if "could not be handled" in r.getMessage()]


@pytest.fixture()
def host_keys(tmp_path):
    d = tmp_path / "keys"
    init_keys(d)
    add_key(d, "hostA", "0-1")
    add_key(d, "hostB", "2-3")
    return d


def _secure_run(cfg, out: Path, keys: Path, shooter: Shooter | None, curve_for=None) -> dict:
    """`fednet server --secure` here, clients 0-1 (hostA's key) and 2-3 (hostB's) as
    `fednet clients` processes; the shooter (if any) fires once they registered."""
    box: dict = {}

    def prepare(session):
        if shooter is not None:
            _attack_when_registered(session, box, shooter, curve_for)

    def serve():
        box["summary"] = run_zmq(cfg.replace(out=str(out)), quiet=True, local_clients=False,
                                 prepare=prepare,
                                 on_listen=lambda ep: box.setdefault("endpoint", ep))
    t = threading.Thread(target=serve)
    t.start()
    while "endpoint" not in box and t.is_alive():
        t.join(0.05)
    procs = [subprocess.Popen([sys.executable, "-m", "fednet.cli", "clients", "--connect",
                               box["endpoint"], "--ids", ids, "--timeout", "30", "--secure",
                               str(keys), "--key", key])
             for ids, key in (("0-1", "hostA"), ("2-3", "hostB"))]
    t.join(180)
    assert [p.wait(60) for p in procs] == [0, 0]
    return box["summary"]


def test_a_holder_of_another_hosts_key_cannot_claim_its_clients(tmp_path, host_keys):
    """`fednet server --secure`: clients 0-1 run with hostA's key, 2-3 with hostB's. The holder
    of hostB's key claims c0000 and c0001 at the server and forges hand-offs into hostA's peer
    sockets; an unknown key forges hand-offs into hostB's: all refused, and the run is the
    undisturbed one (same model, same bytes)."""
    cfg = small_config(clients=4, rounds=3, algo={"name": "fedseq", "params": FEDSEQ},
                       net={"secure": str(host_keys)})
    quiet = _secure_run(cfg, tmp_path / "ref", host_keys, None)
    with np.load(tmp_path / "ref" / "final_model.npz", allow_pickle=False) as z:
        ref_model = {k: z[k] for k in z.files}
    shooter = Shooter(senders=("c0000", "c0001"))  # the ids hostB's key may not claim
    outsider = zmq.curve_keypair()  # a CURVE key no one allowed
    a = load_keys(host_keys, need_server_secret=False, name="hostA")
    b = load_keys(host_keys, need_server_secret=False, name="hostB")

    def curve_for(name, cid):
        if name == "server":
            return b.client_public, b.client_secret, b.server_public
        if cid in (0, 1):  # hostA's peers: hostB's key may not hand off as 0 or 1
            return b.client_public, b.client_secret, a.client_public
        return outsider[0], outsider[1], b.client_public  # hostB's peers: an unknown key

    s = _secure_run(cfg, tmp_path / "run", host_keys, shooter, curve_for)
    _check(s, quiet, (quiet, ref_model), tmp_path / "run", shooter)
    # a key in no allowed/ folder completes no handshake with a peer (the run's keys, WELCOME)
    assert shooter.denied == {"peer2", "peer3"}


ABORT = """
import sys, time, zmq
from fednet.transport import channels, gate
ctx = zmq.Context()
gated = sys.argv[1] == "gated"
auth = gate.Gate(ctx, "pw") if gated else None
sock, ep = channels.bind_router(ctx, "127.0.0.1", 0, setup=gate.server if gated else None)
bad = ctx.socket(zmq.DEALER)
bad.identity = b"\\x00\\x6b\\x8b\\x45\\x67"  # the first id libzmq generates when rand() is unseeded
bad.connect(ep)
time.sleep(0.5)
good = channels.connect_dealer(ctx, ep, gate.client("pw") if gated else None)
good.send(b"hello")
print("received", sock.poll(3000) and sock.recv_multipart()[1], flush=True)
if auth is not None:
    auth.stop()
"""


@pytest.mark.parametrize("gated", [False, True], ids=["no gate", "gate"])
def test_a_peer_chosen_routing_id_cannot_abort_a_gated_router(tmp_path, gated):
    """libzmq 4.3.5 aborts a process whose ROUTER generates a routing id a peer already chose.
    Behind the gate (plaintext launch) the peer without the run key gets no routing id at all:
    the process lives and serves the real client. Without it the same script aborts (the
    control: this test can fail)."""
    r = subprocess.run([sys.executable, "-c", ABORT, "gated" if gated else "open"],
                       capture_output=True, text=True, timeout=60)
    if gated:
        assert r.returncode == 0 and "received b'hello'" in r.stdout, r.stderr
    else:
        assert r.returncode == -6 and "Assertion failed" in r.stderr


def test_outsiders_without_the_run_key_complete_no_handshake_under_launch(tmp_path):
    """Plaintext `fednet launch`: connections without the run key, with libzmq-style routing
    ids (0x00 + 4 bytes) or none, at the server and every peer port, are refused in the
    handshake; the run is the undisturbed one."""
    cfg = small_config(clients=4, rounds=3, algo={"name": "fedseq", "params": FEDSEQ})
    ref = run_for_model(cfg, tmp_path, "ref")
    box: dict = {}
    results: list[str] = []

    def knock(endpoint: str) -> None:
        results.extend(knock_all(endpoint, [b"\x00" + i.to_bytes(4, "big")
                                            for i in range(0, 1 << 32, 1 << 29)] + [b""]))

    def prepare(session):
        orig = session.algo.configure_round

        def configure_round(rnd, clients):
            if rnd == 0:
                for ep in [box["endpoint"]] + [c.endpoint for c in clients]:
                    knock(ep)
            return orig(rnd, clients)
        session.algo.configure_round = configure_round

    s = run_zmq(cfg.replace(out=str(tmp_path / "run")), quiet=True, prepare=prepare,
                on_listen=lambda ep: box.setdefault("endpoint", ep))
    assert len(results) == 5 * 9 and "ok" not in results, results  # no handshake completed
    assert s["status"] == "completed" and not s["failures"]
    with np.load(tmp_path / "run" / "final_model.npz", allow_pickle=False) as z:
        assert same_arrays(ref[1], {k: z[k] for k in z.files})
    assert all(code == 0 for code in s.get("client_exit_codes", {}).values())


def _greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting (64 bytes) offering `mechanism`, as the connecting side."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0" * 32


def _hold_big_frames(port: int, n: int, announce: int, send: int) -> list:
    """n raw TCP connections, each a PLAIN greeting and then a command frame announcing
    `announce` bytes, of which it sends `send` and stops (half-open, holding part of a frame)."""
    import socket

    held = []
    chunk = b"\0" * send
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.sendall(_greeting(b"PLAIN") + b"\x06" + announce.to_bytes(8, "big"))
        s.settimeout(0.2)
        try:
            s.sendall(chunk)
        except OSError:  # the server already cut it: nothing more is buffered anyway
            pass
        held.append(s)
    return held


def test_plaintext_fednet_server_admits_only_join_key_holders(tmp_path, fed):
    """`fednet server` (plaintext) gates every handshake with its join key: connections without
    it, with libzmq-style routing ids (the abort of item 1) or none, complete no handshake; 300
    half-open connections each announcing a 1 GiB frame and sending 1 MiB of it cost the server
    almost nothing (frames over 1.25 MiB are cut: was 2 GiB each, buffered as they came); the
    key holders then run undisturbed to the same model as fednet local."""
    import psutil

    key = tmp_path / "join.key"
    args = ["--clients", "3", "--rounds", "2", "--epochs", "1", "--seed", "5", "-q"]
    ref = fed.run("local", *args, "--out", str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    port = _free_tcp_port()
    srv = fed.start("server", "--bind", f"tcp://127.0.0.1:{port}", *args, "--join-key", str(key),
                    "--out", str(tmp_path / "run"), "--register-timeout", "120")
    # measured from when it listens: its session built (the data, the model, the clock's first
    # count of its work: ~150 MB of imports), not from when its join key appears, before them
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in srv.stderr], daemon=True).start()
    ep = server_endpoint(lines, srv, "127.0.0.1")
    assert ep == f"tcp://127.0.0.1:{port}" and key.exists()
    results = knock_all(ep, [b"\x00\x6b\x8b\x45\x67"] + [b"\x00" + i.to_bytes(4, "big")
                                                       for i in range(0, 1 << 32, 1 << 30)] + [b""])
    assert "ok" not in results and len(results) == 6, results
    server = psutil.Process(srv.pid)
    before = server.memory_info().rss
    held = _hold_big_frames(port, 300, 1 << 30, 1 << 20)
    time.sleep(1.0)
    grown = (server.memory_info().rss - before) / 2**20
    for s in held:
        s.close()
    assert grown < 50, f"the server grew {grown:.0f} MB under 300 half-open big frames"
    wrong = tmp_path / "wrong.key"
    wrong.write_text("ab" * 32)  # a join key, not this run's: refused, and it says so
    wrong.chmod(0o600)
    bad = fed.run("clients", "--connect", ep, "--ids", "0", "--join-key", str(wrong),
                  "--timeout", "3", timeout=60)
    assert bad.returncode != 0 and "refused this host at the handshake" in bad.stderr, bad.stderr
    cl = fed.run("clients", "--connect", ep, "--ids", "0-2", "--join-key", str(key), timeout=120)
    assert cl.returncode == 0, cl.stderr
    assert srv.wait(60) == 0
    with np.load(tmp_path / "run" / "final_model.npz") as a, \
            np.load(tmp_path / "ref" / "final_model.npz") as b:
        assert same_arrays({k: a[k] for k in a.files}, {k: b[k] for k in b.files})


def _free_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
