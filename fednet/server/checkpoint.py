"""Atomic checkpoints of the server's state and resuming from them (--checkpoint-every, --resume).

A checkpoint is RUN/checkpoint/{state.npz, state.json}: the algorithm's arrays (the model and its
server state: FedDyn's h, SCAFFOLD's c, ...), its JSON state (FedSeq's superclients, ...), the
rounds done, the simulated time, the ledger totals and the failures so far. Randomness needs no
saving: every draw comes from (seed, purpose, round, client). It is written to a temporary
folder (each file fsynced) and renamed into place, so a crash leaves either the old or the new
checkpoint (a crash between the two renames leaves checkpoint.old, which --resume then reads).
State that lives in client processes (SCAFFOLD's c_k, FedDyn's g_k, personal models) survives
only if those processes do (clients on other hosts re-register with a restarted server).

A checkpoint is checked before a resumed run writes anything: read() checks the files and the
numbers against the run's configuration, load() also the arrays against what the algorithm's own
checkpoint() produces (names, shapes, dtypes). Anything wrong is a ConfigError naming the file.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from fednet.config import RunConfig
from fednet.errors import ConfigError
from fednet.metrics.accounting import Ledger
from fednet.metrics.files import OutputError, atomic_file, fsync_dir, write_text

Arrays = dict[str, np.ndarray]
# Totals every checkpoint has; the ledger may add others (checked against Ledger().totals())
LEDGER_KEYS = frozenset({"server_to_client", "client_to_server", "client_to_client",
                         "tensor_bytes", "header_bytes", "control"})


def save(out: Path, algo: Any, driver: Any) -> None:
    """Write RUN/checkpoint atomically; a disk error is an OutputError and the old one stays."""
    arrays, meta = algo.checkpoint()
    state = {"rounds_done": driver.rounds_done, "sim_time": driver.sim_time,
             "ledger": driver.ledger.totals(), "failures": driver.failures,
             "setup": driver.setup_stats, "rows": len(driver.history.rows), "algo": meta,
             "algorithm": algo.cfg.algo.name}
    text = json.dumps(state, default=float)
    tmp, final, old = out / "checkpoint.tmp", out / "checkpoint", out / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise OutputError(tmp, e) from None
    try:
        with atomic_file(tmp / "state.npz") as fh:
            np.savez(fh, **arrays)
        write_text(tmp / "state.json", text)
        fsync_dir(tmp)
        shutil.rmtree(old, ignore_errors=True)
        try:
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
        except OSError as e:
            if old.exists() and not final.exists():
                os.replace(old, final)  # put the previous checkpoint back
            raise OutputError(final, e) from None
        fsync_dir(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


class _Check:
    """Raises ConfigError('--resume RUN: FILE: problem')."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def fail(self, path: Path, problem: str) -> None:
        raise ConfigError(f"--resume {self.run_dir}: {path}: {problem}")

    def need(self, ok: bool, path: Path, problem: str) -> None:
        if not ok:
            self.fail(path, problem)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _folder(run_dir: Path) -> Path:
    d = run_dir / "checkpoint"
    if not d.is_dir() and (run_dir / "checkpoint.old").is_dir():
        return run_dir / "checkpoint.old"  # the writer died between its two renames
    if not d.is_dir():
        raise ConfigError(f"--resume {run_dir}: no checkpoint there (runs write one with "
                          "--checkpoint-every N)")
    return d


def _read_json(chk: _Check, path: Path) -> dict[str, Any]:
    chk.need(path.is_file(), path, "missing")
    try:
        state = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        chk.fail(path, f"not valid JSON ({e})")
    chk.need(isinstance(state, dict), path, "not a JSON object")
    return state


def _read_npz(chk: _Check, path: Path) -> Arrays:
    chk.need(path.is_file(), path, "missing")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}  # reading every member checks its CRC
    except Exception as e:  # noqa: BLE001 - zipfile, format and pickle errors alike
        chk.fail(path, f"damaged or not an .npz file ({type(e).__name__}: {e})")
    for k, a in arrays.items():
        chk.need(a.dtype.kind in "biufc", path, f"array '{k}' has dtype {a.dtype}, not numbers")
    return arrays


