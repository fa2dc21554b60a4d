"""Differential privacy (issue 39, docs/algorithms.md §11): accuracy against epsilon, and what DP
costs per round.

    python3 benchmarks/bench_dp.py user [--dataset synthetic-fedprox] [--model auto]
        [--population 1000000] [--cohort 1000] [--rounds 10] [--epochs 1] [--batch-size 64]
        [--lr 0.05] [--seeds 0 1 2] [--epsilons 1 3 8] [--delta 1e-6] [--clip 1.0]
        [--no-adaptive] [--keep F.json] [--plot F.png] [--json F]
    python3 benchmarks/bench_dp.py sgd [--clients 10] [--rounds 25] [--seeds 0 1 2]
        [--noise 1.0] [--clip 1.0] [--json F]
    python3 benchmarks/bench_dp.py user --from-json F.json --plot F.png   # table and plot again

`user`: DP-FedAvg (`--dp central`, Poisson sampling at q = cohort / population, the noise
calibrated by dp-accounting to each epsilon at --delta over --rounds) with a fixed clip norm and
with adaptive clipping (the median), beside non-private FedAvg with the same options, every seed.
Per cell: the final accuracy, the epsilon the run reports, the noise multiplier it chose, the
round's wall-clock and the server's seconds of clipping and noise in it (the rows' dp_s: what DP
adds; the exact sums are FedAvg's own work and are counted apart, dp_fold_s). --plot: final
accuracy against epsilon (mean and range over the seeds), non-private FedAvg as a line.

--keep F.json (user): take from an earlier --json of the same settings the cells of the methods
it has (non-private FedAvg, fixed clipping) and run only the others (adaptive clipping); the
file's fingerprints of those cells must equal HEAD's (benchmarks/fingerprints.json), else it is
refused: the kept cells are then the ones HEAD would compute. The result records what it kept
("kept": the file, its commit and command).

`sgd`: FedAvg on digits with DP-SGD inside every client (Opacus, `--dp-sgd-noise`) beside plain
FedAvg, every seed: the final accuracy, the per-example epsilon of the most exposed client, and
the wall-clock of the training against plain FedAvg's.

Every cell is one `fednet local` process (the command is in the JSON).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHANCE = 0.2  # a non-private mean accuracy below this (10 classes) learned nothing to compare


def _run(argv: list[str], out: Path) -> dict[str, Any]:
    """One `fednet local` cell: its summary and rows (or its error)."""
    cmd = [sys.executable, "-m", "fednet.cli", "local", *argv, "-q", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if not (out / "summary.json").is_file():
        return {"status": f"rc {r.returncode}", "error": r.stderr[-800:], "argv": argv}
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    walls = [b["wall_s"] - a["wall_s"] for a, b in zip([{"wall_s": 0.0}] + rows, rows)]
    return {"status": s["status"], "argv": argv, "accuracy": s["final_accuracy"],
            "wall_s": s["wall_clock_s"], "round_s": walls, "curve": [r["accuracy"] for r in rows],
            "dp_s": [r.get("dp_s") for r in rows], "dp_fold_s": [r.get("dp_fold_s") for r in rows],
            "epsilon": (s.get("dp") or {}).get("epsilon"),
            "sgd_epsilon": ((s.get("dp") or {}).get("sgd") or {}).get("epsilon"),
            "noise": (s.get("dp") or {}).get("noise_multiplier"),
            "clip_end": (s.get("dp") or {}).get("clip")}


def user_cells(a: argparse.Namespace) -> list[tuple[str, float | None, list[str]]]:
    """(method, target epsilon, extra options) of every `user` cell but the seed (all of them;
    --keep leaves out those it holds)."""
    cells: list[tuple[str, float | None, list[str]]] = [("fedavg", None, [])]
    dp = ["--dp", "central", "--dp-delta", str(a.delta), "--dp-clip", str(a.clip)]
    for eps in a.epsilons:
        cells.append(("dp-fixed", eps, [*dp, "--dp-epsilon", str(eps)]))
        if a.adaptive:
            cells.append(("dp-adaptive", eps, [*dp, "--dp-epsilon", str(eps), "--dp-adaptive"]))
    return cells


def user_options(a: argparse.Namespace) -> dict[str, Any]:
    """The options every `user` cell shares, as fednet.api.run keywords."""
    kw: dict[str, Any] = {"dataset": a.dataset, "model": a.model, "clients": a.population,
                          "fraction": a.cohort / a.population, "rounds": a.rounds,
                          "epochs": a.epochs, "batch_size": a.batch_size, "lr": a.lr}
    if a.partition:
        kw["partition"] = a.partition
    if a.batch_clients:
        kw["batch_clients"] = a.batch_clients
    return kw


def user_recipes(a: argparse.Namespace, results: list[dict[str, Any]]
                 ) -> dict[str, dict[str, Any]]:
    """The fingerprints' recipes: seed 0's non-private FedAvg and DP-FedAvg at the smallest
    epsilon (fixed clipping, and adaptive where it ran), their first 2 rounds, each DP cell with
    the noise multiplier its whole run was calibrated to (--dp-noise)."""
    from benchlib.fingerprint import fingerprint_of

    base = {**user_options(a), "seed": a.seeds[0]}
    eps = min(a.epsilons)
    out = {"fedavg": fingerprint_of(base)}
    for method, extra in (("dp-fixed", {}), ("dp-adaptive", {"dp_adaptive": True})):
        noise = next((r.get("noise") for r in results if (r["method"], r["target"], r["seed"])
                      == (method, eps, a.seeds[0]) and r.get("noise")), None)
        if noise:
            out[f"{method}-{eps:g}"] = fingerprint_of({
                **base, "dp": "central", "dp_delta": a.delta, "dp_clip": a.clip,
                "dp_noise": noise, **extra})
    return out


def kept_cells(a: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """--keep: the earlier file's cells (of these seeds and epsilons) and what they are; its
    fingerprints must be at HEAD's training paths (benchmarks/fingerprints.json)."""
    if not a.keep:
        return [], {}
    old = json.loads(Path(a.keep).read_text())
    same = ("dataset", "model", "population", "cohort", "rounds", "epochs", "batch_size", "lr",
            "delta", "clip", "partition", "batch_clients")
    moved = [k for k in same if old["args"].get(k) != getattr(a, k)]
    head = json.loads((ROOT / "benchmarks" / "fingerprints.json").read_text())
    stale = [n for n, fp in old.get("fingerprints", {}).items()
             if head.get(fp["command"], {}).get("path") != fp["path"]]
    if moved or stale or not old.get("fingerprints"):
        raise SystemExit(f"--keep {a.keep}: " + (f"other settings ({', '.join(moved)})" if moved
                         else f"not at HEAD's training path ({', '.join(stale) or 'none'})"))
    cells = [r for r in old["results"] if r["seed"] in a.seeds
             and (r["target"] is None or r["target"] in a.epsilons)]
    return cells, {"file": a.keep, "commit": old.get("commit"), "command": old.get("command"),
                   "methods": sorted({r["method"] for r in cells})}


