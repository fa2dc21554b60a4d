"""FedSeq vs FedAvg behind a 100 Mbit/s server link: simulated time to 80% of centralized, and
where it goes (server link, compute, peer hand-offs). docs/benchmarks/history.md section 12.

    python3 benchmarks/bench_serverlink.py [--out /tmp/bench_serverlink] [--seeds 0,1] [--json F]

Setup: section 3's pathological non-IID digits (100 clients, one class each, 20 client-epochs
per round: FedAvg 20 of 100 clients, FedSeq 2 of 10 superclients, E = 1), with the 664,618-
parameter digits_wide model (benchmarks/wide_digits.py, 2.7 MB a copy) so that transfers cost
link time. Every client has the same profile (1 ms per sample, 0.5 ms RTT, 1 Gbit/s each way),
so a peer hand-off costs the same whichever side's link is charged.

Each (algorithm, seed) runs four times; simulated time does not change training (no deadline),
so the four give the same accuracies and only the clock differs:
  full      --server-bandwidth 100Mbit
  no_link   the server's link unlimited        -> server link = full - no_link
  no_comp   0 s per sample                     -> compute     = full - no_comp
  free_peer client links unlimited             -> client links (peer hand-offs) = full - free_peer
Times are read at the first round at or above 80% of the centralized reference's best accuracy
(centralized, 30 epochs, lr 0.05, seed 0, same model). FedSeq's time includes its setup stage
(pre-training: the model and exemplars go to all 100 clients through the server link).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _util import headline_row, machine, measured, write_json  # noqa: E402

PLUGIN = str(HERE / "wide_digits.py")
COMMON = ["--plugin", PLUGIN, "--model", "digits_wide", "--clients", "100", "--partition",
          "shards", "--alpha", "0", "--epochs", "1", "-q"]
METHODS = {  # lr: the best of a short grid on seed 0 (FedAvg 0.1/0.2/0.4, FedSeq 0.05/0.1)
    "fedavg": ["--algo", "fedavg", "--fraction", "0.2", "--lr", "0.2", "--rounds", "200"],
    "fedseq": ["--algo", "fedseq", "--superclient-fraction", "0.2", "--pretrain-epochs", "40",
               "--lr", "0.05", "--rounds", "80"],
}
REFERENCE = ["--algo", "centralized", "--lr", "0.05", "--rounds", "30", "--seed", "0"]
PROFILE = {"compute_s_per_sample": 1e-3, "rtt_s": 0.5e-3, "up_bps": 125e6, "down_bps": 125e6}
VARIANTS = {
    "full": ({}, ["--server-bandwidth", "100Mbit"]),
    "no_link": ({}, []),
    "no_comp": ({"compute_s_per_sample": 0.0}, ["--server-bandwidth", "100Mbit"]),
    "free_peer": ({"up_bps": 0, "down_bps": 0}, ["--server-bandwidth", "100Mbit"]),
}


def run(out: Path, args: list[str]) -> tuple[dict, list[dict]]:
    """One fednet local run (skipped when its summary exists)."""
    if not (out / "summary.json").exists():
        env = dict(os.environ, PYTHONPATH=str(HERE.parent))
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "fednet", "local", "--out", str(out), "--overwrite",
                        *COMMON, *args], check=True, env=env, stdout=subprocess.DEVNULL)
        print(f"  {out.name}: {time.monotonic() - t0:.0f} s wall", flush=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), [r for r in rows if not r.get("interim")]


def trace(out: Path, name: str, change: dict) -> str:
    p = out / f"profile_{name}.json"
    p.write_text(json.dumps([{**PROFILE, **change}]))
    return str(p)


def at_target(summary: dict, rows: list[dict], target: float) -> dict | None:
    """Round, simulated time and server-link busy time at the first round >= target."""
    setup_busy = summary.get("server_link", {}).get("busy_s", 0.0) - sum(
        r.get("server_busy_s", 0.0) for r in rows)
    busy = setup_busy
    for r in rows:
        busy += r.get("server_busy_s", 0.0)
        if r["accuracy"] >= target:
            return {"round": r["round"] + 1, "sim": r["sim_s"], "busy": busy,
                    "setup": summary.get("setup", {}).get("sim_s", 0.0)}
    return None


def headline(data: dict) -> list:
    """The dashboard's row: FedSeq's speed-up over FedAvg in simulated time to 80% of centralized
    behind the 100 Mbit/s server link (the mean over the seeds where every variant reached it)."""
    sims: dict[str, list[float]] = {}
    for algo, runs in data.get("table", {}).items():
        for g in runs:
            if g["full"] is not None and all(g[v] is not None for v in VARIANTS):
                sims.setdefault(algo, []).append(g["full"]["sim"])
    fa, fs = (statistics.mean(sims[k]) if sims.get(k) else None for k in ("fedavg", "fedseq"))
    return measured(headline_row(
        "network model", "FedSeq vs FedAvg behind a 100 Mbit/s server link: speed-up in "
        "simulated time to 80% of centralized", fa / fs if fa and fs else None, "x", "",
        f"FedAvg {fa or 0:.1f} s, FedSeq {fs or 0:.1f} s; {len(sims.get('fedseq', []))} seeds; "
        "digits shards, 100 clients, the digits_wide model"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/bench_serverlink")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    info = machine()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ref, _ = run(out / "reference", REFERENCE)
    target = 0.8 * ref["best_accuracy"]
    print(f"centralized best accuracy {ref['best_accuracy']:.4f}; target (80%) {target:.4f}")
    table: dict[str, list[dict]] = {}
    for algo, args in METHODS.items():
        for seed in a.seeds.split(","):
            got = {}
            for v, (change, extra) in VARIANTS.items():
                s, rows = run(out / f"{algo}_s{seed}_{v}", [*args, "--seed", seed, "--latency",
                                                           trace(out, v, change), *extra])
                got[v] = at_target(s, rows, target)
                got[v + "_acc"] = [r["accuracy"] for r in rows]
            same = all(got[v + "_acc"] == got["full_acc"] for v in VARIANTS)
            table.setdefault(algo, []).append({**got, "seed": seed, "same": same})
    print("\n| method | seed | rounds to 80% | sim. time to 80% (s) | setup (s) | server link "
          "busy (s) | server link adds (s) | compute adds (s) | client/peer links add (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    means: dict[str, list[float]] = {}
    for algo, runs in table.items():
        for g in runs:
            f = g["full"]
            if f is None or any(g[v] is None for v in VARIANTS):
                print(f"| {algo} | {g['seed']} | not reached | | | | | | |")
                continue
            link, comp, peer = (round(f["sim"] - g[v]["sim"], 1) + 0.0  # no "-0.0"
                                for v in ("no_link", "no_comp", "free_peer"))
            means.setdefault(algo, []).append(f["sim"])
            print(f"| {algo} | {g['seed']} | {f['round']} | {f['sim']:.1f} | {f['setup']:.1f} | "
                  f"{f['busy']:.1f} | {link:.1f} | {comp:.1f} | {peer:.1f} |"
                  + ("" if g["same"] else " (accuracies differ between variants!)"))
    if len(means) == 2 and all(means.values()):
        fa, fs = statistics.mean(means["fedavg"]), statistics.mean(means["fedseq"])
        print(f"\nmean simulated time to 80%: FedAvg {fa:.1f} s, FedSeq {fs:.1f} s: "
              f"FedSeq {fa / fs:.2f}x faster")
    data = {"machine": info, "args": vars(a), "reference_best_accuracy": ref["best_accuracy"],
            "target": target, "table": table}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
