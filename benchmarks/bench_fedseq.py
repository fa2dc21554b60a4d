"""FedSeq vs FedAvg on pathological non-IID digits (one class per client).

    python3 benchmarks/bench_fedseq.py [--rounds 200] [--seeds 0 1 2] [--lrs 0.05 0.1 0.2] [--json F]
    python3 benchmarks/bench_fedseq.py --latency-only      # FedSeq vs FedSeqInter under slow clients

Part 1: rounds to 70/80/90% of centralized accuracy. Every method gets the same budget of client
epochs per round (20: FedAvg samples 20 of 100 clients, FedSeq 2 of 10 superclients of 10
clients, E = 1 epoch per client) and its own learning rate, tuned on seed 0 over --lrs; the best
(fewest rounds to 90%, then to 80%, then best final accuracy) is then run on every seed.
Part 2: superclient quality of greedy-KL vs random grouping (balance ratio, covered classes).
Part 3 (--latency-only, or after parts 1-2): with the `hetero` preset (20% of clients 5x slower),
simulated time to 80% of centralized for FedSeq vs FedSeqInter, and bytes per round by link.
Everything runs in-process (`fednet local` gives the same numbers as `fednet launch`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from fednet.config import RunConfig
from fednet.inproc import run_local

SEQ = {"superclient_fraction": 0.2, "pretrain_epochs": 40}
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg": ("fedavg", {}),
    "fedseq (conf+kl+greedy)": ("fedseq", dict(SEQ)),
    "fedseq (random groups)": ("fedseq", dict(SEQ, grouping="random")),
    "fedseq_inter": ("fedseq_inter", dict(SEQ)),
}


DATA: dict[str, Any] = {}  # --dataset / --data-root / --gpus pass-through (the GPU path)


def cfg_for(algo: str, params: dict[str, Any], rounds: int, lr: float, seed: int,
            latency: str = "none") -> RunConfig:
    """100 clients (digits by default), shards, 20 client-epochs per round."""
    return RunConfig().replace(**DATA, **{
        "clients": 100, "rounds": rounds, "seed": seed, "data.partition": "shards",
        "data.alpha": 0.0, "algo.name": algo, "algo.params": params, "algo.fraction": 0.2,
        "train.epochs": 1, "train.lr": lr, "latency.preset": latency})


def run(cfg: RunConfig) -> dict[str, Any]:
    """One in-process run; its summary, per-round rows and seconds."""
    sessions: list = []
    t = time.perf_counter()
    s = run_local(cfg, quiet=True, write=False, prepare=sessions.append)
    return {"summary": s, "rows": sessions[0].history.rows, "seconds": time.perf_counter() - t,
            "setup": s.get("setup", {})}


def first(rows: list[dict], target: float, key: str = "round") -> float | None:
    """The first row's `key` (round is 1-based) whose accuracy reaches target."""
    for r in rows:
        if r["accuracy"] is not None and r["accuracy"] >= target:
            return r["round"] + 1 if key == "round" else r[key]
    return None


def score(r: dict, acc_c: float) -> tuple:
    rows = r["rows"]
    big = 10**9
    return (first(rows, 0.9 * acc_c) or big, first(rows, 0.8 * acc_c) or big,
            -r["summary"]["final_accuracy"])


def part1(args: argparse.Namespace) -> tuple[list[dict], float]:
    central = run(cfg_for("centralized", {}, 30, 0.1, 0))
    acc_c = central["summary"]["best_accuracy"]
    print(f"centralized reference (30 rounds of 1 epoch, lr 0.1): Acc_centr = {acc_c:.4f}", flush=True)
    out = []
    for label, (algo, params) in METHODS.items():
        tries = {lr: run(cfg_for(algo, params, args.rounds, lr, args.seeds[0])) for lr in args.lrs}
        best = min(tries, key=lambda lr: score(tries[lr], acc_c))
        while best == max(tries) and len(tries) < len(args.lrs) + 3:  # best at the edge: go on
            lr = round(2 * best, 6)
            tries[lr] = run(cfg_for(algo, params, args.rounds, lr, args.seeds[0]))
            best = min(tries, key=lambda lr: score(tries[lr], acc_c))
        for lr, r in tries.items():
            print(f"  tune {label:<26} lr={lr:<5} r90={first(r['rows'], 0.9 * acc_c)} "
                  f"final={r['summary']['final_accuracy']:.3f}", flush=True)
        runs = {args.seeds[0]: tries[best]}
        for seed in args.seeds[1:]:
            runs[seed] = run(cfg_for(algo, params, args.rounds, best, seed))
        for seed, r in runs.items():
            out.append({"method": label, "lr": best, "seed": seed,
                        "final": r["summary"]["final_accuracy"], "seconds": round(r["seconds"], 1),
                        **{f"r{x}": first(r["rows"], x / 100 * acc_c) for x in (70, 80, 90)},
                        "setup": {k: v for k, v in r["setup"].items()
                                  if k in ("balance_ratio_mean", "covered_classes_mean",
                                           "superclients")}})
    return out, acc_c