def user(a: argparse.Namespace) -> dict[str, Any]:
    base = [w for k, v in user_options(a).items()
            for w in ("--" + k.replace("_", "-"), str(v))]
    results, kept = kept_cells(a)
    have = {(r["method"], r["target"], r["seed"]) for r in results}
    with tempfile.TemporaryDirectory(prefix="bench_dp_") as tmp:
        for seed in a.seeds:
            for method, eps, extra in user_cells(a):
                if (method, eps, seed) in have:
                    continue
                out = Path(tmp) / f"{method}-{eps}-{seed}"
                r = {"method": method, "target": eps, "seed": seed,
                     **_run([*base, "--seed", str(seed), *extra], out)}
                results.append(r)
                print(f"{method:12s} eps {eps!s:5s} seed {seed}: {r['status']} "
                      f"acc {r.get('accuracy')} eps {r.get('epsilon')} z {r.get('noise')}",
                      flush=True)
    from benchlib.fingerprint import CLOCKLESS, takes

    return {"part": "user", "args": vars(a), "machine": machine(), "results": results,
            **({"kept": kept} if kept else {}), "fingerprints": takes(user_recipes(a, results), CLOCKLESS)}


def sgd(a: argparse.Namespace) -> dict[str, Any]:
    base = ["--dataset", "digits", "--clients", str(a.clients), "--rounds", str(a.rounds)]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_dpsgd_") as tmp:
        for seed in a.seeds:
            for method, extra in (("fedavg", []), ("dp-sgd", ["--dp-sgd-noise", str(a.noise),
                                                              "--dp-sgd-clip", str(a.clip)])):
                out = Path(tmp) / f"{method}-{seed}"
                r = {"method": method, "seed": seed,
                     **_run([*base, "--seed", str(seed), *extra], out)}
                results.append(r)
                print(f"{method:8s} seed {seed}: {r['status']} acc {r.get('accuracy')} "
                      f"example eps {r.get('sgd_epsilon')} wall {r.get('wall_s')}", flush=True)
    from benchlib.fingerprint import CLOCKLESS, takes

    return {"part": "sgd", "args": vars(a), "machine": machine(), "results": results,
            "fingerprints": takes(sgd_recipes(a), CLOCKLESS)}


def _ok(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in data.get("results", []) if r.get("status") in ("completed", "budget_spent")]


