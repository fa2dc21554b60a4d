"""Large-tensor transfer and small-message latency over loopback tcp with fednet's codec.

Measured side by side in one run, interleaved repetition by repetition:
  memcpy     np.copyto into a preallocated array of the same size (the reference bandwidth)
  zero-copy  fednet encode -> send_multipart(copy=False) -> recv_multipart(copy=False) -> decode
  copying    the same with copy=True on both ends (a reference)
  split      (diagnostic, 10 and 100 MiB) zero-copy, the tensor sent as 4 MiB arrays (frames)
  fresh      (diagnostic) memcpy into a newly allocated array each time (page faults included)
  rawtcp     (diagnostic) the bytes over a plain TCP socket (sendall / recv_into one reused
             buffer): what the kernel's loopback costs without ZeroMQ and without allocation
for float32 tensors of 1, 10 and 100 MiB, between two processes (a DEALER sender, as a client
sending a RESULT, and a ROUTER receiver, as the server; sockets made by fednet.transport.channels,
so with fednet's socket options). Each measurement streams K messages back-to-back and stops the
clock when the receiver acknowledges that it has received and decoded all K.

Then the round-trip latency of a header-only HEARTBEAT over DEALER/ROUTER: bare ZeroMQ (one
byte, no codec), fednet's codec on both ends, and fednet's Channel (codec + byte ledger) on both
ends, each round trip timed on its own.

    python3 benchmarks/bench_transfer.py [--quick] [--json FILE]

Target (issue): zero-copy >= 50% of memcpy bandwidth; a later issue targets < 200 us for the
control round trip.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.util import (cpu_pressure_us, headline_row, loadavg, machine, measured, median,  # noqa: E402
                   pct, table, write_json)

from fednet.metrics.accounting import Ledger  # noqa: E402
from fednet.protocol import Message, MsgKind, decode, encode  # noqa: E402
from fednet.transport.channels import Channel, bind_router, connect_dealer  # noqa: E402

MiB = 1 << 20
GB = 1e9
SENDER = "c0000"
RUN_ID = "0123456789abcdef0123456789abcdef"
TARGET_RATIO = 0.5
TARGET_RTT_US = 200.0
SPLIT_MIB = 4  # diagnostic: the largest tensor also sent as several arrays of this size


# ---- receiver process ----------------------------------------------------------------------
def _receiver(conn: Any) -> None:
    """Bind a ROUTER, then obey commands that arrive on it as one JSON frame each (not fednet
    messages: their bodies are checked against each kind's schema), acknowledged the same way."""
    ctx = zmq.Context()
    sock, endpoint = bind_router(ctx, "127.0.0.1", 0)
    lst = socket.create_server(("127.0.0.1", 0))
    conn.send((endpoint, lst.getsockname()[1]))
    raw, _ = lst.accept()
    rawbuf = bytearray(0)
    chan = Channel(sock, Ledger(), "server", router=True)
    while True:
        ident, raw_cmd = sock.recv_multipart()
        cmd = json.loads(raw_cmd)
        op = cmd["op"]
        if op == "stop":
            break
        if op == "bulk":
            copy = cmd["mode"] == "copy"
            total, checksum = 0, 0.0
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(int(cmd["count"])):
                p = sock.recv_multipart(copy=copy)
                m = decode(p[1:])
                for a in m.arrays.values():
                    total += a.nbytes
                    if cmd.get("verify"):
                        checksum += float(a.sum(dtype=np.float64))
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
            ack = {"bytes": total, "sum": checksum, "minor_faults": faults}
            sock.send_multipart([ident, json.dumps(ack).encode()])
        elif op == "rawtcp":  # plain kernel socket, received into one reused buffer
            n = int(cmd["nbytes"])
            if len(rawbuf) < n:
                rawbuf = bytearray(n)
            view = memoryview(rawbuf)[:n]
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(int(cmd["count"])):
                got = 0
                while got < n:
                    got += raw.recv_into(view[got:], n - got)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
            ack = {"bytes": n * int(cmd["count"]), "minor_faults": faults}
            sock.send_multipart([ident, json.dumps(ack).encode()])
        elif op == "ping_bare":
            for _ in range(int(cmd["n"])):
                who, data = sock.recv_multipart()
                sock.send_multipart([who, data])
        elif op == "ping_codec":
            reply = Message(MsgKind.HEARTBEAT, "server", RUN_ID, round=3)
            for _ in range(int(cmd["n"])):
                p = sock.recv_multipart(copy=False)
                decode(p[1:])
                sock.send_multipart([p[0]] + encode(reply), copy=False)
        elif op == "ping_channel":
            reply = Message(MsgKind.HEARTBEAT, "server", RUN_ID, round=3)
            for _ in range(int(cmd["n"])):
                got = chan.recv()
                assert got is not None
                chan.send(reply, SENDER, route=got.route)
    raw.close()
    lst.close()
    sock.close(0)
    ctx.term()


# ---- sender side -----------------------------------------------------------------------------
class Bench:
    def __init__(self) -> None:
        c = mp.get_context("fork")
        here, there = c.Pipe()
        self.proc = c.Process(target=_receiver, args=(there,), daemon=True)
        self.proc.start()
        endpoint, raw_port = here.recv()
        self.raw = socket.create_connection(("127.0.0.1", raw_port))
        self.ctx = zmq.Context()
        self.sock = connect_dealer(self.ctx, endpoint)
        self.chan = Channel(self.sock, Ledger(), SENDER, router=False)

    def command(self, **body: Any) -> None:
        self.sock.send(json.dumps(body).encode())

    def ack(self) -> dict:
        return json.loads(self.sock.recv())

    def bulk(self, arr: np.ndarray, count: int, mode: str, verify: bool = False,
             split_mib: int = 0) -> tuple[float, dict]:
        """Seconds to stream `count` messages carrying arr, and the receiver's acknowledgement.

        split_mib > 0 sends arr as several arrays (frames) of that many MiB (views, no copy).
        """
        copy = mode == "copy"
        arrays = {"w": arr}
        if split_mib:
            step = split_mib * MiB // arr.itemsize
            arrays = {f"w{i}": arr[o:o + step] for i, o in enumerate(range(0, arr.size, step))}
        msg = Message(MsgKind.RESULT, SENDER, RUN_ID, round=1, task_id=7,
                      body={"n": 1, "body": {}}, arrays=arrays)
        self.command(op="bulk", mode=mode, count=count, verify=verify)
        t0 = time.perf_counter()
        for _ in range(count):
            self.sock.send_multipart(encode(msg), copy=copy)
        ack = self.ack()
        return time.perf_counter() - t0, ack

    def rawtcp(self, arr: np.ndarray, count: int) -> tuple[float, dict]:
        """Seconds to stream arr count times over a plain TCP socket (no ZeroMQ, no codec)."""
        view = memoryview(arr).cast("B")
        self.command(op="rawtcp", nbytes=arr.nbytes, count=count)
        t0 = time.perf_counter()
        for _ in range(count):
            self.raw.sendall(view)
        ack = self.ack()
        return time.perf_counter() - t0, ack

    def ping(self, kind: str, n: int) -> list[float]:
        """Round-trip times in microseconds of n header-only messages, one at a time."""
        self.command(op=f"ping_{kind}", n=n)
        out: list[float] = []
        msg = Message(MsgKind.HEARTBEAT, SENDER, RUN_ID, round=3)
        pc = time.perf_counter_ns
        if kind == "bare":
            for _ in range(n):
                t0 = pc()
                self.sock.send(b"h")
                self.sock.recv()
                out.append((pc() - t0) / 1e3)
        elif kind == "codec":
            for _ in range(n):
                t0 = pc()
                self.sock.send_multipart(encode(msg), copy=False)
                decode(self.sock.recv_multipart(copy=False))
                out.append((pc() - t0) / 1e3)
        else:
            for _ in range(n):
                t0 = pc()
                self.chan.send(msg, "server")
                self.chan.recv()
                out.append((pc() - t0) / 1e3)
        return out

    def close(self) -> None:
        self.command(op="stop")
        self.proc.join(10)
        self.raw.close()
        self.sock.close(linger=1000)
        self.ctx.term()


def memcpy_s(src: np.ndarray, dst: np.ndarray | None, count: int) -> float:
    """Seconds for count copies of src into dst (None: into a freshly allocated array each time,
    as a receiver that allocates its message buffer does; its pages are faulted in by the copy)."""
    t0 = time.perf_counter()
    for _ in range(count):
        np.copyto(dst if dst is not None else np.empty_like(src), src)
    return time.perf_counter() - t0


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: zero-copy against memcpy at 10 and 100 MiB and the control round
    trip's median, codec and Channel, against the targets this file's JSON names."""
    bw = {b["size_mib"]: b for b in data.get("bandwidth", [])}
    lat = data.get("latency", {})
    ratio, rtt = data.get("target_ratio_to_memcpy"), data.get("target_rtt_us")
    out = []
    for s in (10, 100):
        z = bw.get(s, {}).get("zerocopy")
        out.append(headline_row(
            "transfer", f"zero-copy transfer of a {s} MiB tensor / memcpy",
            100 * z["ratio_to_memcpy_median"] if z else None, "%",
            f">= {100 * ratio:.0f}%" if ratio else "",
            f"{z['gbps_median']:.2f} GB/s; plain TCP socket "
            f"{bw[s].get('rawtcp', {}).get('gbps_median', float('nan')):.2f} GB/s" if z else ""))
    for kind, name in (("codec", "fednet codec"), ("channel", "fednet Channel")):
        x = lat.get(kind)
        out.append(headline_row(
            "transfer", f"control round trip, {name} (median)", x["median_us"] if x else None,
            "us", f"< {rtt:.0f} us" if rtt else "", f"p99 {x['p99_us']:.0f} us; bare zmq "
            f"{lat.get('bare', {}).get('median_us', float('nan')):.0f} us" if x else ""))
    return measured(*out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke test)")
    ap.add_argument("--json", help="write the numbers to this file")
    ap.add_argument("--reps", type=int, help="repetitions per size and variant [10; quick 2]")
    ap.add_argument("--pings", type=int, help="round trips per latency variant [3000; quick 500]")
    a = ap.parse_args()
    reps = a.reps or (2 if a.quick else 10)
    pings = a.pings or (500 if a.quick else 3000)
    info = machine()
    print(f"bench_transfer  {info['date']}  git {info['git']}  nproc={info['nproc']}  load={info['loadavg_at_start']}")

    sizes_mib = [1, 10, 100]
    # Messages per measurement: about 200-400 MiB streamed per measurement.
    counts = {1: 200, 10: 30, 100: 4}
    rng = np.random.default_rng(0)
    arrays = {s: rng.standard_normal(s * MiB // 4, dtype=np.float32) for s in sizes_mib}
    dsts = {s: np.empty_like(arrays[s]) for s in sizes_mib}
    for s in sizes_mib:
        np.copyto(dsts[s], arrays[s])  # fault the pages in before timing

    b = Bench()
    t_start = time.monotonic()
    psi0 = cpu_pressure_us()
    try:
        # Correctness once per size and mode: the receiver's checksum must match ours.
        for s in sizes_mib:
            want = float(arrays[s].sum(dtype=np.float64))
            for mode in ("zerocopy", "copy"):
                _, ack = b.bulk(arrays[s], 1, mode, verify=True)
                if ack["bytes"] != arrays[s].nbytes or abs(ack["sum"] - want) > 1e-6 * max(1.0, abs(want)):
                    raise SystemExit(f"transfer check failed for {s} MiB {mode}: {ack} vs {want}")
            b.bulk(arrays[s], 2, "zerocopy")  # warm the connection and allocator
            b.bulk(arrays[s], 2, "copy")

        variants = ("memcpy", "zerocopy", "copy", "rawtcp", "fresh", "split")
        gbps: dict[tuple[int, str], list[float]] = {(s, v): [] for s in sizes_mib for v in variants}
        faults: dict[tuple[int, str], list[float]] = {(s, v): [] for s in sizes_mib for v in variants}
        for rep in range(reps):
            for s in sizes_mib:
                todo = variants if s > SPLIT_MIB else variants[:-1]
                r = rep % len(todo)
                for v in todo[r:] + todo[:r]:  # rotate who goes first
                    k = counts[s]
                    nbytes = arrays[s].nbytes * k
                    if v in ("memcpy", "fresh"):
                        dt = memcpy_s(arrays[s], dsts[s] if v == "memcpy" else None, k)
                    elif v == "rawtcp":
                        dt, ack = b.rawtcp(arrays[s], k)
                        assert ack["bytes"] == nbytes
                        faults[(s, v)].append(ack["minor_faults"] / (s * k))
                    else:
                        dt, ack = b.bulk(arrays[s], k, "copy" if v == "copy" else "zerocopy",
                                         split_mib=SPLIT_MIB if v == "split" else 0)
                        assert ack["bytes"] == nbytes
                        faults[(s, v)].append(ack["minor_faults"] / (s * k))
                    gbps[(s, v)].append(nbytes / dt / GB)

        rows = []
        results: list[dict[str, Any]] = []
        for s in sizes_mib:
            mc = gbps[(s, "memcpy")]
            rec: dict[str, Any] = {"size_mib": s, "messages_per_measurement": counts[s],
                                   "reps": reps,
                                   "memcpy": {"gbps_median": median(mc), "gbps_max": max(mc),
                                              "gbps_all": mc}}
            fr = gbps[(s, "fresh")]
            rec["memcpy_fresh_dst"] = {"gbps_median": median(fr), "gbps_all": fr}
            for v in ("zerocopy", "copy", "split", "rawtcp"):
                xs = gbps[(s, v)]
                if not xs:
                    continue
                ratios = [x / m for x, m in zip(xs, mc)]
                rec[v] = {"gbps_median": median(xs), "gbps_max": max(xs), "gbps_all": xs,
                          "ratio_to_memcpy_median": median(ratios),
                          "receiver_minor_faults_per_mib": median(faults[(s, v)])}
                label = {"zerocopy": "zero-copy", "copy": "copying",
                         "split": f"zero-copy, {SPLIT_MIB} MiB frames",
                         "rawtcp": "plain TCP socket, no zmq"}[v]
                ok = "yes" if median(ratios) >= TARGET_RATIO else "NO"
                rows.append([f"{s} MiB", label, median(mc), median(fr), median(xs), max(xs),
                             median(ratios),
                             median(faults[(s, v)]), ok if v == "zerocopy" else "(ref)"])
            rec["target_met"] = rec["zerocopy"]["ratio_to_memcpy_median"] >= TARGET_RATIO
            results.append(rec)
        print()
        print(f"Bandwidth, GB/s (1 GB = 1e9 B), median of {reps} interleaved repetitions; "
              "ratio = median of per-repetition (variant / memcpy of the same size)")
        print("memcpy = np.copyto into a preallocated array; memcpy fresh = into a newly "
              "allocated one (page faults included)")
        print(table(["tensor", "variant", "memcpy", "memcpy fresh", "GB/s", "best", "/memcpy",
                     "rx faults/MiB",
                     f">= {TARGET_RATIO:.0%}"], rows))

        lat: dict[str, Any] = {}
        lrows = []
        for kind in ("bare", "codec", "channel"):
            b.ping(kind, 200)  # warm-up
        for kind in ("bare", "codec", "channel"):
            us = b.ping(kind, pings)
            lat[kind] = {"n": pings, "median_us": median(us), "p10_us": pct(us, 0.10),
                         "p90_us": pct(us, 0.90), "p99_us": pct(us, 0.99), "min_us": min(us)}
            lrows.append([{"bare": "bare zmq, 1 byte", "codec": "fednet codec (HEARTBEAT)",
                           "channel": "fednet Channel (codec+ledger)"}[kind],
                          lat[kind]["median_us"], lat[kind]["p10_us"], lat[kind]["p90_us"],
                          lat[kind]["p99_us"],
                          "yes" if lat[kind]["median_us"] < TARGET_RTT_US else "NO"])
        print()
        print(f"Control round trip DEALER->ROUTER->DEALER over loopback tcp, microseconds, "
              f"{pings} round trips each")
        print(table(["message", "median", "p10", "p90", "p99", f"< {TARGET_RTT_US:.0f} us"], lrows))
    finally:
        b.close()
    elapsed = time.monotonic() - t_start
    psi1 = cpu_pressure_us()
    pressure = (psi1 - psi0) / 1e6 / elapsed if psi0 is not None and psi1 is not None else None
    print(f"\nmeasured in {elapsed:.0f}s; load average now {loadavg()}; some task of the machine "
          f"waited for a CPU {'-' if pressure is None else f'{pressure:.0%}'} of that time (PSI)")
    write_json(a.json, {"benchmark": "transfer", "machine": info, "quick": a.quick,
                        "elapsed_s": elapsed, "loadavg_at_end": loadavg(), "cpu_pressure": pressure,
                        "target_ratio_to_memcpy": TARGET_RATIO, "bandwidth": results,
                        "target_rtt_us": TARGET_RTT_US, "latency": lat}, headline)


if __name__ == "__main__":
    main()
