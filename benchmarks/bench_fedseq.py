"""FedSeq against FedAvg on pathological non-IID digits, every cost counted (issues 25, 44).

    python3 benchmarks/bench_fedseq.py [--seeds 0 1 2 3 4] [--clients 100] [--fraction 0.2]
        [--latency hetero] [--fedavg-lr 0.4] [--fedseq-lr 0.1] [--fedavg-rounds 200]
        [--fedseq-rounds 60] [--pretrain-epochs 10] [--central-rounds 30] [--of-central 0.9]
        [--json F]

One centralized run (seed 0, --central-rounds epochs at lr 0.1) sets the reference accuracy;
then per seed one FedAvg run per --fedavg-lr and one FedSeq run (greedy KL superclients,
--superclient-fraction 0.2), each `fednet local` with `--target <of-central>x:REFERENCE`, so
that its summary.json's to_target gives the cost of reaching --of-central x the reference's best
accuracy: rounds, client-epochs (FedSeq's pre-training of every client included), simulated
seconds (the pre-training included), bytes each way and wall-clock. The baseline is FedAvg at
its best learning rate on each seed (the fewest rounds to the target among --fedavg-lr; 0.4 was
FedAvg's best over 0.1-0.6 on seeds 0-4 in docs/benchmarks/history.md section 3). Per seed every
cost is a ratio FedSeq / FedAvg; the rows give their geometric mean with its 95% t interval (on
the logarithms) and say "no clear difference" where the interval holds 1. Setup as in history
section 3: digits, shards (one class per client), 1 epoch, batch 8.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, run, summary  # noqa: E402
from benchlib.util import git_state, headline_row, machine, measured, table, write_json  # noqa: E402

COMMON = ("--dataset", "digits", "--partition", "shards", "--alpha", "0", "--epochs", "1",
          "-q")
COSTS = (("rounds", "rounds"), ("client_epochs", "client-epochs (pre-training included)"),
         ("sim_s", "simulated time (pre-training included)"))
"""The to_target costs the rows compare, and how a row names each."""


def local(out: Path, a: argparse.Namespace, *args: str) -> dict[str, Any]:
    """One `fednet local` run into out: its summary (status 'rc N' and the error when it
    failed)."""
    r = run(fednet_module("local", *COMMON, "--clients", str(a.clients), "--latency", a.latency,
                          "--out", str(out), *args))
    if r.rc != 0:
        return {"status": f"rc {r.rc}", "error": r.stderr[-500:]}
    return summary(out)


def cell(method: str, lr: float, seed: int, ref: Path, a: argparse.Namespace,
         out: Path) -> dict[str, Any]:
    """A FedAvg or FedSeq run with the target: its to_target, final accuracy, status."""
    extra = (["--superclient-fraction", "0.2", "--pretrain-epochs", str(a.pretrain_epochs)]
             if method == "fedseq" else [])
    rounds = a.fedseq_rounds if method == "fedseq" else a.fedavg_rounds
    s = local(out, a, "--algo", method, "--lr", str(lr), "--fraction", str(a.fraction),
              "--rounds", str(rounds), "--seed", str(seed), "--target",
              f"{a.of_central}x:{ref}", *extra)
    return {"method": method, "lr": lr, "seed": seed, "status": s.get("status"),
            "error": s.get("error"), "to_target": s.get("to_target"),
            "accuracy": s.get("final_accuracy"), "compute": s.get("compute"),
            "wall_s": s.get("wall_clock_s")}


def reached(r: dict[str, Any]) -> bool:
    t = r.get("to_target") or {}
    return r.get("status") == "completed" and bool(t.get("reached"))


def best_fedavg(results: list[dict[str, Any]], seed: int) -> dict[str, Any] | None:
    """The seed's FedAvg run with the fewest rounds to the target (None: none reached it)."""
    rs = [r for r in results if r["method"] == "fedavg" and r["seed"] == seed and reached(r)]
    return min(rs, key=lambda r: r["to_target"]["rounds"], default=None)


