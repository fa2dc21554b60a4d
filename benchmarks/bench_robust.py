"""Byzantine clients against robust aggregation (issue 40): the defense x attack table on digits,
and the wall-clock of each defense on large rounds.

    python3 benchmarks/bench_robust.py [--json FILE]                     # the defaults below
    python3 benchmarks/bench_robust.py --rounds 10 --seeds 0 1 2 --timing-n 1000 --timing-d 100000

(a) Table: `fednet local` runs (fednet.api.run, in this process) on digits, 100 clients,
    Dirichlet 0.5, every client in every round (--fraction 1), 20% malicious (--malicious 0.2),
    each (attack, defense) with every seed; the final clean accuracy and, for the backdoor, the
    final attack success rate, as mean, sample sd and min..max over the seeds; and each cell's
    wall-clock against plain FedAvg's (the same attack and seeds).
(b) Timing: each defense (robust.apply) on n updates of d float64 coordinates drawn from a
    normal distribution, against the mean of the same matrix (numpy) and against StreamingMean
    (FedAvg's exact streamed mean). Reported: the median of `--repeat` runs.

The issue asks for 1,000 updates of a 1M-parameter model: that matrix is 8 GB of float64, too
much beside the other work of this shared 24 GB machine, so the default times 1,000 x 100,000
(0.8 GB) and 100 x 1,000,000 and says so; Krum and Bulyan grow as n^2 d, the others as n d.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

ATTACKS = ["none", "signflip", "labelflip", "alie", "ipm", "minmax", "backdoor"]
DEFENSES = ["none", "krum", "median", "trimmed_mean", "bulyan", "centered_clip"]
TIMED = ["krum", "multikrum", "bulyan", "median", "trimmed_mean", "norm_bound", "centered_clip"]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", nargs="+", default=ATTACKS)
    ap.add_argument("--defenses", nargs="+", default=DEFENSES)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--malicious", default="0.2")
    ap.add_argument("--timing", nargs="*", default=["1000x100000", "100x1000000", "100x155000"],
                    help="N x D sizes to time each defense on")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--skip-table", action="store_true")
    ap.add_argument("--json", help="write the results to this file")
    return ap


def one(attack: str, defense: str, seed: int, ns: argparse.Namespace, tmp: str) -> dict:
    from fednet.api import run

    t0 = time.perf_counter()
    exp = run(clients=ns.clients, rounds=ns.rounds, epochs=ns.epochs, partition="dirichlet",
              alpha=0.5, seed=seed, attack=attack, malicious=ns.malicious, defense=defense,
              out=f"{tmp}/{attack}-{defense}-{seed}", quiet=True)
    s = exp.summary
    return {"attack": attack, "defense": defense, "seed": seed, "status": s["status"],
            "final_accuracy": s["final_accuracy"],
            "final_attack_success": s.get("final_attack_success"),
            "wall_s": time.perf_counter() - t0, "train_wall_s": s["wall_clock_s"]}


def stats(xs: list[float | None]) -> dict[str, Any]:
    v = [x for x in xs if x is not None]
    return {"mean": statistics.fmean(v) if v else None,
            "sd": statistics.stdev(v) if len(v) > 1 else None,
            "min": min(v) if v else None, "max": max(v) if v else None, "n": len(v)}


def summarize(cells: list[dict]) -> list[dict]:
    out = []
    for a in dict.fromkeys(c["attack"] for c in cells):
        base = [c for c in cells if c["attack"] == a and c["defense"] == "none"]
        for d in dict.fromkeys(c["defense"] for c in cells):
            mine = [c for c in cells if c["attack"] == a and c["defense"] == d]
            if not mine:
                continue
            ratio = (statistics.fmean(c["train_wall_s"] for c in mine)
                     / statistics.fmean(c["train_wall_s"] for c in base)) if base else None
            out.append({"attack": a, "defense": d,
                        "accuracy": stats([c["final_accuracy"] for c in mine]),
                        "attack_success": stats([c["final_attack_success"] for c in mine]),
                        "wall_vs_fedavg": ratio})
    return out


def timing(n: int, d: int, repeat: int) -> dict[str, float]:
    """Median seconds of each defense, numpy's mean and StreamingMean on an n x d matrix."""
    from fednet.algorithms import robust as R
    from fednet.algorithms import robust_spec as S
    from fednet.algorithms.aggregate import StreamingMean

    x = np.random.default_rng(0).normal(size=(n, d))
    w = np.ones(n)
    params = {"krum": S.ByzantineCount(), "multikrum": S.MultiKrumParams(),
              "bulyan": S.ByzantineCount(), "median": S.ByzantineCount(),
              "trimmed_mean": S.TrimmedMeanParams(), "norm_bound": S.NormBoundParams(),
              "centered_clip": S.CenteredClipParams()}
    out: dict[str, float] = {}

    def best(fn) -> float:
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    out["mean (numpy)"] = best(lambda: x.mean(axis=0))

    def streaming() -> None:
        m = StreamingMean()
        for i in range(n):
            m.add({"w": x[i].astype(np.float32)}, 1.0, key=i)
        m.result()
    out["fedavg (StreamingMean)"] = best(streaming)
    for name in TIMED:
        out[name] = best(lambda name=name: R.apply(name, params[name], 0.2, x, w))
    return out


