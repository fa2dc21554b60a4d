"""Liveness and bounded resources at the trust boundary (issue 11), over live sockets and real
processes, in one run:

  (a) kill-to-failure: `run_zmq(local_clients=False)` (what `fednet server` runs) in a thread of
      this process, 3 clients from `fednet clients` in a subprocess, --real-time so that a round
      lasts a few seconds; one client process is SIGKILLed 1 s into round 1. Seconds from the
      kill until the Failure reaches the algorithm (default --round-timeout 300 s).
      The same with SIGSTOP (a frozen client: only the heartbeats can tell).
  (b) kill-all: `fednet server` and `fednet clients` subprocesses; every client process is
      SIGKILLed mid-round. Seconds from the kill until the server exits (status no_clients,
      exit code 3), and the rounds it ran. (b') the same between two rounds (server in a thread).
  (c) freeze-to-notice: `fednet server` is SIGSTOPped mid-run (TCP stays up); seconds until each
      client logs "lost the server" (its stderr, time-stamped as read). Then SIGCONT, and what
      the rest of the run did. (c') a remote client SIGKILLed and started again: registered?
  (d) half-open: 2,000 raw TCP connections to a `fednet server` waiting for its clients, either
      completing the ZMTP 3.0 greeting (PLAIN: the join key's gate) and then sending part of the
      handshake's first command, or sending part of the greeting only. The server's RSS
      (/proc/PID/status VmRSS) is sampled every
      20 ms: peak above the baseline, and what is left a few seconds after the server has
      closed every one of them (heartbeat / handshake timeouts).
  (e) flood: one DEALER holding the join key (an insider) claims client 1 of a 2-client run and
      sends 200,000 READY(hello) (for
      client 1 again, or for an id out of range) without ever reading a reply, while client 0
      registers; the server's peak RSS above the baseline; then it leaves and the run
      completes with client 0.

    python3 benchmarks/bench_trust.py [--json FILE]      # about 3 minutes on 2 cores

The tests in tests/integration/test_liveness.py and test_resources.py run these same scenarios
and assert the issue's targets: failure within 5 s, no_clients/exit 3 at once, a frozen server
noticed within 10 s, 2,000 half-open connections <= 50 MB and given back, a bounded flood.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

MB = 1 << 20
MARKER = "FEDNET_TEST_MARKER"
REAL = ["--epochs", "1", "--batch-size", "16", "--latency", "lan", "--real-time", "-q"]


# ---- processes ---------------------------------------------------------------------------------
def fednet_cmd() -> list[str]:
    """The installed `fednet` script (the same entry point a user types)."""
    exe = shutil.which("fednet")
    return [exe] if exe else [sys.executable, "-c", "from fednet.cli import main; main()"]


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


class Proc:
    """A `fednet` subprocess in its own session whose stderr lines are kept with the time
    (time.monotonic()) they were read."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.p = subprocess.Popen(fednet_cmd() + args, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.pid = self.p.pid
        self.lines: list[tuple[float, str]] = []
        self.eof = False
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            with self._cv:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cv.notify_all()
        with self._cv:
            self.eof = True
            self._cv.notify_all()

    def find(self, pattern: str, n: int = 1, timeout_s: float = 30.0) -> list[tuple[float, str]]:
        """The first n lines matching the regex (with their times); fewer if the time ran out
        or the process closed stderr."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                hits = [(t, x) for t, x in self.lines if rx.search(x)]
                left = deadline - time.monotonic()
                if len(hits) >= n or left <= 0 or self.eof:
                    return hits[:n]
                self._cv.wait(min(left, 0.2))

    def text(self) -> str:
        """Everything it wrote to stderr so far."""
        with self._cv:
            return "\n".join(x for _, x in self.lines)

    def kill_all(self) -> None:
        """SIGCONT + SIGKILL its session and every process under it (the zygote has its own)."""
        try:
            procs = [psutil.Process(self.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            procs = []
        for q in procs:
            try:
                q.send_signal(signal.SIGCONT)
                q.kill()
            except psutil.Error:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.p.wait(10)


def start_server(args: list[str], env: dict[str, str], cwd: Path) -> tuple[Proc, str]:
    """`fednet server --bind tcp://127.0.0.1:0 ARGS` and the endpoint it printed."""
    srv = Proc(["server", "--bind", "tcp://127.0.0.1:0", *args], env, cwd)
    hit = srv.find(r"^server listening on (tcp://127\.0\.0\.1:\d+)$", timeout_s=90)
    if not hit:
        srv.kill_all()
        raise RuntimeError(f"fednet server did not start: {srv.text()[-2000:]}")
    return srv, hit[0][1].rsplit(" ", 1)[1]


def start_clients(endpoint: str, ids: str, env: dict[str, str], cwd: Path,
                  timeout_s: float = 30.0) -> Proc:
    """`fednet clients --connect ENDPOINT --ids IDS --timeout T`."""
    return Proc(["clients", "--connect", endpoint, "--ids", ids, "--timeout", f"{timeout_s:g}"],
                env, cwd)


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


# ---- memory ------------------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    """VmRSS of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def fd_count(pid: int) -> int:
    """Open files of a process (0 once it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def settled_rss(pid: int, seconds: float = 1.0) -> int:
    """The median of VmRSS samples over `seconds` (a baseline)."""
    xs = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        xs.append(rss_bytes(pid))
        time.sleep(0.05)
    return sorted(xs)[len(xs) // 2]


class Sampler:
    """Samples a process's VmRSS (and optionally its open files) every `every_s` in a thread."""

    def __init__(self, pid: int, every_s: float = 0.02, fds: bool = False) -> None:
        self.pid, self.every_s, self.fds = pid, every_s, fds
        self.peak_rss = 0
        self.peak_fds = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))
            if self.fds:
                self.peak_fds = max(self.peak_fds, fd_count(self.pid))
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        """Stop sampling (one last sample first)."""
        self._stop.set()
        self._t.join(5)
        self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))


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
    """The frames of a READY(hello) claiming client cid, proven with the join key as `fednet
    clients` proves it (a fresh nonce unless one is given): the server link's envelope, then
    the message."""
    from fednet.protocol import Message, MsgKind, encode
    from fednet.protocol.proof import client_secret, hello_proof
    from fednet.transport.channels import sub_frame
    from fednet.types import client_name

    nonce = nonce or os.urandom(16)
    body = {"phase": "hello", "cid": cid, "endpoint": "tcp://127.0.0.1:1", "device": "cpu",
            "pid": os.getpid(), "host": "bench", "nonce": nonce,
            "proof": hello_proof(client_secret(_run_key(), cid), cid, nonce)}
    return [sub_frame(cid)] + [bytes(f) for f in encode(Message(MsgKind.READY, client_name(cid),
                                                                 body=body))]


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
    """Send one READY(hello) for cid on a fresh key holder's DEALER; the kind of the answer ('' if
    none)."""
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

    return from_dict({"clients": 3, "rounds": rounds, "seed": 7, "out": str(out),
                      "latency": {"preset": "lan", "real": True, "time_scale": scale},
                      "train": {"epochs": 1, "batch_size": 16, "lr": 0.1}})