def per_seed(results: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per seed with a FedSeq run: FedSeq's and the best FedAvg's to_target costs and their
    ratios (None where either never reached the target)."""
    out = {}
    for r in results:
        if r["method"] != "fedseq":
            continue
        f = best_fedavg(results, r["seed"])
        both = reached(r) and f is not None
        out[r["seed"]] = {"fedavg_lr": f["lr"] if f else None, "fedseq_reached": reached(r),
                          **{k: (r["to_target"][k] / f["to_target"][k]
                                 if both and f is not None and f["to_target"][k] else None)
                             for k, _ in COSTS},
                          "bytes": (_bytes(r) / _bytes(f) if both and f is not None
                                    and _bytes(f) else None)}
    return out


def _bytes(r: dict[str, Any]) -> int:
    """Every byte a run moved to its target: down, up and peer-to-peer (FedSeq's chains)."""
    b = (r.get("to_target") or {}).get("bytes") or {}
    return sum(int(b.get(k) or 0) for k in ("server_to_client", "client_to_server",
                                             "client_to_client"))


def ratio_ci(xs: list[float]) -> tuple[float, float | None, float | None]:
    """The geometric mean of per-seed ratios and its 95% t interval (on their logarithms)."""
    import math

    from fednet.metrics.intervals import mean_ci

    logs = [math.log(x) for x in xs]
    ci = mean_ci(logs)
    return math.exp(sum(logs) / len(logs)), ci and math.exp(ci[0]), ci and math.exp(ci[1])


def verdict(xs: list[float]) -> str:
    """'1.06x [0.91, 1.24]: no clear difference' / '... FedSeq costs less|MORE'."""
    gm, lo, hi = ratio_ci(xs)
    text = f"{gm:.2f}x" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None else "")
    if lo is None or hi is None:
        return text + " (one seed: no interval)"
    return text + (": no clear difference" if lo <= 1 <= hi
                   else ": FedSeq costs less" if hi < 1 else ": FedSeq COSTS MORE")


def _bytes_note(seeds: dict[int, dict[str, Any]]) -> str:
    """FedSeq's bytes to the target as a ratio to FedAvg's (beside the rounds: the dashboard's
    lines are counted, so no row of its own)."""
    xs = [s["bytes"] for s in seeds.values() if s.get("bytes") is not None]
    if not xs:
        return ""
    return (f"; bytes to the target (peer-to-peer included) {verdict(xs)} "
            f"(per seed {'/'.join(f'{x:.2f}' for x in xs)})")


def _unstable(data: dict[str, Any], target: float) -> str:
    """Where a FedAvg run that reached the target ended below it (a late collapse)."""
    rs = [r for r in data.get("results", []) if r["method"] == "fedavg" and reached(r)
          and (r.get("accuracy") or 0.0) < target]
    if not rs:
        return ""
    n = len([r for r in data.get("results", []) if r["method"] == "fedavg"])
    finals = "/".join(f"{r['accuracy']:.2f}" for r in rs)
    return (f"; FedAvg ended below the target after reaching it on {len(rs)}/{n} runs "
            f"(final {finals})")


def _shown(seed: dict[str, Any], key: str) -> str:
    """A seed's ratio, or who never reached the target."""
    if seed[key] is not None:
        return f"{seed[key]:.2f}"
    return "FedSeq never" if not seed["fedseq_reached"] else "FedAvg never"


def _lrs(lrs: Any) -> str:
    return ", ".join(map(str, lrs)) if isinstance(lrs, list) else str(lrs)


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: FedSeq's rounds, client-epochs and simulated time to the target,
    each as a ratio to FedAvg's at its best lr on the same seed, mean over the seeds."""
    a = data.get("args", {})
    seeds = per_seed(data.get("results", []))
    pct = f"{100 * a.get('of_central', 0.9):.0f}%"
    ref = (data.get("reference") or {}).get("best_accuracy") or 0.0
    lrs = sorted({s["fedavg_lr"] for s in seeds.values() if s["fedavg_lr"] is not None})
    grid = a.get("fedavg_lr")
    base = (f"FedAvg lr {_lrs(grid)} (its best of 0.1-0.6 over 5 seeds, docs/benchmarks/"
            "history.md section 3)" if isinstance(grid, list) and len(grid) == 1 else
            f"FedAvg at its best lr per seed (of {_lrs(grid)}; chosen: "
            f"{', '.join(map(str, lrs)) or '-'})")
    setting = (f"baseline: {base}; digits shards, {a.get('clients')} clients, "
               f"fraction {a.get('fraction')}, --latency {a.get('latency')}, pre-training "
               f"{a.get('pretrain_epochs')} epochs, FedSeq lr {a.get('fedseq_lr')}")
    out = []
    for key, what in COSTS:
        xs = [s[key] for s in seeds.values() if s[key] is not None]
        per = "/".join(_shown(s, key) for _, s in sorted(seeds.items()))
        value: float | str | None = (ratio_ci(xs)[0] if xs else "never" if seeds else None)
        row = headline_row(
            "accuracy", f"FedSeq: {what} to {pct} of centralized accuracy, x FedAvg's",
            value, "x" if xs else "", "",
            f"{verdict(xs) if xs else 'never'} (geometric mean, 95% t interval); "
            f"{len(xs)}/{len(seeds)} seeds, per seed {per}"
            f"{_bytes_note(seeds) if key == 'rounds' else ''}"
            f"{_unstable(data, ref * a.get('of_central', 0.9)) if key == 'rounds' else ''}"
            f"; target {pct} of a centralized "
            f"run's best accuracy ({ref:.4f}); {setting}")
        fp = sorted(data.get("fingerprints", {}))
        out.append(row and ({**row, "fingerprint": fp} if fp else row))
    return measured(*out)


def fingerprint_recipes(a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Seed 0's FedAvg (the first --fedavg-lr) and FedSeq as fednet.api.run keywords, 2 rounds."""
    from benchlib.fingerprint import fingerprint_of

    common = {"dataset": "digits", "partition": "shards", "alpha": 0.0, "epochs": 1,
              "clients": a.clients, "latency": a.latency, "fraction": a.fraction,
              "seed": a.seeds[0]}
    return {"fedavg": fingerprint_of({**common, "algo": "fedavg", "lr": a.fedavg_lr[0]}),
            "fedseq": fingerprint_of({**common, "algo": "fedseq", "lr": a.fedseq_lr,
                                      "superclient_fraction": 0.2,
                                      "pretrain_epochs": a.pretrain_epochs})}


def rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    """The table: every run's costs to the target."""
    out = []
    for r in sorted(results, key=lambda r: (r["seed"], r["method"], r["lr"])):
        t = r.get("to_target") or {}
        b = t.get("bytes") or {}
        out.append([r["seed"], r["method"], r["lr"], r["status"], t.get("rounds"),
                    t.get("client_epochs"), t.get("sim_s"), t.get("wall_s"),
                    b.get("server_to_client"), b.get("client_to_server"),
                    b.get("client_to_client"), r.get("accuracy")])
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--latency", default="hetero")
    ap.add_argument("--fedavg-lr", type=float, nargs="+", default=[0.4])
    ap.add_argument("--fedseq-lr", type=float, default=0.1)
    ap.add_argument("--fedavg-rounds", type=int, default=200)
    ap.add_argument("--fedseq-rounds", type=int, default=60)
    ap.add_argument("--pretrain-epochs", type=int, default=10,
                    help="FedSeq's e: 10 is the paper's and its code's (and fednet's default)")
    ap.add_argument("--central-rounds", type=int, default=30)
    ap.add_argument("--of-central", type=float, default=0.9,
                    help="the target: this fraction of the centralized run's best accuracy")
    ap.add_argument("--json")
    return ap


def main() -> None:
    a = parser().parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "central"
        print("centralized reference ...", file=sys.stderr, flush=True)
        central = local(ref, a, "--algo", "centralized", "--lr", "0.1", "--rounds",
                        str(a.central_rounds), "--seed", "0")
        if central.get("status") != "completed":
            raise SystemExit(f"the centralized reference failed: {central.get('error')}")
        for seed in a.seeds:
            for method, lr in [("fedavg", x) for x in a.fedavg_lr] + [("fedseq", a.fedseq_lr)]:
                print(f"seed {seed}: {method} lr {lr} ...", file=sys.stderr, flush=True)
                results.append(cell(method, lr, seed, ref, a, Path(tmp) / f"{method}-{lr}-{seed}"))
    print(f"reference: centralized best accuracy {central['best_accuracy']:.4f}; target "
          f"{a.of_central} x that")
    print(table(["seed", "method", "lr", "status", "rounds", "client-epochs", "sim s", "wall s",
                 "down B", "up B", "peer B", "final acc"], rows(results)))
    data = {"machine": machine(), "commit": git_state(), "args": vars(a),
            "reference": {"best_accuracy": central["best_accuracy"],
                          "wall_s": central.get("wall_clock_s")}, "results": results}
    from benchlib.fingerprint import takes

    data["fingerprints"] = takes(fingerprint_recipes(a))
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
