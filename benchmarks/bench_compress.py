"""Accuracy against uplink bytes: dense FedAvg, FedAvg with each --compress, Factorized-FL (issue 25).

    python3 benchmarks/bench_compress.py [--dataset digits] [--rounds 25] [--seeds 0 1 2]
        [--clients 10] [--epochs 5] [--specs none fp16 int8 qsgd:16 topk:0.01 sign]
        [--factorized] [--down] [--plot F.png] [--json F]
    python3 benchmarks/bench_compress.py --from-json A.json B.json --plot F.png   # table, plot

Every cell is one `fednet local` run (its own process) with the same seed and data; per cell
the final accuracy (mean and range over the seeds), the bytes on the wire (the encoded arrays
and their headers) and their ratio to dense FedAvg's on the same seed, uplink
(client_to_server), downlink (server_to_client: --compress leaves it dense) and both ways, and
the accuracy difference to dense FedAvg seed by seed (mean, min..max). --plot draws accuracy
against cumulative uplink bytes (log scale), one curve per method (the seeds' mean).
--down: each spec is the tasks' encoding (--compress-down) instead of the updates'; the
dashboard then has one row, the downlink ratio of int8 (the other specs in its note).
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

# docs/benchmarks/history.md section 24's targets: uplink / dense FedAvg's, and accuracy within N points
TARGETS = {"fp16": ("<= 0.51", "within 1"), "int8": ("<= 0.26", "within 1"),
           "qsgd:16": ("<= 0.16", ""), "topk:0.01": ("<= 0.025", "within 3")}


def cell(method: str, spec: str, seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    how = ["--compress-down", spec] if a.down and spec != "none" else ["--compress", spec]
    r = run(fednet_module("local", "--algo", method, "--dataset", a.dataset, "--clients",
                          str(a.clients), "--rounds", str(a.rounds), "--epochs", str(a.epochs),
                          "--seed", str(seed), *how, "-q", "--out", str(out)))
    if r.rc != 0:
        return {"method": method, "spec": spec, "seed": seed, "status": f"rc {r.rc}",
                "error": r.stderr[-500:]}
    s, rows = summary(out), metrics(out)
    up, curve = 0, []
    for row in rows:
        up += row["bytes_round"]["client_to_server"]
        curve.append((up, row["accuracy"]))
    last = [row["accuracy"] for row in rows][-a.acc_last:]
    return {"method": method, "spec": spec, "seed": seed, "status": s["status"],
            "accuracy": s["final_accuracy"], "last_mean": sum(last) / len(last),
            "uplink": s["bytes"]["client_to_server"],
            "downlink": s["bytes"]["server_to_client"], "curve": curve}


def _mean_range(xs: list[float], fmt: str) -> str:
    """'mean (min..max)' of xs, each formatted with fmt."""
    return f"{sum(xs) / len(xs):{fmt}} ({min(xs):{fmt}}..{max(xs):{fmt}})"


def ratios(r: dict[str, Any], dense: dict[str, Any]) -> dict[str, float]:
    """A cell's bytes over dense FedAvg's on the same seed: uplink, downlink and both ways."""
    return {"up": r["uplink"] / dense["uplink"], "down": r["downlink"] / dense["downlink"],
            "total": (r["uplink"] + r["downlink"]) / (dense["uplink"] + dense["downlink"])}


def accuracy_change(rs: list[dict[str, Any]], dense: dict[int, dict[str, Any]]) -> str:
    """The accuracy change against dense FedAvg, in points, paired by seed, with its 95% t
    interval ('no clear difference' where it holds 0); on the mean of each run's last rounds
    ("last_mean") where the file has it, else on the final round."""
    from fednet.metrics.intervals import versus

    key = "last_mean" if all("last_mean" in r for r in rs) else "accuracy"
    v = versus({r["seed"]: r[key] for r in rs}, {k: d[key] for k, d in dense.items()},
               higher=True)
    text = f"{100 * v['estimate']:+.2f} points"
    if v["lo"] is not None:
        text += f" [{100 * v['lo']:+.2f}, {100 * v['hi']:+.2f}]"
    text += (" (each run's mean over its last rounds)" if key == "last_mean"
             else " (final round)")
    return text + (": no clear difference" if v["lo"] is not None and v["lo"] <= 0 <= v["hi"]
                   else "")


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: FedAvg's uplink bytes with each --compress over dense FedAvg's (the
    specs with a target first; at most 4); the note gives the downlink and total (both ways)
    ratios, which --compress leaves dense on the way down, and the accuracy change against
    dense FedAvg seed by seed, mean (min..max)."""
    ok = [r for r in data.get("results", []) if r["status"] == "completed"]
    a = data.get("args", {})
    dense = {r["seed"]: r for r in ok if (r["method"], r["spec"]) == ("fedavg", "none")}
    if a.get("down"):
        return measured(down_row(ok, dense, a, data.get("fingerprints", {})))
    specs = list(dict.fromkeys(r["spec"] for r in ok if r["method"] == "fedavg"
                               and r["spec"] != "none"))
    specs.sort(key=lambda s: s not in TARGETS)
    out = []
    for spec in specs[:4]:
        rs = [r for r in ok if (r["method"], r["spec"]) == ("fedavg", spec) and r["seed"] in dense]
        if not rs:
            continue
        rat = [ratios(r, dense[r["seed"]]) for r in rs]
        up, down, total = ([x[k] for x in rat] for k in ("up", "down", "total"))
        target, acc_target = TARGETS.get(spec, ("", ""))
        row = headline_row(
            "compression", f"FedAvg --compress {spec}: uplink bytes / dense FedAvg's",
            sum(up) / len(up), "", target,
            f"baseline: dense FedAvg, same seed; downlink {sum(down) / len(down):.3f} (dense: "
            f"--compress is the uplink's), both ways {sum(total) / len(total):.3f}; accuracy vs "
            f"dense {accuracy_change(rs, dense)}, 95% t interval"
            + (f" (target: {acc_target})" if acc_target else "") + f"; {len(rs)} seeds; "
            f"digits, {a.get('clients')} clients, {a.get('rounds')} rounds x "
            f"{a.get('epochs')} epochs")
        fp = [k for k in (spec, "none") if k in data.get("fingerprints", {})]
        out.append(row and ({**row, "fingerprint": fp} if fp else row))
    return measured(*out)


