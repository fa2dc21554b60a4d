"""FedSeq vs FedAvg on pathological non-IID digits (one class per client): two `fednet sweep`s.

    python3 benchmarks/bench_fedseq.py [--out sweeps/fedseq] [--seeds 0,1,2,3,4] [--jobs 2]
        [--rounds 300] [--plot benchmarks/fedseq_sweep.png] [--dry-run] [--json F]
        [-- more fixed options]

Part 1 (OUT/rounds): rounds to 70/80/90% of centralized accuracy. Every method gets the same
budget of client epochs per round (20: FedAvg samples 20 of 100 clients, FedSeq 2 of 10
superclients of 10 clients, E = 1 epoch per client) and its own learning rate: every lr of its
grid runs on every seed, and the best lr is the one with the fewest mean rounds to 90% (ties:
final accuracy). The reference is a centralized run (30 rounds of 1 epoch, lr 0.1, seed 0).
Part 2 (OUT/latency): with the `hetero` preset (20% of clients 5x slower), simulated seconds to
80% of centralized for FedSeq vs FedSeqInter, seed 0.
This script only builds the two commands, prints them and runs them; both are resumable (run it
again to go on), and `fednet report OUT/rounds` prints the table again. --json F: each part's
sweep.json (its spec, per-setting statistics, best settings and notes; not the cells) after
the runs.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import headline_row, machine, measured, write_json  # noqa: E402

FIXED = ["--clients", "100", "--partition", "shards", "--alpha", "0", "--fraction", "0.2",
         "--epochs", "1", "--latency", "none"]
SEQ = "--superclient-fraction 0.2 --pretrain-epochs 40"
REFERENCE = "centralized:--rounds 30 --lr 0.1 --seed 0"


def part1(a: argparse.Namespace, extra: list[str]) -> list[str]:
    return ["sweep", "--out", f"{a.out}/rounds", "--jobs", str(a.jobs),
            "--metric", "rounds_to:0.9", "--reference", REFERENCE, "--baseline", "fedavg",
            "--show", "rounds_to:0.7", "--show", "rounds_to:0.8",
            "--show", "setup.balance_ratio_mean", "--show", "setup.covered_classes_mean",
            "--method", f"fedavg=--algo fedavg --lr {a.fedavg_lrs}",
            "--method", f"fedseq=--algo fedseq --lr {a.fedseq_lrs} {SEQ}",
            "--method", f"fedseq_random=--algo fedseq --lr {a.fedseq_lrs} {SEQ} --grouping random",
            "--method", f"fedseq_inter=--algo fedseq_inter --lr {a.fedseq_lrs} {SEQ}",
            "--seed", a.seeds, "--", *FIXED, "--rounds", str(a.rounds), *extra]


def part2(a: argparse.Namespace, extra: list[str]) -> list[str]:
    return ["sweep", "--out", f"{a.out}/latency", "--jobs", str(a.jobs),
            "--metric", "sim_to:0.8", "--reference", REFERENCE,
            "--show", "sim_time_s", "--show", "setup.sim_s", "--show", "bytes.client_to_client",
            "--method", f"fedseq=--algo fedseq {SEQ}",
            "--method", f"fedseq_inter=--algo fedseq_inter {SEQ}",
            "--lr", str(a.latency_lr), "--seed", "0",
            "--", *FIXED, "--rounds", str(a.rounds), *extra, "--latency", "hetero"]


def sweep_result(folder: str) -> dict[str, Any] | None:
    """A part's sweep.json without its cells (None when the part has not run)."""
    try:
        d = json.loads((Path(folder) / "sweep.json").read_text())
    except (OSError, ValueError):
        return None
    return {k: v for k, v in d.items() if k != "cells"}


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: FedSeq's speed-up in rounds to 90% of centralized over FedAvg, each
    at its best lr (BENCHMARKS section 3: >= 2x), and FedSeqInter / FedSeq in simulated time to
    80% with slow clients."""
    best = {b["method"]: b for b in (data.get("rounds") or {}).get("best", [])}
    lat = {b["method"]: b for b in (data.get("latency") or {}).get("best", [])}
    fa, fs = best.get("fedavg", {}).get("mean"), best.get("fedseq", {}).get("mean")
    si, ss = lat.get("fedseq_inter", {}).get("mean"), lat.get("fedseq", {}).get("mean")
    a = data.get("args", {})

    def desc(m: str) -> str:
        b = best.get(m, {})
        return f"{m} {b.get('text')}: {b.get('mean') or 0:.1f} ({b.get('reached')}/{b.get('runs')})"
    return measured(
        headline_row("accuracy", "FedSeq vs FedAvg on digits shards (one class per client): "
                     "speed-up in rounds to 90% of centralized, best lr each", fa / fs
                     if fa and fs else None, "x", ">= 2x",
                     "; ".join(desc(m) for m in best) + f"; seeds {a.get('seeds')}"),
        headline_row("accuracy", "FedSeqInter / FedSeq, simulated time to 80% of centralized, "
                     "--latency hetero", si / ss if si and ss else None, "x", "",
                     f"FedSeq {ss or 0:.2f} s, FedSeqInter {si or 0:.2f} s; seed 0"))


def fednet(args: list[str], dry: bool) -> int:
    print("$ fednet " + shlex.join(args), flush=True)
    if dry:
        args = args[:args.index("--")] + ["--dry-run"] + args[args.index("--"):]
    return subprocess.run([sys.executable, "-m", "fednet", *args]).returncode


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="sweeps/fedseq")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fedavg-lrs", default="0.1,0.2,0.3,0.4,0.6")
    ap.add_argument("--fedseq-lrs", default="0.03,0.05,0.1,0.2")
    ap.add_argument("--latency-lr", type=float, default=0.05)
    ap.add_argument("--plot", help="also `fednet report OUT/rounds --plot FILE`")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--json", help="also write both parts' results to this file (not with "
                    "--dry-run)")
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    info = machine()
    rc = fednet(part1(a, extra), a.dry_run)
    if rc == 0 and a.plot and not a.dry_run:
        rc = fednet(["report", f"{a.out}/rounds", "--plot", a.plot], False)
    if rc == 0 and not a.skip_latency:
        rc = fednet(part2(a, extra), a.dry_run)
    if a.json and not a.dry_run:
        data = {"machine": info, "args": vars(a), "extra": extra, "rc": rc,
                "rounds": sweep_result(f"{a.out}/rounds"),
                "latency": None if a.skip_latency else sweep_result(f"{a.out}/latency")}
        write_json(a.json, data, headline(data))
    sys.exit(rc)


if __name__ == "__main__":
    main()
