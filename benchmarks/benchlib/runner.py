"""How a benchmark script runs fednet: the command it starts, a timed subprocess, what the run
wrote (summary.json, metrics.jsonl, final_model.npz), memory sampled while it runs, and
stopping a process tree. In-process runs (fednet.core.inproc.run_local, run_zmq) are called
directly by the scripts that need them.

The three commands differ on purpose, and each script keeps the one it measured with:
fednet_module() (`python -m fednet.cli`, the usual one), fednet_installed() (the `fednet`
console script a user types, for start-up times) and fednet_inline() (`python -c`, which imports
the fednet of the working directory: bench_memory.py runs older checkouts that way)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib.util import cpu_pressure_us


# ---- the command -------------------------------------------------------------------------------
def fednet_module(*args: str) -> list[str]:
    """`python -m fednet.cli ARGS` with this interpreter."""
    return [sys.executable, "-m", "fednet.cli", *args]


def fednet_installed(*args: str) -> list[str]:
    """The installed `fednet` script (what a user types), else `python -m fednet.cli`."""
    exe = shutil.which("fednet")
    return ([exe] if exe else fednet_module())[:] + list(args)


def fednet_inline(*args: str) -> list[str]:
    """`python -c "from fednet.cli import main; main()" ARGS`: with cwd=a checkout, that
    checkout's fednet is imported (the working directory is first on sys.path)."""
    return [sys.executable, "-c", "from fednet.cli import main; main()", *args]


# ---- running it --------------------------------------------------------------------------------
@dataclass
class Ran:
    """A finished command: exit status, wall seconds (exec to exit), stdout and stderr."""

    rc: int
    wall_s: float
    stdout: str
    stderr: str

    @property
    def last_json(self) -> dict[str, Any]:
        """The last line of stdout as JSON (the plain loop's and the children's result line)."""
        return json.loads(self.stdout.strip().splitlines()[-1])


def run(argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
        check: bool = False) -> Ran:
    """Run argv to its end, its output captured; check=True: exit with its stderr's tail when it
    fails."""
    t = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    done = Ran(p.returncode, time.perf_counter() - t, p.stdout, p.stderr)
    if check and p.returncode != 0:
        raise SystemExit(f"exit {p.returncode}: {' '.join(argv)}\n{p.stderr[-3000:]}")
    return done


def run_lines(argv: list[str], timeout_s: float = 600.0) -> dict[str, Any]:
    """Run argv (stdout discarded); wall seconds from exec to exit, stderr lines with the
    seconds after exec at which each was read, the CPU seconds of its whole process tree and the
    machine's CPU pressure meanwhile (PSI "some": the share of the time some task waited for a
    CPU). Exits with stderr's tail when it fails or runs past timeout_s."""
    lines: list[tuple[float, str]] = []
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    psi0 = cpu_pressure_us()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def reader() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            lines.append((time.monotonic() - t0, raw.decode("utf-8", "replace").rstrip()))

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SystemExit(f"timed out after {timeout_s:.0f}s: {' '.join(argv)}") from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    wall = time.monotonic() - t0
    # CPU of the whole process tree (every descendant was waited for by its parent), which a
    # busy shared machine distorts much less than wall-clock.
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    psi1 = cpu_pressure_us()
    pressure = (psi1 - psi0) / 1e6 / wall if psi0 is not None and psi1 is not None else None
    th.join(5)
    if code != 0:
        tail = "\n".join(ln for _, ln in lines[-20:])
        raise SystemExit(f"exit code {code}: {' '.join(argv)}\n{tail}")
    return {"wall_s": wall, "lines": lines, "t_popen": t0, "cpu_s": cpu, "cpu_pressure": pressure}


def line_time(lines: list[tuple[float, str]], needle: str) -> float | None:
    """The time of the first line containing needle (None: none did)."""
    return next((t for t, text in lines if needle in text), None)


