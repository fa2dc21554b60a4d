"""Bounded resources at the trust boundary (issue 11), measured on a `fednet server` process:
2,000 half-open connections hold at most 50 MB and the memory is given back once the server
has closed them; a flood of READY(hello) from a sender that never reads its replies keeps the
server's memory bounded and the run completes.

The scenarios (and the figures for BENCHMARKS.md) live in benchmarks/bench_trust.py, loaded by path.
The servers and clients run their liveness timers at harness.LIVENESS_SCALE (handshakes and
heartbeats close the half-open connections sooner, the flooder's place frees sooner).
"""
from __future__ import annotations

import sys
import uuid

import pytest

from tests.harness import LIVENESS_SCALE as SCALE, bench

bt = bench("bench_trust")

pytestmark = [pytest.mark.net, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def fast_liveness():
    """This module's servers and clients run their liveness timers at SCALE (module scope: the
    half-open server is one per module parameter)."""
    before = bt.set_liveness(SCALE)
    yield
    bt.set_liveness(before)

N_CONN = 2000
N_FLOOD = 200_000


@pytest.fixture(scope="module", params=["frame", "greeting"],
                ids=["greeting+READY then part of a frame", "part of the greeting"])
def half_open(request, tmp_path_factory):
    """One server, 2,000 half-open connections of one kind; the measured figures."""
    cwd = tmp_path_factory.mktemp("half-open")
    env = bt.make_env(uuid.uuid4().hex)
    try:
        res = bt.half_open("srv", env, cwd, N_CONN, request.param)
    finally:
        left = bt.marked(env[bt.MARKER])
        for p in left:
            p.kill()
    assert not left, f"processes left behind: {left}"
    print(f"\nhalf-open ({request.param}): {res}", file=sys.stderr)
    return res


def test_half_open_connections_hold_at_most_50mb_and_are_closed(half_open):
    r = half_open
    assert r["peak_open"] >= N_CONN, r                     # all of them were open at once
    assert r["peak_mb"] <= 50, f"+{r['peak_mb']:.1f} MB for {N_CONN} half-open connections"
    assert r["closed_by_server"] == N_CONN, r              # heartbeat / handshake timeouts
    assert r["closed_s"] < 15, r
    assert r["fds_after"] <= 2, r                          # no socket left behind in the server
    assert r["answers_hello"] == "WELCOME"                 # it still serves a real client
    assert r["rc"] == 143                                  # and stops on SIGTERM


def test_half_open_memory_is_given_back_after_the_server_closed_them(half_open):
    r = half_open
    assert r["after_mb"] <= 5, (f"+{r['after_mb']:.1f} MB still held 3 s after the server closed "
                                f"the connections (peak +{r['peak_mb']:.1f} MB)")


@pytest.mark.parametrize("claim", [1, 7], ids=["claims client 1", "claims an id out of range"])
def test_a_hello_flood_that_never_reads_keeps_the_server_bounded_and_the_run_completes(
        fed, tmp_path, claim):
    """200,000 READY(hello) on one connection that holds client 1's place, replies never read
    (before the fix: +186 MB). Client 1's claim is answered with WELCOME at most once per
    hello_every_s (2 s; 0.2 s here), an id out of range with REJECT at most 50 a second; the
    rest are dropped and counted.
    Client 0 registers during the flood; the run completes with it once the flooder left.
    At the default liveness timers, not the module's tenth: at a 300 ms heartbeat timeout a
    server pause while 200,000 hellos queue drops the flooder's connection with thousands of
    them unread (2,700-5,700 uncounted in 4 of 6 runs on a 2-core machine), which is liveness
    doing its work, not a hello lost uncounted."""
    before = bt.set_liveness(1.0)
    try:
        r = bt.flood("srv", fed.env, tmp_path, N_FLOOD, claim=claim)
    finally:
        bt.set_liveness(before)
    s = r["summary"]
    facts = {k: r[k] for k in ("peak_mb", "base_mb", "flood_s", "run_s", "rc", "clients_rc",
                               "dropped_during_flood")}
    facts.update({k: s.get(k) for k in ("status", "rounds", "rejected_messages", "failures")})
    print(f"\nflood (claim {claim}): {facts}", file=sys.stderr)
    assert r["peak_mb"] <= 50, facts
    assert r["rc"] == 0, r["stderr"]
    assert (s["status"], s["rounds"]) == ("completed", 2), facts
    # every repeated hello the server read was counted. Not every hello sent is read: when the
    # connection closes (the server dropping it, its pipe full past the heartbeat timeout on a
    # loaded machine, or as the flooder leaves and client 1 is declared dead) the hellos still
    # in the kernel's buffers are lost unread: 100-9,200 of 200,000 in 8 runs on this machine,
    # with no disconnect seen during the flood itself (dropped_during_flood). A server that did
    # not count them would show about none
    least = int(0.9 * N_FLOOD)
    assert s["rejected_messages"] >= least, facts
    assert s["bytes"]["rejected"] >= least * r["hello_bytes"], s["bytes"]
    rows = bt._rows(tmp_path / "srv" / "metrics.jsonl")
    assert [row["results"] for row in rows] == [1, 1], facts  # the flooder held client 1's place
    assert [f["client"] for f in s["failures"]] == [1], facts
    assert r["clients_rc"] == 0, facts
