"""The trust-boundary harness of bench_trust.py (and of tests/integration/test_liveness.py and
test_resources.py, through it): `fednet server` and `fednet clients` processes found by a marker
in their environment and sharing one join key, raw ZMTP connections that stay half-open, and an
insider (a DEALER holding the join key) that sends READY(hellos). The processes themselves are
benchlib.runner.Proc; the scenarios are benchlib/trust_scenarios.py."""
from __future__ import annotations

import os
import resource
import selectors
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from benchlib.runner import Proc

MB = 1 << 20
MARKER = "FEDNET_TEST_MARKER"
LAN_1MS = str(Path(__file__).resolve().parent / "lan_1ms.csv")
"""--latency lan's links with the digits CNN trained at 1 ms an example (542,592 FLOPs an
example at 542.592 MFLOP/s), the speed these scenarios' kills and timers were set for (the
preset itself now trains it at 8 GFLOP/s, about 68 us an example: a round is over before a
scenario's signal arrives). Its fixed costs a batch (s_per_op, s_per_conv) are 0: left out, a
trace's would be the edge class's at this rate, about 47 ms a batch of 16 more, and the frozen
server would be noticed only after the task being slept through (f25c78f)."""
REAL = ["--epochs", "1", "--batch-size", "16", "--latency", LAN_1MS, "--real-time", "-q"]
LIVENESS = 1.0
"""The liveness timers of every server and client started here, times the defaults (their
--liveness SCALE, config/liveness.py): 1 for the benchmark's figures; tests/integration/
test_liveness.py sets a tenth (set_liveness)."""


def set_liveness(scale: float) -> float:
    """Run the servers and clients started from now on with their liveness timers at `scale`;
    returns the scale before."""
    global LIVENESS
    before, LIVENESS = LIVENESS, scale
    return before


def liveness_args() -> list[str]:
    """The command-line option of LIVENESS ([] at the defaults)."""
    return [] if LIVENESS == 1.0 else ["--liveness", f"{LIVENESS:g}"]


# ---- processes (benchlib.runner.Proc) ----------------------------------------------------------
def join_key() -> str:
    """The join key file every plaintext server and client here shares (FEDNET_JOIN_KEY, or a
    new file's path in the temporary folder; the first server writes it)."""
    if not os.environ.get("FEDNET_JOIN_KEY"):
        import tempfile
        os.environ["FEDNET_JOIN_KEY"] = os.path.join(tempfile.mkdtemp(), "join.key")
    return os.environ["FEDNET_JOIN_KEY"]


def make_env(marker: str | None = None) -> dict[str, str]:
    """The environment of the fednet subprocesses (a marker to find leftovers by, the join
    key)."""
    join_key()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARKER: marker or uuid.uuid4().hex})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def start_server(args: list[str], env: dict[str, str], cwd: Path) -> tuple[Proc, str]:
    """`fednet server --bind tcp://127.0.0.1:0 ARGS` and the endpoint it printed."""
    srv = Proc(["server", "--bind", "tcp://127.0.0.1:0", *liveness_args(), *args], env, cwd)
    hit = srv.find(r"^server listening on (tcp://127\.0\.0\.1:\d+)$", timeout_s=90)
    if not hit:
        srv.kill_all()
        raise RuntimeError(f"fednet server did not start: {srv.text()[-2000:]}")
    return srv, hit[0][1].rsplit(" ", 1)[1]


def start_clients(endpoint: str, ids: str, env: dict[str, str], cwd: Path,
                  timeout_s: float = 30.0) -> Proc:
    """`fednet clients --connect ENDPOINT --ids IDS --timeout T`."""
    return Proc(["clients", "--connect", endpoint, "--ids", ids, "--timeout", f"{timeout_s:g}",
                 *liveness_args()], env, cwd)


def client_processes(clients: Proc, n: int, timeout_s: float = 60.0) -> list[psutil.Process]:
    """The n client processes of a `fednet clients` (children of its zygote)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            kids = [k for z in psutil.Process(clients.pid).children()
                    if "fednet.launch.zygote" in " ".join(z.cmdline()) for k in z.children()]
            if len(kids) >= n:
                return kids
        except psutil.Error:
            pass
        if clients.p.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"fednet clients did not fork {n} clients: {clients.text()[-2000:]}")


def wait_lines(path: Path, n: int, procs: list[Proc], timeout_s: float = 60.0) -> None:
    """Block until the file has n lines; fails if one of procs exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        for p in procs:
            if p.p.poll() is not None:
                raise RuntimeError(f"exited ({p.p.returncode}) early: {p.text()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{path} did not reach {n} lines within {timeout_s}s")


def marked(marker: str) -> list[psutil.Process]:
    """Live processes started with FEDNET_TEST_MARKER=marker."""
    out = []
    for p in psutil.process_iter():
        try:
            if (p.pid != os.getpid() and p.environ().get(MARKER) == marker
                    and p.status() != psutil.STATUS_ZOMBIE):
                out.append(p)
        except psutil.Error:
            pass
    return out


