"""A ring's simulated timeline against the analytic one, in both runtimes (hand-offs on the right
links: latency.peer_delay).

Four clients with asymmetric profiles (a latency trace whose bandwidth cells carry units). Each
round the server sends the ring's prefixes [0], [0,1], [0,1,2], [0,1,2,3] as four tasks, so each
result's arrival pins one more hop: the model reaches hop k at

    a_0 = T0 + rtt_0/2 + S/down_0
    a_k = a_{k-1} + n_{k-1} c_{k-1} + (rtt_{k-1} + rtt_k)/4 + H_k / min(up_{k-1}, down_k)

and the result of the prefix ending at hop k reaches the server at
a_k + n_k c_k + rtt_k/2 + R/up_k (n: samples trained, c: s per sample; S, H, R: the TASK, HANDOFF
and RESULT sizes as the ledger counted them). The round ends at the last arrival.

    python benchmarks/bench_ring_timeline.py            # fednet local and fednet launch
    python benchmarks/bench_ring_timeline.py --local    # fednet local only
    python benchmarks/bench_ring_timeline.py --json F   # also the figures, as JSON

Used by tests/test_ring_timeline.py and tests/integration/test_ring_timeline_launch.py.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from fednet.network import latency  # noqa: E402
from fednet.config import RunConfig, from_dict  # noqa: E402
from benchlib.util import headline_row, machine, measured, write_json  # noqa: E402

# compute s/sample, RTT s, uplink, downlink: every client different, up != down
TRACE = """client,compute_s_per_sample,rtt_s,up_bps,down_bps
0,0.002,0.030,2Mbit,16Mbit
1,0.0005,0.120,1MB,400kB
2,0.004,0.010,500kbit,40Mbit
3,0.001,0.060,64KiB,3MiB
"""
ROUNDS = 2


def config(trace: Path, out: str = "") -> RunConfig:
    """Four digits clients, FedAvg's client update, the asymmetric trace."""
    return from_dict({"clients": 4, "rounds": ROUNDS, "seed": 3, "out": out,
                      "latency": {"preset": "lan", "file": str(trace),  # the network's time:
                                  "server_profile": "none"},  # the server computes for free
                      "train": {"epochs": 1, "batch_size": 32, "lr": 0.05}})


@dataclass
class Recorder:
    """The `prepare` hook: prefix routes each round; records every result's arrival and
    every message's size (the ledger keeps its entries)."""

    routes: dict[int, list[int]] = field(default_factory=dict)   # task id -> route
    starts: dict[int, float] = field(default_factory=dict)       # round -> T0
    arrivals: dict[int, float] = field(default_factory=dict)     # task id -> arrival at server
    examples: dict[int, int] = field(default_factory=dict)       # cid -> local examples
    session: Any = None

    def __call__(self, session: Any) -> None:
        self.session = session
        session.ledger.keep_entries = True
        algo, driver = session.algo, session.driver
        absorb = algo.absorb

        def configure_round(rnd: int, clients: list[Any]) -> list[Any]:
            ids = sorted(c.cid for c in clients)
            self.examples.update({c.cid: c.num_examples for c in clients})
            self.starts[rnd] = driver.sim_time
            tasks = []
            for k in range(1, len(ids) + 1):
                t = algo.new_task(rnd, ids[:k], algo.global_arrays, algo.task_body(rnd, clients[0]))
                self.routes[t.task_id] = ids[:k]
                tasks.append(t)
            return tasks

        def record(done: Any) -> None:
            self.arrivals[done.task_id] = done.sim_time
            absorb(done)
        session.handoffs = True  # FedAvg made rings: WELCOME carries the peers' links
        algo.configure_round = configure_round
        algo.absorb = record


def sizes(entries: list[Any]) -> list[dict[str, Any]]:
    """Per task, in order (fednet local delivers the tasks one after another): the TASK size, the
    HANDOFF sizes of its hops and the RESULT size."""
    out: list[dict[str, Any]] = []
    for e in entries:
        if e.kind == "TASK":
            out.append({"round": e.round, "S": e.total, "H": [], "R": None})
        elif e.kind == "HANDOFF":
            out[-1]["H"].append(e.total)
        elif e.kind == "RESULT":
            out[-1]["R"] = e.total
    return out