class Proc:
    """A `fednet` subprocess (the installed command, ARGS) in its own session whose stderr lines
    are kept with the time (time.monotonic()) they were read."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.p = subprocess.Popen(fednet_installed(*args), env=env, cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
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
        import psutil

        try:
            procs = [psutil.Process(self.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            procs = []
        for q in procs:
            with contextlib.suppress(psutil.Error):
                q.send_signal(signal.SIGCONT)
                q.kill()
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        self.p.wait(10)


def descendants(pid: int) -> set[int]:
    """Every live descendant of pid (the zygote runs in its own session but is still a child)."""
    try:
        import psutil

        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except Exception:  # noqa: BLE001 - gone, or psutil missing
        return set()


def stop_tree(p: subprocess.Popen, grace_s: float = 8.0) -> None:
    """Stop a process we started and everything it started: SIGINT to its process group (fednet
    launch stops its clients on Ctrl-C), then SIGKILL to the group and to each descendant left
    by pid (the zygote has its own session)."""
    kids = descendants(p.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=grace_s)
    kids |= descendants(p.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    for k in kids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(k, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=5)


# ---- what a run wrote --------------------------------------------------------------------------
def summary(out: Path) -> dict[str, Any]:
    """OUT/summary.json."""
    return json.loads((Path(out) / "summary.json").read_text())


def metrics(out: Path) -> list[dict[str, Any]]:
    """OUT/metrics.jsonl's rows (interim rows included)."""
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x]


def same_model(a: Path, b: Path) -> bool:
    """Two runs' final_model.npz hold bit-identical arrays under the same names."""
    import numpy as np

    with np.load(Path(a) / "final_model.npz", allow_pickle=False) as za, \
            np.load(Path(b) / "final_model.npz", allow_pickle=False) as zb:
        return sorted(za.files) == sorted(zb.files) and all(
            np.array_equal(za[k], zb[k]) for k in za.files)


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


class RssSampler:
    """Samples one process's VmRSS (and optionally its open files) every `every_s` in a thread:
    peak_rss, peak_fds."""

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


class TreePss:
    """The peak of the summed PSS (RSS where PSS is not readable) of a process and its
    descendants, sampled every 0.2 s in a thread; the process group is SIGKILLed once the peak
    passes limit_mb (killed=True). With `rows` (a run's metrics.jsonl): first_row_s, the seconds
    from the start until that file got its first row (round 0 had just ended), and last_row_s,
    until it last grew (the last round had just ended; to within the 0.2 s sampling)."""

    def __init__(self, pid: int, limit_mb: float, rows: Path | None = None) -> None:
        self.pid, self.limit, self.peak_mb, self.killed = pid, limit_mb, 0.0, False
        self.rows, self.t0 = rows, time.perf_counter()
        self.first_row_s: float | None = None
        self.last_row_s: float | None = None
        self._size = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:  # PSS: pages shared by forked processes counted once in all
                try:
                    total += getattr(p.memory_full_info(), "pss", 0) or p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self._row_times()
            self.peak_mb = max(self.peak_mb, total / 2**20)
            if self.peak_mb > self.limit and not self.killed:
                self.killed = True
                os.killpg(self.pid, signal.SIGKILL)
            self._stop.wait(0.2)

    def _row_times(self) -> None:
        size = self.rows.stat().st_size if self.rows is not None and self.rows.exists() else 0
        if size > self._size:  # a row was written
            now = time.perf_counter() - self.t0
            self.first_row_s = now if self.first_row_s is None else self.first_row_s
            self.last_row_s, self._size = now, size

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def run_with_peak(argv: list[str], limit_mb: float, timeout_s: float,
                  rows: Path | None = None) -> dict[str, Any]:
    """argv in its own process group under a TreePss; seconds, peak memory, exit status,
    stdout, stderr's tail, and when `rows` (metrics.jsonl) got its first and last rows."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    peak = TreePss(p.pid, limit_mb, rows)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    peak.stop()
    return {"seconds": time.perf_counter() - t0, "peak_mb": peak.peak_mb, "rc": p.returncode,
            "killed": peak.killed, "stdout": out, "stderr": err[-2000:],
            "first_row_s": peak.first_row_s, "last_row_s": peak.last_row_s}


def mem_available() -> int:
    """The machine's MemAvailable in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0
