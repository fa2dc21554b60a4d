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
accuracy rows each method's mean over the seeds with its 95 % t interval, and Factorized-FL's
difference from each baseline paired by seed with its 95 % interval ("no clear difference" where
it contains 0; fednet/metrics/intervals.py, docs/comparisons.md). Every cell is fednet.api.run
with the keywords of `fednet local` (cell_kwargs); the --json keeps fingerprints (benchlib/
fingerprint.py) of the first seed's cells the rows rest on, 2 rounds each.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, write_json  # noqa: E402

SCENARIOS = {  # fednet.api.run's keywords (`fednet local`'s options)
    "iid": {"partition": "iid"},
    "non-iid": {"partition": "dirichlet", "alpha": 0.5},
    "permuted iid": {"partition": "iid", "permute": True},
    "permuted non-iid": {"partition": "dirichlet", "alpha": 0.5, "permute": True},
    "domain": {"partition": "domain", "permute": True},
}
ALGOS = ["standalone", "standalone@factorized_digits", "fedavg", "fedprox", "cfl", "fedfomo",
         "perfedavg", "pfedpara", "factorized",
         "factorized_beta", "standalone@factorized_digits_xavier", "factorized@factorized_digits_xavier"]
CODE_INIT = "factorized@factorized_digits_xavier"
FINGERPRINTED = {"permuted iid": ("factorized", "standalone", "fedavg"),
                 "permuted non-iid": ("factorized", "standalone")}
"""The cells whose first-seed run is fingerprinted: each accuracy row's method and its baseline,
and FedAvg for the uplink row (the slow lane re-runs them: a few seconds in all)."""


