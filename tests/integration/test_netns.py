"""fednet across an emulated LAN: a server and two client hosts in network namespaces on a bridge.

Each "host" is a network namespace with its own address (10.77.X.1-3, see netns.py); the clients
of h1 and h2 can reach the server and each other only through the bridge, so every model that
goes to a client, back to the server, or from peer to peer (FedSeq) crosses a veth link whose byte
counters we read, and which `tc tbf` can slow down. Root only; skipped elsewhere.
"""
from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.integration.conftest import Fednet, fednet_cmd, jsonl, read_json
from tests.integration.netns import Lan, NetnsUnavailable, tc

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.net]

MODEL_BYTES = 61_864  # the DigitsNet parameters as float32
ROUNDS = 3
RUN = ["--clients", "4", "--rounds", str(ROUNDS), "--epochs", "1", "--batch-size", "16",
       "--latency", "none", "--register-timeout", "60", "--round-timeout", "60", "-q"]
FEDSEQ = ["--algo", "fedseq", "--min-samples", "1400", "--max-clients", "4",
          "--superclient-fraction", "1.0", "--pretrain-epochs", "1"]  # one ring through all 4
CLIENT_IDS = {"h1": "0-1", "h2": "2-3"}
CAP_MBIT = 1.0


@pytest.fixture(scope="module")
def lan():
    """srv, h1 and h2 on one bridge; every namespace is deleted at the end, even on failure."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    try:
        net = Lan.build()
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    try:
        yield net
    finally:
        net.close()


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
    endpoint = ""
    deadline = time.monotonic() + 60
    while not endpoint and time.monotonic() < deadline:
        try:
            line = q.get(timeout=1)
        except queue.Empty:
            assert srv.poll() is None, f"server exited ({srv.returncode}): {''.join(logs['srv'])}"
            continue
        m = re.fullmatch(r"server listening on (tcp://(\S+):(\d+))\n", line)
        if m:
            assert (m.group(2), int(m.group(3)) > 0) == (srv_addr, True), line
            endpoint = m.group(1)
    assert endpoint, "the server did not print 'server listening on tcp://...'"
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


def _check_completed(c: Cluster, models: int = 2) -> None:
    """A completed run of 4 clients; each client host's link carried `models` models per round
    each way (FedAvg: its 2 clients' tasks and results; a FedSeq ring: at least 1)."""
    s = c.summary
    assert (s["status"], s["clients"], s["rounds"]) == ("completed", 4, ROUNDS), s
    assert s["failures"] == [], s["failures"]
    assert s["endpoint"] == c.endpoint
    assert s["devices"] == {"cpu": 4}
    assert [r["client"] for r in c.clients] == [0, 1, 2, 3]
    assert all(r["device"] == "cpu" and r["host"] for r in c.clients), c.clients
    # every client sits in its own host's namespace: the `host` field (the hostname) is the same
    # in all namespaces, so the proof is in the link counters: both client hosts moved models
    # to and from the server over their own veth, the server's link carried all of them.
    for h in ("h1", "h2"):
        assert c.link[h]["rx_bytes"] > ROUNDS * models * MODEL_BYTES, (h, c.link)
        assert c.link[h]["tx_bytes"] > ROUNDS * models * MODEL_BYTES, (h, c.link)


def test_fedavg_across_three_hosts(fed, lan):
    c = run_cluster(fed, lan, "fedavg")
    _check_completed(c)
    assert c.link["srv"]["tx_bytes"] > ROUNDS * 4 * MODEL_BYTES, c.link
    assert c.link["srv"]["rx_bytes"] > ROUNDS * 4 * MODEL_BYTES, c.link
    rows = jsonl(fed.cwd / "fedavg" / "metrics.jsonl")
    assert [r["results"] for r in rows] == [4] * ROUNDS
    assert c.summary["bytes"]["client_to_client"] == 0
    print(f"\n[netns fedavg] wall_clock_s={c.summary['wall_clock_s']:.2f}"
          f" (whole run {c.took_s:.1f}s) link bytes {c.link}")


def test_fedseq_hands_models_from_host_to_host(fed, lan):
    c = run_cluster(fed, lan, "fedseq", *FEDSEQ)
    _check_completed(c, models=1)
    s = c.summary
    groups = s["setup"]["groups"]
    assert any({0, 1} & set(g) and {2, 3} & set(g) for g in groups), groups
    assert s["bytes"]["client_to_client"] > 0
    # The bridge delivered to srv only what h1 and h2 sent to the server; what else they sent into
    # the bridge went from one client host to the other: the hand-offs. A ring through 0..3
    # crosses h1 -> h2 at least once per round (0-1 and 2-3 share a host and skip the bridge).
    into_bridge = c.ports["h1"]["rx_bytes"] + c.ports["h2"]["rx_bytes"]
    host_to_host = into_bridge - c.ports["srv"]["tx_bytes"]
    assert host_to_host > ROUNDS * MODEL_BYTES, (c.ports, groups)
    assert host_to_host <= s["bytes"]["client_to_client"] * 1.2, (host_to_host, s["bytes"])
    print(f"\n[netns fedseq] groups={groups} client_to_client={s['bytes']['client_to_client']} B"
          f" (wire h1<->h2 {host_to_host} B), wall_clock_s={s['wall_clock_s']:.2f}")


def test_bandwidth_cap_on_one_host_slows_the_rounds(fed, lan):
    try:
        with lan.capped("h2"):
            pass
    except RuntimeError as e:
        pytest.skip(f"tc tbf is not available here: {e}")
    free = run_cluster(fed, lan, "free")
    _check_completed(free)
    with lan.capped("h2", rate=f"{CAP_MBIT:g}mbit", burst="16kb", latency="400ms"):
        qd = tc(lan.ns["h2"], "qdisc", "show", "dev", "eth0").stdout
        assert "tbf" in qd, qd
        with Sampler(lan, "h2") as smp:
            capped = run_cluster(fed, lan, "capped", timeout_s=120)
    _check_completed(capped)
    w_free, w_cap = free.summary["wall_clock_s"], capped.summary["wall_clock_s"]
    # Per round, h2's link carries its 2 clients' models down and back up: 4 models through a cap
    # of CAP_MBIT in each direction, which cannot all overlap with training.
    expected_extra = ROUNDS * 4 * MODEL_BYTES * 8 / (CAP_MBIT * 1e6)
    h2 = capped.link["h2"]
    avg_rx = h2["rx_bytes"] * 8 / w_cap / 1e6
    avg_tx = h2["tx_bytes"] * 8 / w_cap / 1e6
    peak_rx, peak_tx = smp.peak_mbit(1.0)
    print(f"\n[netns tbf {CAP_MBIT:g} Mbit/s on h2] wall_clock_s uncapped={w_free:.2f} capped="
          f"{w_cap:.2f} extra={w_cap - w_free:.2f}s (expected ~{expected_extra:.2f}s);"
          f" h2 link bytes down={h2['rx_bytes']} up={h2['tx_bytes']};"
          f" average over the run down={avg_rx:.3f} up={avg_tx:.3f} Mbit/s;"
          f" peak over 1 s down={peak_rx:.3f} up={peak_tx:.3f} Mbit/s"
          f" ({len(smp.samples)} samples)")
    assert w_cap - w_free >= 0.6 * expected_extra, (w_free, w_cap, expected_extra)
    # the cap holds: no 1 s window moved more than the rate plus the 16 KiB bucket (and slack)
    assert peak_rx <= CAP_MBIT * 1.35 and peak_tx <= CAP_MBIT * 1.35, (peak_rx, peak_tx)
    # ... and it was the bottleneck: the busiest second ran near the cap
    assert max(peak_rx, peak_tx) >= CAP_MBIT * 0.5, (peak_rx, peak_tx)
    # both directions carried at least the 2 clients' models every round
    assert h2["rx_bytes"] > ROUNDS * 2 * MODEL_BYTES and h2["tx_bytes"] > ROUNDS * 2 * MODEL_BYTES
