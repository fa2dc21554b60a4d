"""The results folder: config.toml, metrics.jsonl (flushed every round), clients.jsonl, summary.json."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from fednet.config import RunConfig, to_toml


def default_out(cfg: RunConfig) -> Path:
    """runs/<timestamp>-<algo>/ (unique even for runs started in the same second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{stamp}-{cfg.algo.name}"
    p, i = base, 1
    while p.exists():
        i += 1
        p = Path(f"{base}-{i}")
    return p


def resolve_out(cfg: RunConfig) -> Path:
    """--out, or a fresh runs/<timestamp>-<algo>/."""
    return Path(cfg.out) if cfg.out else default_out(cfg)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null means "not a number" in our files
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and rename, so readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


class History:
    """Per-round rows in memory and on disk (when an output folder is given)."""

    def __init__(self, out: Path | None, cfg: RunConfig, keep_rows: int = -1) -> None:
        """keep_rows >= 0 resumes: the first keep_rows lines of metrics.jsonl stay, the rest go."""
        self.out = out
        self.rows: list[dict[str, Any]] = []
        self._fh = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.toml").write_text(to_toml(cfg))
            path = out / "metrics.jsonl"
            if keep_rows >= 0 and path.exists():
                self.rows = [json.loads(x) for x in path.read_text().splitlines()[:keep_rows]]
                path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
                self._fh = path.open("a")
            else:
                self._fh = path.open("w")

    def clients(self, rows: list[dict[str, Any]]) -> None:
        """Per-client statistics (one JSON object per line)."""
        if self.out is not None:
            with (self.out / "clients.jsonl").open("w") as fh:
                for r in rows:
                    fh.write(json.dumps(_clean(r)) + "\n")

    def log_round(self, row: dict[str, Any]) -> None:
        """Append one round and flush it to disk at once."""
        self.rows.append(row)
        if self._fh is not None:
            self._fh.write(json.dumps(_clean(row)) + "\n")
            self._fh.flush()

    def summary(self, data: dict[str, Any]) -> None:
        """Write summary.json (atomically); may be called again as the run goes."""
        if self.out is not None:
            write_json_atomic(self.out / "summary.json", data)

    def close(self) -> None:
        """Close metrics.jsonl."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
