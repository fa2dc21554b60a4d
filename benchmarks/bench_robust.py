"""Byzantine clients against robust aggregation (issue 40): the defense x attack table on digits,
and the wall-clock of each defense on large rounds.

    python3 benchmarks/bench_robust.py [--json FILE]                     # the defaults below
    python3 benchmarks/bench_robust.py --rounds 10 --seeds 0 1 2 --timing-n 1000 --timing-d 100000

(a) Table: `fednet local` runs (fednet.api.run, in this process) on digits, 100 clients,
    Dirichlet 0.5, every client in every round (--fraction 1), 20% malicious (--malicious 0.2),
    each (attack, defense) with every seed; the final clean accuracy and, for the backdoor, the
    final attack success rate, as mean, sample sd and min..max over the seeds; and each cell's
    wall-clock against plain FedAvg's (the same attack and seeds).
(b) Timing: each defense (robust.apply) on n updates of d float64 coordinates drawn from a
    normal distribution, against the mean of the same matrix (numpy) and against StreamingMean
    (FedAvg's exact streamed mean). Reported: the median of `--repeat` runs.

The issue asks for 1,000 updates of a 1M-parameter model: that matrix is 8 GB of float64, too
much beside the other work of this shared 24 GB machine, so the default times 1,000 x 100,000
(0.8 GB) and 100 x 1,000,000 and says so; Krum and Bulyan grow as n^2 d, the others as n d.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

ATTACKS = ["none", "signflip", "alie", "ipm", "backdoor"]
DEFENSES = ["none", "krum", "median", "trimmed_mean", "centered_clip"]
TIMED = ["krum", "multikrum", "bulyan", "median", "trimmed_mean", "norm_bound", "centered_clip"]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", nargs="+", default=ATTACKS)
    ap.add_argument("--defenses", nargs="+", default=DEFENSES)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--partition", default="iid", choices=["iid", "dirichlet"])
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    ap.add_argument("--batch-clients", type=int, default=20)
    ap.add_argument("--noniid", nargs="*", default=["none", "krum"],
                    help="defenses also run without attack on Dirichlet --alpha (Krum non-iid)")
    ap.add_argument("--malicious", default="0.2")
    ap.add_argument("--timing", nargs="*", default=["1000x100000", "100x1000000", "100x155000"],
                    help="N x D sizes to time each defense on")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--skip-table", action="store_true")
    ap.add_argument("--json", help="write the results to this file")
    return ap


def config(attack: str, defense: str, seed: int, ns: argparse.Namespace,
           partition: str | None = None) -> dict[str, Any]:
    """fednet.api.run's keywords of one cell (the same as `fednet local`'s options)."""
    part = partition or ns.partition
    kw: dict[str, Any] = {"clients": ns.clients, "rounds": ns.rounds, "epochs": ns.epochs,
                          "lr": ns.lr, "momentum": ns.momentum, "partition": part, "seed": seed,
                          "attack": attack, "malicious": ns.malicious, "defense": defense,
                          "batch_clients": ns.batch_clients}
    if part == "dirichlet":
        kw["alpha"] = ns.alpha
    return kw


def one(attack: str, defense: str, seed: int, ns: argparse.Namespace, tmp: str,
        partition: str | None = None) -> dict:
    from fednet.api import run

    t0 = time.perf_counter()
    kw = config(attack, defense, seed, ns, partition)
    exp = run(**kw, out=f"{tmp}/{attack}-{defense}-{seed}-{kw['partition']}", quiet=True)
    s = exp.summary
    return {"attack": attack, "defense": defense, "seed": seed, "status": s["status"],
            "partition": kw["partition"],
            "final_accuracy": s["final_accuracy"],
            "final_attack_success": s.get("final_attack_success"),
            "wall_s": time.perf_counter() - t0, "train_wall_s": s["wall_clock_s"]}


def stats(xs: list[float | None]) -> dict[str, Any]:
    """Mean, sd, min..max and the 95% t interval of the mean (clipped to [0, 1]) over seeds."""
    from fednet.metrics.intervals import mean_ci

    v = [x for x in xs if x is not None]
    ci = mean_ci(v, bounds=(0.0, 1.0))
    return {"mean": statistics.fmean(v) if v else None,
            "sd": statistics.stdev(v) if len(v) > 1 else None,
            "min": min(v) if v else None, "max": max(v) if v else None, "n": len(v),
            "lo": ci and ci[0], "hi": ci and ci[1]}


def paired(mine: list[dict], base: list[dict]) -> dict[str, Any]:
    """mine's final accuracy minus base's, paired by seed: mean and 95% t interval."""
    from fednet.metrics.intervals import versus

    return versus({c["seed"]: c["final_accuracy"] for c in mine},
                  {c["seed"]: c["final_accuracy"] for c in base}, higher=True)


def summarize(cells: list[dict]) -> list[dict]:
    """Per (partition, attack, defense): accuracy and attack success over seeds; 'effect': the
    attack's change of this defense's accuracy (against the same defense without attack);
    'cost': the defense's change against FedAvg under the same attack (paired by seed)."""
    out = []
    pick = {}
    for c in cells:
        pick.setdefault((c.get("partition", "dirichlet"), c["attack"], c["defense"]), []).append(c)
    for (part, a, d), mine in pick.items():
        base = pick.get((part, a, "none"), [])
        clean = pick.get((part, "none", d), [])
        ratio = (statistics.fmean(c["train_wall_s"] for c in mine)
                 / statistics.fmean(c["train_wall_s"] for c in base)) if base else None
        out.append({"partition": part, "attack": a, "defense": d,
                    "accuracy": stats([c["final_accuracy"] for c in mine]),
                    "attack_success": stats([c["final_attack_success"] for c in mine]),
                    "effect": paired(mine, clean) if clean and a != "none" else None,
                    "cost": paired(mine, base) if base and d != "none" else None,
                    "failed": sum(c.get("status", "completed") != "completed" for c in mine),
                    "wall_vs_fedavg": ratio})
    return out


