"""Whole runs with --batch-clients beside the plain loop and fednet without it (issue 56 item 4):
the issue's table.

    python3 benchmarks/bench_batched_runs.py --cells synthetic-fedprox:1000000:1000:4:1 \
        --json benchmarks/results/batched_runs_mclr.json      # the million-client job
    python3 benchmarks/bench_batched_runs.py --cells digits:100,digits:1000:100,\
synthetic-cifar10:1000:100:2:1 --json benchmarks/results/batched_runs.json

Cells: DATASET:CLIENTS[:PER_ROUND[:ROUNDS[:EPOCHS]]] (per round: all; rounds: --rounds; epochs:
fednet's default). Each cell runs, one after another and --repeats times interleaved (the same
load on a shared machine): the plain loop (benchmarks/plain_loop.py: torch.optim.SGD, one client
after another, fednet's data and model), `fednet local` without and with --batch-clients
PER_ROUND (the cohort in one block), `fednet launch` with it (--runtimes picks), all --seed 0
and fednet's defaults (--threads 1, as the loop). Per run: the whole command's seconds and
its process tree's CPU seconds (user + system) and the machine's CPU pressure (timed), the
steady round (the median of the rounds from round 1 on: the loop's own timer; fednet's
metrics.jsonl wall_s differences: training, aggregation, evaluation) and each round's accuracy.
--json FILE merges: the cells run now replace those of the same spec in FILE (an earlier run's,
of this script), the others are kept, each with the commit, date, command and matmul peak of the
run that measured it (the file's "commit" names each cell's, its "command" is the runs' commands
that made it, in order).
Per cell: the rounds' useful FLOPs (the examples trained a round, from metrics.jsonl, times one
example's forward and backward FLOPs by training/flops.batch_flops: what the simulated clock
charges; padding not counted) over the steady round, beside this machine's float32 matmul peak
on one thread (measured here, torch.mm of 1024x1024); what must not move between fednet's runs
(bytes without launch's control traffic, messages, simulated time) and the final models'
largest difference.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, run  # noqa: E402
from benchlib.util import (command_line, cpu_pressure_us, headline_row, machine,  # noqa: E402
                           measured, stamp)

HERE = Path(__file__).resolve().parent
RUNTIMES = ("loop", "local", "local-batched", "launch-batched")
TARGETS = {"synthetic-fedprox": "<= 0.05x (issue 56)", "digits": "<= 0.33x (issue 56)",
           "synthetic-cifar10": "<= 0.8x (issue 56)"}


def parse(spec: str, rounds: int) -> dict[str, Any]:
    p = spec.split(":")
    clients = int(p[1])
    return {"spec": spec, "dataset": p[0], "clients": clients,
            "per_round": int(p[2]) if len(p) > 2 else clients,
            "rounds": int(p[3]) if len(p) > 3 else rounds,
            "epochs": int(p[4]) if len(p) > 4 else None}


def timed(argv: list[str]) -> tuple[Any, dict[str, Any]]:
    """run(argv) and its whole process tree's CPU seconds (user and system: every descendant was
    waited for) and the machine's CPU pressure meanwhile (PSI "some": the share of the time some
    task waited for a CPU; None where the kernel has none): on a shared machine the wall-clock
    ratios move with the load, the CPU seconds much less."""
    ru0, psi0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_pressure_us()
    ran = run(argv, check=True)
    ru1, psi1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_pressure_us()
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    pressure = (psi1 - psi0) / 1e6 / ran.wall_s if psi0 is not None and psi1 is not None else None
    return ran, {"cpu_s": cpu, "pressure": pressure}


def loop_run(c: dict[str, Any]) -> dict[str, Any]:
    """The plain loop: its seconds, steady round and final accuracy."""
    argv = [sys.executable, str(HERE / "plain_loop.py"), "--dataset", c["dataset"], "--clients",
            str(c["clients"]), "--fraction", repr(c["per_round"] / c["clients"]), "--rounds",
            str(c["rounds"]), "--seed", "0"] + (["--epochs", str(c["epochs"])] if c["epochs"]
                                                 else [])
    ran, cpu = timed(argv)
    got = ran.last_json
    rounds = got["round_s"]
    return {"wall_s": ran.wall_s, **cpu, "round_s": statistics.median(rounds[1:] or rounds),
            "accuracy": [None] * (len(rounds) - 1) + [got["accuracy"]]}


def fednet_run(c: dict[str, Any], runtime: str, out: Path) -> dict[str, Any]:
    """A fednet run: its seconds, steady round, accuracy curve, examples a round, summary and
    final model."""
    command, _, batched = runtime.partition("-")
    argv = fednet_module(command, "--dataset", c["dataset"], "--clients", str(c["clients"]),
                         "--fraction", repr(c["per_round"] / c["clients"]), "--rounds",
                         str(c["rounds"]), "--seed", "0", "--batch-clients",
                         str(c["per_round"] if batched else 0), "-q", "--out", str(out))
    if c["epochs"]:
        argv += ["--epochs", str(c["epochs"])]
    if command == "launch":
        argv += ["--register-timeout", "600"]
    ran, cpu = timed(argv)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "wall_s" in r and r.get("round", -1) >= 0]
    walls = [r["wall_s"] for r in rows]
    steps = [b - a for a, b in zip(walls, walls[1:])] or walls
    samples = [r["samples"] for r in rows]
    with np.load(out / "final_model.npz") as z:
        model = {k: z[k] for k in z.files}
    return {"wall_s": ran.wall_s, **cpu, "round_s": statistics.median(steps),
            "accuracy": [r.get("accuracy") for r in rows],
            "examples": statistics.median(b - a for a, b in zip([0] + samples, samples)),
            "summary": json.loads((out / "summary.json").read_text()), "model": model}


def example_flops(dataset: str) -> float:
    """One example's training FLOPs (forward and backward) in fednet's default model."""
    from fednet.config import RunConfig
    from fednet.data import load_dataset
    from fednet.models import build_model
    from fednet.training.flops import batch_flops

    ds = load_dataset(dataset)
    b = RunConfig().train.batch_size
    model = build_model("auto", ds.num_classes, ds.input_shape, dataset=dataset, seed=0)
    return batch_flops(model, (b, *ds.input_shape)) / b


def matmul_peak(n: int = 1024, repeats: int = 5) -> float:
    """This machine's float32 matmul FLOP/s on one thread (the best of `repeats`)."""
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def cell(c: dict[str, Any], runtimes: list[str], repeats: int) -> dict[str, Any]:
    """Every runtime's runs of one cell, interleaved; the medians and what must not move."""
    got: dict[str, list[dict[str, Any]]] = {r: [] for r in runtimes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for r in runtimes:
                got[r].append(loop_run(c) if r == "loop" else
                              fednet_run(c, r, Path(tmp) / f"{r}{i}"))
                print(f"  {c['spec']} {r}: {got[r][-1]['wall_s']:.1f} s", flush=True)
    out: dict[str, Any] = {**c, "repeats": repeats, "runs": {}}
    for r, runs in got.items():
        pressures = [x["pressure"] for x in runs if x["pressure"] is not None]
        out["runs"][r] = {"wall_s": round(statistics.median(x["wall_s"] for x in runs), 3),
                          "round_s": round(statistics.median(x["round_s"] for x in runs), 4),
                          "cpu_s": round(statistics.median(x["cpu_s"] for x in runs), 2),
                          "pressure": (round(statistics.median(pressures), 2) if pressures
                                       else None),
                          "accuracy": runs[-1]["accuracy"],
                          "all_s": [[round(x["wall_s"], 2), round(x["round_s"], 4),
                                     round(x["cpu_s"], 2)] for x in runs]}
    fed = [r for r in runtimes if r != "loop"]
    if fed:
        last = {r: got[r][-1] for r in fed}
        ref = last[fed[0]]
        flop = example_flops(c["dataset"]) * ref["examples"]
        out["round_flops"] = flop
        for r in fed:
            out["runs"][r]["gflops"] = round(flop / out["runs"][r]["round_s"] / 1e9, 3)
            s, s0 = last[r]["summary"], ref["summary"]
            out["runs"][r]["same_as_" + fed[0]] = all(
                _moved(s[k]) == _moved(s0[k]) for k in ("bytes", "messages", "sim_time_s"))
            out["runs"][r]["max_rel_diff"] = f"{_diff(last[r]['model'], ref['model']):.1e}"
    return out


def _moved(v: Any) -> Any:
    """What batching must not move: the summary's value, its bytes without the control traffic
    (fednet launch's registration and liveness, which fednet local has none of)."""
    return {k: x for k, x in v.items() if k != "control"} if isinstance(v, dict) else v


def _diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """The largest difference of two models, relative to each array's largest magnitude."""
    return max(float(np.abs(a[k] - b[k]).max()) / max(float(np.abs(b[k]).max()), 1e-12)
               for k in b)


def headline(data: dict) -> list:
    """One row per cell: the batched steady round over the plain loop's, the rest in the note."""
    rows = []
    for c in data.get("cells", []):
        peak = c.get("matmul_peak_gflops", data.get("matmul_peak_gflops"))
        runs = c["runs"]
        if "loop" not in runs or "local-batched" not in runs:
            continue
        loop = runs["loop"]["round_s"]
        parts = [f"{r} {v['round_s']} s ({v['round_s'] / loop:.3g}x, command "
                 f"{v['wall_s'] / runs['loop']['wall_s']:.3g}x)" for r, v in runs.items()
                 if r != "loop"]
        b = runs["local-batched"]
        cpu = ""
        if "cpu_s" in b and "cpu_s" in runs["loop"]:
            cpu = (f"; whole command's CPU seconds (process tree, user + system) local-batched "
                   f"{b['cpu_s']} against the loop's {runs['loop']['cpu_s']} "
                   f"({b['cpu_s'] / runs['loop']['cpu_s']:.3g}x); CPU pressure (PSI some) "
                   + "/".join(f"{v['pressure']}" for v in runs.values()))
        same = all(v.get("same_as_local", True) for v in runs.values())
        acc = {r: v["accuracy"][-1] for r, v in runs.items()}
        rows.append(headline_row(
            "scale", f"{c['dataset']} {c['clients']:,} clients, {c['per_round']:,} a round: "
            "fednet local --batch-clients steady round / the plain loop's",
            round(b["round_s"] / loop, 3), "x", TARGETS.get(c["dataset"], ""),
            f"loop {loop} s a round; " + "; ".join(parts) + f"; {b.get('gflops')} GFLOP/s "
            f"batched (matmul peak {peak}); {c['rounds']} rounds, medians of {c['repeats']}; "
            f"bytes, messages, simulated time {'identical' if same else 'DIFFER'}; final "
            f"accuracy " + ", ".join(f"{r} {a:.3f}" for r, a in acc.items() if a is not None)
            + cpu))
    return measured(*rows)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="digits:100")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES))
    ap.add_argument("--json", default=None, help="write the results here (the dashboard's file)")
    return ap


