"""Liveness and bounded resources at the trust boundary (issue 11), over live sockets and real
processes, in one run:

  (a) kill-to-failure: `run_zmq(local_clients=False)` (what `fednet server` runs) in a thread of
      this process, 3 clients from `fednet clients` in a subprocess, --real-time so that a round
      lasts a few seconds; one client process is SIGKILLed 1 s into round 1. Seconds from the
      kill until the Failure reaches the algorithm (default --round-timeout 300 s).
      The same with SIGSTOP (a frozen client: only the heartbeats can tell).
  (b) kill-all: `fednet server` and `fednet clients` subprocesses; every client process is
      SIGKILLed mid-round. Seconds from the kill until the server exits (status no_clients,
      exit code 3), and the rounds it ran. (b') the same between two rounds (server in a thread).
  (c) freeze-to-notice: `fednet server` is SIGSTOPped mid-run (TCP stays up); seconds until each
      client logs "lost the server" (its stderr, time-stamped as read). Then SIGCONT, and what
      the rest of the run did. (c') a remote client SIGKILLed and started again: registered?
  (d) half-open: 2,000 raw TCP connections to a `fednet server` waiting for its clients, either
      completing the ZMTP 3.0 greeting (PLAIN: the join key's gate) and then sending part of the
      handshake's first command, or sending part of the greeting only. The server's RSS
      (/proc/PID/status VmRSS) is sampled every
      20 ms: peak above the baseline, and what is left a few seconds after the server has
      closed every one of them (heartbeat / handshake timeouts).
  (e) flood: one DEALER holding the join key (an insider) claims client 1 of a 2-client run and
      sends 200,000 READY(hello) (for
      client 1 again, or for an id out of range) without ever reading a reply, while client 0
      registers; the server's peak RSS above the baseline; then it leaves and the run
      completes with client 0.

    python3 benchmarks/bench_trust.py [--json FILE]      # about 3 minutes on 2 cores

The tests in tests/integration/test_liveness.py and test_resources.py run these same scenarios
and assert the issue's targets: failure within 5 s, no_clients/exit 3 at once, a frozen server
noticed within 10 s, 2,000 half-open connections <= 50 MB and given back, a bounded flood.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

import psutil


sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import Proc  # noqa: E402
from benchlib.trust import (MARKER, REAL, liveness_args, make_env, marked,  # noqa: E402
                            set_liveness, start_server, wait_lines)
from benchlib.trust_scenarios import (_rows, flood, freeze_server, half_open,  # noqa: E402
                                      kill_all_between_rounds, kill_all_clients, kill_one_client,
                                      restart_client)
from benchlib.util import (cpu_pressure_us, headline_row, loadavg, machine, measured,  # noqa: E402
                           table, write_json)

__all__ = ["MARKER", "REAL", "Proc", "_rows", "flood", "freeze_server", "half_open",
           "kill_all_between_rounds", "kill_all_clients", "kill_one_client", "liveness_args",
           "make_env", "marked", "restart_client", "set_liveness", "start_server", "wait_lines"]
"""What tests/integration/test_liveness.py and test_resources.py use (as `bt`, through
tests/harness.py's bench("bench_trust")): the harness and the scenarios."""


# ---- the benchmark -----------------------------------------------------------------------------
def _scenarios(a: argparse.Namespace, env: dict[str, str], cwd: Path):
    """(name, facts, table row) per scenario, in order (each one runs when asked for): the groups
    (a)..(e) named in --scenarios."""
    want = set(a.scenarios)
    for sig, what in (() if "a" not in want else ((signal.SIGKILL, "SIGKILLed"),
                                                      (signal.SIGSTOP, "SIGSTOPped (frozen)"))):
        r = kill_one_client(cwd / f"a-{sig}", env, cwd, sig=sig)
        f = r["failure"]
        yield (f"client_{signal.Signals(sig).name}", {"signal_to_failure_s": r["kill_to_failure_s"],
                                                     "reason": f.reason if f else repr(r["error"]),
                                                     "status": (r["summary"] or {}).get("status")},
               [f"(a) one remote client {what} mid-round: signal -> Failure",
                _s(r["kill_to_failure_s"]), "<= 5 s" if sig == signal.SIGKILL else "(heartbeats)",
                f"round timeout 300 s; run {(r['summary'] or {}).get('status')}"])
    if "b" in want:
        yield from _kill_all(env, cwd)
    if "c" in want:
        yield from _freeze_and_restart(env, cwd)
    for mode in (("frame", "greeting") if "d" in want else ()):
        r = half_open(f"d-{mode}", env, cwd, a.connections, mode)
        yield (f"half_open_{mode}", r,
               [f"(d) {a.connections} half-open ({mode}): peak / {r['settle_s']:g} s after",
                f"+{r['peak_mb']:.1f} / +{r['after_mb']:.1f} MB", "<= 50 MB, given back",
                f"{r['peak_open']} open at once; closed by the server {r['closed_s']:.1f} s "
                f"after the first; baseline {r['base_mb']:.0f} MB"])
    for claim in ((1, 7) if "e" in want else ()):
        r = flood(f"e-{claim}", env, cwd, a.flood, claim)
        s = r["summary"]
        got = {k: v for k, v in r.items() if k not in ("stderr", "summary")}
        got.update(status=s["status"], rejected_messages=s.get("rejected_messages"))
        yield (f"flood_claim_{claim}", got,
               [f"(e) {a.flood} READY(hello cid {claim}), replies never read: peak",
                f"+{r['peak_mb']:.1f} MB", "bounded (was +186 MB)",
                f"flood {r['flood_s']:.1f} s; run {s['status']}, rejected "
                f"{s.get('rejected_messages')}"])


def _kill_all(env: dict[str, str], cwd: Path):
    """(b) and (b'): every remote client killed, mid-round and between rounds."""
    r = kill_all_clients("b", env, cwd)
    s = r["summary"]
    yield ("kill_all", {"kill_to_exit_s": r["kill_to_exit_s"], "rc": r["rc"], "status": s["status"],
                        "rounds": s["rounds"], "rounds_planned": r["rounds_planned"]},
           ["(b) every remote client SIGKILLed: kill -> server exit", _s(r["kill_to_exit_s"]),
            "no_clients, exit 3", f"{s['status']}, exit {r['rc']}, {s['rounds']} of "
            f"{r['rounds_planned']} rounds"])
    r = kill_all_between_rounds(cwd / "b2", env, cwd)
    s = r["summary"] or {}
    res = [row["results"] for row in r["rows"]]
    yield ("kill_all_between_rounds", {"status": s.get("status"), "rounds": s.get("rounds"),
                                       "results": res, "kill_to_end_s": r["kill_to_end_s"]},
           ["(b') every remote client SIGKILLed between rounds: kill -> end of run",
            _s(r["kill_to_end_s"]), "no_clients", f"{s.get('status')}, {s.get('rounds')} of "
            f"{r['rounds_planned']} rounds, results per round {res[:4]}..."])


def _freeze_and_restart(env: dict[str, str], cwd: Path):
    """(c) and (c'): the server frozen, then a client killed and started again."""
    r = freeze_server("c", env, cwd, after="wait")
    res = [row["results"] for row in r.get("rows", [])]
    yield ("freeze", {"notice_s": r["notice_s"], "frozen_s": r["frozen_s"], "results": res,
                      "rc": r.get("rc"), "status": r.get("summary", {}).get("status"),
                      "clients_rc": r.get("clients_rc"),
                      "refused": _refused(r["clients_stderr"])},
           ["(c) server SIGSTOPped: freeze -> 'lost the server'",
            " / ".join(f"{x:.2f}" for x in r["notice_s"]) + " s", "<= 10 s",
            f"{len(r['notice_s'])} of 2 clients; after SIGCONT: results per round {res}, "
            f"{_refused(r['clients_stderr'])} re-hellos refused, status "
            f"{r.get('summary', {}).get('status')}"])
    r = restart_client("r", env, cwd)
    res = [row["results"] for row in r.get("rows", [])]
    refused = "refused" in r["restarted_stderr"]
    yield ("restart", {"results": res, "refused": refused, "restarted_rc": r["restarted_rc"]},
           ["(c') a remote client SIGKILLed, then started again", "refused" if refused else
            "registered", "registers again", f"results per round {res}"])


def _refused(stderr: str) -> int:
    """Lines where a client says the server refused (or REJECTed) its registration."""
    return sum(1 for x in stderr.splitlines() if "refused" in x or "unexpected REJECT" in x)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def headline(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: (a) kill -> Failure, (c) a frozen server noticed, (d) half-open
    connections' peak and (e) the flood's peak, with the targets the table above prints."""
    kill, freeze = facts.get("client_SIGKILL", {}), facts.get("freeze", {})
    ho, fl = facts.get("half_open_frame", {}), facts.get("flood_claim_1", {})
    notice = freeze.get("notice_s") or []
    area = "trust boundary"
    return measured(
        headline_row(area, "one remote client SIGKILLed mid-round: kill -> Failure",
                     kill.get("signal_to_failure_s"), "s", "<= 5 s",
                     f"run {kill.get('status')}; the round timeout is 300 s"),
        headline_row(area, "fednet server SIGSTOPped: freeze -> each client says 'lost the "
                     "server'", max(notice) if notice else None, "s", "<= 10 s",
                     f"{len(notice)} of 2 clients; after SIGCONT the run {freeze.get('status')}"),
        headline_row(area, f"{ho.get('n')} half-open connections holding part of a frame: server "
                     "peak RSS growth", ho.get("peak_mb"), "MB",
                     "<= 50 MB" if ho.get("n") == 2000 else "",
                     f"{ho.get('after_mb', 0):+.1f} MB {ho.get('settle_s')} s after the server "
                     "closed them"),
        headline_row(area, f"{fl.get('n')} READY(hello) whose replies are never read: server "
                     "peak RSS growth", fl.get("peak_mb"), "MB", "",
                     f"run {fl.get('status')}, {fl.get('rejected_messages')} rejected"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--flood", type=int, default=200_000)
    ap.add_argument("--scenarios", nargs="+", default=list("abcde"), choices=list("abcde"),
                    help="the groups to run (default all): a client killed, all killed, the "
                    "server frozen, half-open connections, the flood")
    a = ap.parse_args()
    import tempfile

    import logging

    logging.getLogger("fednet").setLevel(logging.ERROR)  # (a)'s server runs in this process
    env = make_env()
    facts: dict[str, Any] = {"machine": machine()}
    rows = []
    left: list[psutil.Process] = []
    with tempfile.TemporaryDirectory() as d:
        try:
            for name, got, row in _scenarios(a, env, Path(d)):
                facts[name] = got
                got["loadavg"] = loadavg()
                rows.append(row)
                print(" | ".join(row), flush=True)
        finally:
            left = marked(env[MARKER])
            for p in left:
                p.kill()
    facts["loadavg_at_end"] = loadavg()
    facts["cpu_pressure_us_at_end"] = cpu_pressure_us()
    print()
    print(table(["scenario", "measured", "target", "notes"], rows))
    if left:
        print(f"killed {len(left)} leftover processes")
    facts = json.loads(json.dumps(facts, default=str))
    write_json(a.json, facts, headline(facts))


if __name__ == "__main__":
    main()
