"""Personalized FL on digits: the Factorized-FL paper's scenarios with 20 clients.

    python3 benchmarks/bench_personal.py [--rounds 30] [--algos ...] [--scenarios ...] [--json F]
                                         [--plot benchmarks/personal_bytes.png] [--seeds 0 1 2]

"standalone@factorized_digits" is Stand-Alone on the factorized backbone, the fair lower bound for
Factorized-FL (the plain rows use each algorithm's own default backbone); it clips its gradients
at norm 5 as Factorized-FL's clients do (without, some of its clients diverge and the run fails).
"...@factorized_digits_xavier" is the same backbone with the official code's Xavier-uniform
init of the dense layers' mu (the paper: zeros; docs/algorithms.md §5.8).
Scenarios: iid, non-iid (Dirichlet 0.5), permuted iid, permuted non-iid (each client relabels
with a private permutation), and domain (5 domains of 2 digits, 4 clients each, permuted).
Every algorithm uses the same local optimiser (SGD, momentum 0.9, E = 1 epoch per round) and is
evaluated the same way: each client's own model on its own test split after its local update;
the table shows the mean (and std) over clients of the final round, and the measured wire bytes
per client per round, up and down. Runs in-process (identical numbers to `fednet launch`).
With --seeds, every run is repeated on each seed: the tables show the first seed, the dashboard's
accuracy rows the mean over the seeds with their range, and Factorized-FL's difference from
Stand-Alone paired by seed with its 95 % interval ("no clear difference" where it contains 0).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from fednet.config import RunConfig
from fednet.core.inproc import run_local

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, measured, write_json  # noqa: E402

SCENARIOS = {
    "iid": {"data.partition": "iid"},
    "non-iid": {"data.partition": "dirichlet", "data.alpha": 0.5},
    "permuted iid": {"data.partition": "iid", "data.permute": True},
    "permuted non-iid": {"data.partition": "dirichlet", "data.alpha": 0.5, "data.permute": True},
    "domain": {"data.partition": "domain", "data.permute": True},
}
ALGOS = ["standalone", "standalone@factorized_digits", "fedavg", "fedprox", "cfl", "fedfomo",
         "perfedavg", "pfedpara", "factorized",
         "factorized_beta", "standalone@factorized_digits_xavier", "factorized@factorized_digits_xavier"]
CODE_INIT = "factorized@factorized_digits_xavier"


def run(algo: str, scenario: dict[str, Any], args: argparse.Namespace, seed: int
        ) -> dict[str, Any]:
    """One in-process run with client-side evaluation ("algo@model" picks the backbone)."""
    name, _, model = algo.partition("@")
    over = {"clients": 20, "rounds": args.rounds, "seed": seed, "algo.name": name,
            "train.model": model or "auto",
            "algo.eval": "clients", "latency.preset": "none", "train.epochs": args.epochs,
            "train.lr": args.lr, "train.momentum": 0.9, "train.weight_decay": 1e-6,
            "train.batch_size": 16, **scenario}
    if name == "cfl":
        over["algo.params"] = {"warmup": max(2, args.rounds // 4)}
    if name == "perfedavg":  # its own step sizes replace --lr (tuned on iid digits: 0.02 / 0.1)
        over["algo.params"] = {"alpha": 0.02, "beta": 0.1}
    if name == "standalone" and model.startswith("factorized"):  # Factorized-FL's clients' clip
        over["algo.params"] = {"clip": 5.0}
    sessions: list = []
    t = time.perf_counter()
    s = run_local(RunConfig().replace(**over), quiet=True, write=False, prepare=sessions.append)
    rows = sessions[0].history.rows
    b = s["bytes"]
    n = max(s["rounds"], 1) * 20
    cum, curve = 0, []
    for r in rows:
        br = r["bytes_round"]
        cum += br["server_to_client"] + br["client_to_server"]
        curve.append((cum, r["accuracy"]))
    return {"algorithm": algo, "final": s["final_accuracy"], "std": rows[-1].get("acc_std"),
            "status": s["status"], "up": b["client_to_server"] / n, "down": b["server_to_client"] / n,
            "seconds": round(time.perf_counter() - t, 1), "curve": curve}


def plot(results: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), constrained_layout=True)
    for ax, sc in zip(axes if len(names) > 1 else [axes], names):
        for r in results[sc]:
            xs = [c / 2**20 for c, _ in r["curve"]]
            ax.plot(xs, [100 * a for _, a in r["curve"]], label=r["algorithm"], lw=1.2)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_title(sc, fontsize=9)
        ax.set_xlabel("cumulative traffic, all clients (MiB)")
        ax.set_ylabel("mean client accuracy (%)")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7) if len(names) > 1 else axes.legend(fontsize=7)
    fig.savefig(path, dpi=110)


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: Factorized-FL's uplink against FedAvg's (BENCHMARKS: <= 15%) and its
    mean client accuracy under permuted labels against FedAvg's and Stand-Alone's."""
    scen = [k for k in data if k in SCENARIOS]

    def get(sc: str, algo: str) -> dict[str, Any] | None:
        return next((r for r in data.get(sc, []) if r["algorithm"] == algo), None)
    out = []
    if "iid" in scen:  # (the bytes do not depend on the scenario: the dashboard has one row)
        fa, fz = get("iid", "fedavg"), get("iid", "factorized")
        if fa and fz and fa["up"]:
            out.append(headline_row(
                "compression", "Factorized-FL uplink / FedAvg's, per client and round (iid)",
                100 * fz["up"] / fa["up"], "%", "<= 15%",
                f"{fz['up'] / 1024:.1f} KiB against {fa['up'] / 1024:.1f} KiB; 20 digits clients"))
    for sc in ("permuted iid", "permuted non-iid"):
        if _finals(data, sc, "factorized"):
            out.append(_accuracy_row(data, sc))
    return measured(*out)