DOWN_ROW = "int8"
"""--down: the spec whose downlink ratio is the dashboard's one row (the others in its note)."""


def down_row(ok: list[dict[str, Any]], dense: dict[int, dict[str, Any]], a: dict[str, Any],
             fps: dict[str, Any]) -> dict[str, Any] | None:
    """--down's row: FedAvg's downlink with --compress-down int8 over dense FedAvg's, and each
    spec's downlink ratio and accuracy change against dense (paired by seed) in the note."""
    parts, value = [], None
    for spec in dict.fromkeys(r["spec"] for r in ok if r["spec"] != "none"):
        rs = [r for r in ok if r["spec"] == spec and r["seed"] in dense]
        if not rs:
            continue
        down = sum(ratios(r, dense[r["seed"]])["down"] for r in rs) / len(rs)
        value = down if spec == DOWN_ROW else value
        parts.append(f"{spec}: downlink {down:.3f}, accuracy vs dense "
                     f"{accuracy_change(rs, dense)}")
    row = headline_row(
        "compression", f"FedAvg --compress-down {DOWN_ROW}: downlink bytes / dense FedAvg's",
        value, "", "", "baseline: dense FedAvg, same seed (the uplink stays dense); "
        + "; ".join(parts) + f"; 95% t intervals, {len(dense)} seeds; digits, "
        f"{a.get('clients')} clients, {a.get('rounds')} rounds x {a.get('epochs')} epochs")
    fp = [k for k in (DOWN_ROW, "none") if k in fps]
    return row and ({**row, "fingerprint": fp} if fp else row)


def fingerprint_recipes(a: argparse.Namespace, cells: list[tuple[str, str]]
                        ) -> dict[str, dict[str, Any]]:
    """Each FedAvg spec's seed-0 cell as fednet.api.run keywords, its first 2 rounds."""
    from benchlib.fingerprint import fingerprint_of

    def how(spec: str) -> dict[str, str]:
        return {"compress_down": spec} if a.down and spec != "none" else {"compress": spec}
    return {spec: fingerprint_of({"algo": m, "dataset": a.dataset, "clients": a.clients,
                                  "epochs": a.epochs, "seed": a.seeds[0], **how(spec)})
            for m, spec in cells if m == "fedavg" and (not a.down or spec in (DOWN_ROW, "none"))}