def raise_nofile(need: int) -> None:
    """Raise this process's soft limit of open files to at least `need` (up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need if hard == resource.RLIM_INFINITY else min(hard, need)
    if soft != resource.RLIM_INFINITY and want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# ---- raw ZMTP ----------------------------------------------------------------------------------
GREETING = (b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"PLAIN".ljust(20, b"\0") + b"\0"
            + b"\0" * 31)
"""A ZMTP 3.0 greeting: signature, version 3.0, mechanism PLAIN (the plaintext server's gate:
a NULL greeting is refused at once), as-server 0, filler (64 bytes)."""


PARTIAL_COMMAND = bytes([0x04, 200]) + b"\0" * 20  # a 200-byte command (HELLO), 20 bytes of it


def open_half_open(endpoint: str, n: int, mode: str, batch: int = 50,
                   timeout_s: float = 30.0) -> list[socket.socket]:
    """n raw TCP connections to endpoint that each stay half-open:

    mode "frame": the ZMTP greeting is completed, then part of the handshake's first command
    (PLAIN's HELLO, which would carry the join key) is sent: a connection whose first frame
    never ends;
    mode "greeting": only the first 11 bytes of the greeting are sent (the handshake never ends).

    Connections are opened `batch` at a time (libzmq listens with a backlog of 100); a batch is
    done when the server has answered each of its connections (accepted, greeting under way).
    """
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    data = GREETING + PARTIAL_COMMAND if mode == "frame" else GREETING[:11]
    want = 64 if mode == "frame" else 10  # the server's greeting (or its signature) came back
    socks: list[socket.socket] = []
    deadline = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    try:
        for start in range(0, n, batch):
            pending: dict[socket.socket, int] = {}
            for _ in range(min(batch, n - start)):
                s = socket.create_connection((host, int(port)), timeout=10)
                s.sendall(data)
                s.setblocking(False)
                socks.append(s)
                pending[s] = 0
                sel.register(s, selectors.EVENT_READ)
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the server answered only {len(socks) - len(pending)} "
                                       f"of {n} connections within {timeout_s:g}s")
                for key, _ in sel.select(0.5):
                    s = key.fileobj  # type: ignore[assignment]
                    try:
                        chunk = s.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:  # reset
                        chunk = b""
                    pending[s] += len(chunk) if chunk else want  # closed already: done too
                    if pending[s] >= want:
                        sel.unregister(s)
                        del pending[s]
    except BaseException:
        for s in socks:
            s.close()
        raise
    finally:
        sel.close()
    return socks


def closed_by_peer(s: socket.socket) -> bool:
    """True when the other end closed the connection (reads what is pending)."""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _run_key() -> bytes:
    """The run key of the servers here: their join key (the first server wrote it)."""
    from fednet.protocol import join_key as join
    return join.wait_for(join_key(), 30)


def hello_frames(cid: int, nonce: bytes | None = None) -> list[bytes]:
    """The frames of a READY(hellos) claiming client cid, proven with the join key as `fednet
    clients` proves it (a fresh nonce unless one is given): the server link's envelope, then
    the message."""
    import numpy as np

    from fednet.protocol import Message, MsgKind, encode
    from fednet.protocol.proof import hellos_proof, process_secret
    from fednet.transport.channels import sub_frame
    from fednet.types import client_name

    nonce = nonce or os.urandom(16)
    cids = np.array([cid], np.int64)
    body = {"phase": "hellos", "device": "cpu", "pid": os.getpid(), "host": "bench",
            "nonce": nonce,
            "proof": hellos_proof(process_secret(_run_key()), cids.tobytes(), nonce)}
    return [sub_frame(cid)] + [bytes(f) for f in encode(Message(MsgKind.READY, client_name(cid),
                                                                 body=body,
                                                                 arrays={"cids": cids}))]


def insider(ctx: Any) -> Any:
    """A DEALER that holds the join key (passes the gate of a plaintext `fednet server`)."""
    import zmq

    from fednet.protocol.proof import gate_password
    from fednet.transport import gate

    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    gate.client(gate_password(_run_key()))(s)
    return s


def welcome_for(endpoint: str, cid: int, timeout_s: float = 10.0) -> str:
    """Send one READY(hellos) for cid on a fresh key holder's DEALER; the kind of the answer (''
    if none)."""
    import zmq

    from fednet.protocol import decode

    ctx = zmq.Context()
    s = insider(ctx)
    try:
        s.connect(endpoint)
        s.send_multipart(hello_frames(cid))
        if not s.poll(int(timeout_s * 1000)):
            return ""
        return decode(s.recv_multipart()[1:]).kind.name  # after the envelope
    finally:
        s.close(0)
        ctx.term()


# ---- scenarios ---------------------------------------------------------------------------------
class ThreadServer:
    """`run_zmq(local_clients=False)` (what `fednet server` runs) in a thread of this process;
    `hooks(session)` may wrap the algorithm's methods (a `prepare` callback)."""

    def __init__(self, cfg: Any, hooks: Any) -> None:
        from fednet.server.main import run_zmq

        self.box: dict[str, Any] = {}

        def serve() -> None:
            try:
                self.box["summary"] = run_zmq(cfg, quiet=True, local_clients=False, prepare=hooks,
                                              on_listen=lambda ep: self.box.setdefault("ep", ep),
                                              join_key=join_key())
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                self.box["error"] = e

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        while "ep" not in self.box and self.thread.is_alive():
            self.thread.join(0.05)
        if "ep" not in self.box:
            raise RuntimeError(f"the server did not start: {self.box.get('error')!r}")
        self.endpoint: str = self.box["ep"]

    @property
    def summary(self) -> dict[str, Any] | None:
        """summary.json's contents once the run ended."""
        return self.box.get("summary")

    @property
    def error(self) -> BaseException | None:
        """What ended the run with an exception, if anything did."""
        return self.box.get("error")


def _cfg(out: Path, rounds: int, scale: float) -> Any:
    from fednet.config import from_dict
    from fednet.config.liveness import DEFAULT

    return from_dict({"clients": 3, "rounds": rounds, "seed": 7, "out": str(out),
                      "latency": {"preset": "lan", "file": LAN_1MS, "real": True,
                                  "time_scale": scale},
                      "train": {"epochs": 1, "batch_size": 16, "lr": 0.1},
                      "liveness": DEFAULT.scaled(LIVENESS).to_dict()})


