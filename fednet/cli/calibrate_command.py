"""`fednet calibrate`: this host's training rate (FLOP/s) measured, written as a latency trace
that any run reads with `--latency FILE` (training/calibrate.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EPILOG = """\b
Examples:
  fednet calibrate                                  # ResNet-18, 3x32x32, batch 32 -> host.json
  fednet calibrate --model digits_cnn --input 1x8x8 --batch 8 --out digits_host.json
  fednet local --latency host.json ...              # clients compute at this host's rate

The FLOPs are torch's FlopCounterMode's (matrix products and convolutions, forward and
backward); a run charges each task the FLOPs its batches count divided by this rate, so a model
whose time goes to other work (tiny models, elementwise layers, Python overhead) costs more real
time than the clock says: calibrate on the model you train for the closest figure
(docs/usage.md, "Client compute"; benchmarks/bench_compute.py measures the gap)."""


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise click.BadParameter(f"'{text}' is not a shape such as 3x32x32")
    return dims


@click.command("calibrate", epilog=EPILOG)
@click.option("--model", default="resnet18", show_default=True,
              help="The fednet model whose training steps are timed (any --model name).")
@click.option("--input", "shape", default="3x32x32", show_default=True, metavar="CxHxW",
              help="One example's shape (the dataset's: digits 1x8x8, CIFAR 3x32x32).")
@click.option("--batch", default=32, show_default=True, type=click.IntRange(1),
              help="Examples a step.")
@click.option("--seconds", default=5.0, show_default=True, type=click.FloatRange(0.1),
              help="How long to time steps (at least 3 steps, after one warm-up step).")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1),
              help="torch threads (every client process trains with 1 unless --threads says).")
@click.option("--rtt", default=0.0, show_default=True, type=click.FloatRange(0.0),
              help="The profile's round-trip time in seconds.")
@click.option("--up", default="0", show_default=True,
              help="The profile's uplink: a rate (100Mbit, 12.5MB; 0: unlimited).")
@click.option("--down", default="0", show_default=True,
              help="The profile's downlink: a rate (0: unlimited).")
@click.option("--out", default="host.json", show_default=True, type=click.Path(dir_okay=False),
              help="The trace file written (a JSON list of one profile: every client's).")
def calibrate_command(model: str, shape: str, batch: int, seconds: float, threads: int,
                      rtt: float, up: str, down: str, out: str) -> None:
    """Measure this host's training rate (FLOP/s) and write it as a profile for --latency."""
    from fednet.errors import ConfigError
    from fednet.network.latency import parse_rate

    try:
        links = {k: parse_rate(v, f"--{k.split('_')[0]}") for k, v in (("up_bps", up),
                                                                        ("down_bps", down))}
        from fednet.training.calibrate import measure

        got = measure(model, _shape(shape), batch, seconds, threads)
    except (ConfigError, ValueError) as e:
        click.echo(f"fednet: error: {e}", err=True)
        sys.exit(2)
    row = {"train_flops_per_s": float(f"{got.flops_per_s:.4g}"), "rtt_s": rtt,
           **{k: 0.0 if v == float("inf") else v for k, v in links.items()}}
    Path(out).write_text(json.dumps([row], indent=1) + "\n")
    click.echo(f"{model} {'x'.join(map(str, got.input_shape))}, batch {batch}, {threads} "
               f"thread(s): {got.steps} steps of {got.flops_per_step / 1e9:.3g} GFLOP in "
               f"{got.seconds:.2f} s = {got.flops_per_s / 1e9:.3g} GFLOP/s")
    click.echo(f"wrote {out}; use it with --latency {out}")