def main() -> None:
    a = parser().parse_args()
    info = machine()
    peak = round(matmul_peak() / 1e9, 1)
    rows = []
    for spec in a.cells.split(","):
        r = cell(parse(spec, a.rounds), a.runtimes.split(","), a.repeats)
        print(json.dumps(r), flush=True)
        rows.append(r)
    print(f"\nfloat32 matmul peak, one thread: {peak} GFLOP/s\n\n| cell | runtime | round s | "
          "x loop | command s | GFLOP/s | accuracy by round |\n|---|---|---|---|---|---|---|")
    for r in rows:
        loop = r["runs"].get("loop", {}).get("round_s")
        for name, v in r["runs"].items():
            ratio = f"{v['round_s'] / loop:.3g}" if loop else "-"
            acc = " ".join("-" if x is None else f"{x:.3f}" for x in v["accuracy"])
            print(f"| {r['spec']} | {name} | {v['round_s']} | {ratio} | {v['wall_s']} | "
                  f"{v.get('gflops', '-')} | {acc} |")
    for r in rows:  # what measured this cell (kept with it when a later run merges)
        r.update(commit=info["git"], date=info["date"], command=command_line(),
                 matmul_peak_gflops=peak)
    data = {"args": vars(a), "machine": info, "matmul_peak_gflops": peak, "cells": rows}
    if a.json:
        write(Path(a.json), merged(Path(a.json), data))


