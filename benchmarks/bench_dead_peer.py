"""Wall-clock time of a FedSeq round whose ring loses a middle peer (SIGKILL before the round's
task is sent), with the default net.ack_timeout (30 s) and net.ack_retries (2), --dead-peer skip.

    python3 benchmarks/bench_dead_peer.py --before /path/to/old/checkout [--repeats 2] [--json F]

Each variant runs in its own process (PYTHONPATH = its checkout), alternating, `repeats` times:
  before      the --before checkout
  no_refusal  this package copied with the closed-port check off (the holder waits out
              its acknowledgement timeouts)
  after       this checkout
Setup: 4 digits clients, one superclient of all 4 (route of 4), 2 rounds; route[2] of round 1
is killed. Printed: round 1's wall seconds, who returned its result (the dead peer's successor
route[3], or route[1] when the chain went back to the server) and its client-to-client bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "benchmarks"))
from _util import headline_row, machine, measured, write_json  # noqa: E402

CHILD = r'''
import json, os, signal, sys
from fednet.config import from_dict
from fednet.server.main import run_zmq
p = {"min_samples": 1400, "max_clients": 4, "superclient_fraction": 1.0, "pretrain_epochs": 1}
cfg = from_dict({"clients": 4, "rounds": 2, "seed": 7, "latency": {"preset": "lan"},
                 "train": {"epochs": 1, "batch_size": 16, "lr": 0.1},
                 "algo": {"name": "fedseq", "params": p}, "out": sys.argv[1]})
box = {}
def prepare(s):
    conf, agg = s.algo.configure_round, s.algo.aggregate_round
    def configure_round(rnd, clients):
        tasks = conf(rnd, clients)
        if rnd == 1:
            box["route"] = route = list(tasks[0].route)
            os.kill(next(c.pid for c in clients if c.cid == route[2]), signal.SIGKILL)
        return tasks
    def aggregate_round(rnd, results, failures):
        box.setdefault("senders", {})[rnd] = [r.cid for r in results]
        return agg(rnd, results, failures)
    s.algo.configure_round, s.algo.aggregate_round = configure_round, aggregate_round
s = run_zmq(cfg, quiet=True, prepare=prepare)
rows = [json.loads(x) for x in open(os.path.join(sys.argv[1], "metrics.jsonl"))]
print(json.dumps({"status": s["status"], "wall_s": rows[1]["wall_s"], "route": box["route"],
                  "sender": box["senders"][1],
                  "c2c": [r["bytes_round"]["client_to_client"] for r in rows]}))
'''


REFUSED = "    def refused(self) -> bool:\n"


def without_refusal(tmp: str) -> str:
    """A copy of this checkout's package whose holders never see a refused connection."""
    shutil.copytree(HERE / "fednet", Path(tmp) / "fednet")
    peers = Path(tmp) / "fednet" / "client" / "peers.py"
    text = peers.read_text()
    assert REFUSED in text
    peers.write_text(text.replace(REFUSED, REFUSED + "        return False\n"))
    return tmp


def run(checkout: str, variant: str) -> dict:
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as pkg:
        if variant == "no_refusal":
            checkout = without_refusal(pkg)
        env = dict(os.environ, PYTHONPATH=checkout)
        p = subprocess.run([sys.executable, "-c", CHILD, out, variant], env=env, cwd=checkout,
                           capture_output=True, text=True, timeout=600, check=True)
        return json.loads(p.stdout.strip().splitlines()[-1])


def headline(data: dict) -> list:
    """The dashboard's rows: round 1's wall seconds with a dead ring peer (the best repeat), this
    checkout and the --before one against it."""
    best = {v: min(x["wall_s"] for x in runs) for v, runs in data.get("runs", {}).items() if runs}
    after, before = best.get("after"), best.get("before")
    what = "FedSeq round whose ring loses a middle peer (SIGKILL), --dead-peer skip"
    return measured(
        headline_row("trust boundary", f"{what}: the round's wall-clock", after, "s", "",
                     f"best of {len(data.get('runs', {}).get('after', []))}; default "
                     "net.ack_timeout 30 s and net.ack_retries 2; 4 digits clients"),
        headline_row("trust boundary", f"{what}: --before checkout / this one",
                     before / after if before and after else None, "x", "",
                     f"before {before or 0:.2f} s, without the refused-connection check "
                     f"{best.get('no_refusal') or 0:.2f} s (best repeats)"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a checkout of the code before the change")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    info = machine()
    variants = [("before", a.before), ("no_refusal", str(HERE)), ("after", str(HERE))]
    got: dict[str, list[dict]] = {v: [] for v, _ in variants}
    for _ in range(a.repeats):
        for v, checkout in variants:
            r = run(checkout, v)
            got[v].append(r)
            hop = "successor" if r["sender"] == [r["route"][3]] else (
                "back to server" if r["sender"] == [r["route"][1]] else str(r["sender"]))
            print(f"{v:11s} round 1 wall {r['wall_s']:7.2f} s  result from {hop:15s} "
                  f"c2c bytes {r['c2c']}", flush=True)
    after = min(x["wall_s"] for x in got["after"])
    for v, _ in variants:
        best = min(x["wall_s"] for x in got[v])
        print(f"{v:11s} best {best:7.2f} s  ratio to after {best / after:6.1f}x")
    data = {"machine": info, "args": vars(a), "runs": got}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
