"""Batched and unbatched training give the same accuracy curves within the seeds' spread (issue 56,
target 4: "Accuracy curves of batched and unbatched runs agree within the seeds' spread on every
batched algorithm").

    python3 benchmarks/bench_batched_accuracy.py [--algos fedavg fedprox ...] [--seeds 0 1 2 3 4]
        [--clients 20] [--fraction 0.5] [--rounds 10] [--epochs 5] [--batch-clients 10]
        [--json F]

Every cell is one `fednet local` run (fednet.api.run, in this process, one torch thread) on digits
(its default model, the digits CNN; iid), once as today (one client after another) and once with
--batch-clients (training/batched.py: the block's clients as one torch.func batch), for every
algorithm whose Spec says batched (algorithms/catalog.BATCHED) and every seed. A batched client's
update equals its unbatched one only to a tolerance (batched kernels reassociate sums), so the two
runs' curves part after a few rounds, as two seeds' do; what must hold is that the difference is
of the size of the seeds' own spread, not a bias. Per algorithm:
- per round, the batched runs' mean accuracy against the unbatched seeds' range (min..max) at
  that round (`outside`: the rounds where the mean leaves the range, and by how much), and the
  gap between the two means over the unbatched seeds' standard deviation (`gap_over_sd`, the
  largest from round 3 on, where the curves have left chance; information: with 5 seeds a side,
  chance alone puts a round's gap above one sd about one round in ten);
- the final accuracy (the mean of each run's last 3 rounds), batched minus unbatched, paired by
  seed, with its 95% t interval: "no clear difference" when the interval holds 0.
Agreement: the interval holds 0 and the batched mean stays inside the unbatched seeds' range at
every round.
Fingerprints (benchlib/fingerprint.py, CLOCKLESS): seed 0's FedAvg cell, batched and unbatched.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

LAST = 3  # a run's final accuracy: the mean of its last LAST rounds
FROM_ROUND = 3  # gap_over_sd from this round (0-based) on


def parser() -> argparse.ArgumentParser:
    from fednet.algorithms.catalog import BATCHED

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", nargs="+", default=list(BATCHED))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-clients", type=int, default=10)
    ap.add_argument("--json", help="write the results to this file")
    return ap


def config(algo: str, seed: int, batched: bool, ns: argparse.Namespace) -> dict[str, Any]:
    """fednet.api.run's keywords of one cell (the same as `fednet local`'s options)."""
    kw: dict[str, Any] = {"algo": algo, "clients": ns.clients, "fraction": ns.fraction,
                          "rounds": ns.rounds, "epochs": ns.epochs, "seed": seed}
    if batched:
        kw["batch_clients"] = ns.batch_clients
    return kw


def one(algo: str, seed: int, batched: bool, ns: argparse.Namespace, tmp: str) -> dict[str, Any]:
    from fednet.api import run

    t0 = time.perf_counter()
    exp = run(**config(algo, seed, batched, ns), out=f"{tmp}/{algo}-{seed}-{batched}", quiet=True)
    curve = [r.get("accuracy") for r in exp.history]
    done = [a for a in curve if a is not None]
    return {"algo": algo, "seed": seed, "batched": batched, "status": exp.summary["status"],
            "curve": curve, "final": statistics.fmean(done[-LAST:]) if done else None,
            "wall_s": time.perf_counter() - t0}


def compare(cells: list[dict[str, Any]], algo: str) -> dict[str, Any]:
    """One algorithm's batched runs against its unbatched ones (the module's docstring)."""
    from fednet.metrics.intervals import versus

    mine = [c for c in cells if c["algo"] == algo and c["batched"]]
    base = [c for c in cells if c["algo"] == algo and not c["batched"]]
    rounds = min(len(c["curve"]) for c in mine + base)
    gaps, sds, outside = [], [], {}
    for r in range(rounds):
        b = [c["curve"][r] for c in base if c["curve"][r] is not None]
        m = [c["curve"][r] for c in mine if c["curve"][r] is not None]
        if len(b) < 2 or not m:
            gaps.append(None)
            sds.append(None)
            continue
        mean = statistics.fmean(m)
        gaps.append(mean - statistics.fmean(b))
        sds.append(statistics.stdev(b))
        if not min(b) <= mean <= max(b):
            outside[r] = mean - (min(b) if mean < min(b) else max(b))
    ratios = [abs(g) / s if s else (0.0 if g == 0 else float("inf"))
              for g, s in zip(gaps[FROM_ROUND:], sds[FROM_ROUND:]) if g is not None and s is not None]
    diff = versus({c["seed"]: c["final"] for c in mine}, {c["seed"]: c["final"] for c in base},
                  higher=True)
    worst = max(ratios) if ratios else None
    holds_zero = diff["lo"] is not None and diff["lo"] <= 0 <= diff["hi"]
    return {"algo": algo, "seeds": len(base), "gap": gaps, "sd": sds, "gap_over_sd": worst,
            "outside": outside,
            "final_batched": statistics.fmean(c["final"] for c in mine),
            "final_unbatched": statistics.fmean(c["final"] for c in base), "difference": diff,
            "agree": bool(holds_zero and not outside),
            "wall_ratio": (statistics.fmean(c["wall_s"] for c in mine)
                           / statistics.fmean(c["wall_s"] for c in base))}


def table_text(rows: list[dict[str, Any]]) -> str:
    def diff(d: dict[str, Any]) -> str:
        return "-" if d["estimate"] is None else \
            f"{d['estimate']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]"

    return table(["algorithm", "seeds", "final unbatched", "final batched",
                  "batched - unbatched (95% t)", "rounds outside the seeds' range",
                  "largest round gap / seeds' sd", "agree",
                  "wall batched / unbatched"],
                 [[r["algo"], r["seeds"], f"{r['final_unbatched']:.4f}",
                   f"{r['final_batched']:.4f}", diff(r["difference"]),
                   ", ".join(f"{k} ({v:+.4f})" for k, v in r["outside"].items()) or "none",
                   "-" if r["gap_over_sd"] is None else f"{r['gap_over_sd']:.2f}",
                   "yes" if r["agree"] else "NO", f"{r['wall_ratio']:.2f}"] for r in rows])


def setting(args: dict[str, Any]) -> str:
    return (f"digits iid, digits CNN, {args.get('clients')} clients, fraction "
            f"{args.get('fraction')}, {args.get('rounds')} rounds x {args.get('epochs')} epochs, "
            f"--batch-clients {args.get('batch_clients')}, {len(args.get('seeds') or [])} seeds")


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = data.get("table") or []
    if not rows:
        return []
    worst = max(rows, key=lambda r: abs(r["difference"]["estimate"] or 0.0))
    spread = max((r for r in rows if r["gap_over_sd"] is not None),
                 key=lambda r: r["gap_over_sd"], default=None)
    agree = sum(r["agree"] for r in rows)
    d = worst["difference"]
    note = (f"{agree} of {len(rows)} batched algorithms agree (final accuracy's paired 95% t "
            f"interval holds 0, and the batched mean stays inside the unbatched seeds' range "
            f"every round); largest "
            f"difference {worst['algo']} [{d['lo']:+.4f}, {d['hi']:+.4f}]"
            + (f"; largest round gap / seeds' sd {spread['gap_over_sd']:.2f} ({spread['algo']})"
               if spread else "") + f"; {setting(data.get('args') or {})}")
    fp = {"fingerprint": sorted(data.get("fingerprints", {}))}
    return [{**r, **fp} for r in measured(headline_row(
        "accuracy", "batched - unbatched final accuracy, largest over the batched algorithms",
        d["estimate"], "", "within the seeds' spread (issue 56)", note))]


def main() -> int:
    ns = parser().parse_args()
    import torch

    torch.set_num_threads(1)
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fednet-batched-acc-") as tmp:
        for algo in ns.algos:
            for seed in ns.seeds:
                for batched in (False, True):
                    c = one(algo, seed, batched, ns, tmp)
                    cells.append(c)
                    print(f"{algo:10s} seed {seed} {'batched  ' if batched else 'unbatched'}: "
                          f"final {c['final']:.4f} {c['status']} {c['wall_s']:.1f}s", flush=True)
    rows = [compare(cells, a) for a in ns.algos]
    print(table_text(rows))
    from benchlib.fingerprint import CLOCKLESS, fingerprint_of, takes

    recipes = {f"batched-acc-{a}-{'batched' if b else 'alone'}":
               fingerprint_of(config(a, ns.seeds[0], b, ns)) for a in ns.algos[:1] for b in (False, True)}
    data = {"machine": machine(), "args": vars(ns), "cells": cells, "table": rows,
            "fingerprints": takes(recipes, CLOCKLESS)}
    write_json(ns.json, data, headline)
    return 0 if all(c["status"] == "completed" for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