def dp_share(rs: list[dict[str, Any]]) -> float:
    """The median over every round of the DP cells of dp_s / the round's wall-clock (the first
    round of each run left out: it imports dp-accounting and warms up)."""
    shares = [d / w for r in rs if r["method"] != "fedavg"
              for d, w in list(zip(r["dp_s"], r["round_s"]))[1:] if d is not None and w > 0]
    return statistics.median(shares) if shares else float("nan")


def summary_rows(data: dict[str, Any]) -> list[list[Any]]:
    """Per (method, target): accuracy mean [min..max], epsilon reported, noise multiplier,
    median round wall-clock, DP's median share of it."""
    ok, rows = _ok(data), []
    keys = list(dict.fromkeys((r["method"], r.get("target")) for r in ok))
    for method, eps in keys:
        rs = [r for r in ok if (r["method"], r.get("target")) == (method, eps)]
        acc = [r["accuracy"] for r in rs]
        rounds = [w for r in rs for w in r["round_s"][1:]]
        rows.append([method, eps if eps is not None else "-", len(rs),
                     f"{statistics.mean(acc):.3f} [{min(acc):.3f}..{max(acc):.3f}]",
                     _mean(r.get("epsilon") or r.get("sgd_epsilon") for r in rs),
                     _mean(r.get("noise") for r in rs), statistics.median(rounds) if rounds else
                     float("nan"), dp_share(rs) if method != "fedavg" else float("nan")])
    return rows


