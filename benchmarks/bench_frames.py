"""One large model over loopback: one frame per array (protocol 1) vs 256 KiB frames (protocol 2).

    python benchmarks/bench_frames.py [--mb 44.8] [--repeats 7]

Both variants run alternately in one process through fednet's Channel (encode, zmq, decode and,
for chunks, the join into one buffer), so machine noise hits both alike. Prints the median time
per message and the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import zmq

import fednet.protocol.codec as codec
from fednet.metrics.accounting import Ledger
from fednet.protocol import Message, MsgKind
from fednet.transport.channels import Channel, bind_router, connect_dealer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=44.8, help="model size in MB (44.8: ResNet-18)")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    ctx = zmq.Context()
    srv, ep = bind_router(ctx, "127.0.0.1", 0)
    cli = connect_dealer(ctx, ep)
    s, c = Channel(srv, Ledger(), "server", True), Channel(cli, Ledger(), "c0000", False)
    model = np.random.default_rng(0).standard_normal(int(a.mb * 1e6 / 4)).astype(np.float32)
    body = {"n": 1, "body": {}}

    def once() -> float:
        t0 = time.perf_counter()
        c.send(Message(MsgKind.RESULT, "c0000", "r", 0, 1, 0.0, body, {"w": model}), "server")
        got = s.recv()
        assert got is not None and got.msg.arrays["w"].shape == model.shape
        return time.perf_counter() - t0

    variants = {"one frame per array": 1 << 31, "256 KiB frames": codec.CHUNK_BYTES}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(a.repeats):
        for name, chunk in variants.items():
            codec.CHUNK_BYTES = chunk
            times[name].append(once())
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, m in med.items():
        print(f"{k:22s} median {m * 1000:7.1f} ms  {model.nbytes / m / 1e9:5.2f} GB/s")
    print(f"ratio (chunks / one frame): {med['256 KiB frames'] / med['one frame per array']:.2f}")
    for sock in (cli, srv):
        sock.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
