"""The floor under issue 56's million-client round: what one round of synthetic-fedprox (a million
clients, 1,000 a round, mclr, one local epoch) cannot go below, piece by piece, beside the plain
loop's round, all on the same cohort and interleaved in one process (the same load).

    python3 benchmarks/bench_floor.py                    # the cell of bench_batched_runs.py
    python3 benchmarks/bench_floor.py --repeats 7 --fednet-rounds 6 --json /tmp/floor.json

The cohort is fednet's own of round --round (contract.Algorithm.select: seeded by the round,
sorted ids). Pieces, each timed --repeats times (wall-clock and this process's CPU seconds),
interleaved, after a warm-up of each; medians, and their ratio to the loop's round:
  gen        the cohort's data made by data/synthetic_fedprox.client_arrays, the exact function
             fednet's clients (and the plain loop) call: every draw, the labels, the splits
  rng        numpy's standard_normal for the same count of values in one call, into an array
             made beforehand (every value client_arrays draws: 672 per client besides its
             n x 60 samples): the generator's own limit, with no per-client work at all
  rng/client the same draws, one standard_normal call per client (n x 60 each)
  train      the cohort's local training as fednet --batch-clients trains it
             (training/batched.train_batched: one block, fednet's defaults, the clients' training
             splits as tensors, seeded batch orders), nothing else
  loop       the plain loop's round on the cohort (benchmarks/benchlib/plain.fedavg_round over
             the clients' data made by client_data, then the global model tested, as
             plain_loop.py does a round)
--fednet-rounds R (0: off) also runs `fednet local --batch-clients` for R rounds (a subprocess,
between the repeats) and takes its steady round (the median of metrics.jsonl's wall_s
differences from round 1 on, as bench_batched_runs.py): the whole round beside its floor, and
"other" = its round - gen - train (the cohort, tasks, messages, ledger, clock, aggregation,
evaluation, metrics), an estimate (its cohorts are rounds 0..R-1, not --round's).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
# benchlib, and this checkout's fednet (from a worktree: not the installed one)
sys.path[:0] = [str(HERE), str(HERE.parent)]
from benchlib.plain import fedavg_round  # noqa: E402
from benchlib.util import command_line, cpu_pressure_us, machine  # noqa: E402

from fednet import rng  # noqa: E402
from fednet.config import RunConfig  # noqa: E402
from fednet.data import synthetic_fedprox as sf  # noqa: E402

DATASET = "synthetic-fedprox"
SMALL_DRAWS = 2 + sf.CLASSES * sf.DIM + sf.CLASSES + sf.DIM  # u, B; W; b; v: before the samples


def cohort(seed: int, clients: int, per_round: int, rnd: int) -> list[int]:
    """fednet's cohort of round rnd (contract.Algorithm.select on a roster of 0..clients-1)."""
    pick = rng.generator(seed, "select", rnd).choice(clients, per_round, replace=False)
    return sorted(int(c) for c in pick)


def config(a: argparse.Namespace) -> RunConfig:
    cfg = RunConfig(clients=a.clients, seed=a.seed)
    return cfg.replace(**{"data.dataset": DATASET, "data.partition": "natural",
                          "train.epochs": a.epochs})


def pieces(a: argparse.Namespace, ids: list[int]) -> dict[str, Callable[[], Any]]:
    """name -> a function doing that piece once."""
    from fednet.data import load_dataset, natural, run_partition, run_test_split
    from fednet.data.client_data import client_data
    from fednet.models import build_model
    from fednet.training.batched import ClientJob, train_batched

    cfg = config(a)
    t = cfg.train
    ds = load_dataset(DATASET)
    model = build_model("auto", ds.num_classes, ds.input_shape, dataset=DATASET, seed=a.seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loop_model = build_model("auto", ds.num_classes, ds.input_shape, dataset=DATASET, seed=a.seed)
    parts = run_partition(ds, cfg.data, a.clients, a.seed)
    test, _ = run_test_split(natural.test_dataset(ds, cfg.data, a.clients, a.seed),
                             cfg.data.exemplars, a.seed)
    tx, ty = torch.from_numpy(test.test_x), torch.from_numpy(test.test_y)
    sizes = [sf.size(a.seed, c) for c in ids]
    values = sum(sizes) * sf.DIM + SMALL_DRAWS * len(ids)
    g = np.random.default_rng(a.seed)
    buf = np.empty(values)  # (a new 200 MB array a call would add its page faults)
    data = [sf.client_arrays(a.seed, c) for c in ids]
    xy = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y, _, _ in data]

    def gen() -> Any:
        return [sf.client_arrays(a.seed, c) for c in ids]

    def raw() -> Any:
        return g.standard_normal(out=buf)

    def raw_each() -> Any:
        return [(g.standard_normal(SMALL_DRAWS), g.standard_normal((n, sf.DIM))) for n in sizes]

    def train() -> Any:
        jobs = [ClientJob(x, y, torch.Generator().manual_seed(rng.int_seed(a.seed, "batches",
                                                                           a.round, c)),
                          lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay,
                          nesterov=t.nesterov, epochs=t.epochs, batch_size=t.batch_size)
                for c, (x, y) in zip(ids, xy)]
        return train_batched(model, jobs)

    def loop() -> Any:
        clients = ((c, torch.from_numpy(cd.x), torch.from_numpy(np.ascontiguousarray(cd.y)))
                   for c, cd in ((c, client_data(ds, cfg.data, a.clients, a.seed, c, parts[c]))
                                 for c in ids))
        fedavg_round(loop_model, state, clients, t, a.seed, a.round)
        loop_model.eval()
        with torch.no_grad():
            return float((loop_model(tx).argmax(1) == ty).float().mean())

    return {"gen": gen, "rng": raw, "rng/client": raw_each, "train": train, "loop": loop}