def timing(n: int, d: int, repeat: int) -> dict[str, float]:
    """Median seconds of each defense, numpy's mean and StreamingMean on an n x d matrix."""
    from fednet.algorithms import robust as R
    from fednet.algorithms import robust_spec as S
    from fednet.algorithms.aggregate import StreamingMean

    x = np.random.default_rng(0).normal(size=(n, d))
    w = np.ones(n)
    params = {"krum": S.ByzantineCount(), "multikrum": S.MultiKrumParams(),
              "bulyan": S.ByzantineCount(), "median": S.ByzantineCount(),
              "trimmed_mean": S.TrimmedMeanParams(), "norm_bound": S.NormBoundParams(),
              "centered_clip": S.CenteredClipParams()}
    out: dict[str, float] = {}

    def best(fn) -> float:
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    out["mean (numpy)"] = best(lambda: x.mean(axis=0))

    def streaming() -> None:
        m = StreamingMean()
        for i in range(n):
            m.add({"w": x[i].astype(np.float32)}, 1.0, key=i)
        m.result()
    out["fedavg (StreamingMean)"] = best(streaming)
    for name in TIMED:
        out[name] = best(lambda name=name: R.apply(name, params[name], 0.2, x, w))
    return out


def ci_text(s: dict | None) -> str:
    """'0.912 [0.901, 0.923]' (mean and 95% interval) or '-'."""
    if not s or s.get("mean") is None:
        return "-"
    return f"{s['mean']:.3f}" + (f" [{s['lo']:.3f}, {s['hi']:.3f}]" if s.get("lo") is not None
                                 else "")