def kill_one_client(out: Path, env: dict[str, str], cwd: Path, sig: int = signal.SIGKILL,
                    scale: float = 5.0) -> dict[str, Any]:
    """(a) A ThreadServer, 3 remote clients (`fednet clients`), client 1 sent `sig` 1 s into
    round 1 of 3 (SIGSTOP: frozen, its TCP connection stays up; it is killed once the run
    ended). Returns the signal-to-failure seconds, the failure, the summary."""
    from fednet.types import Failure

    box: dict[str, Any] = {"failures": []}
    round1 = threading.Event()

    def hooks(session: Any) -> None:
        conf, absorb = session.algo.configure_round, session.algo.absorb

        def configure_round(rnd: int, clients: list[Any]) -> Any:
            tasks = conf(rnd, clients)
            if rnd == 1:
                box["pids"] = {c.cid: c.pid for c in clients}
                round1.set()
            return tasks

        def on_reply(done: Any) -> Any:
            if isinstance(done, Failure):
                box["failures"].append((time.monotonic(), done))
            return absorb(done)

        session.algo.configure_round, session.algo.absorb = configure_round, on_reply

    t0 = time.monotonic()
    srv = ThreadServer(_cfg(out, 3, scale), hooks)
    cl = start_clients(srv.endpoint, "0-2", env, cwd)
    try:
        if not round1.wait(60):
            raise RuntimeError(f"round 1 did not start: {srv.error!r} {cl.text()[-2000:]}")
        time.sleep(1.0)  # the victim holds its task (it trains, then sleeps the simulated time)
        os.kill(box["pids"][1], sig)
        t_kill = time.monotonic()
        srv.thread.join(60)
        if sig != signal.SIGKILL:
            os.kill(box["pids"][1], signal.SIGKILL)
        rc = cl.p.wait(30)
    finally:
        if cl.p.poll() is None:
            cl.kill_all()
    first = next(((t, f) for t, f in box["failures"] if f.cid == 1), None)
    return {"kill_to_failure_s": first[0] - t_kill if first else None,
            "failure": first[1] if first else None, "failures": [f for _, f in box["failures"]],
            "summary": srv.summary, "error": srv.error, "clients_rc": rc,
            "clients_stderr": cl.text(), "run_s": time.monotonic() - t0}


