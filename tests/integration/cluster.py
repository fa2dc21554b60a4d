"""The netns tests' cluster harness: a server in the namespace srv and `fednet clients` in h1 and
h2 (tests/integration/netns.py's Lan), their output drained, the links' byte counters read
before and after (test_netns.py, test_netns_shaped.py)."""
from __future__ import annotations

import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.integration.conftest import Fednet, fednet_cmd, jsonl, read_json, server_endpoint
from tests.integration.netns import Lan

MODEL_BYTES = 61_864  # the DigitsNet parameters as float32
ROUNDS = 3
RUN = ["--clients", "4", "--rounds", str(ROUNDS), "--epochs", "1", "--batch-size", "16",
       "--latency", "none", "--register-timeout", "60", "--round-timeout", "60", "-q"]
FEDSEQ = ["--algo", "fedseq", "--min-samples", "1400", "--max-clients", "4",
          "--superclient-fraction", "1.0", "--pretrain-epochs", "1"]  # one ring through all 4
CLIENT_IDS = {"h1": "0-1", "h2": "2-3"}
CAP_MBIT = 1.0


class Sampler:
    """Samples the rx/tx byte counters of one host's eth0 every `period` s in a thread."""

    def __init__(self, net: Lan, host: str, period: float = 0.1) -> None:
        self.net, self.host, self.period = net, host, period
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            c = self.net.counters(self.host)
            self.samples.append((time.monotonic(), c["rx_bytes"], c["tx_bytes"]))
            self._stop.wait(self.period)

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def peak_mbit(self, window_s: float = 1.0) -> tuple[float, float]:
        """The highest (rx, tx) rate over any window of at least window_s, in Mbit/s."""
        best = [0.0, 0.0]
        j = 0
        s = self.samples
        for i in range(len(s)):
            while j + 1 < i and s[i][0] - s[j + 1][0] >= window_s:
                j += 1
            dt = s[i][0] - s[j][0]
            if dt >= window_s:
                for k in (0, 1):
                    best[k] = max(best[k], (s[i][1 + k] - s[j][1 + k]) * 8 / dt / 1e6)
        return best[0], best[1]


@dataclass
class Cluster:
    """What one server + two client hosts run left behind."""

    summary: dict[str, Any]
    clients: list[dict[str, Any]]
    endpoint: str
    took_s: float
    link: dict[str, dict[str, int]] = field(default_factory=dict)   # host -> eth0 deltas
    ports: dict[str, dict[str, int]] = field(default_factory=dict)  # bridge port -> deltas
    stderr: dict[str, str] = field(default_factory=dict)


def _start_in(fed: Fednet, net: Lan, host: str, *args: str) -> subprocess.Popen[str]:
    """`ip netns exec <host> fednet ARGS`, tracked by the fed fixture (same pid: ip execs)."""
    p = subprocess.Popen([*net.exec_prefix(host), *fednet_cmd(), *args], env=fed.env, cwd=fed.cwd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    fed.popens.append(p)
    return p


def _drain(p: subprocess.Popen[str], q: queue.Queue[str], keep: list[str]) -> None:
    for line in p.stderr:
        keep.append(line)
        q.put(line)


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def run_cluster(fed: Fednet, net: Lan, out: str, *args: str, timeout_s: float = 90,
                ids: dict[str, str] = CLIENT_IDS, run: list[str] = RUN) -> Cluster:
    """Server in srv (port chosen at bind time), clients by host (`ids`: 0-1 in h1, 2-3 in h2);
    all must exit 0."""
    before = {h: net.counters(h) for h in ("srv", *ids)}
    ports0 = net.port_counters()
    t0 = time.monotonic()
    srv_addr = net.addr["srv"]
    srv = _start_in(fed, net, "srv", "server", "--bind", f"tcp://{srv_addr}:0", *run, *args,
                    "--out", out)
    logs: dict[str, list[str]] = {"srv": []}
    q: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_drain, args=(srv, q, logs["srv"]), daemon=True).start()
    endpoint = server_endpoint(q, srv, srv_addr, lambda: "".join(logs["srv"]))
    procs: dict[str, subprocess.Popen[str]] = {}
    drains = []
    for host, which in ids.items():
        procs[host] = _start_in(fed, net, host, "clients", "--connect", endpoint, "--ids", which,
                                "--advertise", net.addr[host], "--timeout", "60")
        logs[host] = []
        t = threading.Thread(target=_drain, args=(procs[host], queue.Queue(), logs[host]),
                             daemon=True)
        t.start()
        drains.append(t)
    codes = {h: p.wait(timeout=timeout_s) for h, p in procs.items()}
    codes["srv"] = srv.wait(timeout=30)
    took = time.monotonic() - t0
    for t in drains:
        t.join(timeout=5)
    err = {h: "".join(v) for h, v in logs.items()}
    assert codes == {h: 0 for h in codes}, (codes, err)
    ports1 = net.port_counters()
    return Cluster(summary=read_json(fed.cwd / out / "summary.json"),
                   clients=jsonl(fed.cwd / out / "clients.jsonl"), endpoint=endpoint, took_s=took,
                   link={h: _delta(net.counters(h), before[h]) for h in before},
                   ports={p: _delta(ports1[p], ports0[p]) for p in ports1}, stderr=err)
