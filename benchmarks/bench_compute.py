"""The clock's client compute (FLOPs / the host's FLOP/s) against the CPU seconds the same
training really takes, side by side (issue 52).

    python3 benchmarks/bench_compute.py [--profile host.json] [--reps 3] [--json F]

The host's rate is `fednet calibrate`'s measurement (ResNet-18 3x32x32 batch 32, 1 thread;
--profile: a trace file's train_flops_per_s instead). Each workload is one client's training as
fednet runs it (training/local.train or training/dpsgd.train_private, 1 torch thread, inside a
training/flops Meter as core/executor opens one): mclr and the digits CNN on digits-shaped data
(1x8x8, batch 8), ResNet-18 on CIFAR-shaped data (3x32x32, batch 32), and DP-SGD on the digits
CNN. The simulated seconds are the meter's FLOPs / the rate (what the clock charges); the
measured ones are the process's CPU seconds (time.process_time, median of --reps); the ratio
simulated / measured is 1 where the clock is right.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fednet.models import build_model
from fednet.training import flops
from fednet.training.local import train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

WORKLOADS = (  # name, model, example shape, batch, how it trains
    ("mclr", "mclr", (1, 8, 8), 8, "plain"),
    ("digits CNN", "digits_cnn", (1, 8, 8), 8, "plain"),
    ("ResNet-18", "resnet18", (3, 32, 32), 32, "plain"),
    ("digits CNN, DP-SGD", "digits_cnn", (1, 8, 8), 8, "dpsgd"),
)


def _rate(a: argparse.Namespace) -> tuple[float, str]:
    if a.profile:
        from fednet.config import LatencyConfig
        from fednet.network import latency

        p = latency.profiles(LatencyConfig(file=a.profile), 1, 0)[0]
        return p.train_flops_per_s, f"{a.profile}"
    from fednet.training.calibrate import measure

    c = measure(seconds=a.calibrate_seconds)
    return c.flops_per_s, (f"fednet calibrate: {c.model} {'x'.join(map(str, c.input_shape))} "
                           f"batch {c.batch}, {c.steps} steps in {c.seconds:.2f} s")


def _once(model_name: str, shape: tuple[int, ...], batch: int, how: str, n: int
          ) -> tuple[int, float, int]:
    """(FLOPs counted, CPU seconds, examples trained) of one epoch over n examples."""
    model = build_model(model_name, 10, shape, seed=0)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn((n, *shape), generator=g), torch.randint(0, 10, (n,), generator=g)
    if how == "dpsgd":
        from fednet.training.dpsgd import train_private
        from fednet.training.optim import OptimSpec

        def run() -> Any:
            return train_private(model, x, y, epochs=1, batch_size=batch,
                                 spec=OptimSpec("sgd", 0.05, 0.0, 0.0, nesterov=False),
                                 generator=torch.Generator().manual_seed(1),
                                 noise_generator=torch.Generator().manual_seed(2),
                                 noise=1.0, clip=1.0)
    else:
        def run() -> Any:
            return train(model, x, y, epochs=1, batch_size=batch, lr=0.05,
                         generator=torch.Generator().manual_seed(1))
    with flops.metered() as m:
        t = time.process_time()
        stats = run()
        cpu = time.process_time() - t
    return m.flops, cpu, stats.samples


def measure_all(a: argparse.Namespace, rate: float) -> list[dict[str, Any]]:
    rows = []
    for name, model, shape, batch, how in WORKLOADS:
        n = a.resnet_examples if model == "resnet18" else a.examples
        _once(model, shape, batch, how, min(n, 2 * batch))  # warm-up: kernels, Opacus import
        runs = [_once(model, shape, batch, how, n) for _ in range(a.reps)]
        counted, _, samples = runs[0]
        cpu = statistics.median(r[1] for r in runs)
        sim = counted / rate
        rows.append({"workload": name, "model": model, "how": how, "examples": samples,
                     "flops": counted, "flops_per_example": counted / max(samples, 1),
                     "cpu_s": cpu, "cpu_s_runs": [r[1] for r in runs], "sim_s": sim,
                     "sim_over_cpu": sim / cpu if cpu > 0 else None})
    return rows


def headline(data: dict) -> list:
    """The dashboard's rows (three: its line budget): simulated over measured compute for
    ResNet-18 and for the digits CNN (mclr in its note), and DP-SGD's cost on the clock."""
    rows = {r["workload"]: r for r in data.get("rows", [])}
    rate = data.get("rate", 0) / 1e9

    def ratio(name: str, extra: str = "") -> dict | None:
        r = rows.get(name)
        return None if r is None else headline_row(
            "network model", f"client compute on the clock / measured CPU s, {name} (host profile)",
            r.get("sim_over_cpu"), "x", "0.75-1.25x (issue 52)",
            f"{r['sim_s']:.3g} s simulated, {r['cpu_s']:.3g} s CPU, {r['examples']} examples of "
            f"{r['flops_per_example']:.3g} FLOP at {rate:.3g} GFLOP/s{extra}")
    m = rows.get("mclr")
    out = [ratio("ResNet-18"), ratio("digits CNN", f"; mclr {m['sim_over_cpu']:.3g}x" if m else "")]
    dp, plain = rows.get("digits CNN, DP-SGD"), rows.get("digits CNN")
    if dp and plain and plain["cpu_s"] > 0:
        clock = (dp["sim_s"] / dp["examples"]) / (plain["sim_s"] / plain["examples"])
        real = (dp["cpu_s"] / dp["examples"]) / (plain["cpu_s"] / plain["examples"])
        out.append(headline_row(
            "network model", "DP-SGD / plain training, digits CNN, per example: on the clock",
            clock, "x", "within 25 % of measured (issue 52)", f"measured {real:.2f}x"))
    return measured(*out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a trace file whose train_flops_per_s is the host's rate "
                                      "(default: measure it as fednet calibrate does)")
    ap.add_argument("--calibrate-seconds", type=float, default=5.0)
    ap.add_argument("--examples", type=int, default=1437, help="digits workloads' examples "
                                                                "(digits' training set)")
    ap.add_argument("--resnet-examples", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    torch.set_num_threads(1)  # as every client process trains
    rate, source = _rate(a)
    print(f"host rate {rate / 1e9:.3g} GFLOP/s ({source})")
    rows = measure_all(a, rate)
    print(table(["workload", "examples", "FLOP/example", "CPU s", "simulated s", "sim / CPU"],
                [[r["workload"], r["examples"], f"{r['flops_per_example']:.4g}",
                  f"{r['cpu_s']:.3f}", f"{r['sim_s']:.3f}", f"{r['sim_over_cpu']:.3f}"]
                 for r in rows]))
    data = {"machine": machine(), "args": vars(a), "rate": rate, "rate_source": source,
            "rows": rows}
    for r in headline(data)[2:]:
        print(f"{r['metric']}: {r['value']:.2f}x ({r['note']})")
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