def _mean(xs: Any) -> float:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.mean(xs) if xs else float("nan")


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = _ok(data)
    fig, ax = plt.subplots(figsize=(5.5, 3.8), constrained_layout=True)
    base = [r["accuracy"] for r in ok if r["method"] == "fedavg"]
    if base:
        ax.axhline(100 * statistics.mean(base), color="k", ls="--", lw=1,
                   label=f"non-private FedAvg ({len(base)} seeds; dotted: their range)")
        for b in (min(base), max(base)):
            ax.axhline(100 * b, color="k", ls=":", lw=0.7)
    for i, method in enumerate(("dp-fixed", "dp-adaptive")):
        eps = sorted({r["target"] for r in ok if r["method"] == method})
        if not eps:
            continue
        accs = [[100 * r["accuracy"] for r in ok if (r["method"], r["target"]) == (method, e)]
                for e in eps]
        mean = [statistics.mean(x) for x in accs]
        ax.plot(eps, mean, marker="o", color=f"C{i}",
                label=f"DP-FedAvg, {method[3:]} clipping (shaded: 95% t interval)")
        from fednet.metrics.intervals import mean_ci

        cis = [mean_ci(x) or (min(x), max(x)) for x in accs]
        ax.fill_between(eps, [c[0] for c in cis], [c[1] for c in cis], color=f"C{i}",
                        alpha=0.15, lw=0)
    args = data["args"]
    ax.set_xscale("log")
    ax.set_xticks(sorted({r["target"] for r in ok if r.get("target")}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(f"epsilon (user-level, delta {args['delta']:g})")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(f"{args['dataset']} ({args['model']}), {args['population']:,} clients, "
                 f"{args['cohort']:,} a round, {args['rounds']} rounds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: accuracy at each epsilon beside non-private FedAvg, DP's share of
    a round; DP-SGD's per-example epsilon and its time against plain FedAvg."""
    ok, a = _ok(data), data.get("args", {})
    if data.get("part") == "sgd":
        return _sgd_headline(ok, data.get("fingerprints") or {})
    where = f"{a.get('dataset')}, {a.get('population', 0):,} clients, {a.get('cohort', 0):,} a round"
    base = [r["accuracy"] for r in ok if r["method"] == "fedavg"]
    out = []
    chance = bool(base) and statistics.mean(base) < CHANCE
    fp = {"fingerprint": sorted(data.get("fingerprints", {}))} if data.get("fingerprints") else {}
    setting = (f"{where}, {a.get('rounds')} rounds, model {a.get('model')}, lr {a.get('lr')}, "
               f"delta {a.get('delta')}, clip {a.get('clip')}")
    for eps in sorted({r["target"] for r in ok if r.get("target") is not None} - (
            {r.get("target") for r in ok} if chance else set())):
        mine = [r for r in ok if (r["method"], r["target"]) == ("dp-fixed", eps)]
        adaptive = [r for r in ok if (r["method"], r["target"]) == ("dp-adaptive", eps)]
        if mine and base:
            row = headline_row(
                "privacy", f"DP-FedAvg accuracy at epsilon {eps:g} ({where})",
                statistics.mean(r["accuracy"] for r in mine), "",
                "non-private >= 0.7 (issue 55)", f"fixed clipping {_ci([r['accuracy'] for r in mine])}"
                f", vs non-private {_paired(mine, ok)}; "
                + (f"adaptive clipping (the median) {_ci([r['accuracy'] for r in adaptive])}, "
                   f"vs non-private {_paired(adaptive, ok)}, vs fixed "
                   f"{_paired(adaptive, ok, 'dp-fixed', eps)}; " if adaptive else "")
                + f"non-private {_ci(base)}; {len(mine)} seeds, 95% t intervals; {setting}")
            out.append(row and {**row, **fp})
    out.append(headline_row("privacy", f"DP's clipping and noise / a round's wall-clock ({where})",
                            dp_share(ok), "", "<= 0.05", "median over rounds and cells" + (
                                f"; non-private FedAvg stays at {statistics.mean(base):.3f} "
                                "(chance): no accuracy to compare" if chance else "")))
    return measured(*out)


def _ci(xs: list[float]) -> str:
    """'0.912 [0.901, 0.923]': the mean and its 95% t interval."""
    from fednet.metrics.intervals import mean_ci

    ci = mean_ci(xs, bounds=(0.0, 1.0))
    return f"{statistics.mean(xs):.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _paired(mine: list[dict[str, Any]], ok: list[dict[str, Any]], base: str = "fedavg",
            eps: float | None = None) -> str:
    """The accuracy change against the `base` method's cells at `eps` (default: non-private
    FedAvg) on the same seed, with its 95% interval; 'no clear difference' where it holds 0."""
    from fednet.metrics.intervals import versus

    v = versus({r["seed"]: r["accuracy"] for r in mine},
               {r["seed"]: r["accuracy"] for r in ok
                if (r["method"], r.get("target")) == (base, eps)}, higher=True)
    if v["estimate"] is None:
        return "-"
    text = f"{v['estimate']:+.3f}"
    if v["lo"] is not None:
        text += f" [{v['lo']:+.3f}, {v['hi']:+.3f}]"
        text += ": no clear difference" if v["lo"] <= 0 <= v["hi"] else ""
    return text


def _sgd_headline(ok: list[dict[str, Any]], fps: dict[str, Any]) -> list[dict[str, Any]]:
    dp = [r for r in ok if r["method"] == "dp-sgd"]
    plain = {r["seed"]: r for r in ok if r["method"] == "fedavg"}
    pairs = [(r, plain[r["seed"]]) for r in dp if r["seed"] in plain]
    if not pairs:
        return []
    ratio = statistics.mean(r["wall_s"] / p["wall_s"] for r, p in pairs)
    eps = statistics.mean(r["sgd_epsilon"] for r, _ in pairs)
    fp = {"fingerprint": sorted(fps)} if fps else {}
    row = headline_row("privacy", "DP-SGD (Opacus) per-example epsilon, digits, 10 clients", eps,
                       "", "", f"the most exposed client; accuracy vs plain FedAvg "
                       f"{_paired(dp, ok)} (95% t interval, {len(pairs)} seeds); DP-SGD "
                       f"{_ci([r['accuracy'] for r in dp])}, plain "
                       f"{_ci([p['accuracy'] for _, p in pairs])}")
    return measured(
        row and {**row, **fp},
        headline_row("privacy", "DP-SGD training wall-clock / plain FedAvg's (digits, 10 clients)",
                     ratio, "x", "", f"{len(pairs)} seeds"))


def sgd_recipes(a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Seed 0's plain FedAvg and DP-SGD cells as fednet.api.run keywords, 2 rounds."""
    from benchlib.fingerprint import fingerprint_of

    base = {"dataset": "digits", "clients": a.clients, "seed": a.seeds[0]}
    return {"fedavg": fingerprint_of(base),
            "dp-sgd": fingerprint_of({**base, "dp_sgd_noise": a.noise, "dp_sgd_clip": a.clip})}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("user", "sgd"))
    ap.add_argument("--dataset", default="synthetic-fedprox")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--population", type=int, default=1_000_000)
    ap.add_argument("--cohort", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--no-adaptive", dest="adaptive", action="store_false")
    ap.add_argument("--keep", help="user: an earlier --json of the same settings whose cells are "
                    "kept, not re-run (its fingerprints must be at HEAD's training paths)")
    ap.add_argument("--partition", default="", help="user: --partition of the cells (digits: iid)")
    ap.add_argument("--batch-clients", type=int, default=0,
                    help="user: --batch-clients of the cells (0: off)")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--plot")
    ap.add_argument("--json")
    ap.add_argument("--from-json")
    return ap


def main() -> None:
    a = parser().parse_args()
    if a.from_json:
        data = json.loads(Path(a.from_json).read_text())
    else:
        data = user(a) if a.part == "user" else sgd(a)
    print(table(["method", "epsilon", "seeds", "accuracy", "epsilon reported", "noise z",
                 "round s", "DP share"], summary_rows(data)))
    if a.plot and data.get("part") == "user":
        plot(data, Path(a.plot))
    if not a.from_json:
        write_json(a.json, data, headline)


if __name__ == "__main__":
    main()