def write(path: Path, data: dict[str, Any]) -> None:
    """benchlib.util.write_json's file (stamped, indented), but with the merged file's own
    commit and command (stamp would put this run's command on every cell kept)."""
    out = stamp(data, headline(data), Path(__file__).name)
    out.update({k: data[k] for k in ("commit", "command") if data.get(k)})
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def merged(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """`data` (this run's) with the cells of an earlier --json of this script at `path` that
    this run did not measure (keyed by "spec"; this run's replace the file's, in the file's
    order, new specs after); the file's "commit" and "command" then name each cell's run. An
    earlier cell without its own commit, date or command takes its file's."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return data
    if not isinstance(old, dict) or old.get("script") != Path(__file__).name:
        return data
    info = old.get("machine") if isinstance(old.get("machine"), dict) else {}
    ran = {c["spec"]: c for c in data["cells"]}
    cells = []
    for c in old.get("cells", []):
        if c.get("spec") in ran:
            cells.append(ran.pop(c["spec"]))
        else:
            cells.append({"commit": info.get("git", "?"), "date": info.get("date", ""),
                          "command": old.get("command", ""),
                          "matmul_peak_gflops": old.get("matmul_peak_gflops"), **c})
    cells += ran.values()
    kept = len(cells) - len(data["cells"])
    if kept:
        print(f"kept {kept} cell(s) of {path} that this run did not measure")
    by_commit: dict[str, list[str]] = {}
    for c in cells:
        by_commit.setdefault(c["commit"], []).append(c["spec"])
    commit = (next(iter(by_commit)) if len(by_commit) == 1 else
              ", ".join(f"{k} ({', '.join(v)})" for k, v in by_commit.items()))
    return {**data, "cells": cells, "commit": commit,
            "command": " && ".join(dict.fromkeys(c["command"] for c in cells))}


if __name__ == "__main__":
    main()
