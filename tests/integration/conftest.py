"""Helpers for tests that run the `fednet` command: a marker on every process, leak checks."""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

MARKER = "FEDNET_TEST_MARKER"
SMALL = ["--clients", "3", "--rounds", "2", "--epochs", "1", "--batch-size", "16", "-q"]


@pytest.fixture(autouse=True)
def join_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every `fednet server` and `fednet clients` a test starts shares this join key file
    (FEDNET_JOIN_KEY, as a user may export it; the server writes it, its clients read it)."""
    path = tmp_path / "join.key"
    monkeypatch.setenv("FEDNET_JOIN_KEY", str(path))
    return path


def fednet_cmd() -> list[str]:
    """The installed `fednet` script (the same entry point a user types)."""
    exe = shutil.which("fednet")
    return [exe] if exe else [sys.executable, "-c", "from fednet.cli import main; main()"]


def marked(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes started with FEDNET_TEST_MARKER=marker, wherever they are now."""
    out = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get(MARKER) == marker and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def wait_gone(marker: str, timeout_s: float) -> list[psutil.Process]:
    """Poll until no marked process is left; returns those still alive after timeout_s."""
    deadline = time.monotonic() + timeout_s
    left = marked(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked(marker)
    return left


def describe(procs: list[psutil.Process]) -> list[str]:
    """'pid: cmdline' for an assertion message."""
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(f"{p.pid}: ?")
    return out


def _default_sigint() -> None:
    """(In the child, before exec) SIGINT back to its default: Python then raises
    KeyboardInterrupt on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Fednet:
    """Runs `fednet` commands carrying this test's marker; kills and reports leftovers at the end."""

    def __init__(self, marker: str, cwd: Path) -> None:
        self.marker, self.cwd = marker, cwd
        self.env = dict(os.environ, **{MARKER: marker}, PYTHONUNBUFFERED="1")
        self.env.pop("CUDA_VISIBLE_DEVICES", None)
        self.popens: list[subprocess.Popen[str]] = []

    def run(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """Run to completion; stdout and stderr captured as text."""
        return subprocess.run(fednet_cmd() + list(args), env=self.env, cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start in its own process group (like a shell job); stderr piped, stdout to a file.
        Ctrl-C's default disposition, as a terminal's foreground job has it: pytest started in
        the background by a script (`pytest ... &`) ignores SIGINT, the child would inherit that
        and never see a Ctrl-C the test sends."""
        p = subprocess.Popen(fednet_cmd() + list(args), env=self.env, cwd=self.cwd,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=_default_sigint)
        self.popens.append(p)
        return p

    def processes(self) -> list[psutil.Process]:
        """Every live process of this test (launchers, zygotes, clients)."""
        return marked(self.marker)

    def cleanup(self) -> list[str]:
        """Wait for this test's processes to end on their own; kill and name what is left."""
        for p in self.popens:  # a test that failed half-way may leave a long run going
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        left = wait_gone(self.marker, 10.0)
        names = describe(left)
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        return names


@pytest.fixture
def fed(tmp_path: Path):
    """A `fednet` runner whose processes must all be gone when the test ends."""
    f = Fednet(uuid.uuid4().hex, tmp_path)
    yield f
    left = f.cleanup()
    assert not left, f"fednet processes left behind: {left}"


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (asserts: exit 2, one line, no traceback)."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("fednet: error: "), lines[0]
    return lines[0][len("fednet: error: "):]


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen[str] | None = None,
                   timeout_s: float = 60.0) -> int:
    """Block until the file has at least n lines (fails if proc exits first); returns the count."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            k = path.read_text().count("\n")
            if k >= n:
                return k
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"fednet exited ({proc.returncode}) early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"{path} did not reach {n} lines within {timeout_s}s")


def server_endpoint(lines: queue.Queue[str], proc: subprocess.Popen[str], host: str,
                    output: Any = lambda: "", timeout_s: float = 60.0) -> str:
    """The endpoint `fednet server --bind tcp://HOST:0` prints ('server listening on
    tcp://HOST:PORT', read from `lines`, its stderr line by line): bound on `host` and a port
    the kernel chose. Fails if the server exits first (with `output()`, what it printed) or
    prints no such line in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, f"server exited ({proc.returncode}): {output()}"
            continue
        m = re.fullmatch(r"server listening on (tcp://(\S+):(\d+))\n", line)
        if m:
            assert (m.group(2), int(m.group(3)) > 0) == (host, True), line
            return m.group(1)
    pytest.fail("the server did not print 'server listening on tcp://...'")


def read_json(path: Path) -> Any:
    """Parse a JSON file."""
    return json.loads(path.read_text())


def jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSON-lines file."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def serve_in_thread(cfg: Any, out: Path) -> tuple[Any, dict[str, Any]]:
    """`fednet server` (run_zmq without local clients) in a thread of this process; returns
    (thread, box) once it listens: box["endpoint"], and box["summary"] when the run ends."""
    import threading

    from fednet.server.main import run_zmq

    box: dict[str, Any] = {}

    def serve() -> None:
        box["summary"] = run_zmq(cfg.replace(out=str(out)), quiet=True, local_clients=False,
                                 on_listen=lambda ep: box.setdefault("endpoint", ep))
    t = threading.Thread(target=serve)
    t.start()
    while "endpoint" not in box and t.is_alive():
        t.join(0.05)
    return t, box
