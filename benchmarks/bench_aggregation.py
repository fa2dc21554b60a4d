"""Peak server memory while aggregating, against the number of clients per round: results
streamed into the running sums as they arrive (what fednet does) versus all results held until
the round ends (the previous behaviour), measured side by side in one run.

    python3 benchmarks/bench_aggregation.py [--clients 10 50 100 200] [--params 2600000]
                                            [--senders 4] [--json F]

Each measurement runs in a fresh process: a real ROUTER socket and fednet's Channel, codec and
FedAvg; `--senders` forked processes send one RESULT per client (a model of `--params` float32
parameters in 20 arrays, as large as ResNet-9 by default) over TCP on loopback. The server's peak
resident memory above its level before the first result (Linux VmHWM, reset through
/proc/self/clear_refs) is reported in MiB and in models (MiB / model size). The two modes must
produce bit-identical global models (checked).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402


def _shapes(params: int) -> list[tuple[int, ...]]:
    per = params // 20
    return [(per // 64, 64) for _ in range(20)]


def _sender(endpoint: str, cids: list[int], params: int, gap_s: float) -> None:
    from fednet.protocol import encode
    from fednet.types import Task
    from fednet.core.wire import result_message

    ctx = zmq.Context()
    for cid in cids:
        rng = np.random.default_rng(cid)
        arrays = {f"layer{i}": rng.standard_normal(s).astype(np.float32)
                  for i, s in enumerate(_shapes(params))}
        msg = result_message(cid, Task(cid + 1, 0, [cid]), arrays, {"loss": 1.0}, 10 + cid, 0.0, "")
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, f"c{cid:04d}".encode())
        s.connect(endpoint)
        s.send_multipart(encode(msg), copy=False)
        s.close(linger=-1)
        time.sleep(gap_s)  # the next client of this sender is still training
    ctx.term()


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def measure(mode: str, k: int, params: int, senders: int, gap_s: float, out: mp.Queue) -> None:
    """One (mode, clients) point in this process; puts (peak bytes above start, model digest)."""
    from fednet.algorithms import build
    from fednet.config import RunConfig
    from fednet.metrics.accounting import Ledger
    from fednet.transport.channels import Channel, bind_router
    from fednet.core.wire import message_result

    algo = build(RunConfig().replace(clients=k))
    algo.setup({f"layer{i}": np.zeros(s, np.float32) for i, s in enumerate(_shapes(params))})
    ctx = zmq.Context()
    sock, endpoint = bind_router(ctx, "127.0.0.1", 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    chan = Channel(sock, Ledger(), "server", router=True)
    procs = [mp.get_context("fork").Process(target=_sender, args=(endpoint, list(range(i, k, senders)),
                                                                   params, gap_s)) for i in range(senders)]
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current level
    start = _vm("VmRSS")
    for p in procs:
        p.start()
    results = []
    while len(results) < k:
        got = chan.recv()
        if got is None:
            continue
        msg = got.msg  # a Received (it was a (route, msg, size) tuple)
        r = message_result(msg, int(msg.sender[1:]), 0.0)
        del msg, got
        if mode == "streamed":
            algo.absorb(r)
        results.append(r)
    algo.aggregate_round(0, results, [])
    peak = _vm("VmHWM") - start
    for p in procs:
        p.join()
    digest = float(sum(float(v.astype(np.float64).sum()) for v in algo.global_arrays.values()))
    out.put((peak, digest))
    sock.close(linger=0)
    ctx.term()


def headline(data: dict) -> list[dict]:
    """The dashboard's rows: the server's peak while folding streamed results, in models, at the
    most clients per round, for the longest and the shortest sender pause."""
    pts, model = data.get("points", []), data.get("model_bytes") or 1
    gaps = sorted({p["gap_ms"] for p in pts}, reverse=True)
    out = []
    for gap in dict.fromkeys(gaps[:1] + gaps[-1:]):
        p = max((p for p in pts if p["gap_ms"] == gap), key=lambda p: p["clients"])
        when = "results arrive as clients finish" if gap else "all results at once"
        out.append(headline_row(
            "scale", f"server peak while aggregating, {p['clients']} clients a round, {when}",
            p["streamed"] / model, "models", "",
            f"all held: {p['held'] / model:.1f} models; {model / 2**20:.1f} MiB model; "
            f"same model: {'yes' if p['same_model'] else 'NO'}"))
    return measured(*out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100, 200])
    ap.add_argument("--params", type=int, default=2_600_000)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--gap-ms", type=float, nargs="+", default=[0.0, 50.0],
                    help="pause of each sender between two results (0: all at once)")
    ap.add_argument("--json")
    args = ap.parse_args()
    model = 4 * 20 * (args.params // 20 // 64) * 64
    rows, data = [], []
    for gap in args.gap_ms:
        for k in args.clients:
            point = {"clients": k, "gap_ms": gap}
            for mode in ("held", "streamed"):
                ctx = mp.get_context("fork")
                q: mp.Queue = ctx.Queue()
                p = ctx.Process(target=measure, args=(mode, k, args.params, args.senders,
                                                      gap / 1000, q))
                p.start()
                peak, digest = q.get(timeout=600)
                p.join()
                point[mode] = peak
                point[mode + "_digest"] = digest
            point["same_model"] = point["held_digest"] == point["streamed_digest"]
            data.append(point)
            rows.append([f"{gap:g}", k, f"{point['held'] / 2**20:.0f}",
                         f"{point['held'] / model:.1f}", f"{point['streamed'] / 2**20:.0f}",
                         f"{point['streamed'] / model:.1f}",
                         f"{point['held'] / max(point['streamed'], 1):.1f}x", point["same_model"]])
            print(f"gap {gap:g} ms, {k} clients done", file=sys.stderr, flush=True)
    print(f"model: {model / 2**20:.1f} MiB ({args.params:,} float32 parameters in 20 arrays)")
    print(f"{args.senders} senders; gap: each sender's pause between two results")
    print(table(["gap ms", "clients/round", "held MiB", "held models", "streamed MiB", "streamed models",
                 "held/streamed", "same model"], rows))
    res = {"machine": machine(), "model_bytes": model, "points": data}
    write_json(args.json, res, headline(res))


if __name__ == "__main__":
    main()
