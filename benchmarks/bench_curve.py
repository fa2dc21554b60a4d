"""Throughput cost of --secure (CURVE) on loopback, plain and encrypted side by side.

    python3 benchmarks/bench_curve.py [--mib 10] [--reps 10] [--json F]

A 10 MiB float32 tensor goes DEALER -> ROUTER through fednet's codec and channels, alternating
plaintext and CURVE (keys from fednet.transport.security) in one run; prints GB/s and the ratio.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from fednet.metrics.accounting import Ledger
from fednet.protocol import Message, MsgKind
from fednet.transport import security
from fednet.transport.channels import Channel, bind_router, connect_dealer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, machine, measured, write_json  # noqa: E402


def headline(data: dict) -> list:
    """The dashboard's row: how much CURVE costs in throughput."""
    p, c = data.get("plaintext_gbps_median"), data.get("curve_gbps_median")
    return measured(headline_row(
        "transfer", f"--secure (CURVE) throughput cost, a {data.get('args', {}).get('mib')} MiB "
        "tensor over loopback", p / c if p and c else None, "x", "",
        f"plaintext {p:.2f} GB/s, CURVE {c:.2f} GB/s" if p and c else ""))


def once(ctx: zmq.Context, keys: security.Keys | None, arr: np.ndarray, n: int) -> float:
    srv_setup = (lambda s: security.as_server(s, keys.server_public, keys.server_secret)) if keys else None
    cli_setup = (lambda s: security.as_client(s, keys.server_public, keys)) if keys else None
    rsock, ep = bind_router(ctx, "127.0.0.1", 0, setup=srv_setup)
    dsock = connect_dealer(ctx, ep, cli_setup)
    rx, tx = Channel(rsock, Ledger(), "server", True), Channel(dsock, Ledger(), "c0000", False)
    msg = Message(MsgKind.RESULT, "c0000", "r", 0, 1, 0.0, {"n": 1, "body": {}}, {"w": arr})
    tx.send(msg, "server")          # warm-up: handshake, buffers
    rx.recv()
    t = time.perf_counter()
    for _ in range(n):
        tx.send(msg, "server")
        rx.recv()
    dt = time.perf_counter() - t
    dsock.close(0)
    rsock.close(0)
    return n * arr.nbytes / dt / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=10)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    info = machine()
    d = tempfile.mkdtemp()
    security.init_keys(d)
    security.add_key(d, "bench", "0")
    client = security.load_keys(d, need_server_secret=False, name="bench")
    keys = dataclasses.replace(security.load_keys(d, need_server_secret=True),
                               client_public=client.client_public,
                               client_secret=client.client_secret)
    ctx = zmq.Context()
    auth = security.start_authenticator(ctx)  # any key that completes the CURVE handshake
    arr = np.random.default_rng(0).standard_normal(a.mib * 2**18).astype(np.float32)
    plain, curve = [], []
    for _ in range(a.reps):
        plain.append(once(ctx, None, arr, 5))
        curve.append(once(ctx, keys, arr, 5))
    auth.stop()
    p, c = statistics.median(plain), statistics.median(curve)
    print(f"{a.mib} MiB tensor, median of {a.reps} interleaved repetitions of 5 messages")
    print(f"plaintext {p:.2f} GB/s   CURVE {c:.2f} GB/s   CURVE costs {p / c:.1f}x throughput")
    data = {"machine": info, "args": vars(a), "plaintext_gbps": plain, "curve_gbps": curve,
            "plaintext_gbps_median": p, "curve_gbps_median": c}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