def diff_text(v: dict | None) -> str:
    """'-0.012 [-0.020, -0.004]', with 'no clear difference' where the interval holds 0."""
    if not v or v.get("estimate") is None:
        return "-"
    text = f"{v['estimate']:+.3f}"
    if v.get("lo") is None:
        return text
    text += f" [{v['lo']:+.3f}, {v['hi']:+.3f}]"
    return text + (": no clear difference" if v["lo"] <= 0 <= v["hi"] else "")


def table_text(rows: list[dict]) -> str:
    return table(["partition", "attack", "defense", "accuracy [95% CI]", "attack success",
                  "attack's effect", "vs FedAvg", "wall vs fedavg"],
                 [[r.get("partition", "dirichlet"), r["attack"], r["defense"],
                   ci_text(r["accuracy"]), ci_text(r["attack_success"]),
                   diff_text(r.get("effect")), diff_text(r.get("cost")),
                   "-" if r["wall_vs_fedavg"] is None else f"{r['wall_vs_fedavg']:.2f}x"]
                  for r in rows])


NAMES = {"none": "FedAvg", "krum": "Krum", "median": "median", "trimmed_mean": "trimmed mean",
         "centered_clip": "centered clipping", "bulyan": "Bulyan", "multikrum": "Multi-Krum",
         "norm_bound": "norm bound"}
ATTACK_NAMES = {"signflip": "sign flipping", "alie": "ALIE", "ipm": "IPM", "backdoor": "backdoor",
                "labelflip": "label flipping", "minmax": "min-max", "minsum": "min-sum"}


def setting(args: dict[str, Any]) -> str:
    """The table's setting, for the notes."""
    return (f"digits {args.get('partition')}, {args.get('clients')} clients all in every round, "
            f"{args.get('rounds')} rounds x {args.get('epochs')} epochs, lr {args.get('lr')} "
            f"momentum {args.get('momentum')}; {len(args.get('seeds', []))} seeds, 95% t "
            "intervals")


