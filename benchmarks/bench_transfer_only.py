"""A ResNet-18 round's transfers alone (docs/benchmarks/history.md section 15, "Transfers alone"), side by side
with loopback TCP's throughput measured in the same run.

    python3 benchmarks/bench_transfer_only.py [--reps 3] [--algos echo echo-fedavg] [--json F]

The round of section 15's `bench_many.py --part big` (ResNet-18, 44.7 MB; 100 clients of
synthetic-cifar10-small, `--clients-per-process 10`, 1 round) with the clients' compute taken
out: echo_plugin.py's clients return the received model unchanged (`echo`: the server drops each
result on arrival; `echo-fedavg`: FedAvg's server folds each one in). For each launch, alternating
with a fresh loopback TCP measurement of the round's bytes (two processes, plain sockets, 256 KiB
sends, 8.95 GB = 100 x 44.7 MB each way; its wall time and both processes' CPU):

- window: the server's first TASK sent .. its last RESULT received whole (round_timing_plugin's
  server-side timestamps), and window / (bytes moved / TCP throughput), the issue's ratio;
- the loopback interface's busy time (section 15's measure, bench_many.LoopbackMeter) over the
  same ideal;
- where the time goes: the union of in-flight intervals, decode on the clients and the server,
  the clients' task handling (no training here), aggregation, all processes' CPU in the round
  against the CPU the same bytes took through plain TCP.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _util import headline_row, loadavg, machine, measured, median, write_json  # noqa: E402
from bench_many import LoopbackMeter, fednet, split_round, tcp_transfer, timed  # noqa: E402


ROUND_BYTES, CHUNK = 8_947_810_200, 256 * 1024  # a round's TASK + RESULT bytes (measured)


def window(events: list[dict[str, Any]], per_round: int = 100) -> dict[str, Any]:
    """First TASK sent .. last RESULT received (and decoded), server-side timestamps: for the
    first round (the issue's figure) and, with several rounds, for each later one (rounds do not
    overlap: every round sends per_round tasks and waits for their results)."""
    tasks = sorted(e["t"] for e in events if e["ev"] == "send" and e["kind"] == "TASK")
    results = sorted((e for e in events if e["ev"] == "recv" and e["kind"] == "RESULT"),
                     key=lambda e: e["t"])
    last = results[min(per_round, len(results)) - 1]
    later = [results[min(r + per_round, len(results)) - 1]["t"] - tasks[r]
             for r in range(per_round, len(tasks), per_round)]
    return {"window_s": last["t"] - tasks[0], "window_decoded_s": last["t"] + last["dt"]
            - tasks[0], "tasks": len(tasks), "results": len(results), "later_windows_s": later}


def launch(tmp: Path, tag: str, algo: str, tput: float, per_process: str, rounds: int = 1
           ) -> dict[str, Any]:
    tdir, out = tmp / f"timing_{tag}", tmp / f"run_{tag}"
    tdir.mkdir()
    env = dict(os.environ, FEDNET_TIMING_DIR=str(tdir),
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    argv = fednet() + ["launch", "--plugin", str(HERE / "round_timing_plugin.py"),
                       "--plugin", str(HERE / "echo_plugin.py"), "--algo", algo,
                       "--dataset", "synthetic-cifar10-small", "--model", "resnet18",
                       "--clients", "100", "--rounds", str(rounds), "--epochs", "1",
                       "--batch-size", "8",
                       "--clients-per-process", per_process, "-q", "--out", str(out)]
    meter = LoopbackMeter(tput)
    wall, _ = timed(argv, env)
    meter.stop()
    events = [json.loads(line) for f in tdir.glob("*.jsonl") for line in f.read_text().splitlines()]
    first = min((e for e in events if e["ev"] == "round"), key=lambda e: e["t"])
    r = split_round([e for e in events if e["t"] <= first["t"] + first["dt"]])  # round 0
    r.update(window(events))
    r["later_over_ideal"] = [w / (r["bytes_moved"] / tput) for w in r["later_windows_s"]]
    ideal = r["bytes_moved"] / tput
    r.update(algo=algo, tcp_bytes_per_s=tput, command_s=wall, ideal_transfer_s=ideal,
             window_over_ideal=r["window_s"] / ideal, lo_busy_s=meter.busy_s,
             lo_busy_over_ideal=meter.busy_s / ideal, lo_busy_bytes=meter.bytes,
             loadavg=loadavg())
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tdir, ignore_errors=True)
    return r


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: a ResNet-18 round's transfer window over bytes / loopback TCP
    throughput, per algorithm (the issue's <= 1.5x is for `echo`, transfers alone), first round
    and, with --rounds > 1, later rounds."""
    runs = data.get("runs", [])
    out = []
    for algo in dict.fromkeys(r["algo"] for r in runs):
        mine = [r for r in runs if r["algo"] == algo]
        first = [r["window_over_ideal"] for r in mine]
        later = [x for r in mine for x in r.get("later_over_ideal", [])]
        what = f"ResNet-18 round, 100 clients, `{algo}` (no compute)"
        target = "<= 1.5x" if algo == "echo" else ""
        out.append(headline_row(
            "transfer", f"{what}: first round's transfer window / ideal", median(first), "x",
            target, f"median of {len(first)}: " + ", ".join(f"{x:.2f}" for x in first)
            + f"; TCP {median([r['tcp_bytes_per_s'] for r in mine]) / 1e9:.2f} GB/s"))
        if later:
            out.append(headline_row(
                "transfer", f"{what}: later rounds' transfer window / ideal", median(later), "x",
                target, f"median of {len(later)}"))
    return measured(*out[:4])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--algos", nargs="+", default=["echo", "echo-fedavg"])
    ap.add_argument("--per-process", default="10")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds per launch: the first is the issue's figure (every process "
                         "receives into fresh memory); later ones show the steady state")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fednet_transfer_only_") as d:
        for i in range(args.reps):
            for algo in args.algos:
                tput, tcp_cpu = tcp_transfer(ROUND_BYTES // CHUNK * CHUNK, CHUNK)
                r = launch(Path(d), f"{i}_{algo}", algo, tput, args.per_process, args.rounds)
                r["tcp_cpu_s"] = tcp_cpu
                rows.append(r)
                print(f"{i} {algo:12s} tcp {tput / 1e9:.2f} GB/s  moved {r['bytes_moved'] / 1e9:.2f}"
                      f" GB  ideal {r['ideal_transfer_s']:.2f}s  window {r['window_s']:.2f}s "
                      f"(x{r['window_over_ideal']:.2f})  lo busy {r['lo_busy_s']:.2f}s "
                      f"(x{r['lo_busy_over_ideal']:.2f})  in flight {r['latency_s']:.2f}s  decode "
                      f"clients {r['decode_clients_s']:.2f}s server {r['decode_server_s']:.2f}s  "
                      f"tasks {r['compute_sum_s']:.2f}s  aggregation {r['aggregation_s']:.2f}s  "
                      f"cpu {r['process_cpu_s']:.1f}s (decode clients "
                      f"{r['decode_clients_cpu_s']:.1f} server {r['decode_server_cpu_s']:.1f}; TCP "
                      f"alone {tcp_cpu:.1f}s)  round {r['round_s']:.2f}s  "
                      f"load {r['loadavg']}" + ("  later rounds " + " ".join(
                          f"{w:.2f}s (x{x:.2f})" for w, x in zip(r["later_windows_s"],
                                                                   r["later_over_ideal"]))
                          if r["later_windows_s"] else ""), flush=True)
    if args.json:
        data = {"machine": machine(), "runs": rows}
        write_json(args.json, data, headline(data))


if __name__ == "__main__":
    main()
