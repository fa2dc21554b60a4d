"""Baselines on pathological non-IID digits: final accuracy and rounds to 70/80/90% of centralized.

    python3 benchmarks/bench_baselines.py [--clients 50] [--rounds 40] [--seeds 0] [--json FILE]

Every algorithm runs in-process (`fednet local`, identical numbers to `fednet launch`) with the
same seed, rounds, local epochs and learning rate, on the shards split (alpha = 0: one class per
client). FedDyn's parameter explosion, if it happens, shows as status "diverged".
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from fednet.config import RunConfig
from fednet.core.inproc import run_local

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import headline_row, measured, write_json  # noqa: E402

ALGOS = [("fedavg", {}), ("fedprox", {"mu": 0.01}), ("scaffold", {}), ("feddyn", {"alpha": 0.1}),
         ("feddyn", {"alpha": 0.1, "clip": 30.0})]


def rounds_to(accs: list[float], target: float) -> int | None:
    """First round (1-based) whose accuracy reaches target."""
    return next((i + 1 for i, a in enumerate(accs) if a is not None and a >= target), None)


def run(algo: str, params: dict, args: argparse.Namespace, seed: int) -> dict:
    cfg = RunConfig().replace(**{
        "clients": args.clients, "rounds": args.rounds, "seed": seed, "data.partition": "shards",
        "data.alpha": 0.0, "algo.name": algo, "algo.params": params, "train.epochs": args.epochs,
        "train.lr": args.lr, "latency.preset": "none"})
    t = time.perf_counter()
    sessions: list = []
    s = run_local(cfg, quiet=True, write=False, prepare=sessions.append)
    return {"summary": s, "rows": sessions[0].history.rows, "seconds": time.perf_counter() - t}


def headline(data: dict) -> list[dict]:
    """The dashboard's rows: FedAvg's and the best baseline's final accuracy (mean over seeds)."""
    a, out = data.get("args", {}), data.get("results", [])
    acc: dict[str, list[float]] = {}
    for o in out:
        if o["algorithm"] != "centralized":
            acc.setdefault(o["algorithm"], []).append(o["final_accuracy"])
    if not acc:
        return []
    mean = {k: statistics.mean(v) for k, v in acc.items()}
    best = max(mean, key=mean.get)
    central = statistics.mean(o["acc_centr"] for o in out)
    r90 = ["-" if o["r90"] is None else str(o["r90"]) for o in out if o["algorithm"] == best]
    where = (f"digits shards, {a.get('clients')} clients, {a.get('rounds')} rounds, "
             f"E={a.get('epochs')}, lr {a.get('lr')}")
    return measured(
        headline_row("accuracy", "best baseline on digits shards (one class per client): final "
                     "accuracy", mean[best], "", "", f"{best}; rounds to 90% of centralized "
                     f"{' / '.join(r90)}; centralized {central:.3f}; seeds: {len(r90)}; {where}"),
        headline_row("accuracy", "FedAvg on digits shards (one class per client): final accuracy",
                     mean.get("fedavg"), "", "", where))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    out = []
    for seed in args.seeds:
        central = run("centralized", {}, args, seed)
        acc_c = central["summary"]["final_accuracy"]
        rows = [("centralized", {}, central)] + [(a, p, run(a, p, args, seed)) for a, p in ALGOS]
        for name, params, r in rows:
            s = r["summary"]
            accs = [x["accuracy"] for x in r["rows"]]
            label = name + ("" if not params else " " + ",".join(f"{k}={v}" for k, v in params.items()))
            out.append({"seed": seed, "algorithm": label, "status": s["status"],
                        "final_accuracy": s["final_accuracy"], "best_accuracy": s["best_accuracy"],
                        "rounds": s["rounds"], "acc_centr": acc_c, "seconds": round(r["seconds"], 1),
                        **{f"r{x}": rounds_to(accs, x / 100 * acc_c) for x in (70, 80, 90)}})
    print(f"digits, {args.clients} clients, shards (alpha=0), {args.rounds} rounds, "
          f"E={args.epochs}, lr={args.lr}")
    print(f"{'seed':>4} {'algorithm':<26} {'status':<10} {'final':>7} {'best':>7} "
          f"{'r70':>5} {'r80':>5} {'r90':>5} {'time':>6}")
    for o in out:
        f = lambda v: "-" if v is None else str(v)  # noqa: E731
        print(f"{o['seed']:>4} {o['algorithm']:<26} {o['status']:<10} {o['final_accuracy']:>7.3f} "
              f"{o['best_accuracy']:>7.3f} {f(o['r70']):>5} {f(o['r80']):>5} {f(o['r90']):>5} "
              f"{o['seconds']:>5.1f}s")
    data = {"args": vars(args), "results": out}  # "results": the list this file used to hold
    write_json(args.json, data, headline(data))


if __name__ == "__main__":
    main()