def table_rows(results: list[dict[str, Any]], cells: list[tuple[str, str]]) -> list[list[Any]]:
    """The printed table: per cell, accuracy, byte ratios and accuracy change against dense."""
    dense = {r["seed"]: r for r in results if (r["method"], r["spec"]) == ("fedavg", "none")
             and r["status"] == "completed"}
    rows = []
    for method, spec in cells:
        rs = [r for r in results if (r["method"], r["spec"]) == (method, spec)
              and r["status"] == "completed"]
        if not rs:
            rows.append([method, spec, "failed"] + [None] * 5)
            continue
        acc = [r["accuracy"] for r in rs]
        rat = [ratios(r, dense[r["seed"]]) for r in rs if r["seed"] in dense]
        diff = [r["accuracy"] - dense[r["seed"]]["accuracy"] for r in rs if r["seed"] in dense]
        rows.append([method, spec, _mean_range(acc, ".4f")]
                    + [_mean_range([x[k] for x in rat], ".4f") if rat else "-"
                       for k in ("up", "down", "total")]
                    + [_mean_range(diff, "+.4f") if diff else "-", rs[0]["uplink"]])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--acc-last", type=int, default=5,
                    help="a run's accuracy for the comparison: the mean of its last N rounds")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--specs", nargs="+", default=["none", "fp16", "int8", "qsgd:16", "topk:0.01"])
    ap.add_argument("--factorized", action="store_true",
                    help="also Factorized-FL, dense and with each spec")
    ap.add_argument("--down", action="store_true",
                    help="the specs encode the tasks (--compress-down), not the updates")
    ap.add_argument("--plot")
    ap.add_argument("--json")
    ap.add_argument("--from-json", nargs="+", help="table and plot the results of earlier runs "
                    "(their --json files) instead of running")
    a = ap.parse_args()
    cells = [("fedavg", s) for s in a.specs]
    if a.factorized:
        cells += [("factorized", s) for s in a.specs]
    results: list[dict[str, Any]] = []
    if a.from_json:
        runs = {}  # a cell run twice (the same seed in two files) is the same run: once
        for f in a.from_json:
            runs.update({(r["method"], r["spec"], r["seed"]): r
                         for r in json.loads(Path(f).read_text())["results"]})
        results = list(runs.values())
        seen = [(r["method"], r["spec"]) for r in results]
        cells = list(dict.fromkeys(seen))
        a.seeds = sorted({r["seed"] for r in results})
        a.specs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (a.seeds if a.specs else []):  # seed by seed: each seed's cells side by side
            for method, spec in cells:
                print(f"seed {seed}: {method} --compress{'-down' * a.down} {spec} ...",
                      file=sys.stderr, flush=True)
                results.append(cell(method, spec, seed, a,
                                    Path(tmp) / f"{method}-{spec.replace(':', '_')}-{seed}"))
    rows = table_rows(results, cells)
    print(table(["method", "compress", "accuracy: mean (range)", "uplink / dense FedAvg",
                 "downlink / dense", "both ways / dense", "accuracy - dense (per seed)",
                 "uplink bytes (first seed)"], rows))
    if a.plot:
        plot(results, cells, Path(a.plot), a)
    from benchlib.fingerprint import CLOCKLESS, takes

    data = {"machine": machine(), "commit": git_state(), "args": vars(a), "results": results,
            "fingerprints": {} if a.from_json else takes(fingerprint_recipes(a, cells), CLOCKLESS)}
    write_json(a.json, data, headline(data))


def plot(results: list[dict[str, Any]], cells: list[tuple[str, str]], path: Path,
         a: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, spec in cells:
        rs = [r for r in results if (r["method"], r["spec"]) == (method, spec) and "curve" in r]
        if not rs:
            continue
        n = min(len(r["curve"]) for r in rs)
        x = np.mean([[c[0] for c in r["curve"][:n]] for r in rs], axis=0)
        y = np.mean([[c[1] for c in r["curve"][:n]] for r in rs], axis=0)
        ax.plot(x, y, marker=".", label=f"{method} {spec if spec != 'none' else '(dense)'}"
                                        f" ({len(rs)} seed{'s' if len(rs) > 1 else ''})")
    ax.set_xscale("log")
    ax.set_xlabel("uplink bytes on the wire (cumulative)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{a.dataset}, {a.clients} clients, {a.epochs} epochs: the mean over each "
                 "method's seeds")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