def table_text(rows: list[dict]) -> str:
    def fmt(s: dict) -> str:
        if s["mean"] is None:
            return "-"
        sd = f" ± {s['sd']:.3f}" if s["sd"] is not None else ""
        return f"{s['mean']:.3f}{sd} [{s['min']:.3f}..{s['max']:.3f}]"
    return table(["attack", "defense", "accuracy (mean ± sd [min..max])", "attack success",
                  "wall vs fedavg"],
                 [[r["attack"], r["defense"], fmt(r["accuracy"]), fmt(r["attack_success"]),
                   "-" if r["wall_vs_fedavg"] is None else f"{r['wall_vs_fedavg']:.2f}x"]
                  for r in rows])


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = {(r["attack"], r["defense"]): r for r in data.get("table", [])}

    def acc(a: str, d: str) -> float | None:
        r = rows.get((a, d))
        return None if r is None else r["accuracy"]["mean"]

    def seeds(a: str, d: str) -> str:
        """The note's seeds: how many the mean is over, and their range."""
        s = (rows.get((a, d)) or {}).get("accuracy") or {}
        return (f"; mean of {s['n']} seeds, range {s['min']:.3f}-{s['max']:.3f}"
                if s.get("n") else "")
    t = data.get("timing", {})
    big = next((v for k, v in t.items() if k.startswith("1000x")), {})
    note = f"digits, {data.get('args', {}).get('clients')} clients, dirichlet 0.5, 20% malicious"
    return measured(
        headline_row("robustness", "FedAvg accuracy, no attack", acc("none", "none"), "", "",
                     note + seeds("none", "none")),
        headline_row("robustness", "FedAvg accuracy under sign flipping", acc("signflip", "none"),
                     "", "falls", note + seeds("signflip", "none")),
        headline_row("robustness", "Krum accuracy under ALIE", acc("alie", "krum"), "", "",
                     note + seeds("alie", "krum")),
        headline_row("robustness", "trimmed mean accuracy under ALIE", acc("alie", "trimmed_mean"),
                     "", "", note + seeds("alie", "trimmed_mean")),
        headline_row("robustness", "Krum, 1,000 x 100,000 updates", big.get("krum"), "s", "",
                     "numpy, float64"),
        headline_row("robustness", "Bulyan, 1,000 x 100,000 updates", big.get("bulyan"), "s", "",
                     "numpy, float64"))


def main() -> int:
    ns = parser().parse_args()
    import torch

    torch.set_num_threads(1)
    cells: list[dict] = []
    if not ns.skip_table:
        with tempfile.TemporaryDirectory(prefix="fednet-robust-") as tmp:
            for a in ns.attacks:
                for d in ns.defenses:
                    for seed in ns.seeds:
                        c = one(a, d, seed, ns, tmp)
                        cells.append(c)
                        print(f"{a:10s} {d:14s} seed {seed}: acc {c['final_accuracy']:.4f} "
                              f"asr {c['final_attack_success']} {c['wall_s']:.1f}s", flush=True)
    rows = summarize(cells)
    if rows:
        print(table_text(rows))
    times = {}
    for size in ns.timing:
        n, d = (int(v) for v in size.split("x"))
        times[size] = timing(n, d, ns.repeat)
        print(size, {k: round(v, 3) for k, v in times[size].items()}, flush=True)
    data = {"machine": machine(), "args": vars(ns), "cells": cells, "table": rows,
            "timing": times}
    write_json(ns.json, data, headline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
