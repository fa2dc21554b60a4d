"""`fednet calibrate`: this host's training rate (FLOP/s, training/calibrate.py) and protocol
rates (X25519, HKDF, AES-GCM, AES-CTR bytes, Shamir, noise draws; secagg/rates.py) measured and
written as a latency trace that any run reads with `--latency FILE`; `--server-out FILE` also
writes every operation's rate (network/ops.RATES) as a server profile for `--server-profile`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EPILOG = """\b
Examples:
  fednet calibrate                                  # ResNet-18, 3x32x32, batch 32 -> host.json
  fednet calibrate --model digits_cnn --input 1x8x8 --batch 8 --out digits_host.json
  fednet calibrate --server-out server.json         # and this host as the server
  fednet local --latency host.json --server-profile server.json ...

The protocol rates are timed on the primitives fednet runs (secagg/crypto.py, secagg/shamir.py,
numpy's normal draws, sums and float64 products), each a fixed amount after a warm-up.

The FLOPs are torch's FlopCounterMode's (matrix products and convolutions, forward and
backward); the seconds per operation (s_per_op) are timed on mclr's training (1x8x8, batch 8),
whose time is its dispatched operations' fixed cost, and a convolution call's further fixed
cost (s_per_conv) on the digits CNN's. A run charges each task the FLOPs its batches count
divided by the rate plus the operations and convolutions they dispatch at those costs; a model
whose time goes elsewhere costs another real time than the clock says: calibrate on the model
you train for the closest figure (docs/usage.md, "Client compute"; benchmarks/bench_compute.py measures
the gap)."""


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
@click.option("--ops-scale", default=1.0, show_default=True, type=click.FloatRange(0.0, min_open=True),
              help="Size of the protocol workloads (1: about 0.4 s each; less: faster, noisier).")
@click.option("--server-out", type=click.Path(dir_okay=False), default=None,
              help="Also write every operation's rate here: a server profile for "
                   "--server-profile FILE.")
@click.option("--out", default="host.json", show_default=True, type=click.Path(dir_okay=False),
              help="The trace file written (a JSON list of one profile: every client's).")
def calibrate_command(model: str, shape: str, batch: int, seconds: float, threads: int,
                      rtt: float, up: str, down: str, ops_scale: float, server_out: str | None,
                      out: str) -> None:
    """Measure this host's training rate (FLOP/s) and protocol rates and write them as a profile
    for --latency (and --server-out: a server profile for --server-profile)."""
    from fednet.errors import ConfigError
    from fednet.network.latency import parse_rate
    from fednet.opcount import CLIENT_RATES, OPS

    try:
        links = {k: parse_rate(v, f"--{k.split('_')[0]}") for k, v in (("up_bps", up),
                                                                        ("down_bps", down))}
        from fednet.secagg import rates as host_rates
        from fednet.training.calibrate import measure

        got = measure(model, _shape(shape), batch, seconds, threads)
        ops = host_rates.measure(OPS if server_out else tuple(r.removesuffix("_per_s") for r in CLIENT_RATES),
                                 ops_scale)
    except (ConfigError, ValueError) as e:
        click.echo(f"fednet: error: {e}", err=True)
        sys.exit(2)
    rate = {f"{op}_per_s": float(f"{r.per_s:.4g}") for op, r in ops.items()}
    row = {"train_flops_per_s": float(f"{got.flops_per_s:.4g}"), "rtt_s": rtt,
           **{k: 0.0 if v == float("inf") else v for k, v in links.items()},
           **{k: rate[k] for k in CLIENT_RATES}, "s_per_op": float(f"{got.s_per_op:.4g}"),
           "s_per_conv": float(f"{got.s_per_conv:.4g}")}
    Path(out).write_text(json.dumps([row], indent=1) + "\n")
    click.echo(f"{model} {'x'.join(map(str, got.input_shape))}, batch {batch}, {threads} "
               f"thread(s): {got.steps} steps of {got.flops_per_step / 1e9:.3g} GFLOP in "
               f"{got.seconds:.2f} s = {got.flops_per_s / 1e9:.3g} GFLOP/s")
    ops_w, conv_w = got.small
    click.echo(f"  operations: {ops_w.steps} steps of mclr 1x8x8 batch 8 ({ops_w.work.ops} "
               f"operations each) in {ops_w.seconds:.2f} s = {got.s_per_op * 1e6:.3g} us an "
               f"operation; convolutions: {conv_w.steps} steps of the digits CNN ("
               f"{conv_w.work.convs} each) in {conv_w.seconds:.2f} s = "
               f"{got.s_per_conv * 1e6:.3g} us a convolution")
    for op, r in ops.items():
        click.echo(f"  {op:8s} {r.what}: {r.seconds:.3f} s = {r.per_s:.4g} {UNITS.get(op, '/s')}")
    click.echo(f"wrote {out}; use it with --latency {out}")
    if server_out:
        server = {"source": f"fednet calibrate on this host ({len(rate)} operations)", **rate}
        Path(server_out).write_text(json.dumps(server, indent=1) + "\n")
        click.echo(f"wrote {server_out}; use it with --server-profile {server_out}")


UNITS = {"prg": "bytes/s", "gemm": "FLOP/s", "shamir": "multiply-adds/s",
         "stream": "element ops/s", "noise": "draws/s"}
