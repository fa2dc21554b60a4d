"""What a round is made of, for bench_many.py's big part: the round's time split into transfer,
decode, aggregation and compute from the events benchmarks/round_timing_plugin.py writes in every
process, against what loopback TCP moves between two processes in the same run (plain sockets)
and the loopback interface's busy time meanwhile."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20


def tcp_throughput(total: int = 512 * MiB, chunk: int = 256 * 1024) -> float:
    """Bytes per second through loopback TCP between two processes (plain sockets)."""
    return tcp_transfer(total, chunk)[0]


def tcp_transfer(total: int, chunk: int = 256 * 1024) -> tuple[float, float]:
    """(bytes per second, CPU seconds of sender and receiver) for `total` bytes through
    loopback TCP between two processes (plain sockets, `chunk`-byte sends)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    pid = os.fork()
    if pid == 0:  # the sender
        c = socket.create_connection(srv.getsockname())
        buf = memoryview(bytearray(chunk))
        for _ in range(total // chunk):
            c.sendall(buf)
        c.close()
        os._exit(0)
    conn, _ = srv.accept()
    buf = bytearray(chunk)
    got, c0, t = 0, time.thread_time(), time.monotonic()
    while got < total:
        n = conn.recv_into(buf)
        if not n:
            break
        got += n
    dt, cpu = time.monotonic() - t, time.thread_time() - c0
    _, _, ru = os.wait4(pid, 0)
    conn.close()
    srv.close()
    return got / dt, cpu + ru.ru_utime + ru.ru_stime


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1e18
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def split_round(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The round's time split from the plugin's events (one round)."""
    rnd = next(e for e in events if e["ev"] == "round")
    sent = {(e["kind"], e["task"]): e for e in events if e["ev"] == "send"}
    got = {(e["kind"], e["task"]): e for e in events if e["ev"] == "recv"}
    spans = {"TASK": [], "RESULT": []}
    moved = 0
    for key, s in sent.items():
        if key[0] in spans and key in got:
            spans[key[0]].append((s["t"], got[key]["t"]))
            moved += s["nbytes"]
    dec = {k: sum(e["dt"] for e in events if e["ev"] == "recv" and e["kind"] == k)
           for k in ("TASK", "RESULT")}
    dec_cpu = {k: sum(e.get("cpu", 0) for e in events if e["ev"] == "recv" and e["kind"] == k)
               for k in ("TASK", "RESULT")}
    comp = [e for e in events if e["ev"] == "compute"]
    agg = [e for e in events if e["ev"] == "aggregate"]
    sends = [e for e in events if e["ev"] == "send" and e["kind"] in spans]
    t0, t1 = rnd["t"], rnd["t"] + rnd["dt"]
    by_pid: dict[int, list[float]] = {}
    for e in events:
        if t0 <= e["t"] <= t1 + 1.0:
            by_pid.setdefault(e["pid"], []).append(e["pcpu"])
    proc_cpu = sum(max(v) - min(v) for v in by_pid.values())
    return {"round_s": rnd["dt"], "process_cpu_s": proc_cpu,
            "latency_down_s": _union(spans["TASK"]),
            "latency_up_s": _union(spans["RESULT"]),
            "latency_s": _union(spans["TASK"] + spans["RESULT"]),
            "decode_clients_s": dec["TASK"], "decode_server_s": dec["RESULT"],
            "decode_clients_cpu_s": dec_cpu["TASK"], "decode_server_cpu_s": dec_cpu["RESULT"],
            "encode_send_cpu_s": sum(e.get("cpu", 0) for e in sends),
            "aggregation_s": sum(e["dt"] for e in agg),
            "aggregation_cpu_s": sum(e.get("cpu", 0) for e in agg),
            "compute_sum_s": sum(e["dt"] for e in comp),
            "compute_cpu_s": sum(e.get("cpu", 0) for e in comp),
            "compute_span_s": max(e["t"] + e["dt"] for e in comp) - min(e["t"] for e in comp),
            "bytes_moved": moved, "messages": sum(len(v) for v in spans.values()),
            "server_rss_round_start": rnd.get("rss0", 0),
            "server_rss_max_aggregate": max((e.get("rss", 0) for e in agg), default=0),
            "server_rss_growth": max((e.get("rss", 0) for e in agg), default=0)
            - rnd.get("rss0", 0)}


class LoopbackMeter:
    """Samples the loopback interface's byte counter every 20 ms in a thread: the time during
    which it moved data at over 5% of the measured TCP throughput, and the bytes then."""

    def __init__(self, tput: float, every: float = 0.02) -> None:
        import threading

        self.tput, self.every = tput, every
        self.busy_s, self.bytes = 0.0, 0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    @staticmethod
    def _lo() -> int:
        for line in Path("/proc/net/dev").read_text().splitlines():
            if line.strip().startswith("lo:"):
                return int(line.split(":", 1)[1].split()[0])  # received bytes
        return 0

    def _run(self) -> None:
        last, t_last = self._lo(), time.monotonic()
        while not self._stop.wait(self.every):
            now, t = self._lo(), time.monotonic()
            if now - last > 0.05 * self.tput * (t - t_last):
                self.busy_s += t - t_last
                self.bytes += now - last
            last, t_last = now, t

    def stop(self) -> None:
        self._stop.set()
        self._th.join()
