"""FedSeqInter vs FedSeq when clients come and go (--availability): simulated time to 80% of
centralized on pathological non-IID digits. docs/benchmarks/history.md section 13.

    python3 benchmarks/bench_availability.py [--out /tmp/bench_availability] [--seeds 0,1,2]
        [--json F]

Setup: section 3 part 2 (100 clients, one class each, superclient fraction 0.2, 40 pre-training
epochs, E = 1, lr 0.05, `--latency hetero`: 20% of clients 5x slower compute, 10x slower uplink),
300 rounds, under three availability models:
  always   every client online (the default; section 3's figures)
  churn    a trace written here (OUT/churn.csv, seed 1234): each client alternates online and
           offline stretches of exponential length, mean 8 s online and 2 s offline (80% online,
           a change every few rounds: a round takes about 0.3 simulated s), from the stationary
           state at time 0
  windows  the preset offline:0.2:1 (a fresh seeded 20% of clients offline in every second)
The table: simulated seconds to 80% of centralized (the first logged model at or above it,
FedSeqInter's interim bank averages included, as `fednet sweep --metric sim_to` counts them),
final accuracy, and what availability did: peers skipped by rings, tasks failed when their
client went offline, clients that missed pre-training (they are in no superclient). Reference:
centralized, 30 epochs, lr 0.1, seed 0. Runs are `fednet local` (identical to fednet launch:
tests/integration/test_availability_parity.py) and are skipped when their summary exists.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _util import headline_row, machine, measured, write_json  # noqa: E402

FIXED = ["--clients", "100", "--partition", "shards", "--alpha", "0", "--fraction", "0.2",
         "--epochs", "1", "--latency", "hetero", "--lr", "0.05", "--rounds", "300", "-q"]
SEQ = ["--superclient-fraction", "0.2", "--pretrain-epochs", "40"]
REFERENCE = ["--algo", "centralized", "--lr", "0.1", "--rounds", "30", "--seed", "0",
             "--clients", "100", "--latency", "none", "-q"]
MEAN_ON, MEAN_OFF, HORIZON = 8.0, 2.0, 2000.0


def churn_trace(path: Path, n: int = 100, seed: int = 1234) -> None:
    """Alternating exponential online/offline stretches per client (CSV of online intervals)."""
    g = np.random.default_rng(seed)
    rows = ["client,start,end"]
    for c in range(n):
        t, online = 0.0, g.random() < MEAN_ON / (MEAN_ON + MEAN_OFF)
        while t < HORIZON:
            d = g.exponential(MEAN_ON if online else MEAN_OFF)
            if online:
                rows.append(f"{c},{t:.6f},{t + d:.6f}")
            t += d
            online = not online
        if online:
            rows.append(f"{c},{t:.6f},")  # online for good after the horizon
    path.write_text("\n".join(rows) + "\n")


def run(out: Path, args: list[str]) -> tuple[dict, list[dict]]:
    """One fednet local run (skipped when its summary exists)."""
    if not (out / "summary.json").exists():
        env = dict(os.environ, PYTHONPATH=str(HERE.parent))
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "fednet", "local", "--out", str(out), "--overwrite",
                        *args], check=True, env=env, stdout=subprocess.DEVNULL)
        print(f"  {out.name}: {time.monotonic() - t0:.0f} s wall", flush=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), rows


def sim_to(rows: list[dict], target: float) -> float | None:
    """Simulated seconds at the first logged model at or above target (None: never)."""
    for r in sorted(rows, key=lambda r: r["sim_s"]):
        if r["accuracy"] >= target:
            return r["sim_s"]
    return None


def seed_ratios(cells: dict[str, list[dict]]) -> list[float]:
    """FedSeqInter's time to target over FedSeq's, seed by seed (where both reached it)."""
    pairs = zip(cells.get("fedseq", []), cells.get("fedseq_inter", []))
    return [y["to"] / x["to"] for x, y in pairs if x["to"] and y["to"]]


def headline(data: dict) -> list[dict]:
    """The dashboard's rows: per availability model, FedSeqInter's simulated time to 80% of
    centralized over FedSeq's (the mean of per-seed ratios)."""
    by: dict[str, dict[str, list[dict]]] = {}
    for t in data.get("table", []):
        by.setdefault(t["availability"], {})[t["method"]] = t["cells"]
    out = []
    for model, cells in by.items():
        ratios = seed_ratios(cells)
        out.append(headline_row(
            "network model", f"FedSeqInter / FedSeq simulated time to 80% of centralized, "
            f"availability {model}", statistics.mean(ratios) if ratios else None, "x", "",
            f"{len(ratios)} seeds: " + " / ".join(f"{x:.2f}" for x in ratios)
            + "; digits shards, 100 clients, --latency hetero"))
    return measured(*out[:4])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/bench_availability")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "churn.csv"
    churn_trace(trace)
    models = {"always": "always", "churn": str(trace), "windows": "offline:0.2:1"}
    info = machine()
    print(json.dumps(info))
    ref, _ = run(out / "reference", REFERENCE)
    target = 0.8 * ref["best_accuracy"]
    print(f"target: 80% of centralized {ref['best_accuracy']:.4f} = {target:.4f}")
    seeds = [int(s) for s in a.seeds.split(",")]
    table: dict[tuple[str, str], list[dict]] = {}
    for seed in seeds:
        for model, spec in models.items():
            for algo in ("fedseq", "fedseq_inter"):
                s, rows = run(out / f"{algo}-{model}-s{seed}",
                              ["--algo", algo, *SEQ, *FIXED, "--seed", str(seed),
                               "--availability", spec])
                av = s.get("availability", {})
                table.setdefault((model, algo), []).append({
                    "to": sim_to(rows, target), "final": s["final_accuracy"],
                    "sim": s["sim_time_s"], "skipped": av.get("skipped_peers", 0),
                    "failed": av.get("offline_failures", 0),
                    "no_pretrain": 100 - sum(len(g) for g in s.get("setup", {}).get("groups", [])),
                    "status": s["status"]})
    print(f"\nseeds {a.seeds}; simulated seconds to {target:.4f} (mean, per seed), 300 rounds")
    print("| availability | method | sim s to 80% | per seed | sim s, 300 rounds | final acc "
          "| skipped peers | offline failures | missed pre-training |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (model, algo), cells in table.items():
        tos = [c["to"] for c in cells]
        ok = [t for t in tos if t is not None]
        mean = f"{statistics.mean(ok):.2f}" if len(ok) == len(tos) else \
            f"- ({len(ok)} of {len(tos)})"
        print(f"| {model} | {algo} | {mean} | {' / '.join('-' if t is None else f'{t:.2f}' for t in tos)}"
              f" | {statistics.mean(c['sim'] for c in cells):.2f}"
              f" | {statistics.mean(c['final'] for c in cells):.3f}"
              f" | {statistics.mean(c['skipped'] for c in cells):.0f}"
              f" | {statistics.mean(c['failed'] for c in cells):.0f}"
              f" | {statistics.mean(c['no_pretrain'] for c in cells):.0f} |")
    for model in models:
        ratios = seed_ratios({algo: table.get((model, algo), [])
                              for algo in ("fedseq", "fedseq_inter")})
        if ratios:
            print(f"{model}: FedSeqInter / FedSeq time to target, mean of per-seed ratios "
                  f"{statistics.mean(ratios):.3f} ({len(ratios)} seeds)")
    data = {"machine": info, "args": vars(a), "reference_best_accuracy": ref["best_accuracy"],
            "target": target, "seeds": seeds,
            "table": [{"availability": m, "method": algo, "cells": cells}
                      for (m, algo), cells in table.items()]}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
