"""Reading an availability trace: per-client online intervals in simulated seconds (CSV or JSON).

Format (docs/usage.md, docs/architecture.md "Client availability"): one row per online interval,
columns `client`, `start`, `end` (seconds of simulated time from the run's start; `end` empty,
`inf` or JSON null = online for good). A client is offline outside its intervals. Rows of one
client may come in any order; overlapping or touching intervals are joined.

Length rule: every client 0 .. n-1 of the run needs at least one row; rows of clients >= n are
not used (a trace of 1000 clients serves a run of 100).
"""
from __future__ import annotations

import math
from pathlib import Path

from fednet.errors import ConfigError
from fednet.network.latency import trace_rows

COLUMNS = ("client", "start", "end")
Intervals = list[tuple[float, float]]


def read_trace(path: str, n: int, option: str = "--availability") -> list[Intervals]:
    """Every client's merged, sorted online intervals [start, end) from the file at `path`;
    ConfigError (naming the file, the line or entry and the column) on anything else."""
    p = Path(path)
    where = f"{option} {p}"
    if not p.is_file():
        raise ConfigError(f"{option}: file '{p}' does not exist (give a preset: always, "
                          "offline:F[:S], diurnal[:DAY[:ON]], or a CSV/JSON trace)")
    named = trace_rows(p, where, COLUMNS)
    if not named:
        raise ConfigError(f"{where}: the trace has no rows; one row per online interval with "
                          f"the columns {', '.join(COLUMNS)}")
    per: dict[int, Intervals] = {}
    for at, r in named:
        bad = sorted(str(k) for k in r if k not in COLUMNS)
        missing = [c for c in COLUMNS if c not in r]
        if bad or missing:
            raise ConfigError(f"{where}: {at}: " + "; ".join(
                ([f"unknown column(s) {', '.join(bad)}"] if bad else [])
                + ([f"missing column(s) {', '.join(missing)}"] if missing else []))
                + f"; a trace has the columns {', '.join(COLUMNS)}")
        cid = _number(r["client"], f"{where}: {at}: client", forever=False)
        if cid != int(cid):
            raise ConfigError(f"{where}: {at}: client must be an integer id (got {r['client']!r})")
        start = _number(r["start"], f"{where}: {at}: start", forever=False)
        end = _number(r["end"], f"{where}: {at}: end", forever=True)
        if end <= start:
            raise ConfigError(f"{where}: {at}: end ({r['end']!r}) must be after start "
                              f"({r['start']!r})")
        per.setdefault(int(cid), []).append((start, end))
    lack = [c for c in range(n) if c not in per]
    if lack:
        raise ConfigError(f"{where}: no row for client(s) {', '.join(map(str, lack[:5]))}"
                          f"{' ...' if len(lack) > 5 else ''}; every client 0..{n - 1} needs at "
                          "least one online interval (rows of clients past the run's are not used)")
    return [merge(per[c]) for c in range(n)]


def merge(spans: Intervals) -> Intervals:
    """Sorted intervals with overlapping or touching ones joined."""
    out: Intervals = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _number(v: object, where: str, forever: bool) -> float:
    """A finite number >= 0 (a CSV cell is text); with `forever`, empty/inf/null is infinity."""
    if forever and (v is None or (isinstance(v, str) and v.strip().lower() in ("", "inf"))):
        return math.inf
    try:
        x = float(v) if not isinstance(v, bool) else math.nan  # type: ignore[arg-type]  # errors caught
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < 0:
        more = " (or empty/inf: online for good)" if forever else ""
        raise ConfigError(f"{where} must be a finite number >= 0{more} (got {v!r})")
    return x
