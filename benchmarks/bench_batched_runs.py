"""Whole `fednet local` runs, batched (--batch-clients) against unbatched, side by side (issue 56
item 4, first part).

    python3 benchmarks/bench_batched_runs.py --json benchmarks/results/batched_runs.json
    python3 benchmarks/bench_batched_runs.py --cells digits:100 --repeats 1

Cells (DATASET:CLIENTS[:PER_ROUND]): digits:100 (the digits CNN, every client each round) and
synthetic-fedprox:20000:1000 (mclr, the million-client job's cohort of 1,000 a round at a small
population). Each run: `fednet local` with fednet's defaults, --seed 0, --rounds R, and
--batch-clients B (the cohort in one block; 0 for the unbatched run), as a subprocess. The two
runs of a cell alternate --repeats times (both see the same load on a shared machine). Per run:
the whole command's seconds and the steady round (the median of metrics.jsonl's wall_s
differences from round 1 on: training, aggregation and evaluation); the medians, their ratios,
and what must not move: the bytes, the messages and the simulated time (equal, or the cell says
so), the final model's largest difference relative to each array's scale, the final accuracies.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, run  # noqa: E402
from benchlib.util import headline_row, machine, measured, write_json  # noqa: E402

TARGETS = {"digits:100": "<= 0.33x (issue 56, steady round against the plain loop's)"}


def one(dataset: str, clients: int, per_round: int, batch: int, rounds: int, out: Path
        ) -> dict[str, Any]:
    """One `fednet local` run: its seconds, steady round, summary and final model."""
    argv = fednet_module("local", "--dataset", dataset, "--clients", str(clients), "--fraction",
                         repr(per_round / clients), "--rounds", str(rounds), "--seed", "0",
                         "--batch-clients", str(batch), "-q", "--out", str(out), "--overwrite")
    if dataset != "digits":
        argv += ["--partition", "natural"]
    ran = run(argv, check=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    walls = [r["wall_s"] for r in rows if "wall_s" in r and r.get("round", -1) >= 0]
    steps = [b - a for a, b in zip(walls, walls[1:])] or walls
    summary = json.loads((out / "summary.json").read_text())
    with np.load(out / "final_model.npz") as z:
        model = {k: z[k] for k in z.files}
    return {"wall_s": ran.wall_s, "round_s": statistics.median(steps), "summary": summary,
            "model": model}


def cell(spec: str, rounds: int, repeats: int) -> dict[str, Any]:
    parts = spec.split(":")
    dataset, clients = parts[0], int(parts[1])
    per_round = int(parts[2]) if len(parts) > 2 else clients
    got: dict[str, list[dict[str, Any]]] = {"plain": [], "batched": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for name, batch in (("plain", 0), ("batched", per_round)):
                got[name].append(one(dataset, clients, per_round, batch, rounds,
                                     Path(tmp) / f"{name}{i}"))
    p, b = got["plain"][-1], got["batched"][-1]
    sp, sb = p["summary"], b["summary"]
    diff = max(float(np.abs(p["model"][k] - b["model"][k]).max())
               / max(float(np.abs(p["model"][k]).max()), 1e-12) for k in p["model"])
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "round_s")}
           for k, v in got.items()}
    return {"cell": spec, "dataset": dataset, "clients": clients, "per_round": per_round,
            "rounds": rounds, "repeats": repeats,
            "plain_wall_s": round(med["plain"]["wall_s"], 3),
            "batched_wall_s": round(med["batched"]["wall_s"], 3),
            "plain_round_s": round(med["plain"]["round_s"], 4),
            "batched_round_s": round(med["batched"]["round_s"], 4),
            "round_ratio": round(med["batched"]["round_s"] / med["plain"]["round_s"], 3),
            "wall_ratio": round(med["batched"]["wall_s"] / med["plain"]["wall_s"], 3),
            "same_bytes": sp["bytes"] == sb["bytes"], "same_messages": sp["messages"] == sb["messages"],
            "same_sim_time": sp["sim_time_s"] == sb["sim_time_s"],
            "max_rel_diff": f"{diff:.1e}", "plain_accuracy": sp.get("final_accuracy"),
            "batched_accuracy": sb.get("final_accuracy"),
            "all_s": {k: [[round(r["wall_s"], 3), round(r["round_s"], 4)] for r in v]
                      for k, v in got.items()}}


def headline(data: dict) -> list:
    """One row per cell: the batched steady round over the unbatched one."""
    rows = []
    for r in data.get("cells", []):
        same = "bytes, messages, simulated time identical" if (
            r["same_bytes"] and r["same_messages"] and r["same_sim_time"]) else \
            "bytes/messages/simulated time DIFFER"
        rows.append(headline_row(
            "scale", f"fednet local, {r['dataset']} {r['clients']:,} clients "
            f"({r['per_round']:,} a round): steady round with --batch-clients / without",
            r["round_ratio"], "x", "",
            f"{r['batched_round_s']} s against {r['plain_round_s']} s a round, whole command "
            f"{r['wall_ratio']}x ({r['batched_wall_s']} against {r['plain_wall_s']} s), medians "
            f"of {r['repeats']}, {r['rounds']} rounds; {same}; model within {r['max_rel_diff']}"
            f" of scale; accuracy {r['batched_accuracy']} against {r['plain_accuracy']}"))
    return measured(*rows)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="digits:100,synthetic-fedprox:20000:1000")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the results here (the dashboard's file)")
    return ap


def main() -> None:
    a = parser().parse_args()
    info = machine()
    rows = []
    for spec in a.cells.split(","):
        r = cell(spec, a.rounds, a.repeats)
        print(json.dumps(r), flush=True)
        rows.append(r)
    print("\n| cell | round s plain | round s batched | ratio | command s plain | batched | ratio "
          "| identical bytes/time | max rel diff |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cell']} | {r['plain_round_s']} | {r['batched_round_s']} | "
              f"{r['round_ratio']} | {r['plain_wall_s']} | {r['batched_wall_s']} | "
              f"{r['wall_ratio']} | {r['same_bytes'] and r['same_sim_time']} | "
              f"{r['max_rel_diff']} |")
    data = {"args": vars(a), "machine": info, "cells": rows}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
