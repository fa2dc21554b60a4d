"""fednet across an emulated LAN: a server and two client hosts in network namespaces on a bridge.

Each "host" is a network namespace with its own address (10.77.X.1-3, see netns.py); the clients
of h1 and h2 can reach the server and each other only through the bridge, so every model that
goes to a client, back to the server, or from peer to peer (FedSeq) crosses a veth link whose byte
counters we read, and which `tc tbf` can slow down. Root only; skipped elsewhere.
"""
from __future__ import annotations

import os

import pytest

from tests.integration.conftest import jsonl
from tests.integration.cluster import (CAP_MBIT, FEDSEQ, MODEL_BYTES, ROUNDS, Cluster, Sampler, run_cluster)
from tests.integration.netns import Lan, NetnsUnavailable, tc

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.net]



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
