"""gpu_check.py's parts, one function each: pytest -m gpu, the CUDA context, the plain loop and
fednet launch (their commands and what they wrote), and the figures read from them: round times,
the auto rule's memory estimate, fednet's verdict on --gpus, pytest's JUnit counts."""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib.gpu_children import CONTEXT_MARKS
from benchlib.gpu_device import DeviceMemory
from benchlib.parts import Runner, last_json
from fednet.metrics.report import device_counts

MiB = 1 << 20
SCRIPT = Path(__file__).resolve().parents[1] / "gpu_check.py"


def this_script() -> list[str]:
    """gpu_check.py with this interpreter (its --child processes)."""
    return [sys.executable, str(SCRIPT)]


def per_round(walls: list[float]) -> tuple[float, list[float]]:
    """(the round time: mean after round 0, or round 0's alone; every round's duration) from
    cumulative wall-clock marks (metrics.jsonl wall_s)."""
    if not walls:
        return float("nan"), []
    d = [walls[0]] + [b - a for a, b in zip(walls, walls[1:])]
    later = d[1:]
    return (sum(later) / len(later) if later else d[0]), d


def loop_round(rounds: list[dict[str, float]], key: str = "round_s") -> float:
    vals = [r[key] for r in rounds]
    if not vals:
        return float("nan")
    return sum(vals[1:]) / len(vals[1:]) if len(vals) > 1 else vals[0]


def rule_estimate(dataset: str, model: str, clients: int, per_process: int, processes: int,
                  ndev: int) -> dict[str, Any]:
    """The auto rule's device memory for this run (platform/packing.py, core/footprint.py)."""
    from fednet.config import from_dict
    from fednet.core.footprint import device_bytes_per_client
    from fednet.platform import packing

    cfg = from_dict({"clients": clients, "data": {"dataset": dataset}, "train": {"model": model},
                     "gpus": [0]})
    per_client = device_bytes_per_client(cfg)
    proc = packing.CUDA_CONTEXT_BYTES + packing.DEVICE_WORKSPACE_BYTES + per_process * per_client
    return {"per_client_mib": per_client / MiB, "per_process_mib": proc / MiB,
            "device_mib": packing._device_need(clients, per_process, ndev, per_client) / MiB,
            "context_mib": packing.CUDA_CONTEXT_BYTES / MiB,
            "workspace_mib": packing.DEVICE_WORKSPACE_BYTES / MiB}


def gpus_refusal(text: str) -> str | None:
    """fednet's own verdict on --gpus text: None when accepted, else its message."""
    from fednet.errors import ConfigError
    from fednet.platform.gpus import parse_gpus

    try:
        parse_gpus(text)
        return None
    except ConfigError as e:
        return str(e)