def _mean(v: list[float]) -> str:
    return f"{sum(v) / len(v):.3f}"


def _accuracy_row(data: dict[str, Any], sc: str) -> dict[str, Any]:
    """Factorized-FL's mean client accuracy in scenario `sc` against FedAvg's and Stand-Alone's
    (on the plain backbone, and on Factorized-FL's own: the fair lower bound); and, where it
    ran, the same pair with the official code's dense mu init (one row: the dashboard's lines
    are counted)."""
    fz = _finals(data, sc, "factorized")
    refs = (("FedAvg", "fedavg"), ("Stand-Alone", "standalone"),
            ("Stand-Alone on its backbone", "standalone@factorized_digits"))
    finals = {n: _finals(data, sc, a) for n, a in refs}
    others = "; ".join(f"{n} {_mean(v)}" for n, v in finals.items() if v)
    seeds = (f"mean of {len(fz)} seeds, range {min(fz):.3f}-{max(fz):.3f}; "
             if len(fz) > 1 else "1 seed; ")
    loses = _against(data, sc, "factorized", "standalone")
    code, code_sa = _finals(data, sc, CODE_INIT), _finals(data, sc, "standalone@factorized_digits_xavier")
    init = (f"; with the official code's dense mu init {_mean(code)}"
            + (f" (Stand-Alone on it {_mean(code_sa)})" if code_sa else "")
            + _against(data, sc, CODE_INIT, "standalone") if code else "")
    return headline_row("accuracy", f"Factorized-FL mean client accuracy, digits {sc}",
                        sum(fz) / len(fz), "", "", seeds + others + loses + init + "; 20 clients")


T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Student's t, two-sided 95 %, by degrees of freedom (1.96 beyond)."""


