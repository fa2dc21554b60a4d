"""The results folder: config.toml, metrics.jsonl (flushed every round), clients.jsonl,
population.npz (when asked), summary.json.

Every file except metrics.jsonl is replaced atomically (metrics/files.py); metrics.jsonl is
appended one row per round, and rewritten atomically when a resumed run cuts it back."""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from fednet.config import RunConfig, to_toml
from fednet.errors import ConfigError
from fednet.metrics.files import (OutputError, atomic_file, clean_json, make_dir, remove,
                                  write_json, write_jsonl, write_text)

# What a run writes into its folder; a fresh run in an existing folder (--overwrite) removes the
# previous run's files first, so that nothing stale (a checkpoint, a summary) is left beside it.
RESULT_FILES = ("summary.json", "run.json", "clients.jsonl", "population.npz", "final_model.npz",
                "accuracy_vs_round.png",
                "accuracy_vs_sim_time.png", "accuracy_vs_bytes.png", "accuracy_vs_epsilon.png",
                "mlflow.json", "server.json")
RESULT_DIRS = ("checkpoint", "checkpoint.old", "checkpoint.tmp", "tensorboard")


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


def check_out(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse a results folder that holds files (unless resumed or overwritten) or that cannot be
    written; nothing is created here."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder")
    if out.is_dir() and not resume and not overwrite and any(out.iterdir()):
        raise ConfigError(f"--out {out} already holds files; give a new folder, --resume {out} to "
                          "continue that run, or --overwrite to replace it")
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"--out {out}: '{probe}' is a file, not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        ro = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        code = errno.EROFS if ro else errno.EACCES
        raise OutputError(out, OSError(code, os.strerror(code)))


def _clear_previous_run(out: Path) -> None:
    for name in RESULT_FILES:
        remove(out / name)
    for name in RESULT_DIRS:
        if (out / name).is_dir():
            try:
                shutil.rmtree(out / name)
            except OSError as e:
                raise OutputError(out / name, e) from None


class History:
    """Per-round rows in memory and on disk (when an output folder is given)."""

    def __init__(self, out: Path | None, cfg: RunConfig, keep_rows: int = -1,
                 resolved: dict[str, str] | None = None) -> None:
        """keep_rows >= 0 resumes: the first keep_rows lines of metrics.jsonl stay, the rest go.
        `resolved`: what the run settled at its start that config.toml leaves open (the model
        built, `model`; the evaluation mode, `eval`), written to run.json for the reports."""
        self.out = out
        self.rows: list[dict[str, Any]] = []
        self._fh: IO[str] | None = None
        self.listeners: list[Any] = []  # called with each row once it is on disk (--track)
        if out is None:
            return
        make_dir(out)
        path = out / "metrics.jsonl"
        if keep_rows < 0:
            _clear_previous_run(out)
        elif path.exists():  # resumed: checked by checkpoint.read before anything is written
            self.rows = [json.loads(x) for x in path.read_text().splitlines()[:keep_rows]]
        write_text(out / "config.toml", to_toml(cfg))
        if resolved is not None:
            write_json(out / "run.json", resolved)
        write_jsonl(path, self.rows)  # atomic: a resume cuts the rows after the checkpoint
        try:
            self._fh = path.open("a")
        except OSError as e:
            raise OutputError(path, e) from None

    def clients(self, rows: list[dict[str, Any]]) -> None:
        """Per-client statistics (one JSON object per line)."""
        if self.out is not None:
            write_jsonl(self.out / "clients.jsonl", rows)

    def population(self, columns: dict[str, Any]) -> None:
        """population.npz (--population-file): one array per column, a row per client."""
        if self.out is not None:
            with atomic_file(self.out / "population.npz") as fh:  # plain arrays
                np.savez(fh, **columns)

    def log_round(self, row: dict[str, Any]) -> None:
        """Append one round and flush it to disk at once."""
        self.rows.append(row)
        if self._fh is not None:
            try:
                self._fh.write(json.dumps(clean_json(row)) + "\n")
                self._fh.flush()
            except OSError as e:
                self._drop_file()
                raise OutputError(self.out / "metrics.jsonl", e) from None  # type: ignore[operator]  # open: out set
        for listen in self.listeners:
            listen(row)

    def summary(self, data: dict[str, Any]) -> None:
        """Write summary.json (atomically); may be called again as the run goes."""
        if self.out is not None:
            write_json(self.out / "summary.json", data)

    def _drop_file(self) -> None:
        """After a failed write: stop writing metrics.jsonl (its unflushed tail is lost)."""
        fh, self._fh = self._fh, None
        try:
            fh.close()  # type: ignore[union-attr]  # called while the file is open
        except OSError:
            pass

    def close(self) -> None:
        """Close metrics.jsonl."""
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError as e:
                raise OutputError(self.out / "metrics.jsonl", e) from None  # type: ignore[operator]  # open: out set


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """The rows of folder/metrics.jsonl ([] without one); a line that is not a JSON object (the
    one a running run is writing) is skipped, not the whole file."""
    try:
        lines = (Path(folder) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