def kill_all_between_rounds(out: Path, env: dict[str, str], cwd: Path, rounds: int = 30
                            ) -> dict[str, Any]:
    """(b') A ThreadServer and 3 remote clients; when round 2 is configured (between rounds:
    nobody holds a task), every client process is SIGKILLed and the server goes on 0.3 s later
    (the connections are closed by then). Returns the summary and the rounds."""
    done = threading.Event()
    box: dict[str, Any] = {}

    def hooks(session: Any) -> None:
        conf = session.algo.configure_round

        def configure_round(rnd: int, clients: list[Any]) -> Any:
            if rnd == 2 and not done.is_set():
                for c in clients:
                    os.kill(c.pid, signal.SIGKILL)
                box["t_kill"] = time.monotonic()
                time.sleep(0.3)
                done.set()
            return conf(rnd, clients)

        session.algo.configure_round = configure_round

    srv = ThreadServer(_cfg(out, rounds, 1.0), hooks)
    cl = start_clients(srv.endpoint, "0-2", env, cwd)
    try:
        srv.thread.join(90)
        t_end = time.monotonic()
        rc = cl.p.wait(30)
    finally:
        if cl.p.poll() is None:
            cl.kill_all()
    return {"summary": srv.summary, "error": srv.error, "rows": _rows(out / "metrics.jsonl"),
            "kill_to_end_s": t_end - box["t_kill"] if "t_kill" in box else None,
            "clients_rc": rc, "rounds_planned": rounds}


def kill_all_clients(out: str, env: dict[str, str], cwd: Path, rounds: int = 30,
                     scale: float = 4.0) -> dict[str, Any]:
    """(b) `fednet server` + `fednet clients` (2 clients, --real-time); every client process is
    SIGKILLed 1 s into round 1. Returns the kill-to-exit seconds, exit code and summary."""
    srv, endpoint = start_server(["--clients", "2", "--rounds", str(rounds), *REAL,
                                  "--time-scale", f"{scale:g}", "--out", out], env, cwd)
    cl = start_clients(endpoint, "0-1", env, cwd)
    try:
        kids = client_processes(cl, 2)
        wait_lines(cwd / out / "metrics.jsonl", 1, [srv, cl])
        time.sleep(1.0)
        for k in kids:
            k.kill()
        t_kill = time.monotonic()
        rc = srv.p.wait(60)
        took = time.monotonic() - t_kill
        crc = cl.p.wait(30)
    finally:
        for p in (srv, cl):
            if p.p.poll() is None:
                p.kill_all()
    summary = json.loads((cwd / out / "summary.json").read_text())
    return {"kill_to_exit_s": took, "rc": rc, "clients_rc": crc, "summary": summary,
            "stderr": srv.text(), "rounds_planned": rounds}


