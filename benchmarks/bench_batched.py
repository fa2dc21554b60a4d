"""One round of G clients' local training: the plain loop one client after another vs the same
clients trained together (training/batched.train_batched), side by side in one process (issue 56).

    python3 benchmarks/bench_batched.py --json benchmarks/results/batched.json   # the 4 cells
    python3 benchmarks/bench_batched.py --cells mclr:100 --repeats 5

Cells (MODEL:CLIENTS): mclr:100 and mclr:1000 (60 features, 10 classes, 30-50 samples a client,
as synthetic-fedprox), digits_cnn:100 (1x8x8, 10 classes, 10-20 samples a client, as digits
split over 100 clients), fedseq_cnn:20 (3x32x32, 10 classes, 40-60 samples a client, as
synthetic-cifar10 over 1,000 clients; on a CPU train_batched trains it client by client:
batched.per_client's rule); synthetic data. Every client starts from the same model and trains with
fednet's defaults (RunConfig: SGD, epochs, batch size, lr, momentum, weight decay), its batch order
from its own seeded generator. The plain loop is fednet's own (training/local.train on a model
loaded with the round's weights, one client after another); the batched round includes drawing
every client's batches (from the round's model: train_batched does not change the model). The
two are timed --repeats times each, interleaved, after a warm-up; the medians are printed
(wall-clock, and the process's CPU time, which other processes' load on a shared machine moves
less),
with their ratio, the largest difference between the two runs' final parameters (relative to the
tensor's scale), and the useful FLOP/s of each (the plain loop's FLOPs, counted by
torch.utils.flop_counter on one batch: forward and backward of the matrix products and
convolutions, the padding not counted) beside this machine's float32 matmul peak on the same
threads. One JSON line per cell, then a table; --json: the
file the dashboard reads (BENCHMARKS.md, area "scale": a row per model, its largest cell).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from fednet.config import RunConfig
from fednet.models import build_model
from fednet.training.batched import ClientJob, train_batched
from fednet.training.local import train
from fednet.training.optim import spec_of
from benchlib.util import headline_row, machine, measured, write_json

TARGETS = {("mclr", 1000): "<= 0.05x (issue 56's round)", ("digits_cnn", 100): "<= 0.33x (issue 56)",
           ("fedseq_cnn", 20): "<= 0.8x (issue 56's CIFAR round)"}
"""Issue 56's targets are for a whole fednet round; the local training here is their bulk."""

SHAPES = {"mclr": ((1, 1, 60), 10, (30, 50)), "digits_cnn": ((1, 8, 8), 10, (10, 20)),
          "fedseq_cnn": ((3, 32, 32), 10, (40, 60))}


def clients(model: str, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic (x, y) per client, sizes uniform in the cell's range."""
    shape, k, (lo, hi) = SHAPES[model]
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lo, hi + 1, (count,), generator=g).tolist()
    return [(torch.randn((n,) + shape, generator=g), torch.randint(0, k, (n,), generator=g))
            for n in sizes]


def flops_per_example(model: torch.nn.Module, shape: tuple[int, ...], batch: int) -> float:
    """Forward and backward FLOPs of one example (a batch of `batch`, divided)."""
    x = torch.zeros((batch,) + shape)
    with FlopCounterMode(display=False) as fc:
        model(x).sum().backward()
    model.zero_grad()
    return fc.get_total_flops() / batch


def matmul_peak(n: int = 1024, seconds: float = 0.5) -> float:
    """This machine's float32 matmul FLOP/s on the benchmark's threads (n x n products, the best
    of a few): the physical limit the achieved FLOP/s compare with."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def plain_round(model, state, data, t, seed):
    """Each client alone: load the round's model, fednet's local loop; the final models."""
    out = []
    for i, (x, y) in enumerate(data):
        model.load_state_dict(state)
        train(model, x, y, epochs=t.epochs, batch_size=t.batch_size, lr=t.lr, optim=spec_of(t),
              generator=torch.Generator().manual_seed(seed + i))
        out.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return out


def batched_round(model, data, t, seed):
    jobs = [ClientJob(x, y, torch.Generator().manual_seed(seed + i), lr=t.lr, momentum=t.momentum,
                      weight_decay=t.weight_decay, nesterov=t.nesterov, epochs=t.epochs,
                      batch_size=t.batch_size) for i, (x, y) in enumerate(data)]
    return train_batched(model, jobs)


def timed(fns: dict, repeats: int) -> dict:
    """Each of fns timed `repeats` times, interleaved (one of each in turn: both see the same
    load on a shared machine), after a warm-up call of each; name -> (median, times, output,
    median of the process's CPU seconds)."""
    out = {k: f() for k, f in fns.items()}  # warm-up: first calls' imports and allocations
    times: dict = {k: [] for k in fns}
    cpu: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            out[k] = f()
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: (statistics.median(times[k]), times[k], out[k], statistics.median(cpu[k]))
            for k in fns}


