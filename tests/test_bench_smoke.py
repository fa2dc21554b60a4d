"""benchmarks/ as a small package (issue 37 item 5): every script there is either on the
dashboard (it defines headline() and writes its figures with --json, read by
benchmarks/dashboard.py) or a tool the benchmarks use (their cohesion: tests/test_cohesion.py); and each dashboard
script runs at its smallest sizes and writes the JSON the dashboard reads (slow lane: they start
real fednet processes). Scripts dropped from the dashboard are archived in
docs/benchmarks/history.md ("Archived commands") with the commit that had them."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.harness import BENCHMARKS, bench

TOOLS = {"dashboard.py": "writes BENCHMARKS.md from the --json files",
         "flower_secagg.py": "Flower's SecAgg+ beside fednet's, wall-clock and bytes (needs a flwr venv)",
         "golden.py": "the golden pins of tests/test_golden.py",
         "bench_floor.py": "issue 56's million-client round beside its floor, piece by piece "
                           "(the evidence for the 0.05x target's block; no dashboard row)",
         "flower_reference.py": "Flower's robust aggregates for tests/golden/flower_robust.json",
         "plain_loop.py": "the plain PyTorch loop bench_many.py and bench_population.py time",
         "pfl_peer.py": "bench_population.py's optional peer: the same job through pfl-research",
         "round_timing_plugin.py": "bench_many.py's --plugin (timestamps, a small dataset)",
         "secagg_plugin.py": "bench_secagg.py's --plugin (an MLP model)",
         "synthetic_plugin.py": "bench_memory.py's --plugin for older checkouts"}
"""The files in benchmarks/ that are not benchmarks, and what each is for."""


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


SMOKE: dict[str, list[str]] = {
    "bench_aggregation.py": ["--clients", "4", "--params", "20000", "--senders", "2",
                             "--gap-ms", "0"],
    "bench_async.py": ["--clients", "6", "--rounds", "2", "--async-rounds", "3", "--seeds", "0",
                       "--methods", "fedavg", "fedbuff"],
    "bench_batched.py": ["--cells", "mclr:3,digits_cnn:2", "--repeats", "1"],
    "bench_batched_accuracy.py": ["--algos", "fedavg", "--seeds", "0", "1", "--clients", "6",
                                  "--rounds", "2", "--epochs", "1", "--batch-clients", "3"],
    "bench_batched_runs.py": ["--cells", "digits:6", "--rounds", "2", "--repeats", "1"],
    "bench_big_frames.py": ["--connections", "20", "--announce-mib", "16", "--port", "PORT"],
    "bench_compress.py": ["--clients", "3", "--rounds", "1", "--epochs", "1", "--seeds", "0",
                          "--specs", "none", "fp16"],
    "bench_curve.py": ["--mib", "1", "--reps", "2"],
    "bench_compute.py": ["--examples", "32", "--resnet-examples", "4", "--reps", "1",
                         "--calibrate-seconds", "0.2", "--ops-scale", "0.02", "--cohorts", "6",
                         "--robust-n", "12", "--robust-d", "50", "--codec-model", "digits_cnn",
                         "--codecs", "int8", "qsgd", "topk", "--secagg-modes", "plus",
                         "plus-int8"],
    "bench_dp.py": ["user", "--population", "200", "--cohort", "20", "--rounds", "2", "--seeds",
                    "0", "--epsilons", "8", "--no-adaptive"],
    "bench_fedseq.py": ["--clients", "10", "--seeds", "0", "--fedavg-rounds", "2",
                        "--fedseq-rounds", "2", "--pretrain-epochs", "1", "--central-rounds", "1"],
    "bench_frames.py": ["--mb", "2", "--repeats", "2"],
    "bench_inproc.py": ["--clients", "4", "--rounds", "2", "--epochs", "1", "--reps", "1"],
    "bench_launch.py": ["--quick", "--clients", "3", "--ready-reps", "1", "--reps", "1",
                        "--rounds", "1", "--no-breakdown"],
    "bench_many.py": ["--part", "copies", "scale", "--reps", "1", "--scale-clients", "20"],
    "bench_memory.py": ["--clients", "50", "--per-process", "25"],  # 1,000 images to train
    "bench_personal.py": ["--rounds", "1", "--algos", "fedavg", "--scenarios", "iid"],
    "bench_population.py": ["--populations", "50", "--per-round", "5", "--rounds", "2",
                            "--runtimes", "loop", "local", "launch", "pfl", "--timeout-s",
                            "300"],  # (pfl: its row, or a line that it is skipped)
    "bench_ring_timeline.py": ["--local"],
    "bench_robust.py": ["--clients", "10", "--rounds", "1", "--epochs", "1", "--seeds", "0",
                        "--attacks", "alie", "--defenses", "none", "krum", "--timing", "20x1000"],
    "bench_secagg.py": ["--population", "60", "--cohorts", "10", "--drops", "0.1",
                        "--full-clients", "6"],
    "bench_scaling.py": ["--clients", "3", "--rounds", "2"],
    "bench_stack.py": ["--population", "40", "--cohorts", "10", "--rounds", "1", "--seeds", "0",
                       "--epsilons", "8", "--methods", "stack", "--parity-cohort", "0"],
    "bench_transfer.py": ["--quick", "--reps", "1", "--pings", "50"],
    "bench_trust.py": ["--scenarios", "d", "e", "--connections", "20", "--flood", "200"],
}
"""Each dashboard script's smallest run (the figures mean nothing; the script must run)."""
COVERED = {"gpu_check.py": "tests/test_gpu_check.py runs its CPU path end to end with --json"}


def test_every_script_is_on_the_dashboard_or_a_tool_and_small():
    dash = bench("dashboard")
    scripts = set(dash.benchmark_scripts())
    files = {p.name for p in BENCHMARKS.glob("*.py")}
    assert files - scripts == set(TOOLS), "a script that is neither a benchmark (with " \
        "headline() and --json) nor a tool: put it on the dashboard or archive it " \
        "(docs/benchmarks/history.md, 'Archived commands')"
    assert scripts == set(SMOKE) | set(COVERED), "each dashboard script needs a smoke run"
    results = {dash.read_result(p)["script"] for p in (BENCHMARKS / "results").glob("*.json")}
    assert scripts <= results, f"no result file: {sorted(scripts - results)}"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_script_runs_small_and_writes_its_json(script, tmp_path):
    out = tmp_path / "result.json"
    args = [_free_port() if a == "PORT" else a for a in SMOKE[script]]
    t = time.monotonic()
    p = subprocess.run([sys.executable, str(BENCHMARKS / script), *args, "--json", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    data = json.loads(out.read_text())
    assert data["script"] == script and data["command"].startswith("python3 ")
    assert {"commit", "date", "headline", "machine"} <= data.keys()
    got = bench("dashboard").read_result(out)  # the dashboard reads it: rows well formed
    assert got["script"] == script and isinstance(got["rows"], list)
    print(f"{script}: {time.monotonic() - t:.1f} s, {len(got['rows'])} rows")