def _rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl ([] when there is none)."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _finish(srv: Proc, cl: Proc, out: Path, res: dict[str, Any], grace_s: float = 10.0) -> None:
    """Wait for the server to end its run, then (at most grace_s) for the clients; record exit
    codes (None: still running, then killed), the rows of metrics.jsonl and the summary."""
    try:
        res["rc"] = srv.p.wait(60)
    except subprocess.TimeoutExpired:
        res["rc"] = None
    try:
        res["clients_rc"] = cl.p.wait(grace_s)
    except subprocess.TimeoutExpired:
        res["clients_rc"] = None
    res["rows"] = _rows(out / "metrics.jsonl")
    if (out / "summary.json").exists():
        res["summary"] = json.loads((out / "summary.json").read_text())


def freeze_server(out: str, env: dict[str, str], cwd: Path, after: str = "kill",
                  rounds: int = 6) -> dict[str, Any]:
    """(c) `fednet server` + 2 clients (--timeout 10); the server is SIGSTOPped after its first
    round and SIGCONTinued once both clients logged "lost the server" (at most 12 s). Then
    after="kill": everything is killed; after="wait": the run is left to finish. Returns the
    freeze-to-notice seconds per client (and with "wait" the rounds, summary, exit codes)."""
    srv, endpoint = start_server(["--clients", "2", "--rounds", str(rounds), *REAL,
                                  "--time-scale", "2", "--out", out], env, cwd)
    cl = start_clients(endpoint, "0-1", env, cwd, timeout_s=10)
    res: dict[str, Any] = {}
    try:
        wait_lines(cwd / out / "metrics.jsonl", 1, [srv, cl])
        os.kill(srv.pid, signal.SIGSTOP)
        t_freeze = time.monotonic()
        hits = cl.find(r"client \d+: lost the server at ", n=2, timeout_s=12)
        res["notice_s"] = [t - t_freeze for t, _ in hits]
        res["notice_lines"] = [x for _, x in hits]
        os.kill(srv.pid, signal.SIGCONT)
        res["frozen_s"] = time.monotonic() - t_freeze
        if after == "wait":
            _finish(srv, cl, cwd / out, res)
    finally:
        for p in (srv, cl):
            if p.p.poll() is None:
                p.kill_all()
    res["stderr"], res["clients_stderr"] = srv.text(), cl.text()
    return res


