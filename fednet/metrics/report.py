"""Text tables: the end-of-run summary and `fednet report` (runs side by side)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics.progress import human_bytes


def _fmt(v: Any, kind: str = "") -> str:
    if v is None:
        return "-"
    if kind == "bytes":
        return human_bytes(float(v))
    if kind == "pct":
        return f"{100 * float(v):.2f}%"
    if kind == "s":
        return f"{float(v):.2f}s"
    return str(v)


def summary_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs describing one run's summary."""
    b = s.get("bytes", {})
    tb = b.get("tensor_bytes") or 0
    wire = (b.get("server_to_client", 0) + b.get("client_to_server", 0) + b.get("client_to_client", 0))
    rows = [
        ("algorithm", _fmt(s.get("algorithm"))),
        ("status", _fmt(s.get("status"))),
        ("clients", _fmt(s.get("clients"))),
        ("rounds", f"{s.get('rounds')}/{s.get('rounds_planned', s.get('rounds'))}"),
        ("final accuracy", _fmt(s.get("final_accuracy"), "pct")),
        ("best accuracy", _fmt(s.get("best_accuracy"), "pct")),
        ("wall-clock", _fmt(s.get("wall_clock_s"), "s")),
        ("simulated time", _fmt(s.get("sim_time_s"), "s")),
        ("server -> client", _fmt(b.get("server_to_client"), "bytes")),
        ("client -> server", _fmt(b.get("client_to_server"), "bytes")),
        ("client -> client", _fmt(b.get("client_to_client"), "bytes")),
        ("tensor bytes (minimum)", _fmt(tb, "bytes")),
        ("wire / minimum", f"{wire / tb:.4f}" if tb else "-"),
        ("control traffic", _fmt(b.get("control"), "bytes")),
    ]
    if s.get("ready_s") is not None:
        rows.append(("clients ready after", _fmt(s.get("ready_s"), "s")))
    if s.get("server_peak_rss_bytes"):
        label = "server peak memory" if s.get("runtime") != "local" else "peak memory (RSS)"
        rows.append((label, _fmt(s.get("server_peak_rss_bytes"), "bytes")))
    if s.get("client_pss_bytes"):
        rows.append(("client memory (PSS)", _fmt(s.get("client_pss_bytes"), "bytes")))
    devices = s.get("devices") or {}
    if devices:
        counts: dict[str, int] = {}
        for d in devices.values():
            counts[str(d)] = counts.get(str(d), 0) + 1
        rows.append(("devices", ", ".join(f"{d} x{n}" for d, n in sorted(counts.items()))))
    if s.get("failures"):
        rows.append(("failures", str(len(s["failures"]))))
    return rows


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table."""
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, sep] + body)


def summary_table(s: dict[str, Any]) -> str:
    """The end-of-run table for one summary."""
    return table(["", "value"], [[k, v] for k, v in summary_rows(s)])


def load_summary(run: str | Path) -> dict[str, Any]:
    """summary.json of a run folder (or the file itself); ConfigError when missing."""
    p = Path(run)
    f = p / "summary.json" if p.is_dir() else p
    if not f.exists():
        raise ConfigError(f"'{run}' has no summary.json; give a run folder such as runs/<name>")
    try:
        s = json.loads(f.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read '{f}': {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"'{f}' is not valid JSON ({e})") from None
    if not isinstance(s, dict):
        raise ConfigError(f"'{f}' is not a run summary (a JSON object)")
    return s


def compare(runs: list[str]) -> str:
    """Runs side by side: one column per run."""
    sums = [load_summary(r) for r in runs]
    cols = [summary_rows(s) for s in sums]
    labels = [k for k, _ in cols[0]]
    rows = []
    for lab in labels:
        rows.append([lab] + [dict(c).get(lab, "-") for c in cols])
    headers = ["run"] + [Path(r).name or str(r) for r in runs]
    return table(headers, rows)
