"""Accuracy against simulated time: FedAvg, FedBuff, FedAsync, FedSeq, FedSeqInter, and FedAvg's
simple fixes for stragglers, over-selection and a deadline (issues 25, 44).

    python3 benchmarks/bench_async.py [--dataset digits] [--clients 50] [--fraction 0.2]
        [--rounds 25] [--async-rounds 75] [--seeds 0 1 2] [--latency hetero]
        [--availability SPEC] [--methods fedavg fedavg_os fedavg_dl fedbuff fedasync fedseq
        fedseq_inter] [--over-select 1.5] [--deadline 0.1]
        [--seq-args "--superclient-fraction 0.5"]
        [--plot F.png] [--json F]
    python3 benchmarks/bench_async.py --from-json A.json B.json [--plot F.png] [--json F]
        # table, plot and JSON of earlier runs together (seeds run apart, one file)

Every cell is one `fednet local` run (its own process) with the same seed, data and latency
profiles. The target of a seed is the mean accuracy of plain FedAvg's last --target-last rounds
on that seed (not one noisy round); per method the table
gives the simulated time at which it first reaches that target (the mean and range over the
seeds that reached it, and how many did), its ratio to FedAvg's own time to the target seed by
seed, the accuracy at FedAvg's final simulated time, and the final accuracy. FedAsync and
FedBuff run --async-rounds rounds (a round is K replies used: as much client work as a
synchronous round of K clients), so they have room to reach the target; so do the FedAvg
variants below, whose rounds end sooner than plain FedAvg's (with 25 rounds the over-selected
FedAvg ran out of rounds below the target on 2 of 3 seeds).

Two baselines: plain FedAvg (`fedavg`, which waits for every selected client, stragglers
included) sets each seed's target and the denominator of every ratio; FedAvg with fednet's
`--over-select F` (`fedavg_os`: F x the clients selected, the first K results kept) and with
`--deadline S` (`fedavg_dl`: results later than S simulated seconds dropped) are the simple
fixes a production system uses, the strongest simple baselines of the asynchronous methods.
The table also gives each method's client-epochs to the target (surplus and late clients'
work counts: fednet charges every task sent) and its downlink bytes per round, both against
plain FedAvg's.
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
BASELINES = {"fedavg_os": "--over-select", "fedavg_dl": "--deadline"}
"""The FedAvg variants: their option (its value from this script's option of the same name)."""
NAMES = {"fedavg": "plain FedAvg", "fedbuff": "FedBuff", "fedasync": "FedAsync",
         "fedseq": "FedSeq", "fedseq_inter": "FedSeqInter"}


def algo_args(method: str, a: argparse.Namespace) -> list[str]:
    """--algo and, for a FedAvg variant, its option: ['--algo', 'fedavg', '--over-select', '1.5']."""
    opt = BASELINES.get(method)
    if opt is None:
        return ["--algo", method]
    return ["--algo", "fedavg", opt, str(getattr(a, opt[2:].replace("-", "_")))]


def name(method: str, args: dict[str, Any]) -> str:
    """A method as the rows name it: 'FedAvg --over-select 1.5'."""
    opt = BASELINES.get(method)
    if opt is None:
        return NAMES.get(method, method)
    return f"FedAvg {opt} {args.get(opt[2:].replace('-', '_'))}"


def cell(method: str, seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    rounds = a.async_rounds if method in ASYNC or method in BASELINES else a.rounds
    argv = fednet_module("local", *algo_args(method, a), "--dataset", a.dataset, "--clients",
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
    kept = [row for row in rows if not row.get("interim") or method not in ASYNC]
    curve = [(row["sim_s"], row["accuracy"]) for row in kept]
    stale = [row["staleness_mean"] for row in rows if "staleness_mean" in row]
    return {"method": method, "seed": seed, "status": s["status"], "rounds": s["rounds"],
            "accuracy": s["final_accuracy"], "sim_s": s["sim_time_s"], "curve": curve,
            "epochs": [row.get("client_epochs") for row in kept],
            "down_per_round": s["bytes"]["server_to_client"] / max(1, s["rounds"]),
            "staleness": sum(stale) / len(stale) if stale else None,
            "wall_s": s["wall_clock_s"]}


def first(curve: list[tuple[float, float]], target: float) -> int | None:
    """The index of the first row whose accuracy reaches `target` (None: never)."""
    return next((i for i, (_, acc) in enumerate(curve) if acc >= target - 1e-12), None)


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first simulated time the accuracy reaches `target` (None: never)."""
    i = first(curve, target)
    return None if i is None else curve[i][0]


def at_time(curve: list[tuple[float, float]], t: float) -> float | None:
    """The accuracy of the last row at or before simulated time t."""
    before = [acc for s, acc in curve if s <= t + 1e-9]
    return before[-1] if before else None


def target_of(run: dict[str, Any], last: int) -> float:
    """A seed's target: the mean accuracy of the baseline's last `last` rows (0 or a file that
    predates --target-last: its final accuracy, one noisy round)."""
    accs = [acc for _, acc in run["curve"]][-last:] if last else []
    return sum(accs) / len(accs) if accs else run["accuracy"]


def ratio_ci(xs: list[float]) -> tuple[float, float | None, float | None]:
    """The geometric mean of ratios and its 95% t interval (on their logarithms)."""
    import math

    from fednet.metrics.intervals import mean_ci

    logs = [math.log(x) for x in xs]
    ci = mean_ci(logs)
    gm = math.exp(sum(logs) / len(logs))
    return gm, ci and math.exp(ci[0]), ci and math.exp(ci[1])


def ci_text(xs: list[float]) -> str:
    """'0.41x [0.36, 0.47]' (geometric mean, 95% interval) of per-seed ratios."""
    gm, lo, hi = ratio_ci(xs)
    return f"{gm:.3f}x" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else "")


def _ratio(x: float | None, ref: float | None) -> float | None:
    return x / ref if x is not None and ref else None


def per_seed(results: list[dict[str, Any]], method: str, last: int = 0
             ) -> dict[int, dict[str, Any]]:
    """Per seed the method completed (and plain FedAvg too): its simulated time to plain
    FedAvg's final accuracy over FedAvg's own (`time`, None: never reached), the same for the
    client-epochs (`epochs`; None where a file predates them), the downlink bytes per round
    over FedAvg's (`down`), the accuracy at FedAvg's last simulated time (`at_end`), the final
    accuracy and the mean staleness."""
    ref = {r["seed"]: r for r in results if r["method"] == "fedavg" and r["status"] == "completed"}
    out = {}
    for r in results:
        if r["method"] != method or r["status"] != "completed" or r["seed"] not in ref:
            continue
        f = ref[r["seed"]]
        goal = target_of(f, last)
        i, fi = first(r["curve"], goal), first(f["curve"], goal)
        ep, fep = r.get("epochs"), f.get("epochs")
        out[r["seed"]] = {
            "time": _ratio(None if i is None else r["curve"][i][0],
                           None if fi is None else f["curve"][fi][0]),
            "epochs": _ratio(ep[i] if ep and i is not None else None,
                             fep[fi] if fep and fi is not None else None),
            "down": _ratio(r.get("down_per_round"), f.get("down_per_round")),
            "at_end": at_time(r["curve"], f["sim_s"]), "final": r["accuracy"],
            "staleness": r.get("staleness"), "target": goal,
            "sim_to": None if i is None else r["curve"][i][0]}
    return out


def _values(seeds: dict[int, dict[str, Any]], key: str) -> list[float]:
    return [s[key] for s in seeds.values() if s[key] is not None]


def _mean_range(xs: list[float], digits: int = 3) -> str:
    return (f"{sum(xs) / len(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"
            if xs else "-")


def losses(seeds: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]) -> tuple[int, int]:
    """On how many of the seeds both ran the method reached the target later than the
    baseline (or never, where the baseline did), and how many seeds that is."""
    common = [k for k in seeds if k in base]
    lost = [k for k in common if base[k]["time"] is not None
            and (seeds[k]["time"] is None or seeds[k]["time"] > base[k]["time"])]
    return len(lost), len(common)


def summarize(results: list[dict[str, Any]], methods: list[str], last: int = 0
              ) -> list[list[Any]]:
    """The table: per method, seeds that reached the target, then each figure's mean (range)."""
    rows = []
    for m in methods:
        seeds = per_seed(results, m, last)
        if not seeds:
            rows.append([m, "failed"] + [None] * 7)
            continue
        times = _values(seeds, "time")
        rows.append([m, f"{len(times)}/{len(seeds)}",
                     " / ".join("never" if s["time"] is None else f"{s['time']:.3f}"
                                for _, s in sorted(seeds.items())),
                     _mean_range(times), _mean_range(_values(seeds, "epochs")),
                     _mean_range(_values(seeds, "down")),
                     _mean_range(_values(seeds, "at_end"), 4),
                     _mean_range(_values(seeds, "final"), 4),
                     _mean_range(_values(seeds, "staleness"), 2)])
    return rows


def versus_text(seeds: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]],
                base_name: str) -> str:
    """The method against a baseline paired by seed (the seeds where both reached the target):
    the ratio of their times with its 95% interval, and 'no clear difference' where it holds 1."""
    pairs = [seeds[k]["time"] / base[k]["time"] for k in seeds
             if k in base and seeds[k]["time"] and base[k]["time"]]
    if len(pairs) < 2:
        return f"not compared with {base_name} (fewer than 2 seeds where both reached it)"
    gm, lo, hi = ratio_ci(pairs)
    ci = f"{gm:.2f}x its time [{lo:.2f}, {hi:.2f}], {len(pairs)} seeds paired"
    if lo is not None and hi is not None and lo <= 1 <= hi:
        return f"no clear difference from {base_name} ({ci})"
    return f"{'SLOWER' if gm > 1 else 'faster'} than {base_name} ({ci})"


def _note(seeds: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]], base_name: str,
          method: str, last: int) -> str:
    """What a row says beyond its value: the interval, the seeds, the other costs, and how it
    compares with the strongest simple baseline (FedAvg with over-selection)."""
    times = _values(seeds, "time")
    per = "/".join("never" if s["time"] is None else f"{s['time']:.3f}"
                   for _, s in sorted(seeds.items()))
    goal = _values(seeds, "target")
    what = (f"the mean of its last {last} rounds' accuracy, {_mean_range(goal)} over seeds"
            if last else "its final accuracy (one round)")
    parts = [f"{ci_text(times) if times else 'never'} (geometric mean, 95% t interval); "
             f"baseline: plain FedAvg (waits for every client), target {what}; "
             f"{len(times)}/{len(seeds)} seeds reached it, per seed {per}"]
    ep, down = _values(seeds, "epochs"), _values(seeds, "down")
    if ep:
        parts.append(f"client-epochs to it {ci_text(ep)}")
    if down:
        parts.append(f"downlink/round {sum(down) / len(down):.2f}x")
    if base and method != "fedavg_os":
        parts.append(versus_text(seeds, base, base_name))
    elif method != "fedavg_os":
        parts.append("not compared with an over-selected FedAvg (none in this file)")
    return "; ".join(parts)


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: each method's simulated time to plain FedAvg's accuracy (the mean
    of its last rounds), as a fraction of plain FedAvg's (BENCHMARKS: FedBuff <= 0.67 under
    --latency hetero), with FedAvg --over-select (the strongest simple baseline) and --deadline
    beside FedBuff and FedAsync, and against the over-selected FedAvg in each row's note."""
    a, results = data.get("args", {}), data.get("results", [])
    last = int(a.get("target_last") or 0)
    av = a.get("availability") or ""
    where = f", --availability {av}" if av else ""
    setting = (f"{a.get('dataset')} {a.get('partition')}, {a.get('clients')} clients, "
               f"fraction {a.get('fraction')}, --latency {a.get('latency')}{where}")
    base = per_seed(results, "fedavg_os", last)
    fps = data.get("fingerprints", {})
    out = []
    for method in ("fedavg_os", "fedavg_dl", "fedbuff", "fedasync"):
        seeds = per_seed(results, method, last)
        times = _values(seeds, "time")
        stated = method == "fedbuff" and not av and a.get("latency") == "hetero"
        value = ratio_ci(times)[0] if times else "never" if seeds else None
        row = headline_row(
            "asynchronous", f"{name(method, a)}: simulated time to FedAvg's accuracy, "
            f"x plain FedAvg's{where}", value, "x" if times else "",
            "<= 0.67" if stated else "",
            f"{_note(seeds, base, name('fedavg_os', a), method, last)}; {setting}")
        mine = [k for k in (method, "fedavg") if k in fps]
        out.append(row and ({**row, "fingerprint": mine} if mine else row))
    return measured(*out)