def restart_client(out: str, env: dict[str, str], cwd: Path, rounds: int = 8) -> dict[str, Any]:
    """`fednet server` (2 clients, --real-time) with `fednet clients --ids 0` and `--ids 1`; client
    1's process is SIGKILLed after round 0 and, once it is past the server's grace time, started
    again. Returns the rounds (results per round), summary, exit codes, the restart's stderr."""
    srv, endpoint = start_server(["--clients", "2", "--rounds", str(rounds), *REAL,
                                  "--time-scale", "2", "--out", out], env, cwd)
    a = start_clients(endpoint, "0", env, cwd, timeout_s=10)
    b = start_clients(endpoint, "1", env, cwd, timeout_s=10)
    again: Proc | None = None
    res: dict[str, Any] = {}
    try:
        client_processes(b, 1)
        wait_lines(cwd / out / "metrics.jsonl", 1, [srv, a, b])
        # picked once it has trained: the zygote's first child seen may be a short-lived one
        alive = [k for k in client_processes(b, 1) if k.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            raise RuntimeError(f"client 1 exited by itself: {b.text()[-2000:]}")
        alive[0].kill()
        res["killed_rc"] = b.p.wait(30)
        time.sleep(2.0)  # heartbeats and the grace time: client 1 is gone for the server
        res["restarted_at_round"] = len(_rows(cwd / out / "metrics.jsonl"))
        again = start_clients(endpoint, "1", env, cwd, timeout_s=10)
        _finish(srv, a, cwd / out, res)
        try:
            res["restarted_rc"] = again.p.wait(10)
        except subprocess.TimeoutExpired:
            res["restarted_rc"] = None
    finally:
        for p in (srv, a, b, again):
            if p is not None and p.p.poll() is None:
                p.kill_all()
    res["stderr"], res["restarted_stderr"] = srv.text(), again.text() if again else ""
    return res


def half_open(out: str, env: dict[str, str], cwd: Path, n: int = 2000, mode: str = "frame",
              settle_s: float = 3.0) -> dict[str, Any]:
    """(d) n half-open connections (see open_half_open) to a `fednet server` that waits for its
    client; its RSS before, at the peak, and settle_s after it closed all of them."""
    raise_nofile(n + 512)
    srv, endpoint = start_server(["--clients", "1", "--rounds", "1", "--register-timeout", "120",
                                  "-q", "--out", out], env, cwd)
    res: dict[str, Any] = {"n": n, "mode": mode}
    socks: list[socket.socket] = []
    try:
        base = settled_rss(srv.pid)
        base_fds = fd_count(srv.pid)
        sampler = Sampler(srv.pid, fds=True)
        t0 = time.monotonic()
        socks = open_half_open(endpoint, n, mode)
        res["open_s"] = time.monotonic() - t0
        res["open_at_end"] = fd_count(srv.pid) - base_fds
        deadline = time.monotonic() + 30
        while True:  # the server closes them (heartbeat or handshake timeout)
            left = [s for s in socks if not closed_by_peer(s)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        res["closed_by_server"] = n - len(left)
        res["closed_s"] = time.monotonic() - t0
        time.sleep(settle_s)
        sampler.stop()
        after = settled_rss(srv.pid, 0.5)
        res.update(base_mb=base / MB, peak_mb=(sampler.peak_rss - base) / MB,
                   after_mb=(after - base) / MB, settle_s=settle_s,
                   peak_open=sampler.peak_fds - base_fds,
                   fds_after=fd_count(srv.pid) - base_fds)
        for s in socks:
            s.close()
        socks = []
        res["answers_hello"] = welcome_for(endpoint, 0)
        srv.p.send_signal(signal.SIGTERM)
        res["rc"] = srv.p.wait(30)
    finally:
        for s in socks:
            s.close()
        if srv.p.poll() is None:
            srv.kill_all()
    return res


def flood(out: str, env: dict[str, str], cwd: Path, n: int = 200_000, claim: int = 1
          ) -> dict[str, Any]:
    """(e) A 2-client `fednet server`; one DEALER claims client 1 with a READY(hello) and then
    sends n READY(hello) claiming client `claim` (1 again, or an id out of range) without ever
    reading a reply, while `fednet clients --ids 0` registers. Then it leaves, and the run
    completes with client 0 alone once client 1's connection is gone (the run cannot start
    before: client 1 is taken). Returns the server's peak RSS above its baseline during the
    flood, the flood's duration, exit codes and the summary."""
    import zmq

    srv, endpoint = start_server(["--clients", "2", "--rounds", "2", "--epochs", "1",
                                  "--batch-size", "16", "--latency", "none", "-q",
                                  "--out", out], env, cwd)
    frames = hello_frames(claim)
    res: dict[str, Any] = {"n": n, "claim": claim,  # the message's bytes (not its envelope)
                           "hello_bytes": sum(map(len, frames[1:]))}
    cl: Proc | None = None
    ctx = zmq.Context()
    s = insider(ctx)  # a holder of the join key that misbehaves
    s.setsockopt(zmq.SNDTIMEO, 60_000)  # a server that stopped reading fails the flood
    try:
        base = settled_rss(srv.pid)
        sampler = Sampler(srv.pid)
        s.connect(endpoint)
        t0 = time.monotonic()
        cl = start_clients(endpoint, "0", env, cwd)
        s.send_multipart(hello_frames(1))  # client 1's place is taken: the run waits
        for _ in range(n):
            s.send_multipart(frames)
        res["flood_s"] = time.monotonic() - t0
        time.sleep(1.0)  # the last queued messages reach the server
        sampler.stop()
        res.update(base_mb=base / MB, peak_mb=(sampler.peak_rss - base) / MB)
        s.close(0)  # gone (claim 1: dead after the grace time; the run starts with client 0)
        res["rc"] = srv.p.wait(90)
        res["clients_rc"] = cl.p.wait(30)
        res["run_s"] = time.monotonic() - t0
        res["summary"] = json.loads((cwd / out / "summary.json").read_text())
    finally:
        s.close(0)
        ctx.term()
        for p in (srv, cl):
            if p is not None and p.p.poll() is None:
                p.kill_all()
    res["stderr"] = srv.text()
    return res


# ---- the benchmark -----------------------------------------------------------------------------
def _scenarios(a: argparse.Namespace, env: dict[str, str], cwd: Path):
    """(name, facts, table row) per scenario, in order (each one runs when asked for)."""
    for sig, what in ((signal.SIGKILL, "SIGKILLed"), (signal.SIGSTOP, "SIGSTOPped (frozen)")):
        r = kill_one_client(cwd / f"a-{sig}", env, cwd, sig=sig)
        f = r["failure"]
        yield (f"client_{signal.Signals(sig).name}", {"signal_to_failure_s": r["kill_to_failure_s"],
                                                     "reason": f.reason if f else repr(r["error"]),
                                                     "status": (r["summary"] or {}).get("status")},
               [f"(a) one remote client {what} mid-round: signal -> Failure",
                _s(r["kill_to_failure_s"]), "<= 5 s" if sig == signal.SIGKILL else "(heartbeats)",
                f"round timeout 300 s; run {(r['summary'] or {}).get('status')}"])
    r = kill_all_clients("b", env, cwd)
    s = r["summary"]
    yield ("kill_all", {"kill_to_exit_s": r["kill_to_exit_s"], "rc": r["rc"], "status": s["status"],
                        "rounds": s["rounds"], "rounds_planned": r["rounds_planned"]},
           ["(b) every remote client SIGKILLed: kill -> server exit", _s(r["kill_to_exit_s"]),
            "no_clients, exit 3", f"{s['status']}, exit {r['rc']}, {s['rounds']} of "
            f"{r['rounds_planned']} rounds"])
    r = kill_all_between_rounds(cwd / "b2", env, cwd)
    s = r["summary"] or {}
    res = [row["results"] for row in r["rows"]]
    yield ("kill_all_between_rounds", {"status": s.get("status"), "rounds": s.get("rounds"),
                                       "results": res, "kill_to_end_s": r["kill_to_end_s"]},
           ["(b') every remote client SIGKILLed between rounds: kill -> end of run",
            _s(r["kill_to_end_s"]), "no_clients", f"{s.get('status')}, {s.get('rounds')} of "
            f"{r['rounds_planned']} rounds, results per round {res[:4]}..."])
    r = freeze_server("c", env, cwd, after="wait")
    res = [row["results"] for row in r.get("rows", [])]
    yield ("freeze", {"notice_s": r["notice_s"], "frozen_s": r["frozen_s"], "results": res,
                      "rc": r.get("rc"), "status": r.get("summary", {}).get("status"),
                      "clients_rc": r.get("clients_rc"),
                      "refused": _refused(r["clients_stderr"])},
           ["(c) server SIGSTOPped: freeze -> 'lost the server'",
            " / ".join(f"{x:.2f}" for x in r["notice_s"]) + " s", "<= 10 s",
            f"{len(r['notice_s'])} of 2 clients; after SIGCONT: results per round {res}, "
            f"{_refused(r['clients_stderr'])} re-hellos refused, status "
            f"{r.get('summary', {}).get('status')}"])
    r = restart_client("r", env, cwd)
    res = [row["results"] for row in r.get("rows", [])]
    refused = "refused" in r["restarted_stderr"]
    yield ("restart", {"results": res, "refused": refused, "restarted_rc": r["restarted_rc"]},
           ["(c') a remote client SIGKILLed, then started again", "refused" if refused else
            "registered", "registers again", f"results per round {res}"])
    for mode in ("frame", "greeting"):
        r = half_open(f"d-{mode}", env, cwd, a.connections, mode)
        yield (f"half_open_{mode}", r,
               [f"(d) {a.connections} half-open ({mode}): peak / {r['settle_s']:g} s after",
                f"+{r['peak_mb']:.1f} / +{r['after_mb']:.1f} MB", "<= 50 MB, given back",
                f"{r['peak_open']} open at once; closed by the server {r['closed_s']:.1f} s "
                f"after the first; baseline {r['base_mb']:.0f} MB"])
    for claim in (1, 7):
        r = flood(f"e-{claim}", env, cwd, a.flood, claim)
        s = r["summary"]
        got = {k: v for k, v in r.items() if k not in ("stderr", "summary")}
        got.update(status=s["status"], rejected_messages=s.get("rejected_messages"))
        yield (f"flood_claim_{claim}", got,
               [f"(e) {a.flood} READY(hello cid {claim}), replies never read: peak",
                f"+{r['peak_mb']:.1f} MB", "bounded (was +186 MB)",
                f"flood {r['flood_s']:.1f} s; run {s['status']}, rejected "
                f"{s.get('rejected_messages')}"])


def _refused(stderr: str) -> int:
    """Lines where a client says the server refused (or REJECTed) its registration."""
    return sum(1 for x in stderr.splitlines() if "refused" in x or "unexpected REJECT" in x)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def headline(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: (a) kill -> Failure, (c) a frozen server noticed, (d) half-open
    connections' peak and (e) the flood's peak, with the targets the table above prints."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib.util import headline_row, measured

    kill, freeze = facts.get("client_SIGKILL", {}), facts.get("freeze", {})
    ho, fl = facts.get("half_open_frame", {}), facts.get("flood_claim_1", {})
    notice = freeze.get("notice_s") or []
    area = "trust boundary"
    return measured(
        headline_row(area, "one remote client SIGKILLed mid-round: kill -> Failure",
                     kill.get("signal_to_failure_s"), "s", "<= 5 s",
                     f"run {kill.get('status')}; the round timeout is 300 s"),
        headline_row(area, "fednet server SIGSTOPped: freeze -> each client says 'lost the "
                     "server'", max(notice) if notice else None, "s", "<= 10 s",
                     f"{len(notice)} of 2 clients; after SIGCONT the run {freeze.get('status')}"),
        headline_row(area, f"{ho.get('n')} half-open connections holding part of a frame: server "
                     "peak RSS growth", ho.get("peak_mb"), "MB",
                     "<= 50 MB" if ho.get("n") == 2000 else "",
                     f"{ho.get('after_mb', 0):+.1f} MB {ho.get('settle_s')} s after the server "
                     "closed them"),
        headline_row(area, f"{fl.get('n')} READY(hello) whose replies are never read: server "
                     "peak RSS growth", fl.get("peak_mb"), "MB", "",
                     f"run {fl.get('status')}, {fl.get('rejected_messages')} rejected"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--flood", type=int, default=200_000)
    a = ap.parse_args()
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib.util import cpu_pressure_us, loadavg, machine, table, write_json

    import logging

    logging.getLogger("fednet").setLevel(logging.ERROR)  # (a)'s server runs in this process
    env = make_env()
    facts: dict[str, Any] = {"machine": machine()}
    rows = []
    left: list[psutil.Process] = []
    with tempfile.TemporaryDirectory() as d:
        try:
            for name, got, row in _scenarios(a, env, Path(d)):
                facts[name] = got
                got["loadavg"] = loadavg()
                rows.append(row)
                print(" | ".join(row), flush=True)
        finally:
            left = marked(env[MARKER])
            for p in left:
                p.kill()
    facts["loadavg_at_end"] = loadavg()
    facts["cpu_pressure_us_at_end"] = cpu_pressure_us()
    print()
    print(table(["scenario", "measured", "target", "notes"], rows))
    if left:
        print(f"killed {len(left)} leftover processes")
    facts = json.loads(json.dumps(facts, default=str))
    write_json(a.json, facts, headline(facts))


if __name__ == "__main__":
    main()
