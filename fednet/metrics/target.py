"""Cost to a target accuracy: --target's value, and what a run spent until its first row at or
above it (summary.json's `to_target`, `fednet report`): rounds, client compute, simulated and
wall-clock seconds, bytes in each direction. Setup stages count like any round: their compute
is in every row's `client_epochs` and `samples`, their time in `sim_s`, their bytes here."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics.sweep_table import first_reaching, read_summary

DIRECTIONS = ("server_to_client", "client_to_server", "client_to_client")
TARGET_HELP = ("an accuracy in (0, 1] (0.9), or Fx:RUN, F times the best accuracy of the "
               "finished run in folder RUN (0.9x:runs/central)")


@dataclass(frozen=True)
class Target:
    """The accuracy a run waits for; `fraction` x `reference` (the best accuracy of run
    folder `run`) when given as Fx:RUN."""

    accuracy: float
    fraction: float | None = None
    run: str = ""
    reference: float | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.accuracy}
        if self.fraction is not None:
            out["reference"] = {"run": self.run, "fraction": self.fraction,
                                "best_accuracy": self.reference}
        return out


def _accuracy(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0 < v <= 1:
        raise ConfigError(f"--target {what}: expected {TARGET_HELP}")
    return v


def parse_target(text: str) -> Target | None:
    """--target's value (None: '', no target); a bad one is a ConfigError naming --target.
    Fx:RUN reads RUN/summary.json once, here."""
    text = text.strip()
    if not text:
        return None
    frac, sep, run = text.partition("x:")
    if not sep:
        return Target(_accuracy(text, text))
    f = _accuracy(frac, text)
    s = read_summary(Path(run)) if run else None
    best = s.get("best_accuracy") if s else None
    if not isinstance(best, (int, float)) or isinstance(best, bool) or not math.isfinite(best):
        raise ConfigError(f"--target {text}: '{run}' is no finished run folder with a best "
                          f"accuracy (its summary.json); expected {TARGET_HELP}")
    return Target(f * float(best), f, run, float(best))


def cost_to(rows: list[dict[str, Any]], target: Target, setup_bytes: dict[str, int] | None
            ) -> dict[str, Any]:
    """summary.json's `to_target`: at the first row whose accuracy reaches the target, the
    rounds run (its round + 1), the client compute and the simulated and wall-clock seconds it
    carries, and the bytes sent so far per direction (the setup's, `setup_bytes`, and every
    row's up to it) and in total; `reached` false and nulls when no row reaches it."""
    i = first_reaching(rows, target.accuracy)
    out: dict[str, Any] = {**target.describe(), "reached": i is not None}
    if i is None:
        return {**out, "rounds": None, "client_epochs": None, "samples": None, "sim_s": None,
                "wall_s": None, "bytes": None}
    row = rows[i]
    sent = {k: int((setup_bytes or {}).get(k, 0)) for k in DIRECTIONS}
    for r in rows[:i + 1]:
        b = r.get("bytes_round") or {}
        for k in DIRECTIONS:
            sent[k] += int(b.get(k, 0) or 0)
    return {**out, "rounds": int(row["round"]) + 1, "client_epochs": row.get("client_epochs"),
            "samples": row.get("samples"), "sim_s": row.get("sim_s"), "wall_s": row.get("wall_s"),
            "bytes": {**sent, "total": sum(sent.values())}}


def cost_summary(rows: list[dict[str, Any]], target: Target | None,
                 setup_bytes: dict[str, int] | None) -> dict[str, Any]:
    """summary.json's `compute` (the client compute of the run's last row, when its rows count
    it) and, with a target, `to_target` (cost_to)."""
    last = rows[-1] if rows else {}
    out: dict[str, Any] = {}
    if "client_epochs" in last:
        out["compute"] = {"client_epochs": last["client_epochs"], "samples": last.get("samples"),
                          **({"client_compute_s": last["client_compute_s"]}
                             if "client_compute_s" in last else {})}
    if last.get("server_compute_s") and "compute" in out:  # (the server charged: synchronous)
        out["compute"]["server_compute_s"] = last["server_compute_s"]
    split = time_split(rows)
    if split:
        out["time_split"] = split
    if target is not None:
        out["to_target"] = cost_to(rows, target, setup_bytes)
    return out


def time_split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's `time_split`: the rows' sim_split summed (simulated seconds of the run's
    critical paths: download, client compute, protocol compute, upload, server compute and
    waiting; core/time_split.py), and per stage of a staged protocol (`by_stage`)."""
    total: dict[str, float] = {}
    stages: dict[str, dict[str, float]] = {}
    for r in rows:
        for k, v in (r.get("sim_split") or {}).items():
            total[k] = total.get(k, 0.0) + float(v)
        for stage, split in (r.get("sim_split_by_stage") or {}).items():
            into = stages.setdefault(stage, {})
            for k, v in split.items():
                into[k] = into.get(k, 0.0) + float(v)
    return {**total, **({"by_stage": stages} if stages else {})}
