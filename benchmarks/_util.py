"""Small helpers shared by the benchmark scripts: machine facts, tables, statistics, JSON."""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any, Sequence


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
    root = Path(__file__).resolve().parent.parent
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


def write_json(path: str | None, data: dict[str, Any]) -> None:
    """Write data to path (when given), indented."""
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"wrote {path}")
