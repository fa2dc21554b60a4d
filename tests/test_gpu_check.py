"""benchmarks/gpu_check.py, the prepared device check of issue 27, without a device: it parses,
`--help` works, its helpers read nvidia-smi's and pytest's output, a hanging part is stopped at its
own timeout, and its CPU path runs end to end and writes JSON with every GPU part marked
skipped. (The GPU path itself can only run on a lent device.)"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import bench

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"
gc = bench("gpu_check")


def test_help_names_the_options():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for opt in ("--json", "--budget-s", "--cpu-only", "--only", "--skip", "pytest -m gpu"):
        assert opt in out.stdout


def test_nvidia_smi_and_junit_outputs_are_read(tmp_path):
    assert gc.parse_compute_apps("1234, 512\n1234, 8\n99, [N/A]\nbad\n77, 300\n") == \
        {1234: 520, 77: 300}
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.a" name="ok"/><testcase classname="tests.a" name="ok2"/>'
        '<testcase classname="tests.b" name="bad"><failure message="x"/></testcase>'
        '<testcase classname="tests.c" name="sk"><skipped message="needs CUDA"/></testcase>'
        '</testsuite></testsuites>')
    n = gc.junit_counts(xml)
    assert (n["tests"], n["passed"], n["failed"], n["skipped"]) == (4, 2, 1, 1)
    assert n["failing"] == ["tests.b::bad"] and n["skipped_ids"] == ["tests.c::sk"]


def test_round_times_skip_round_zero():
    rnd, each = gc.per_round([2.0, 2.5, 3.5])
    assert each == [2.0, 0.5, 1.0] and rnd == pytest.approx(0.75)
    assert gc.per_round([4.0]) == (4.0, [4.0])
    assert gc.loop_round([{"round_s": 3.0}, {"round_s": 1.0}, {"round_s": 2.0}]) == 1.5


def test_cuda_visible_devices_maps_nvidia_smis_index(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gc.smi_id(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert gc.smi_id(1) == "5"


def test_a_hanging_part_is_stopped_at_its_timeout_and_the_budget_is_kept(tmp_path):
    run = gc.Runner(gc.Budget(60.0), tmp_path)
    t = time.monotonic()
    r = run.run("hang", [sys.executable, "-c", "import time; time.sleep(60)"], 1.5, 0)
    assert r["status"] == "timed out" and time.monotonic() - t < 20
    r = run.run("big", [sys.executable, "-c", "pass"], 100, 1000)
    assert r["status"] == "not run" and "budget" in r["why"]
    r = run.run("bad", [sys.executable, "-c", "import sys; sys.exit('boom')"], 30, 0)
    assert r["status"] == "failed" and "boom" in r["why"]


def test_targets_and_the_table_from_gpu_figures():
    parts = [{"part": "pytest-gpu", "status": "ok", "pytest": {"tests": 9, "passed": 9,
                                                               "failed": 0, "errors": 0,
                                                               "skipped": 0}},
             {"part": "digits/loop-gpu", "status": "ok", "round_s": 1.0, "loop": {"accuracy": .5}},
             {"part": "digits/launch-gpu", "status": "ok", "round_s": 1.2, "accuracy": 0.5,
              "choice": {"per_process": 1, "processes": 100},
              "memory": {"per_process_mib": 800.0, "peak_used_mib": 80000},
              "estimate": {"per_process_mib": 780.0}},
             {"part": "cifar/loop-gpu", "status": "ok", "round_s": 1.0},
             {"part": "cifar/launch-gpu", "status": "ok", "round_s": 2.0,
              "memory": {"per_process_mib": 400.0}, "estimate": {"per_process_mib": 800.0}},
             {"part": "resnet18/launch-gpu", "status": "timed out", "why": "stopped after 9 s"}]
    t = gc.targets(parts, True)
    assert t["gpu_tests_pass"]["verdict"] == "met"
    r, m = t["round_within_1.3x"], t["memory_estimate_within_25pct"]
    assert r["digits"]["verdict"] == "met" and r["digits"]["ratio"] == pytest.approx(1.2)
    assert r["cifar"]["verdict"] == "not met" and r["resnet18"]["verdict"] == "not measured"
    assert m["digits"]["verdict"] == "met" and m["cifar"]["verdict"] == "not met"
    rows = gc.rows_of(parts)
    assert rows[2][4] == "1.20x" and rows[2][5] == "1 x 100 proc" and rows[2][9] == "0.97"
    assert "stopped after 9 s" in rows[-1][-1]
    assert gc.targets(parts, False)["gpu_tests_pass"]["verdict"].startswith("not measured")


@pytest.mark.slow  # the whole script, as the other benchmarks' smoke tests (12 s)
def test_the_cpu_path_runs_end_to_end_and_marks_every_gpu_part_skipped(tmp_path):
    out = tmp_path / "gpu.json"
    t = time.monotonic()
    p = subprocess.run([sys.executable, str(SCRIPT), "--cpu-only", "--budget-s", "90",
                        "--json", str(out)], capture_output=True, text=True, timeout=150)
    wall = time.monotonic() - t
    assert p.returncode == 0, p.stderr[-3000:]
    assert wall < 90
    res = json.loads(out.read_text())
    assert res["mode"] == "cpu" and res["no_gpu_reason"] == "--cpu-only"
    by = {r["part"]: r for r in res["parts"]}
    assert by["info"]["status"] == "ok"
    for name in ("pytest-gpu", "context", "digits/loop-gpu", "digits/launch-gpu",
                 "digits/launch-gpu-batched", "cifar/launch-gpu", "resnet18/loop-gpu",
                 "resnet18/launch-gpu-2slots"):
        assert by[name]["status"] == gc.NO_CUDA, name
    for name in ("digits/loop-cpu", "digits/launch-cpu", "digits/launch-cpu-batched"):
        assert by[name]["status"] == "ok", (name, by[name].get("why"))
        assert by[name]["round_s"] > 0
    assert by["digits/launch-cpu"]["choice"]["per_process"] >= 1
    assert "--batch-clients" in by["digits/launch-cpu-batched"]["choice"]["reason"]
    assert all(v["verdict"].startswith("not measured") for v in res["targets"].values())
    assert "targets:" in p.stdout and "digits/launch-cpu" in p.stdout
    assert "part" in p.stdout.splitlines()[2]  # the table's header, after two summary lines


def test_sigterm_stops_the_running_part_and_still_prints_the_table(tmp_path):
    out = tmp_path / "gpu.json"
    p = subprocess.Popen([sys.executable, str(SCRIPT), "--cpu-only", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not out.exists():  # rewritten after every part
        time.sleep(0.1)
    assert out.exists()
    assert json.loads(out.read_text())["complete"] is False
    p.send_signal(15)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["complete"] is True and res["interrupted"] == "signal 15"
    assert "targets:" in stdout