def fednet_round(a: argparse.Namespace) -> float:
    """`fednet local --batch-clients` for --fednet-rounds rounds: its steady round."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        subprocess.run([sys.executable, "-m", "fednet.cli", "local", "--dataset", DATASET,
                        "--clients", str(a.clients), "--fraction", repr(a.per_round / a.clients),
                        "--rounds", str(a.fednet_rounds), "--seed", str(a.seed), "--epochs",
                        str(a.epochs), "--batch-clients", str(a.per_round), "-q", "--out",
                        str(out)], check=True, stdout=subprocess.DEVNULL, cwd=HERE.parent)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    walls = [r["wall_s"] for r in rows if "wall_s" in r and r.get("round", -1) >= 0]
    return statistics.median(b - x for x, b in zip(walls, walls[1:]))


def measure(a: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)  # fednet's default (--threads 1) and the plain loop's
    ids = cohort(a.seed, a.clients, a.per_round, a.round)
    fns = pieces(a, ids)
    for f in fns.values():  # warm-up: imports, first allocations, torch's first step
        f()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    fed: list[float] = []
    psi0, t0 = cpu_pressure_us(), time.perf_counter()
    for i in range(a.repeats):
        for k, f in fns.items():
            w, c = time.perf_counter(), time.process_time()
            f()
            wall[k].append(time.perf_counter() - w)
            cpu[k].append(time.process_time() - c)
        if a.fednet_rounds and i < a.fednet_repeats:
            fed.append(fednet_round(a))
        print(f"  repeat {i + 1}: " + ", ".join(f"{k} {wall[k][-1]:.3f} s" for k in fns)
              + (f", fednet round {fed[-1]:.3f} s" if len(fed) == i + 1 else ""), flush=True)
    psi1 = cpu_pressure_us()
    pressure = ((psi1 - psi0) / 1e6 / (time.perf_counter() - t0)
                if psi0 is not None and psi1 is not None else None)
    med = {k: statistics.median(v) for k, v in wall.items()}
    loop = med["loop"]
    out: dict[str, Any] = {
        "clients": a.clients, "per_round": a.per_round, "round": a.round, "epochs": a.epochs,
        "samples": sum(sf.size(a.seed, c) for c in ids),
        "train_samples": sum(sf.train_size(a.seed, c) for c in ids),
        "repeats": a.repeats, "pressure": None if pressure is None else round(pressure, 2),
        "pieces": {k: {"wall_s": round(med[k], 4), "x_loop": round(med[k] / loop, 4),
                       "cpu_s": round(statistics.median(cpu[k]), 4),
                       "cpu_x_loop": round(statistics.median(cpu[k])
                                           / statistics.median(cpu["loop"]), 4),
                       "all_s": [round(x, 4) for x in wall[k]]} for k in fns}}
    floor = med["gen"] + med["train"]
    out["floor"] = {"gen+train_s": round(floor, 4), "x_loop": round(floor / loop, 4),
                    "rng+train_s": round(med["rng"] + med["train"], 4),
                    "rng+train_x_loop": round((med["rng"] + med["train"]) / loop, 4)}
    if fed:
        r = statistics.median(fed)
        out["fednet"] = {"round_s": round(r, 4), "x_loop": round(r / loop, 4),
                         "other_s": round(r - floor, 4), "other_x_loop": round((r - floor) / loop, 4),
                         "all_s": [round(x, 4) for x in fed]}
    return out


def report(r: dict[str, Any]) -> str:
    loop = r["pieces"]["loop"]["wall_s"]
    lines = [f"cohort of round {r['round']}: {r['per_round']:,} of {r['clients']:,} clients, "
             f"{r['samples']:,} samples ({r['train_samples']:,} train), {r['epochs']} epoch(s); "
             f"medians of {r['repeats']}, CPU pressure {r['pressure']}", "",
             "| piece | s | x loop's round | CPU s | CPU x loop |", "|---|---|---|---|---|"]
    for k, v in r["pieces"].items():
        lines.append(f"| {k} | {v['wall_s']} | {v['x_loop']} | {v['cpu_s']} | {v['cpu_x_loop']} |")
    f = r["floor"]
    lines.append(f"| gen + train (the floor) | {f['gen+train_s']} | {f['x_loop']} | | |")
    lines.append(f"| rng + train | {f['rng+train_s']} | {f['rng+train_x_loop']} | | |")
    if "fednet" in r:
        fe = r["fednet"]
        lines.append(f"| fednet local --batch-clients round | {fe['round_s']} | {fe['x_loop']} | | |")
        lines.append(f"| its other (round - gen - train) | {fe['other_s']} | {fe['other_x_loop']} "
                     "| | |")
    lines.append(f"\nissue 56's target, 0.05x the loop's round: {0.05 * loop:.3f} s")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--per-round", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--round", type=int, default=1, help="whose cohort (fednet's, by round)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fednet-rounds", type=int, default=6,
                    help="rounds of the fednet local run (0: no fednet run)")
    ap.add_argument("--fednet-repeats", type=int, default=3, help="fednet runs, at most --repeats")
    ap.add_argument("--json", default=None, help="also write the result here")
    return ap


def main() -> None:
    a = parser().parse_args()
    if a.per_round > a.clients or math.isnan(a.per_round / a.clients):
        raise SystemExit("--per-round must be at most --clients")
    r = measure(a)
    r.update(machine=machine(), command=command_line())
    print(json.dumps(r))
    print(report(r))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=2, default=str) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
