"""One large model over loopback: one frame per array (protocol 1) vs 256 KiB frames (protocol 2).

    python benchmarks/bench_frames.py [--mb 44.8] [--repeats 7] [--json F]

Both variants run alternately in one process through fednet's Channel (encode, zmq, decode and,
for chunks, the join into one buffer), so machine noise hits both alike. Prints the median time
per message and the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import zmq

import fednet.protocol.codec as codec
from fednet.metrics.accounting import Ledger
from fednet.protocol import Message, MsgKind
from fednet.transport.channels import Channel, bind_router, connect_dealer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, machine, measured, write_json  # noqa: E402


def headline(data: dict) -> list:
    """The dashboard's row: 256 KiB frames against one frame per array, time per message."""
    med, mb = data.get("median_s", {}), data.get("args", {}).get("mb")
    one, chunks = med.get("one frame per array"), med.get("256 KiB frames")
    return measured(headline_row(
        "transfer", f"a {mb} MB model in 256 KiB frames / in one frame per array, time per "
        "message", chunks / one if one and chunks else None, "x", "",
        f"{data.get('model_bytes', 0) / chunks / 1e9:.2f} GB/s against "
        f"{data.get('model_bytes', 0) / one / 1e9:.2f} GB/s" if one and chunks else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=44.8, help="model size in MB (44.8: ResNet-18)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    info = machine()
    ctx = zmq.Context()
    # one frame per array needs frames past fednet's cap on a frame (MAX_FRAME_BYTES, 0c84d58)
    srv, ep = bind_router(ctx, "127.0.0.1", 0, setup=lambda s: s.setsockopt(zmq.MAXMSGSIZE, -1))
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
    data = {"machine": info, "args": vars(a), "model_bytes": model.nbytes, "times_s": times,
            "median_s": med}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
