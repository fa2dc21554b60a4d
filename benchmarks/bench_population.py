"""Population scale (issue 22): cost that follows the cohort, not the population.

    python3 benchmarks/bench_population.py [--populations 10000 100000 1000000] [--per-round 1000]
        [--dataset synthetic-fedprox] [--rounds 5] [--epochs 1]
        [--runtimes loop local launch pfl] [--pfl-python PY] [--limit-mb 12000] [--algo fedavg]
        [--json F]

For each population, side by side in one run (in this order: the plain loop, `fednet local`,
`fednet launch`, and pfl-research when it imports: pfl_peer.py, else one line says it is
skipped): FedAvg with `--fraction per_round / population`, the same seed and data (--algo: another algorithm for
fednet's runs, e.g. scaffold, whose clients keep their state in the run's store on disk; the
loop stays FedAvg, so its ratio then compares unlike work). Per
run: the whole command's seconds, the seconds before the first round started (command start to
round 0's start: imports, data, registration; from when metrics.jsonl got its first row, less
that round's wall-clock), the median round wall-clock (rounds 1.. when there are
several) and its ratio to the plain loop's round, the seconds from the last round's end to the command's exit, the
bytes written into the run folder besides the final model, the peak of the summed proportional set size
(PSS) of the command and every process it started (sampled every 0.2 s), and the final accuracy (the loop
does fednet local's FedAvg rounds: the same cohorts and batch orders, so its accuracy is fednet
local's; pfl-research draws its own cohorts). A run whose processes together pass --limit-mb is
killed and reported so.

The plain loop is benchmarks/plain_loop.py (one process, torch.optim.SGD, fednet's cohort draw
and the clients' data through fednet's client_data, so natural datasets work too).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, metrics, run_with_peak, summary  # noqa: E402
from benchlib.util import (git_state, headline_row, machine, measured, median, table,  # noqa: E402
                   write_json)

HERE = Path(__file__).resolve().parent


def fednet_run(runtime: str, n: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    argv = fednet_module(runtime, "--algo", a.algo, "--dataset", a.dataset, "--clients", str(n),
                         "--fraction", repr(a.per_round / n), "--rounds", str(a.rounds),
                         "--epochs", str(a.epochs), "--seed", "0", "-q", "--out", str(out),
                         "--register-timeout", "600")
    r = run_with_peak(argv, a.limit_mb, a.timeout_s, out / "metrics.jsonl")
    r.pop("stdout")
    if (out / "summary.json").exists():
        s, rows = summary(out), metrics(out)
        walls = [rows[0]["wall_s"]] + [b["wall_s"] - a_["wall_s"] for a_, b in zip(rows, rows[1:])]
        first = r["first_row_s"]  # round 0 ended then; it took rows[0]["wall_s"]
        last = r["last_row_s"]
        r.update(status=s["status"], accuracy=s.get("final_accuracy"),
                 round_s=median(walls[1:] or walls), ready_s=s.get("ready_s"),
                 before_first_round_s=None if first is None else first - rows[0]["wall_s"],
                 after_last_round_s=None if last is None else r["seconds"] - last,
                 folder_bytes=folder_bytes(out))
    else:
        r["status"] = "killed (memory)" if r["killed"] else f"no summary (rc {r['rc']})"
    return r


def folder_bytes(out: Path) -> int:
    """The bytes a run wrote into its folder, its final model aside (issue 43: <= 10 MB at a
    million clients)."""
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file()
               and f.name != "final_model.npz")


def has_pfl(python: str) -> bool:
    """Whether pfl-research imports under `python`."""
    return subprocess.run([python, "-c", "import pfl.algorithm"], capture_output=True).returncode == 0


def loop_run(n: int, a: argparse.Namespace, peer: str = "") -> dict[str, Any]:
    """The plain loop (plain_loop.py), or with `peer` pfl-research (pfl_peer.py, under that
    Python): the same job, one JSON line."""
    script = "pfl_peer.py" if peer else "plain_loop.py"
    argv = [peer or sys.executable, str(HERE / script), "--dataset", a.dataset, "--clients",
            str(n), "--fraction", repr(a.per_round / n), "--rounds", str(a.rounds),
            "--epochs", str(a.epochs)]
    r = run_with_peak(argv, a.limit_mb, a.timeout_s)
    if r["rc"] == 0:
        got = json.loads(r["stdout"].strip().splitlines()[-1])
        r.update(status="completed", accuracy=got["accuracy"],
                 round_s=got["loop_s"] / a.rounds, before_first_round_s=r["seconds"] - got["loop_s"])
    else:
        r["status"] = f"failed (rc {r['rc']})"
    r.pop("stdout")
    return r


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows at the largest population, for each fednet runtime measured: the
    whole command and the round against the plain loop's, when the first round starts (launch:
    when its clients were ready), the last round -> exit, the run folder besides the model and
    the peak memory (issue 43's targets at 1,000,000 clients, 1,000 a round)."""
    res, a = data.get("results", []), data.get("args", {})
    mine = [r for r in res if r["runtime"] not in ("loop", "pfl") and r.get("round_s")]
    if not mine:
        return []
    n = max(r["population"] for r in mine)
    at = {r["runtime"]: r for r in res if r["population"] == n}
    million = n == 1_000_000 and a.get("per_round") == 1000
    ten = n == 10_000_000 and a.get("per_round") == 1000  # both within 4 GB, ready <= 10 s
    rows: list[dict[str, Any] | None] = []
    for rt, (whole, peak) in (("local", ("<= 1.0x", "<= 1.2 GB")),
                              ("launch", ("<= 0.85x", "<= 2 GB"))):
        r = at.get(rt)
        if r is None or not r.get("round_s"):
            continue
        what = f"{n:,} clients, {a.get('per_round'):,} a round, fednet {rt} ({a.get('algo')})"
        t = (lambda x: x if million else "")  # noqa: E731 - targets hold at that size only
        loop = at.get("loop") or {}
        if loop.get("rc") != 0:  # a loop that failed is no yardstick
            loop = {}
        peer = at.get("pfl") or {}
        if peer.get("rc") == 0:
            rows.append(headline_row(
                "scale", f"{what}: the whole command / pfl-research's", r["seconds"] /
                peer["seconds"], "x", "", f"{r['seconds']:.1f} s against {peer['seconds']:.1f} s"))
        rows += [
            headline_row("scale", f"{what}: the whole command / the plain loop's",
                         r["seconds"] / loop["seconds"] if loop.get("seconds") else None, "x",
                         t(whole), f"{r['seconds']:.1f} s against {loop.get('seconds', 0):.1f} s"),
            headline_row("scale", f"{what}: a round / the plain loop's", r.get("vs_loop"), "x",
                         "", f"median round {r['round_s']:.2f} s"),
            headline_row("scale", f"{what}: " + ("clients ready" if rt == "launch" else
                                                 "the first round starts"),
                         r.get("ready_s") if rt == "launch" else r.get("before_first_round_s"),
                         "s", (t("<= 5 s") or ("<= 10 s" if ten else "")) if rt == "launch" else "",
                         f"{a.get('dataset')}; status {r['status']}"),
            headline_row("scale", f"{what}: the last round -> exit", r.get("after_last_round_s"),
                         "s", t("<= 2 s"), "metrics.jsonl's last row to the command's exit"),
            headline_row("scale", f"{what}: the run folder besides the model",
                         None if r.get("folder_bytes") is None else r["folder_bytes"] / 1e6, "MB",
                         t("<= 10 MB"), "every file but final_model.npz"),
            headline_row("scale", f"{what}: peak memory, all processes", r["peak_mb"] * 2**20 / 1e9,
                         "GB", t(peak) or ("<= 4 GB" if ten else ""),
                         "PSS summed, sampled every 0.2 s, the output phase in"),
        ]
    return measured(*rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--populations", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--per-round", type=int, default=1000)
    ap.add_argument("--dataset", default="synthetic-fedprox")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--runtimes", nargs="+", default=["loop", "local", "launch", "pfl"],
                    choices=["loop", "local", "launch", "pfl"],
                    help="pfl: pfl-research (pip install pfl), an optional peer: skipped with a "
                         "line when it does not import under --pfl-python")
    ap.add_argument("--pfl-python", default=sys.executable,
                    help="the Python that has pfl-research (default: this one)")
    ap.add_argument("--limit-mb", type=float, default=12_000,
                    help="kill a run whose processes together hold more (default 12000)")
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--algo", default="fedavg", help="fednet's algorithm (the loop is FedAvg)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    results: list[dict[str, Any]] = []
    if "pfl" in a.runtimes and not has_pfl(a.pfl_python):
        print(f"pfl-research does not import under {a.pfl_python} (pip install pfl): its rows "
              "are skipped", file=sys.stderr)
        a.runtimes = [r for r in a.runtimes if r != "pfl"]
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.populations:
            loop = None
            for rt in a.runtimes:
                print(f"population {n:,}: {rt} ...", file=sys.stderr, flush=True)
                r = (loop_run(n, a) if rt == "loop" else loop_run(n, a, a.pfl_python)
                     if rt == "pfl" else fednet_run(rt, n, a, Path(tmp) / f"{rt}{n}"))
                r.update(population=n, runtime=rt)
                if rt == "loop":
                    loop = r
                if loop and loop.get("round_s") and r.get("round_s"):
                    r["vs_loop"] = r["round_s"] / loop["round_s"]
                results.append(r)
    rows = [[r["population"], r["runtime"], r["status"], r.get("before_first_round_s"),
             r.get("round_s"), r.get("vs_loop"), r.get("after_last_round_s"), r["peak_mb"],
             None if r.get("folder_bytes") is None else r["folder_bytes"] / 1e6,
             r.get("accuracy"), r["seconds"]]
            for r in results]
    print(table(["population", "runtime", "status", "before round 0 s", "round s", "x loop",
                 "last round -> exit s", "peak MB (all processes)", "folder MB (no model)",
                 "accuracy", "command s"], rows))
    data = {"machine": machine(), "commit": git_state(), "args": vars(a), "results": results}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
