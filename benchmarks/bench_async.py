"""Accuracy against simulated time: FedAvg, FedBuff, FedAsync, FedSeq, FedSeqInter (issue 25).

    python3 benchmarks/bench_async.py [--dataset digits] [--clients 50] [--fraction 0.2]
        [--rounds 25] [--async-rounds 75] [--seeds 0 1 2] [--latency hetero]
        [--availability SPEC] [--methods fedavg fedbuff fedasync fedseq fedseq_inter]
        [--seq-args "--superclient-fraction 0.5"]
        [--plot F.png] [--json F]
    python3 benchmarks/bench_async.py --from-json A.json --plot F.png   # table and plot again

Every cell is one `fednet local` run (its own process) with the same seed, data and latency
profiles. The target of a seed is FedAvg's final accuracy on that seed; per method the table
gives the simulated time at which it first reaches that target (the mean and range over the
seeds that reached it, and how many did), its ratio to FedAvg's own time to the target seed by
seed, the accuracy at FedAvg's final simulated time, and the final accuracy. FedAsync and
FedBuff run --async-rounds rounds (a round is K replies used: as much client work as a
synchronous round of K clients), so they have room to reach the target.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, metrics, run, summary  # noqa: E402
from benchlib.util import git_state, headline_row, machine, measured, table, write_json  # noqa: E402

ASYNC = ("fedasync", "fedbuff")


def cell(method: str, seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    rounds = a.async_rounds if method in ASYNC else a.rounds
    argv = fednet_module("local", "--algo", method, "--dataset", a.dataset, "--clients",
                         str(a.clients), "--fraction", str(a.fraction), "--rounds", str(rounds),
                         "--seed", str(seed), "--latency", a.latency, "--partition", a.partition,
                         "-q", "--out", str(out))
    if a.availability:
        argv += ["--availability", a.availability]
    if method.startswith("fedseq"):
        argv += a.seq_args.split()
    r = run(argv)
    if r.rc != 0:
        return {"method": method, "seed": seed, "status": f"rc {r.rc}", "error": r.stderr[-500:]}
    s, rows = summary(out), metrics(out)
    curve = [(row["sim_s"], row["accuracy"]) for row in rows if not row.get("interim")
             or method not in ASYNC]
    stale = [row["staleness_mean"] for row in rows if "staleness_mean" in row]
    return {"method": method, "seed": seed, "status": s["status"], "rounds": s["rounds"],
            "accuracy": s["final_accuracy"], "sim_s": s["sim_time_s"], "curve": curve,
            "staleness": sum(stale) / len(stale) if stale else None,
            "wall_s": s["wall_clock_s"]}


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first simulated time the accuracy reaches `target` (None: never)."""
    return next((t for t, acc in curve if acc >= target - 1e-12), None)


def at_time(curve: list[tuple[float, float]], t: float) -> float | None:
    """The accuracy of the last row at or before simulated time t."""
    before = [acc for s, acc in curve if s <= t + 1e-9]
    return before[-1] if before else None


def summarize(results: list[dict[str, Any]], methods: list[str]) -> list[list[Any]]:
    ref = {r["seed"]: r for r in results if r["method"] == "fedavg" and r["status"] == "completed"}
    rows = []
    for m in methods:
        rs = [r for r in results if r["method"] == m and r["status"] == "completed"
              and r["seed"] in ref]
        if not rs:
            rows.append([m, "failed", None, None, None, None, None])
            continue
        ratios, times, eq, fin = [], [], [], []
        for r in rs:
            f = ref[r["seed"]]
            target = f["accuracy"]
            t, tf = time_to(r["curve"], target), time_to(f["curve"], target)
            if t is not None:
                times.append(t)
                ratios.append(t / tf)
            eq.append(at_time(r["curve"], f["sim_s"]))
            fin.append(r["accuracy"])
        st = [r["staleness"] for r in rs if r["staleness"] is not None]
        rows.append([m, f"{len(times)}/{len(rs)}",
                     f"{sum(times) / len(times):.2f} ({min(times):.2f}-{max(times):.2f})"
                     if times else "never",
                     f"{sum(ratios) / len(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
                     if ratios else "-",
                     _mean_range([x for x in eq if x is not None]), _mean_range(fin),
                     f"{sum(st) / len(st):.2f}" if st else "-"])
    return rows


def _mean_range(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})" if xs else "-"


