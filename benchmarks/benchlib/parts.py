"""gpu_check.py's parts: each one a subprocess (run from the repository root, the working tree
first on PYTHONPATH, in a session of its own) with its own timeout under an overall time budget,
never started when the budget left is below what it needs; its record (status, wall seconds,
exit status, stderr's tail, device memory) kept in order."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from benchlib.gpu_device import DeviceMemory, Sampler
from benchlib.runner import stop_tree
from benchlib.util import ROOT

RESERVE_S = 8.0           # kept back from every part for printing and writing


def child_env() -> dict[str, str]:
    """The environment of every part: the working tree first on PYTHONPATH (no install needed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", ""))
                                        if p)
    return env


def fednet_importable() -> str | None:
    """None when fednet's working tree imports here, else the error and what to do."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import fednet.platform.packing  # noqa: F401  (light: no torch)
        return None
    except Exception as e:  # noqa: BLE001 - whatever it is, the message says it
        return (f"fednet is not importable here ({type(e).__name__}: {e}). From the repository "
                "root: pip install --no-deps --no-build-isolation -e . (a machine without "
                "internet must already have torch, with CUDA for the GPU parts, pyzmq, msgpack, "
                "numpy, scikit-learn, click, psutil, scipy, tomli-w)")


class Budget:
    """The overall time budget (seconds from construction)."""

    def __init__(self, total_s: float) -> None:
        self.total_s, self.t0 = total_s, time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.total_s - self.elapsed()


def tail(text: str, n: int = 1500) -> str:
    return text[-n:] if text else ""


class Runner:
    """Runs parts under the budget; every part's record is kept in order."""

    def __init__(self, budget: Budget, tmp: Path, mem: DeviceMemory | None = None,
                 on_record: Callable[[], None] | None = None) -> None:
        self.budget, self.tmp, self.mem = budget, tmp, mem
        self.parts: list[dict[str, Any]] = []
        self.device_peak_mib: int | None = None
        self.on_record = on_record  # e.g. writes the JSON so far (a killed check leaves it)

    def record(self, name: str, status: str, **kw: Any) -> dict[str, Any]:
        r = {"part": name, "status": status, **kw}
        self.parts.append(r)
        print(f"[gpu_check {self.budget.elapsed():5.0f}s] {name}: {status}"
              + (f" ({kw['why']})" if kw.get("why") else ""), file=sys.stderr, flush=True)
        if self.on_record is not None:
            with contextlib.suppress(Exception):
                self.on_record()
        return r

    def run(self, name: str, argv: list[str], cap_s: float, min_s: float, *,
            sample: bool = False, count_root: bool = False,
            on_line: Callable[[str, subprocess.Popen], None] | None = None,
            processes: Callable[[], int | None] | None = None) -> dict[str, Any]:
        """Run argv as part `name` with timeout min(cap_s, budget left); its stdout, stderr,
        exit status, wall time and (sample=True) device memory."""
        left = self.budget.left() - RESERVE_S
        if left < min_s:
            return self.record(name, "not run", why=f"budget: {max(left, 0):.0f} s left, needs "
                                                    f"~{min_s:.0f} s")
        timeout = min(cap_s, left)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        out_f, err_f = self.tmp / f"{safe}.out", self.tmp / f"{safe}.err"
        sampler = Sampler(self.mem, count_root=count_root) \
            if sample and self.mem is not None and self.mem.source else None
        t0 = time.monotonic()
        with open(out_f, "w") as fo, open(err_f, "w") as fe:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE if on_line else fo, stderr=fe,
                                 stdin=subprocess.DEVNULL, env=child_env(), cwd=str(ROOT),
                                 start_new_session=True, text=True)
            if sampler:
                sampler.start(p.pid)
            timed_out = False
            try:
                if on_line:
                    watchdog = threading.Timer(timeout, lambda: stop_tree(p))
                    watchdog.start()
                    assert p.stdout is not None
                    for line in p.stdout:
                        fo.write(line)
                        on_line(line.strip(), p)
                    watchdog.cancel()
                    p.wait()
                    timed_out = time.monotonic() - t0 >= timeout
                else:
                    p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_tree(p)
            except BaseException as e:  # Ctrl-C or SIGTERM: the part goes too, then the report
                stop_tree(p, grace_s=3.0)
                if sampler:
                    sampler.stop()
                self.record(name, "stopped", why=f"interrupted ({e or 'Ctrl-C'}) after "
                                                 f"{time.monotonic() - t0:.0f} s")
                raise
            finally:
                if sampler:
                    sampler.stop()
        wall = time.monotonic() - t0
        stdout, stderr = out_f.read_text(errors="replace"), err_f.read_text(errors="replace")
        extra: dict[str, Any] = {"wall_s": wall, "rc": p.returncode, "timeout_s": timeout}
        if sampler:
            extra["memory"] = sampler.result(processes() if processes else None)
            pk = sampler.peak_used
            if pk is not None:
                self.device_peak_mib = max(self.device_peak_mib or 0, pk)
        if timed_out:
            r = self.record(name, "timed out", why=f"stopped after {timeout:.0f} s",
                            stderr_tail=tail(stderr), **extra)
        elif p.returncode != 0:
            last = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or [""]
            r = self.record(name, "failed", why=f"exit {p.returncode}: {last[0][:160]}",
                            stderr_tail=tail(stderr), **extra)
        else:
            r = self.record(name, "ok", **extra)
        r["_stdout"] = stdout
        return r


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)
    return None