def fingerprint_recipes(a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each method's seed-0 cell as fednet.api.run keywords, its first 2 rounds."""
    from benchlib.fingerprint import fingerprint_of

    out = {}
    for m in a.methods:
        if m.startswith("fedseq"):
            continue
        words = algo_args(m, a)
        kw: dict[str, Any] = {"algo": words[1], "dataset": a.dataset, "clients": a.clients,
                              "fraction": a.fraction, "seed": a.seeds[0], "latency": a.latency,
                              "partition": a.partition}
        if len(words) > 2:
            kw[words[2][2:].replace("-", "_")] = float(words[3])
        if a.availability:
            kw["availability"] = a.availability
        out[m] = fingerprint_of(kw)
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--partition", default="iid")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--async-rounds", type=int, default=75)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--target-last", type=int, default=5,
                    help="each seed's target: the mean accuracy of plain FedAvg's last N rounds "
                    "(0: its final round's)")
    ap.add_argument("--latency", default="hetero")
    ap.add_argument("--availability", default="")
    ap.add_argument("--methods", nargs="+",
                    default=["fedavg", "fedavg_os", "fedavg_dl", "fedbuff", "fedasync"],
                    help="fedavg_os: FedAvg --over-select; fedavg_dl: FedAvg --deadline")
    ap.add_argument("--over-select", type=float, default=1.5,
                    help="fedavg_os's --over-select (production systems over-select by 30%%)")
    ap.add_argument("--deadline", type=float, default=0.1,
                    help="fedavg_dl's --deadline in simulated seconds (digits, --latency hetero, "
                    "issue 52's clock of FLOPs, dispatched operations and convolutions: a fast "
                    "client's round takes about 0.06-0.075, a slow one's over 0.12, and any "
                    "deadline in 0.08-0.12 drops the same results; 0.02 was this default under "
                    "the FLOP-only clock, and drops every result now)")
    ap.add_argument("--seq-args", default="--superclient-fraction 0.5",
                    help="more options of the FedSeq and FedSeqInter runs (several superclients "
                    "a round, so that FedSeqInter's slots differ from FedSeq's)")
    ap.add_argument("--plot")
    ap.add_argument("--json")
    ap.add_argument("--from-json", nargs="+",
                    help="table, plot and --json of earlier runs' --json files together")
    return ap