def seed_ratios(results: list[dict[str, Any]], method: str) -> tuple[list[float], int]:
    """Per seed: the method's simulated time to FedAvg's final accuracy over FedAvg's own (the
    seeds that reached it), and how many of the method's seeds completed."""
    ref = {r["seed"]: r for r in results if r["method"] == "fedavg" and r["status"] == "completed"}
    rs = [r for r in results if r["method"] == method and r["status"] == "completed"
          and r["seed"] in ref]
    out = []
    for r in rs:
        f = ref[r["seed"]]
        t, tf = time_to(r["curve"], f["accuracy"]), time_to(f["curve"], f["accuracy"])
        if t is not None and tf:
            out.append(t / tf)
    return out, len(rs)


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: FedBuff's and FedAsync's time to FedAvg's final accuracy, as a
    fraction of FedAvg's (BENCHMARKS: FedBuff <= 0.67 under --latency hetero)."""
    a, results = data.get("args", {}), data.get("results", [])
    av = a.get("availability") or ""
    where = f", --availability {av}" if av else ""
    setting = (f"{a.get('dataset')} {a.get('partition')}, {a.get('clients')} clients, "
               f"--latency {a.get('latency')}{where}")
    out = []
    for method, name in (("fedbuff", "FedBuff"), ("fedasync", "FedAsync")):
        ratios, n = seed_ratios(results, method)
        stated = method == "fedbuff" and not av and a.get("latency") == "hetero"
        target = "<= 0.67" if stated else ""
        out.append(headline_row(
            "asynchronous", f"{name}: simulated time to FedAvg's final accuracy, x FedAvg's{where}",
            sum(ratios) / len(ratios) if ratios else None, "x", target,
            f"mean of {len(ratios)}/{n} seeds, range {min(ratios, default=0):.3f}-"
            f"{max(ratios, default=0):.3f}; {setting}"))
    return measured(*out)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--partition", default="iid")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--async-rounds", type=int, default=75)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--latency", default="hetero")
    ap.add_argument("--availability", default="")
    ap.add_argument("--methods", nargs="+",
                    default=["fedavg", "fedbuff", "fedasync", "fedseq", "fedseq_inter"])
    ap.add_argument("--seq-args", default="--superclient-fraction 0.5",
                    help="more options of the FedSeq and FedSeqInter runs (several superclients "
                    "a round, so that FedSeqInter's slots differ from FedSeq's)")
    ap.add_argument("--plot")
    ap.add_argument("--json")
    ap.add_argument("--from-json", nargs="+", help="table and plot earlier runs' --json files")
    return ap


def main() -> None:
    a = parser().parse_args()
    results: list[dict[str, Any]] = []
    if a.from_json:
        for f in a.from_json:
            d = json.loads(Path(f).read_text())
            results += d["results"]
            a.__dict__.update({k: v for k, v in d["args"].items() if k not in ("plot", "json",
                                                                              "from_json")})
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for seed in a.seeds:  # seed by seed: each seed's methods side by side
                for m in a.methods:
                    print(f"seed {seed}: {m} ...", file=sys.stderr, flush=True)
                    results.append(cell(m, seed, a, Path(tmp) / f"{m}-{seed}"))
    print(table(["method", "reached", "sim s to FedAvg's final accuracy (mean, range)",
                 "ratio to FedAvg (per seed)", "accuracy at FedAvg's end time",
                 "final accuracy", "staleness"], summarize(results, a.methods)))
    if a.plot:
        plot(results, a.methods, Path(a.plot), a)
    if not a.from_json:
        data = {"machine": machine(), "commit": git_state(), "args": vars(a), "results": results}
        write_json(a.json, data, headline(data))


def plot(results: list[dict[str, Any]], methods: list[str], path: Path,
         a: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    ref = [r["sim_s"] for r in results if r["method"] == "fedavg" and r["status"] == "completed"]
    for i, m in enumerate(methods):
        rs = [r for r in results if r["method"] == m and "curve" in r]
        for j, r in enumerate(rs):  # every seed: no averaging over different time grids
            ax.plot([c[0] for c in r["curve"]], [c[1] for c in r["curve"]], color=f"C{i}",
                    lw=1, alpha=0.8,
                    label=f"{m} ({len(rs)} seed{'s' if len(rs) > 1 else ''})" if j == 0 else None)
    if ref:
        ax.axvline(max(ref), color="grey", ls=":", lw=1, label="FedAvg's last round (latest seed)")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("test accuracy")
    extra = f", --availability {a.availability}" if a.availability else ""
    ax.set_title(f"{a.dataset} {a.partition}, {a.clients} clients, fraction {a.fraction}, "
                 f"--latency {a.latency}{extra}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
