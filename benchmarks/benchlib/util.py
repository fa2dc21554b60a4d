"""Small helpers shared by the benchmark scripts: machine facts, tables, statistics, JSON (with
the keys every benchmark's --json has, and its headline rows for benchmarks/dashboard.py).
Running fednet and sampling memory is benchlib/runner.py."""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (benchmarks/benchlib/util.py is two folders below it)."""


def machine() -> dict[str, Any]:
    """What the numbers were measured on (cores from nproc, load average at the start)."""
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    except (OSError, ValueError, subprocess.CalledProcessError):
        nproc = os.cpu_count() or 0
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        load = []
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "git": git_state(),
            "nproc": nproc, "cpu": cpu, "python": platform.python_version(),
            "loadavg_at_start": load}


def git_state() -> str:
    """The commit of the checkout, with '+dirty' when fednet/ has uncommitted changes."""
    root = ROOT
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "fednet"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def loadavg() -> list[float]:
    """The 1/5/15-minute load averages now (the machine is shared)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


def cpu_pressure_us() -> int | None:
    """Microseconds during which some task of this machine waited for a CPU (PSI), or None."""
    try:
        for line in Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some"):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence (nan when empty)."""
    return statistics.median(xs) if xs else float("nan")


def pct(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of xs by nearest rank."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width text table."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells[0], widths)),
             "  ".join("-" * w for w in widths)]
    for r in cells[1:]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


# The dashboard's areas (benchmarks/dashboard.py: one table each, in this order).
AREAS = ("start-up and memory", "transfer", "scale", "accuracy", "compression", "privacy",
         "asynchronous", "network model", "trust boundary", "robustness", "checkpoint", "GPU",
         "secure aggregation")


def headline_row(area: str, metric: str, value: Any, unit: str = "", target: str = "",
                 note: str = "") -> dict[str, Any] | None:
    """One headline row (None when the value was not measured: None, NaN or infinite).
    `target` only where BENCHMARKS.md states one; "" otherwise."""
    if area not in AREAS:
        raise ValueError(f"unknown area {area!r}; one of {AREAS}")
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return {"area": area, "metric": metric, "value": value, "unit": unit, "target": target,
            "note": note}


def measured(*candidates: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The headline: the rows that were measured."""
    return [r for r in candidates if r is not None]


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran, as typed from the repository root: 'python3 benchmarks/x.py ...'."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]) if argv else Path("?")
    try:
        shown = str(script.resolve().relative_to(ROOT))
    except (OSError, ValueError):
        shown = str(script)
    return "python3 " + shlex.join([shown, *argv[1:]])


def stamp(data: dict[str, Any], headline: list[dict[str, Any]] | None,
          script: str | None = None) -> dict[str, Any]:
    """data with the keys every benchmark's JSON has: script, command, commit, date (also in
    "machine", added when missing) and headline (the dashboard's rows)."""
    info = data.get("machine") if isinstance(data.get("machine"), dict) else machine()
    return {**data, "machine": info,
            "script": script or Path(sys.argv[0]).name, "command": command_line(),
            "commit": data.get("commit") or info.get("git", "unknown"),
            "date": info.get("date", ""), "headline": list(headline or [])}


def write_json(path: str | Path | None, data: dict[str, Any],
               headline: list[dict[str, Any]] | Callable[[dict[str, Any]], list] | None = None
               ) -> None:
    """Write data to path (when given), indented, stamped with the common keys (stamp);
    `headline`: the rows, or the script's function that makes them from data."""
    if path:
        caller = sys._getframe(1).f_globals.get("__file__")
        rows = headline(data) if callable(headline) else headline
        data = stamp(data, rows, Path(caller).name if caller else None)
        Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"wrote {path}")
