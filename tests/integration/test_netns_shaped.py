"""The virtual clock checked against real shaped links: one client per host, a tc tbf cap on each
host's link matching its profile (uplink on its eth0, downlink on its bridge port), --real-time
--shaped-links (clients sleep only the latencies and the compute; the network runs the
transfers). The simulated time of each round and its measured wall-clock agree within 15% for
FedAvg and FedSeq (a ring across the four hosts: every hand-off crosses two capped links).

Not modelled by the virtual clock, so part of the gap: TCP/IP and Ethernet headers (~4.5% of a
transfer at a 1500-byte MTU), the tbf bucket (`burst` bytes pass at line rate), TCP slow start
(negligible here: no netem, so sub-millisecond RTTs), the server's aggregation and evaluation
and the processes' own overheads (not simulated time). Latency is not on the wire (netem is not
available): it stays in the clients' real-time sleeps. Root only; skipped without tc tbf.
"""
from __future__ import annotations

import os
import shutil

import pytest

from tests.integration.conftest import jsonl
from tests.integration.netns import Lan, NetnsUnavailable
from tests.integration.cluster import FEDSEQ, run_cluster

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.net]

HOSTS = ("srv", "h1", "h2", "h3", "h4")
# client i on host h{i+1}: compute s/sample, RTT s, up, down (plain numbers would be bytes/s)
TRACE = """client,compute_s_per_sample,rtt_s,up_bps,down_bps
0,0.004,0.040,1Mbit,2Mbit
1,0.003,0.080,2Mbit,1Mbit
2,0.005,0.020,1.5Mbit,3Mbit
3,0.004,0.060,1Mbit,1.5Mbit
"""
RATES = {"h1": (1e6 / 8, 2e6 / 8), "h2": (2e6 / 8, 1e6 / 8), "h3": (1.5e6 / 8, 3e6 / 8),
         "h4": (1e6 / 8, 1.5e6 / 8)}  # bytes/s (up, down), as the trace says
ROUNDS = 4
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def lan5():
    """srv and one host per client, each client host's link capped by tbf as its profile."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("tc") is None:
        pytest.skip("no tc (iproute2) on this machine")
    try:
        net = Lan.build(hosts=HOSTS)
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    try:
        try:
            with net.shaped({"h1": (1e5, 1e5)}):
                pass
        except RuntimeError as e:
            pytest.skip(f"tc tbf is not available here: {e}")
        with net.shaped(RATES):
            yield net
    finally:
        net.close()


def _per_round(rows: list[dict], setup: bool) -> list[tuple[int, float, float]]:
    """(round, simulated s, wall s) per round; the first round only when there was no setup
    stage (its wall-clock start is not recorded)."""
    out, prev = [], (0.0, 0.0)
    for i, r in enumerate(rows):
        if i or not setup:
            out.append((r["round"], r["sim_s"] - prev[0], r["wall_s"] - prev[1]))
        prev = (r["sim_s"], r["wall_s"])
    return out


def _run(fed, lan5, algo: str, links: str) -> tuple[dict, list[tuple[int, float, float]], list[str]]:
    trace = fed.cwd / "trace.csv"
    trace.write_text(TRACE)
    run = ["--clients", "4", "--rounds", str(ROUNDS), "--epochs", "1", "--batch-size", "16",
           "--latency", str(trace), "--real-time", links, "--register-timeout", "60",
           "--round-timeout", "120", "-q"]
    extra = FEDSEQ if algo == "fedseq" else []
    out = f"{algo}{links}"
    c = run_cluster(fed, lan5, out, *extra, timeout_s=300, run=run,
                    ids={f"h{i + 1}": str(i) for i in range(4)})
    s = c.summary
    assert (s["status"], s["rounds"], s["failures"]) == ("completed", ROUNDS, []), s
    per = _per_round(jsonl(fed.cwd / out / "metrics.jsonl"), setup=bool(s.get("setup")))
    lines = [f"round {r}: simulated {sim:.3f} s, wall {wall:.3f} s, wall/sim {wall / sim:.3f}"
             for r, sim, wall in per]
    print(f"\n[netns shaped {algo} {links}] tbf per host (up, down Mbit/s): "
          + ", ".join(f"{h} {u * 8e-6:g}/{d * 8e-6:g}" for h, (u, d) in RATES.items())
          + "\n  " + "\n  ".join(lines)
          + f"\n  run: simulated {s['sim_time_s']:.3f} s, wall-clock {s['wall_clock_s']:.3f} s;"
          f" bytes c->c {s['bytes']['client_to_client']}")
    return s, per, lines


@pytest.mark.parametrize("algo", ["fedavg", "fedseq"])
def test_simulated_round_time_matches_real_shaped_links(fed, lan5, algo):
    s, per, lines = _run(fed, lan5, algo, "--shaped-links")
    if algo == "fedseq":  # one ring through the four hosts: three hand-offs per round
        assert s["setup"]["groups"] == [[0, 1, 2, 3]] or len(s["setup"]["groups"][0]) == 4
        assert s["bytes"]["client_to_client"] > 3 * ROUNDS * 61_864
    assert len(per) >= ROUNDS - 1
    for r, sim, wall in per:
        assert sim > 1.0, (r, sim)  # transfers and compute both weigh (not a trivial round)
        assert abs(wall - sim) <= TOLERANCE * sim, lines


def test_the_caps_are_real_sleeping_the_transfers_too_pays_them_twice(fed, lan5):
    """Without --shaped-links the clients also sleep the transfers the tbf caps already made
    real: each FedAvg round overshoots by about its slowest client's down + up transfer time
    (client 3: 61,864 B at 1.5 and 1 Mbit/s, 0.82 s), so the agreement above is no accident."""
    _, per, lines = _run(fed, lan5, "fedavg", "--simulated-links")
    twice = 61_864 * 8 / 1.5e6 + 61_864 * 8 / 1e6
    for _r, sim, wall in per:
        assert wall - sim >= 0.7 * twice, lines