def cell_kwargs(algo: str, scenario: str, args: argparse.Namespace, seed: int
                ) -> dict[str, Any]:
    """One cell as fednet.api.run's keywords ("algo@model" picks the backbone): every client
    evaluates its own model (--eval clients), no simulated network."""
    name, _, model = algo.partition("@")
    kw: dict[str, Any] = {"clients": 20, "rounds": args.rounds, "seed": seed, "algo": name,
                          "model": model or "auto", "eval_mode": "clients", "latency": "none",
                          "epochs": args.epochs, "lr": args.lr, "momentum": 0.9,
                          "weight_decay": 1e-6, "batch_size": 16, **SCENARIOS[scenario]}
    if name == "cfl":
        kw["params"] = {"warmup": max(2, args.rounds // 4)}
    if name == "perfedavg":  # its own step sizes replace --lr (tuned on iid digits: 0.02 / 0.1)
        kw["params"] = {"alpha": 0.02, "beta": 0.1}
    if name == "standalone" and model.startswith("factorized"):  # Factorized-FL's clients' clip
        kw["clip"] = 5.0
    return kw


def run(algo: str, scenario: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One in-process run (fednet.api.run, as `fednet local`) with client-side evaluation."""
    from fednet.api import run as fednet_run

    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fednet-personal-") as tmp:
        exp = fednet_run(**cell_kwargs(algo, scenario, args, seed), out=f"{tmp}/run", quiet=True)
    s, rows = exp.summary, exp.history
    b = s["bytes"]
    n = max(s["rounds"], 1) * 20
    cum, curve = 0, []
    for r in rows:
        br = r["bytes_round"]
        cum += br["server_to_client"] + br["client_to_server"]
        curve.append((cum, r["accuracy"]))
    return {"algorithm": algo, "final": s["final_accuracy"],
            "std": rows[-1].get("acc_std") if rows else None,
            "status": s["status"], "up": b["client_to_server"] / n, "down": b["server_to_client"] / n,
            "seconds": round(time.perf_counter() - t, 1), "curve": curve}


def fingerprint_recipes(args: argparse.Namespace, seed: int) -> dict[str, dict[str, Any]]:
    """The recipes of FINGERPRINTED's cells that ran, on `seed`, 2 rounds each."""
    from benchlib.fingerprint import fingerprint_of

    return {f"{algo} {sc}": fingerprint_of(cell_kwargs(algo, sc, args, seed))
            for sc, algos in FINGERPRINTED.items() if sc in args.scenarios
            for algo in algos if algo in args.algos}


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
    mean client accuracy under permuted labels against Stand-Alone's and FedAvg's."""
    fps = data.get("fingerprints") or {}

    def rests_on(*names: str) -> dict[str, Any]:
        got = [n for n in names if n in fps]
        return {"fingerprint": got} if got else {}
    out = []
    up = _uplink_row(data)
    if up is not None:
        out.append({**up, **rests_on(f"factorized {up['scenario']}", f"fedavg {up['scenario']}")})
        del out[-1]["scenario"]
    for sc in ("permuted iid", "permuted non-iid"):
        if _finals(data, sc, "factorized"):
            out.append({**_accuracy_row(data, sc), **rests_on(f"factorized {sc}",
                                                               f"standalone {sc}")})
    return out


def _runs(data: dict[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Seed -> scenario -> the cells (--seeds runs; else the one seed's tables)."""
    return data.get("seeds") or {str(data.get("args", {}).get("seed", 0)):
                                 {sc: data[sc] for sc in SCENARIOS if sc in data}}


def _uplink_row(data: dict[str, Any]) -> dict[str, Any] | None:
    """Factorized-FL's uplink bytes per client and round over FedAvg's, from the first scenario
    that ran both (the bytes follow from the models, not from the labels), per seed."""
    for sc in SCENARIOS:
        pairs = [(got["factorized"]["up"], got["fedavg"]["up"]) for by_sc in _runs(data).values()
                 for got in [{r["algorithm"]: r for r in by_sc.get(sc, [])}]
                 if "factorized" in got and "fedavg" in got and got["fedavg"]["up"]]
        if not pairs:
            continue
        shares = sorted({100 * fz / fa for fz, fa in pairs})
        same = "the same on each" if len(shares) == 1 else \
            f"{shares[0]:.2f}-{shares[-1]:.2f}% over them"
        row = headline_row(
            "compression", "Factorized-FL uplink / FedAvg's, per client and round",
            sum(100 * fz / fa for fz, fa in pairs) / len(pairs), "%", "<= 15%",
            f"{pairs[0][0] / 1024:.1f} KiB against {pairs[0][1] / 1024:.1f} KiB; digits {sc}, "
            f"20 clients; {len(pairs)} seed(s), {same}")
        return row and {**row, "scenario": sc}
    return None


REFS = (("Stand-Alone", "standalone"), ("Stand-Alone on its backbone",
                                        "standalone@factorized_digits"), ("FedAvg", "fedavg"))


def _accuracy_row(data: dict[str, Any], sc: str) -> dict[str, Any]:
    """Factorized-FL's mean client accuracy in scenario `sc` (mean and 95% t interval over the
    seeds) against Stand-Alone's (on the plain backbone, and on Factorized-FL's own: the fair
    lower bound) and FedAvg's, each paired by seed; and, where it ran, the same with the
    official code's dense mu init (one row: the dashboard's lines are counted)."""
    fz = _finals(data, sc, "factorized")
    parts = [f"Factorized-FL {_ci(fz)}"] + [
        f"{name} {_ci(v)}: Factorized-FL {_against(data, sc, 'factorized', algo)}"
        for name, algo in REFS if (v := _finals(data, sc, algo))]
    code = _finals(data, sc, CODE_INIT)
    if code:
        sa = "standalone@factorized_digits_xavier"
        parts.append(f"with the official code's dense mu init (--model factorized_digits_xavier) "
                     f"Factorized-FL {_ci(code)}, against Stand-Alone "
                     f"{_against(data, sc, CODE_INIT, 'standalone')}" + (
                         f"; Stand-Alone on that backbone {_ci(_finals(data, sc, sa))}: "
                         f"{_against(data, sc, CODE_INIT, sa)}" if _finals(data, sc, sa) else ""))
    seeds = sorted(_runs(data), key=int)
    parts.append(f"{len(fz)} seeds ({', '.join(seeds)}), 95% t intervals, differences paired "
                 f"by seed; 20 clients, {_setting(data)}")
    return headline_row("accuracy", f"Factorized-FL mean client accuracy, digits {sc}",
                        sum(fz) / len(fz), "", "", "; ".join(parts))


def _setting(data: dict[str, Any]) -> str:
    a = data.get("args", {})
    return f"{a.get('rounds')} rounds x {a.get('epochs')} epochs, lr {a.get('lr')}"


def _ci(xs: list[float]) -> str:
    """'0.683 [0.652, 0.714]': the mean and its 95% t interval (clipped to [0, 1])."""
    from fednet.metrics.intervals import mean_ci

    ci = mean_ci(xs, bounds=(0.0, 1.0))
    return f"{sum(xs) / len(xs):.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _against(data: dict[str, Any], sc: str, algo: str, base: str) -> str:
    """algo's final accuracy minus base's, paired by seed, with its 95 % interval: a verdict
    only where the interval excludes 0 ('no clear difference' otherwise); '-' without pairs."""
    from fednet.metrics.intervals import versus

    v = versus(_by_seed(data, sc, algo), _by_seed(data, sc, base), higher=True)
    if v["estimate"] is None:
        return "-"
    if v["lo"] is None:
        return f"{v['estimate']:+.3f} (1 seed: no interval)"
    verdict = ("LOSES" if v["hi"] < 0 else "higher" if v["lo"] > 0 else "no clear difference")
    return f"{v['estimate']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]: {verdict}"


def _by_seed(data: dict[str, Any], sc: str, algo: str) -> dict[str, float]:
    """Seed -> algo's final mean client accuracy in scenario sc (completed runs only)."""
    return {seed: r["final"] for seed, by_sc in _runs(data).items() for r in by_sc.get(sc, [])
            if r["algorithm"] == algo and r["status"] == "completed"}


def _finals(data: dict[str, Any], sc: str, algo: str) -> list[float]:
    """The final mean client accuracy of `algo` in scenario `sc` on every seed run."""
    return list(_by_seed(data, sc, algo).values())


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
                r = run(a, sc, args, seed)
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
    if args.json:
        from benchlib.fingerprint import CLOCKLESS, takes

        data["fingerprints"] = takes(fingerprint_recipes(args, next(iter(by_seed))), CLOCKLESS)
    write_json(args.json, data, headline)


if __name__ == "__main__":
    main()