def table1(out: list[dict], rounds: int) -> None:
    print(f"\nrounds to X% of centralized (budget {rounds} rounds; '-' = not reached), mean over seeds")
    print(f"{'method':<26} {'lr':>5} {'r70':>7} {'r80':>7} {'r90':>7} {'final':>7} "
          f"{'balance':>8} {'covered':>8}")
    fed = None
    for m in METHODS:
        rs = [o for o in out if o["method"] == m]
        def mean(k: str) -> str:
            v = [o[k] for o in rs]
            return "-" if any(x is None for x in v) else f"{statistics.mean(v):.1f}"
        bal = [o["setup"].get("balance_ratio_mean") for o in rs]
        cov = [o["setup"].get("covered_classes_mean") for o in rs]
        b = f"{statistics.mean(bal):.2f}" if bal[0] is not None else ""
        c = f"{statistics.mean(cov):.2f}" if cov[0] is not None else ""
        print(f"{m:<26} {rs[0]['lr']:>5} {mean('r70'):>7} {mean('r80'):>7} {mean('r90'):>7} "
              f"{statistics.mean(o['final'] for o in rs):>7.3f} {b:>8} {c:>8}")
        if m == "fedavg":
            fed = [o["r90"] for o in rs]
    for m in METHODS:
        if m == "fedavg":
            continue
        rs = [o["r90"] for o in out if o["method"] == m]
        if fed and all(x is not None for x in rs):
            num = [x if x is not None else rounds for x in fed]
            bound = "" if all(x is not None for x in fed) else ">="
            print(f"speed-up in rounds to 90% vs tuned FedAvg, {m}: {bound}"
                  f"{statistics.mean(num) / statistics.mean(rs):.1f}x")


def part3(args: argparse.Namespace, acc_c: float) -> list[dict]:
    print("\nhetero latency (20% of clients 5x slower compute, 10x slower uplink)")
    rows = []
    for label in ("fedseq (conf+kl+greedy)", "fedseq_inter"):
        algo, params = METHODS[label]
        r = run(cfg_for(algo, params, args.rounds, args.latency_lr, 0, "hetero"))
        pre = r["setup"].get("sim_s", 0.0)
        t80 = first(r["rows"], 0.8 * acc_c, "sim_s")
        per = r["rows"][-1]
        n = r["summary"]["rounds"]
        b = r["summary"]["bytes"]
        rows.append({"method": label, "sim_to_80": t80, "pretrain_sim_s": pre,
                     "sim_total": r["summary"]["sim_time_s"], "final": per["accuracy"],
                     "server_bytes_per_round": (b["server_to_client"] + b["client_to_server"]
                                                - r["setup"]["bytes"]["server_to_client"]
                                                - r["setup"]["bytes"]["client_to_server"]) / n,
                     "peer_bytes_per_round": b["client_to_client"] / n})
    print(f"{'method':<26} {'sim s to 80%':>13} {'sim s total':>12} {'final':>7} "
          f"{'server<->client/round':>22} {'client<->client/round':>22}")
    for o in rows:
        t = "-" if o["sim_to_80"] is None else f"{o['sim_to_80']:.1f}"
        print(f"{o['method']:<26} {t:>13} {o['sim_total']:>12.1f} {o['final']:>7.3f} "
              f"{o['server_bytes_per_round'] / 1024:>19.1f} KiB {o['peer_bytes_per_round'] / 1024:>19.1f} KiB")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    ap.add_argument("--latency-only", action="store_true")
    ap.add_argument("--latency-lr", type=float, default=0.05)
    ap.add_argument("--dataset", default="digits", help="e.g. cifar10 (needs --data-root)")
    ap.add_argument("--data-root", default="")
    ap.add_argument("--gpus", default="", help="e.g. 0 or 0,1: clients pinned round-robin")
    ap.add_argument("--json")
    args = ap.parse_args()
    DATA.update({"data.dataset": args.dataset, "data.data_root": args.data_root,
                 "gpus": [int(g) for g in args.gpus.split(",") if g.strip()]})
    result: dict[str, Any] = {}
    if args.latency_only:
        acc_c = run(cfg_for("centralized", {}, 30, 0.1, 0))["summary"]["best_accuracy"]
    else:
        out, acc_c = part1(args)
        table1(out, args.rounds)
        result["rounds_to_target"] = out
    result["acc_centr"] = acc_c
    result["latency"] = part3(args, acc_c)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