def cell(model_name: str, count: int, repeats: int, seed: int = 0) -> dict:
    t = RunConfig().train
    shape, k, _ = SHAPES[model_name]
    model = build_model(model_name, k, shape, seed=seed)
    state = {n: v.clone() for n, v in model.state_dict().items()}
    data = clients(model_name, count, seed)
    alone_model = copy.deepcopy(model)  # the plain loop's (it leaves the last client's in it)
    got = timed({"plain": lambda: plain_round(alone_model, state, data, t, 1000),
                 "batched": lambda: batched_round(model, data, t, 1000)}, repeats)
    (plain_s, plain_all, alone, plain_cpu), (batch_s, batch_all, together, batch_cpu) = (
        got["plain"], got["batched"])
    diff = max(float((together.params[n][i] - p).abs().max() / p.abs().max())
               for i, ps in enumerate(alone) for n, p in ps.items())
    examples = t.epochs * sum(len(y) for _, y in data)
    flops = flops_per_example(model, shape, t.batch_size) * examples
    return {"model": model_name, "clients": count, "examples": examples,
            "steps": sum(s.steps for s in together.stats), "plain_s": round(plain_s, 4),
            "batched_s": round(batch_s, 4), "ratio": round(batch_s / plain_s, 4),
            "plain_cpu_s": round(plain_cpu, 4), "batched_cpu_s": round(batch_cpu, 4),
            "cpu_ratio": round(batch_cpu / plain_cpu, 4),
            "speedup": round(plain_s / batch_s, 2), "max_rel_diff": f"{diff:.1e}",
            "plain_gflops": round(flops / plain_s / 1e9, 3),
            "batched_gflops": round(flops / batch_s / 1e9, 3),
            "plain_all_s": [round(x, 4) for x in plain_all],
            "batched_all_s": [round(x, 4) for x in batch_all], "threads": torch.get_num_threads()}


ROW_MODELS = ("mclr", "digits_cnn")
"""The models with a dashboard row of their own; another model's cells go in the last row's note
(BENCHMARKS.md's line budget; the CIFAR-shaped model's whole round has its row from
bench_batched_runs.py)."""


def headline(data: dict) -> list:
    """The dashboard's rows, one per model of ROW_MODELS (the budget of BENCHMARKS.md's lines):
    its largest cell's batched round over the plain loop's, its other cells' ratios in the note;
    the other models' cells in the last row's note."""
    cells = data.get("cells", [])
    rows = []
    extra = "".join(
        f"; {r['model']} {r['clients']:,} clients {r['ratio']}x (CPU time "
        f"{r.get('cpu_ratio', '?')}x; parameters within {r['max_rel_diff']} of scale)"
        for r in cells if r["model"] not in ROW_MODELS)
    models = [m for m in dict.fromkeys(r["model"] for r in cells) if m in ROW_MODELS]
    for i, model in enumerate(models):
        mine = sorted((r for r in cells if r["model"] == model), key=lambda r: r["clients"])
        r, others = mine[-1], mine[:-1]
        rows.append(headline_row(
            "scale", f"{model}, {r['clients']:,} clients' local training a round: batched "
            "(training/batched.py) / the plain loop, one client after another", r["ratio"], "x",
            TARGETS.get((model, r["clients"]), ""),
            f"{r['batched_s']} s against {r['plain_s']} s, medians of {len(r['plain_all_s'])}; "
            f"{r['batched_gflops']} against {r['plain_gflops']} GFLOP/s (matmul peak "
            f"{data.get('matmul_peak_gflops', '?')}); parameters within "
            f"{r['max_rel_diff']} of scale; {r['threads']} thread"
            + (f"; CPU time {r['cpu_ratio']}x" if "cpu_ratio" in r else "")
            + "".join(f"; {o['clients']:,} clients {o['ratio']}x" for o in others)
            + (extra if i == len(models) - 1 else "")))
    return measured(*rows)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="mclr:100,mclr:1000,digits_cnn:100,fedseq_cnn:20")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (fednet's default: 1)")
    ap.add_argument("--json", default=None, help="write the results here (the dashboard's file)")
    return ap


def main() -> None:
    a = parser().parse_args()
    torch.set_num_threads(a.threads)
    info = machine()
    peak = round(matmul_peak() / 1e9, 1)
    print(f"matmul peak ({a.threads} thread(s), 1024 x 1024 float32): {peak} GFLOP/s")
    rows = []
    for spec in a.cells.split(","):
        name, count = spec.split(":")
        r = cell(name, int(count), a.repeats)
        print(json.dumps(r), flush=True)
        rows.append(r)
    print("\n| cell | plain loop s | batched s | batched / plain | plain GFLOP/s | batched GFLOP/s "
          "| max rel diff |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']}, {r['clients']} clients | {r['plain_s']} | {r['batched_s']} | "
              f"{r['ratio']} ({r['speedup']}x) | {r['plain_gflops']} | {r['batched_gflops']} | "
              f"{r['max_rel_diff']} |")
    data = {"args": vars(a), "machine": info, "matmul_peak_gflops": peak, "cells": rows}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