def _against(data: dict[str, Any], sc: str, algo: str, base: str) -> str:
    """algo's final accuracy minus base's, paired by seed, with its 95 % interval: a verdict
    only where the interval excludes 0 ("no clear difference" otherwise); '' under 2 seeds."""
    d = _paired(data, sc, algo, base)
    if len(d) < 2:
        return ""
    mean = sum(d) / len(d)
    sd = (sum((x - mean) ** 2 for x in d) / (len(d) - 1)) ** 0.5
    half = T95.get(len(d) - 1, 1.96) * sd / len(d) ** 0.5
    who = "Factorized-FL" + ("" if algo == "factorized" else " with it")
    verdict = ("LOSES to" if mean + half < 0 else "beats" if mean - half > 0 else
               "shows no clear difference from")
    return (f"; {who} {verdict} Stand-Alone (paired over {len(d)} seeds: {mean:+.3f} "
            f"± {half:.3f})")


def _paired(data: dict[str, Any], sc: str, algo: str, base: str) -> list[float]:
    """Per seed where both completed: algo's final accuracy minus base's (--seeds runs)."""
    out = []
    for by_sc in (data.get("seeds") or {}).values():
        got = {r["algorithm"]: r for r in by_sc.get(sc, []) if r["status"] == "completed"}
        if algo in got and base in got:
            out.append(got[algo]["final"] - got[base]["final"])
    return out


def _finals(data: dict[str, Any], sc: str, algo: str) -> list[float]:
    """The final mean client accuracy of `algo` in scenario `sc` on every seed run (--seeds),
    else on the one seed."""
    runs = data.get("seeds") or {"": {sc: data.get(sc, [])}}
    return [r["final"] for by_sc in runs.values() for r in by_sc.get(sc, [])
            if r["algorithm"] == algo and r["status"] == "completed"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", help="run every cell on each of these seeds "
                    "(the tables show the first; the dashboard's accuracy rows their mean)")
    ap.add_argument("--algos", nargs="+", default=ALGOS)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    ap.add_argument("--json")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    by_seed: dict[int, dict[str, list[dict]]] = {}
    for seed in args.seeds or [args.seed]:
        by_seed[seed] = {}
        for sc in args.scenarios:
            by_seed[seed][sc] = []
            for a in args.algos:
                r = run(a, SCENARIOS[sc], args, seed)
                by_seed[seed][sc].append(r)
                print(f"seed {seed} {sc:<17} {a:<16} acc {r['final']:.3f} (std {r['std'] or 0:.3f})"
                      f"  up {r['up'] / 1024:8.1f} KiB  down {r['down'] / 1024:8.1f} KiB  "
                      f"{r['status']}  {r['seconds']}s", flush=True)
    results = next(iter(by_seed.values()))
    print("\nmean client accuracy (final round)")
    print(f"{'algorithm':<16}" + "".join(f"{sc:>18}" for sc in results))
    for a in args.algos:
        cells = [next(r for r in results[sc] if r["algorithm"] == a) for sc in results]
        print(f"{a:<16}" + "".join(f"{c['final']:>18.3f}" for c in cells))
    print("\nbytes per client per round (up / down), first scenario")
    base = next((r for r in results[args.scenarios[0]] if r["algorithm"] == "fedavg"), None)
    for r in results[args.scenarios[0]]:
        rel = f"  uplink = {100 * r['up'] / base['up']:.1f}% of FedAvg" if base and base["up"] else ""
        print(f"{r['algorithm']:<16} {r['up'] / 1024:9.1f} KiB / {r['down'] / 1024:9.1f} KiB{rel}")
    if args.plot:
        plot(results, args.plot)
    data: dict[str, Any] = {**results, "args": vars(args)}  # the first seed's scenarios as before
    if len(by_seed) > 1:  # every seed's finals and bytes (no curves)
        data["seeds"] = {str(k): {sc: [{x: r[x] for x in ("algorithm", "final", "std", "up", "down",
                                                           "status")} for r in rows]
                                  for sc, rows in v.items()} for k, v in by_seed.items()}
    write_json(args.json, data, headline(data))


if __name__ == "__main__":
    main()
