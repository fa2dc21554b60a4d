"""Atomic checkpoints of the server's state and resuming from them (--checkpoint-every, --resume).

A checkpoint is RUN/checkpoint/{state.npz, state.json}: the algorithm's arrays (the model and its
server state: FedDyn's h, SCAFFOLD's c, ...), its JSON state (FedSeq's superclients, ...), the
rounds done, the simulated time, the ledger totals and the failures so far. Randomness needs no
saving: every draw comes from (seed, purpose, round, client). It is written to a temporary
folder and renamed into place, so a crash leaves either the old or the new checkpoint.
State that lives in client processes (SCAFFOLD's c_k, FedDyn's g_k, personal models) survives
only if those processes do (clients on other hosts re-register with a restarted server).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from fednet.errors import ConfigError


def save(out: Path, algo: Any, driver: Any) -> None:
    """Write RUN/checkpoint atomically."""
    arrays, meta = algo.checkpoint()
    tmp = out / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.savez(tmp / "state.npz", **arrays)
    state = {"rounds_done": driver.rounds_done, "sim_time": driver.sim_time,
             "ledger": driver.ledger.totals(), "failures": driver.failures,
             "setup": driver.setup_stats, "rows": len(driver.history.rows), "algo": meta,
             "algorithm": algo.cfg.algo.name}
    (tmp / "state.json").write_text(json.dumps(state, default=float))
    final = out / "checkpoint"
    old = out / "checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def load(run_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and state of RUN/checkpoint; a ConfigError naming --resume when absent."""
    d = Path(run_dir) / "checkpoint"
    if not (d / "state.json").exists():
        raise ConfigError(f"--resume {run_dir}: no checkpoint there (runs write one with "
                          "--checkpoint-every N)")
    state = json.loads((d / "state.json").read_text())
    with np.load(d / "state.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, state