def analytic(route: list[int], profs: list[latency.Profile], samples: dict[int, int], t0: float,
             s: int, handoffs: list[int], r: int) -> tuple[list[float], float]:
    """(the model's arrival at each hop, the result's arrival at the server), by the formulas of
    the module docstring, written out here rather than through network/latency.py."""
    p = profs[route[0]]
    a = t0 + (p.rtt_s / 2 + s / p.down_bps)
    hops = [a]
    for prev, cur, h in zip(route, route[1:], handoffs):
        src, dst = profs[prev], profs[cur]
        sent = a + samples[prev] * src.compute_s_per_sample
        a = sent + ((src.rtt_s + dst.rtt_s) / 4 + h / min(src.up_bps, dst.down_bps))
        hops.append(a)
    last = profs[route[-1]]
    done = a + samples[route[-1]] * last.compute_s_per_sample
    return hops, done + (last.rtt_s / 2 + r / last.up_bps)


def run(runtime: str, workdir: Path) -> dict[str, Any]:
    """Run one runtime; returns its observed and analytic timelines and the summary."""
    from fednet.core.inproc import run_local

    trace = workdir / "trace.csv"
    trace.write_text(TRACE)
    cfg = config(trace, str(workdir / runtime))
    rec = Recorder()
    if runtime == "local":
        summary = run_local(cfg, quiet=True, prepare=rec)
    else:
        from fednet.server.main import run_zmq
        summary = run_zmq(cfg, quiet=True, prepare=rec)
    return {"summary": summary, "recorder": rec, "cfg": cfg,
            "entries": list(rec.session.ledger.entries)}


def timeline(local: dict[str, Any]) -> list[dict[str, Any]]:
    """Analytic rows (per task) from a fednet local run's recorded sizes and starts."""
    rec, cfg = local["recorder"], local["cfg"]
    profs = latency.profiles(cfg.latency, cfg.clients, cfg.seed)
    samples = {c: n * cfg.train.epochs for c, n in rec.examples.items()}
    rows = []
    for tid, sz in zip(sorted(rec.routes), sizes(local["entries"])):
        route = rec.routes[tid]
        hops, arrival = analytic(route, profs, samples, rec.starts[sz["round"]], sz["S"],
                                 sz["H"], sz["R"])
        rows.append({"round": sz["round"], "task": tid, "route": route, "hops": hops,
                     "analytic": arrival, "S": sz["S"], "H": sz["H"], "R": sz["R"]})
    return rows


def report(rows: list[dict[str, Any]], observed: dict[str, dict[int, float]],
           ends: dict[str, float]) -> float:
    """Print the table; returns the largest |observed - analytic| in seconds."""
    worst = 0.0
    names = list(observed)
    print(f"{'round':>5} {'route':<13} {'hop arrivals (analytic, s)':<44} {'result: analytic':>17} "
          + " ".join(f"{n:>17}" for n in names))
    for r in rows:
        got = [observed[n][r["task"]] for n in names]
        worst = max([worst] + [abs(g - r["analytic"]) for g in got])
        hops = " ".join(f"{h:.6f}" for h in r["hops"])
        print(f"{r['round']:>5} {str(r['route']):<13} {hops:<44} {r['analytic']:>17.9f} "
              + " ".join(f"{g:>17.9f}" for g in got))
    last = max(r["analytic"] for r in rows)
    print(f"run's simulated time: analytic {last:.9f} s; "
          + "; ".join(f"{n} {t:.9f} s" for n, t in ends.items()))
    print(f"largest |observed - analytic|: {worst:.3g} s")
    return worst


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's row: the largest gap between a result's observed and analytic arrival."""
    ends = data.get("sim_time_s", {})
    return measured(headline_row(
        "network model", "a ring's simulated timeline, 4 clients with asymmetric links: largest "
        "|observed - analytic| arrival", data.get("worst_s"), "s", "",
        f"{len(data.get('rows', []))} results; run's simulated time "
        + ", ".join(f"{n} {t:.9f} s" for n, t in ends.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--local", action="store_true", help="fednet local only")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"local": run("local", Path(tmp))}
        if not args.local:
            runs["launch"] = run("launch", Path(tmp))
        rows = timeline(runs["local"])
        print("profiles (compute s/sample, rtt s, up B/s, down B/s):")
        for i, p in enumerate(latency.profiles(runs["local"]["cfg"].latency, 4, 3)):
            print(f"  client {i}: {p.compute_s_per_sample:g}, {p.rtt_s:g}, {p.up_bps:g}, "
                  f"{p.down_bps:g}")
        observed = {n: v["recorder"].arrivals for n, v in runs.items()}
        ends = {n: v["summary"]["sim_time_s"] for n, v in runs.items()}
        worst = report(rows, observed, ends)
    data = {"machine": info, "args": vars(args), "rows": rows, "observed": observed,
            "sim_time_s": ends, "worst_s": worst}
    write_json(args.json, data, headline(data))


if __name__ == "__main__":
    main()