def junit_counts(path: Path) -> dict[str, Any]:
    """tests, passed, failed, errors, skipped and the failing tests' ids from pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors",
                                                          "skipped")}
    bad, skipped = [], []
    for case in root.iter("testcase"):
        cid = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            bad.append(cid)
        elif case.find("skipped") is not None:
            skipped.append(cid)
    return {"tests": n["tests"], "failed": n["failures"], "errors": n["errors"],
            "skipped": n["skipped"],
            "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
            "failing": bad, "skipped_ids": skipped}


def launch_argv(w: dict[str, Any], clients: int, rounds: int, out: Path, gpus: str | None,
                epochs: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "fednet.cli", "launch", "--clients", str(clients), "--rounds",
            str(rounds), "--epochs", str(epochs or w["epochs"]), "--batch-size", str(w["batch"]),
            "--dataset", w["dataset"], "--model", w["model"], "--seed", "0", "--augment", "none",
            "--register-timeout", "240", "--round-timeout", "300", "-q", "--out", str(out)]
    if gpus:
        argv += ["--gpus", gpus]
    return argv + list(extra)


def plain_argv(w: dict[str, Any], clients: int, rounds: int, device: str, epochs: int | None = None,
               cpu_eval_sample: int = 0) -> list[str]:
    return this_script() + ["--child", "plain", "--dataset", w["dataset"], "--model", w["model"],
                            "--clients", str(clients), "--rounds", str(rounds), "--epochs",
                            str(epochs or w["epochs"]), "--batch-size", str(w["batch"]),
                            "--device", device, "--cpu-eval-sample", str(cpu_eval_sample)]


def read_run(out: Path) -> dict[str, Any]:
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rnd, each = per_round([float(r["wall_s"]) for r in rows])
    return {"round_s": rnd, "rounds_s": each, "ready_s": s.get("ready_s"),
            "choice": s.get("clients_per_process", {}), "accuracy": s.get("final_accuracy"),
            "status_run": s.get("status"), "devices": sorted(device_counts(s)),
            "client_pss_bytes": s.get("client_pss_bytes"),
            "server_peak_rss_bytes": s.get("server_peak_rss_bytes"),
            "total_wall_s": s.get("total_wall_s")}


def do_plain(run: Runner, name: str, w: dict[str, Any], clients: int, rounds: int, device: str,
             cap: float, mn: float, epochs: int | None = None, cpu_eval: int = 0) -> dict[str, Any]:
    r = run.run(name, plain_argv(w, clients, rounds, device, epochs, cpu_eval), cap, mn,
                sample=device.startswith("cuda"), count_root=True, processes=lambda: 1)
    got = last_json(r.pop("_stdout", ""))
    if r["status"] == "ok" and got:
        r["loop"] = got
        r["round_s"] = loop_round(got["rounds"])
        r["train_s"] = loop_round(got["rounds"], "train_s")
        r["test_s"] = loop_round(got["rounds"], "test_s")
    elif r["status"] == "ok":
        r.update(status="failed", why="no result line")
    return r


def do_launch(run: Runner, name: str, w: dict[str, Any], clients: int, rounds: int,
              gpus: str | None, cap: float, mn: float, epochs: int | None = None,
              extra: Sequence[str] = ()) -> dict[str, Any]:
    out = run.tmp / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    shutil.rmtree(out, ignore_errors=True)
    holder: dict[str, Any] = {}

    def processes() -> int | None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            holder["run"] = read_run(out)
            return int(holder["run"]["choice"]["processes"])
        return None

    r = run.run(name, launch_argv(w, clients, rounds, out, gpus, epochs, extra), cap, mn,
                sample=bool(gpus), processes=processes)
    r.pop("_stdout", None)
    if r["status"] == "ok":
        try:
            r.update(holder.get("run") or read_run(out))
        except (OSError, ValueError, KeyError) as e:
            r.update(status="failed", why=f"no summary: {e}")
    elif (out / "summary.json").exists():
        with contextlib.suppress(OSError, ValueError, KeyError):
            r["partial"] = read_run(out)
    shutil.rmtree(out, ignore_errors=True)  # ResNet-18 runs write 45 MB models
    return r


def do_pytest(run: Runner) -> dict[str, Any]:
    xml = run.tmp / "pytest-gpu.xml"
    r = run.run("pytest-gpu", [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                               "no:cacheprovider", "--junitxml", str(xml), "tests"], 150, 30)
    r.pop("_stdout", None)
    if xml.exists():
        with contextlib.suppress(ET.ParseError, OSError):
            r["pytest"] = junit_counts(xml)
            if r["status"] == "failed" and r["pytest"]["failed"] + r["pytest"]["errors"]:
                r["why"] = f"{r['pytest']['failed'] + r['pytest']['errors']} failing"
    return r


def do_context(run: Runner, gpu: int, mem: DeviceMemory) -> dict[str, Any]:
    marks: dict[str, Any] = {}
    base = mem.used() if mem.source else None

    def on_line(line: str, p: subprocess.Popen) -> None:
        if line in CONTEXT_MARKS and mem.source:
            time.sleep(1.0)
            mine = mem.by_pid().get(p.pid)
            used = mem.used()
            marks[line] = mine if mine is not None else (
                used - base if used is not None and base is not None else None)
            marks[line + "_how"] = "per pid" if mine is not None else "device delta"

    r = run.run("context", this_script() + ["--child", "context", "--device", f"cuda:{gpu}"],
                60, 10, on_line=on_line)
    r["context"] = marks
    r["torch"] = last_json(r.pop("_stdout", "")) or {}
    return r