def _check_state(chk: _Check, path: Path, s: dict[str, Any], cfg: RunConfig) -> None:
    name = s.get("algorithm")
    chk.need(name == cfg.algo.name, path,
             f"a checkpoint of algorithm {name!r}, this run is {cfg.algo.name!r}")
    rd = s.get("rounds_done")
    chk.need(_is_int(rd) and rd >= 0, path, f"rounds_done must be a whole number >= 0 (got {rd!r})")
    chk.need(rd <= cfg.rounds, path, f"rounds_done is {rd}, more than --rounds {cfg.rounds} "
                                     f"(resume with --rounds {rd} or more)")
    t = s.get("sim_time")
    chk.need(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
             and t >= 0, path, f"sim_time must be a finite number >= 0 (got {t!r})")
    ledger = s.get("ledger")
    chk.need(isinstance(ledger, dict), path, "the byte ledger is missing")
    missing = sorted(LEDGER_KEYS - set(ledger))
    chk.need(not missing, path, f"the byte ledger lacks {', '.join(missing)}")
    unknown = sorted(set(ledger) - LEDGER_KEYS - set(Ledger().totals()))
    chk.need(not unknown, path, f"the byte ledger has an unknown key {unknown[0] if unknown else ''!r}")
    bad = sorted(k for k, v in ledger.items() if not (_is_int(v) and v >= 0))
    chk.need(not bad, path, f"ledger '{bad[0] if bad else ''}' must be a whole number >= 0")
    rows = s.get("rows")
    chk.need(_is_int(rows) and rows >= 0, path, f"rows must be a whole number >= 0 (got {rows!r})")
    f = s.get("failures", [])
    chk.need(isinstance(f, list) and all(isinstance(x, dict) for x in f), path,
             "failures must be a list of objects")
    chk.need(isinstance(s.get("setup", {}), dict), path, "setup must be an object")
    meta = s.get("algo")
    chk.need(isinstance(meta, dict), path, "the algorithm's state ('algo') is missing")
    nt = meta.get("next_task", 0)
    chk.need(_is_int(nt) and nt >= 0, path, f"algo.next_task must be a whole number >= 0 (got {nt!r})")
    groups = meta.get("superclients", [])
    chk.need(isinstance(groups, list) and all(
        isinstance(g, list) and all(_is_int(c) and 0 <= c < cfg.clients for c in g) for g in groups),
        path, f"algo.superclients must be lists of client ids in 0..{cfg.clients - 1}")


def _check_metrics(chk: _Check, run_dir: Path, rows: int) -> None:
    path = run_dir / "metrics.jsonl"
    chk.need(path.is_file(), path, f"missing (the checkpoint keeps its first {rows} rows)")
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
        ok = all(isinstance(json.loads(x), dict) for x in lines[:rows])
    except (OSError, ValueError):
        ok = False
    chk.need(ok, path, f"its first {rows} rows are not all JSON objects")
    chk.need(len(lines) >= rows, path, f"{len(lines)} rows, the checkpoint needs its first {rows}")


def read(run_dir: str | Path, cfg: RunConfig) -> tuple[Arrays, dict[str, Any]]:
    """The arrays and state of RUN/checkpoint, checked against the run (no algorithm needed);
    a ConfigError naming --resume and the file when absent or damaged."""
    run_dir = Path(run_dir)
    chk = _Check(run_dir)
    d = _folder(run_dir)
    state = _read_json(chk, d / "state.json")
    arrays = _read_npz(chk, d / "state.npz")
    _check_state(chk, d / "state.json", state, cfg)
    _check_metrics(chk, run_dir, state["rows"])
    return arrays, state


def check_arrays(chk: _Check, path: Path, arrays: Arrays, template: Arrays) -> None:
    """Names, shapes and dtypes as the algorithm's own checkpoint() has them now; besides, state
    arrays the algorithm creates later (state/<what>/<model key>, shaped like that parameter)."""
    for k, t in template.items():
        chk.need(k in arrays, path, f"array '{k}' is missing")
        a = arrays[k]
        chk.need(a.shape == t.shape, path, f"array '{k}' has shape {a.shape}, the model needs "
                                           f"{t.shape}")
        chk.need(a.dtype == t.dtype, path, f"array '{k}' has dtype {a.dtype}, the model needs "
                                           f"{t.dtype}")
    for k in sorted(set(arrays) - set(template)):
        parts = k.split("/", 2)
        ref = template.get(f"model/{parts[2]}") if len(parts) == 3 and parts[0] == "state" else None
        chk.need(ref is not None, path, f"array '{k}' does not belong to this model")
        chk.need(arrays[k].shape == ref.shape and arrays[k].dtype.kind == "f", path,  # type: ignore[union-attr]
                 f"array '{k}' has shape {arrays[k].shape} and dtype {arrays[k].dtype}, expected "
                 f"floats of shape {ref.shape}")  # type: ignore[union-attr]


def load(run_dir: str | Path, algo: Any, cfg: RunConfig) -> tuple[Arrays, dict[str, Any]]:
    """read(), then the arrays checked against algo.checkpoint() and restored into algo."""
    run_dir = Path(run_dir)
    arrays, state = read(run_dir, cfg)
    chk = _Check(run_dir)
    template, _ = algo.checkpoint()
    path = _folder(run_dir) / "state.npz"
    check_arrays(chk, path, arrays, template)
    try:
        algo.restore(arrays, state["algo"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        chk.fail(_folder(run_dir) / "state.json", f"the algorithm's state does not fit ({e})")
    return arrays, state