def attack_row(rows: dict, a: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """One attack: FedAvg's accuracy under it (the value), its effect, each defense's."""
    part = args.get("partition")
    mine = rows.get((part, a, "none"))
    if mine is None:
        return None
    pct = float(args.get("malicious", 0.2)) * 100
    parts = [f"FedAvg's change {diff_text(mine['effect'])}"]
    if mine.get("failed"):
        parts.append(f"FedAvg's runs ended diverged (a non-finite loss) on {mine['failed']}/"
                     f"{mine['accuracy']['n']} seeds")
    if a == "backdoor":
        parts.append(f"backdoor success on FedAvg {ci_text(mine['attack_success'])}")
    for d in NAMES:
        r = rows.get((part, a, d))
        if d == "none" or r is None:
            continue
        asr = f", success {ci_text(r['attack_success'])}" if a == "backdoor" else ""
        parts.append(f"{NAMES[d]} {ci_text(r['accuracy'])} (vs FedAvg {diff_text(r['cost'])}"
                     f"{asr})")
    return headline_row("robustness", f"FedAvg accuracy under {ATTACK_NAMES.get(a, a)} "
                        f"({pct:.0f}% malicious)", mine["accuracy"]["mean"], "", "",
                        f"{ci_text(mine['accuracy'])}; " + "; ".join(parts) + "; "
                        + setting(args))


def clean_rows(rows: dict, args: dict[str, Any]) -> list[dict[str, Any] | None]:
    """FedAvg's clean accuracy, each defense's clean cost, Krum's on non-iid data."""
    part = args.get("partition")
    fa = rows.get((part, "none", "none"))
    out = [headline_row("robustness", "FedAvg clean accuracy, the robustness table's model",
                        fa and fa["accuracy"]["mean"], "", ">= 0.9 (issue 55)",
                        f"{ci_text(fa and fa['accuracy'])}; {setting(args)}")]
    for d in NAMES:
        r = rows.get((part, "none", d))
        if d != "none" and r is not None and r.get("cost"):
            out.append(headline_row(
                "robustness", f"{NAMES[d]}: clean accuracy minus FedAvg's (no attack)",
                r["cost"]["estimate"], "", "", f"{diff_text(r['cost'])}, paired by seed; "
                f"{NAMES[d]} {ci_text(r['accuracy'])}; {setting(args)}"))
    kn, fn = rows.get(("dirichlet", "none", "krum")), rows.get(("dirichlet", "none", "none"))
    if kn is not None and fn is not None:
        out.append(headline_row(
            "robustness", f"Krum: clean accuracy minus FedAvg's, non-iid (Dirichlet "
            f"{args.get('alpha')})", kn["cost"]["estimate"], "", "",
            f"{diff_text(kn['cost'])}; Krum {ci_text(kn['accuracy'])}, FedAvg "
            f"{ci_text(fn['accuracy'])} (docs/algorithms.md, robustness); "
            + setting(args).replace(str(part), f"Dirichlet {args.get('alpha')}", 1)))
    return out


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    args = data.get("args", {})
    rows = {(r.get("partition", "dirichlet"), r["attack"], r["defense"]): r
            for r in data.get("table", [])}
    t = data.get("timing", {})
    big = next((v for k, v in t.items() if k.startswith("1000x")), {})
    fp = {"fingerprint": sorted(data.get("fingerprints", {}))}
    out = measured(*clean_rows(rows, args),
                   *(attack_row(rows, a, args) for a in args.get("attacks", [])
                     if a != "none"),
                   headline_row("robustness", "Krum, 1,000 x 100,000 updates", big.get("krum"),
                                "s", "", "numpy, float64"),
                   headline_row("robustness", "Bulyan, 1,000 x 100,000 updates",
                                big.get("bulyan"), "s", "", "numpy, float64"))
    return [{**r, **fp} if "updates" not in r["metric"] else r for r in out]


def fingerprint_recipes(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The fingerprints' recipes: seed 0's clean FedAvg and Krum under ALIE, first 2 rounds."""
    from benchlib.fingerprint import fingerprint_of

    pairs = [("none", "none"), ("alie", "krum"), ("backdoor", "median")]
    return {f"{a}-{d}": fingerprint_of(config(a, d, ns.seeds[0], ns)) for a, d in pairs
            if a in ns.attacks and d in ns.defenses}


def main() -> int:
    ns = parser().parse_args()
    import torch

    torch.set_num_threads(1)
    cells: list[dict] = []
    if not ns.skip_table:
        with tempfile.TemporaryDirectory(prefix="fednet-robust-") as tmp:
            for a in ns.attacks:
                for d in ns.defenses:
                    for seed in ns.seeds:
                        c = one(a, d, seed, ns, tmp)
                        cells.append(c)
                        print(f"{a:10s} {d:14s} seed {seed}: acc {c['final_accuracy']:.4f} "
                              f"asr {c['final_attack_success']} {c['wall_s']:.1f}s", flush=True)
            for d in ns.noniid if ns.partition == "iid" else []:
                for seed in ns.seeds:
                    c = one("none", d, seed, ns, tmp, partition="dirichlet")
                    cells.append(c)
                    print(f"dirichlet {d:14s} seed {seed}: acc {c['final_accuracy']:.4f}",
                          flush=True)
    rows = summarize(cells)
    if rows:
        print(table_text(rows))
    times = {}
    for size in ns.timing:
        n, d = (int(v) for v in size.split("x"))
        times[size] = timing(n, d, ns.repeat)
        print(size, {k: round(v, 3) for k, v in times[size].items()}, flush=True)
    from benchlib.fingerprint import CLOCKLESS, takes

    data = {"machine": machine(), "args": vars(ns), "cells": cells, "table": rows,
            "timing": times,
            "fingerprints": takes(fingerprint_recipes(ns), CLOCKLESS) if cells else {}}
    write_json(ns.json, data, headline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