def merged(files: list[str], a: argparse.Namespace) -> tuple[list[dict[str, Any]], list[Any]]:
    """The results of earlier --json files (a (method, seed) in two files: the later one), with
    a's options from theirs (seeds and methods: the union) and their fingerprints (a.fingerprints,
    the later file's where two name one); and each file's machine and commit."""
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    sources, seeds, methods = [], [], []
    for f in files:
        d = json.loads(Path(f).read_text())
        runs.update({(r["method"], r["seed"]): r for r in d["results"]})
        a.fingerprints.update(d.get("fingerprints") or {})  # a later file's recipe wins
        a.__dict__.update({k: v for k, v in d["args"].items()
                           if k not in ("plot", "json", "from_json", "seeds", "methods",
                                        "fingerprints")})
        seeds += d["args"]["seeds"]
        methods += d["args"]["methods"]
        sources.append({"file": f, "commit": d.get("commit"), "machine": d.get("machine")})
    a.seeds, a.methods = sorted(set(seeds)), list(dict.fromkeys(methods))
    return list(runs.values()), sources


def main() -> None:
    a = parser().parse_args()
    results: list[dict[str, Any]] = []
    sources: list[Any] = []
    a.fingerprints = {}
    if a.from_json:
        results, sources = merged(a.from_json, a)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for seed in a.seeds:  # seed by seed: each seed's methods side by side
                for m in a.methods:
                    print(f"seed {seed}: {m} ...", file=sys.stderr, flush=True)
                    results.append(cell(m, seed, a, Path(tmp) / f"{m}-{seed}"))
    print(table(["method", "reached", "sim time to target / FedAvg's, per seed", "mean (range)",
                 "client-epochs to it / FedAvg's", "downlink per round / FedAvg's",
                 "accuracy at FedAvg's end time", "final accuracy", "staleness"],
                summarize(results, a.methods, a.target_last)))
    if a.plot:
        plot(results, a.methods, Path(a.plot), a)
    if a.json:  # with --from-json: the files' runs together (each file's commit in "sources")
        commits = {str(x["commit"]) for x in sources}
        from benchlib.fingerprint import takes

        data = {"machine": machine(),
                "args": {k: v for k, v in vars(a).items() if k != "fingerprints"},
                "results": results,
                "commit": " ".join(sorted(commits)) if sources else git_state(),
                **({"sources": sources} if sources else {}),
                "fingerprints": takes(fingerprint_recipes(a)) if not sources else {
                    k: v for k, v in a.fingerprints.items() if k in a.methods}}
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
