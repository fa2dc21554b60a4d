"""gpu_check.py's workloads, its table (one row per part) and the issue's targets, each met / not
met / not measured."""
from __future__ import annotations

import math
from typing import Any

from benchlib.util import table

ROUND_TARGET = 1.3        # a fednet round on the GPU / the plain GPU loop's round
MEMORY_TARGET = 0.25      # |rule's estimate / measured - 1|
NO_CUDA = "skipped: no CUDA device"

WORKLOADS: list[dict[str, Any]] = [
    {"key": "digits", "dataset": "digits", "model": "auto", "epochs": 5, "batch": 8,
     "rounds": 5, "cpu_rounds": 5, "caps": {"loop": 90, "launch": 180, "cpu": 150},
     "mins": {"loop": 15, "launch": 40, "cpu": 25}},
    {"key": "cifar", "dataset": "synthetic-cifar10", "model": "auto", "epochs": 1, "batch": 32,
     "rounds": 3, "cpu_rounds": 2, "caps": {"loop": 120, "launch": 220, "cpu": 200},
     "mins": {"loop": 20, "launch": 50, "cpu": 45}},
    {"key": "resnet18", "dataset": "synthetic-cifar10", "model": "resnet18", "epochs": 1,
     "batch": 64, "rounds": 2, "cpu_rounds": 1, "caps": {"loop": 180, "launch": 300, "cpu": 240},
     "mins": {"loop": 30, "launch": 90, "cpu": 120}},
]


def f1(v: Any, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def mean_round(parts: list[dict[str, Any]], name: str) -> float | None:
    """The mean round time of the successful parts called `name` (one per --reps)."""
    got = [p["round_s"] for p in parts if p["part"] == name and p["status"] == "ok"
           and p.get("round_s") is not None and not math.isnan(p["round_s"])]
    return sum(got) / len(got) if got else None


def last_part(parts: list[dict[str, Any]], name: str, ok: bool = False) -> dict[str, Any]:
    """The last part called `name` (ok=True: the last that succeeded), or {}."""
    got = [p for p in parts if p["part"] == name and (not ok or p["status"] == "ok")]
    return got[-1] if got else {}


def rows_of(parts: list[dict[str, Any]]) -> list[list[Any]]:
    """One table row per part: part, status, s, s/round, vs GPU loop, clients/process, device
    MiB per process measured, rule's estimate, estimate / measured, device peak MiB, note."""
    rows = []
    for p in parts:
        w = p["part"].split("/")[0]
        rnd = p.get("round_s")
        vs = "-"
        ref, label = mean_round(parts, f"{w}/loop-gpu"), ""
        if ref is None and p["part"].endswith("-cpu"):
            ref, label = mean_round(parts, f"{w}/loop-cpu"), " (CPU loop)"
        if rnd is not None and ref and "/loop" not in p["part"]:
            vs = f"{rnd / ref:.2f}x{label}"
        mem = p.get("memory") or {}
        est = p.get("estimate") or {}
        meas = mem.get("per_process_mib")
        ratio = f"{est['per_process_mib'] / meas:.2f}" if meas and est else "-"
        choice = p.get("choice") or {}
        cpp = f"{choice['per_process']} x {choice['processes']} proc" if choice else "-"
        note = "; ".join(x for x in (p.get("why", ""), p.get("note", "")) if x)
        acc = p.get("accuracy") if "accuracy" in p else (p.get("loop") or {}).get("accuracy")
        rows.append([p["part"], p["status"], f1(p.get("wall_s"), 1), f1(rnd), vs, cpp,
                     f1(acc, 3), f1(meas, 0), f1(est.get("per_process_mib"), 0), ratio,
                     f1(mem.get("peak_used_mib")), note[:NOTE_CHARS]])
    return rows


NOTE_CHARS = 110
HEADERS = ["part", "status", "s", "s/round", "vs GPU loop", "per process (auto)", "accuracy",
           "device MiB/proc", "rule MiB/proc", "rule/measured", "device peak MiB", "note"]


def targets(parts: list[dict[str, Any]], gpu_path: bool) -> dict[str, Any]:
    """The issue's three targets, each met / not met / not measured."""
    if not gpu_path:
        return {k: {"verdict": "not measured: no CUDA device"} for k in
                ("gpu_tests_pass", "round_within_1.3x", "memory_estimate_within_25pct")}
    t: dict[str, Any] = {}
    pt = last_part(parts, "pytest-gpu")
    py = pt.get("pytest")
    if py:
        ok = py["tests"] > 0 and py["passed"] == py["tests"]
        t["gpu_tests_pass"] = {"verdict": "met" if ok else "not met", **{
            k: py[k] for k in ("tests", "passed", "failed", "errors", "skipped")}}
    else:
        t["gpu_tests_pass"] = {"verdict": "not measured: " + pt.get("status", "not run")}
    rounds, memory = {}, {}
    for w in WORKLOADS:
        k = w["key"]
        loop, launch = mean_round(parts, f"{k}/loop-gpu"), mean_round(parts, f"{k}/launch-gpu")
        if loop and launch:
            ratio = launch / loop
            rounds[k] = {"ratio": ratio, "launch_round_s": launch, "loop_round_s": loop,
                         "verdict": "met" if ratio <= ROUND_TARGET else "not met"}
        else:
            rounds[k] = {"verdict": "not measured"}
        launch_p = last_part(parts, f"{k}/launch-gpu", ok=True)
        meas = (launch_p.get("memory") or {}).get("per_process_mib")
        est = (launch_p.get("estimate") or {}).get("per_process_mib")
        if meas and est:
            off = est / meas - 1
            memory[k] = {"estimate_over_measured": est / meas,
                         "verdict": "met" if abs(off) <= MEMORY_TARGET else "not met"}
        else:
            memory[k] = {"verdict": "not measured"}
    t["round_within_1.3x"] = rounds
    t["memory_estimate_within_25pct"] = memory
    return t


def print_report(res: dict[str, Any]) -> None:
    info = res.get("gpu", {})
    print(f"gpu_check: {res['mode']} path; {res['elapsed_s']:.0f} s of a {res['budget_s']:.0f} s "
          f"budget; git {res['machine'].get('git')}; {res['machine'].get('nproc')} cores")
    if info:
        print(f"device: {info.get('name') or info.get('smi_name') or '-'}; torch "
              f"{info.get('torch', '-')} (CUDA {info.get('torch_cuda') or 'none'}); driver "
              f"{info.get('driver', '-')} (CUDA {info.get('driver_cuda', '-')}); memory "
              f"{info.get('total_mib') or info.get('smi_total_mib') or '-'} MiB; peak used in this "
              f"check {res.get('device_peak_mib') or '-'} MiB")
    print(table(HEADERS, rows_of(res["parts"])))
    t = res["targets"]
    print("targets:")
    for k, v in t.items():
        if "verdict" in v:
            extra = "" if "tests" not in v else \
                f" ({v['passed']} of {v['tests']} passed, {v['failed']} failed, {v['errors']} " \
                f"errors, {v['skipped']} skipped)"
            print(f"  {k}: {v['verdict']}{extra}")
        else:
            print(f"  {k}: " + "; ".join(
                f"{w} {x['verdict']}" + (f" ({x['ratio']:.2f}x)" if "ratio" in x else "")
                + (f" (estimate/measured {x['estimate_over_measured']:.2f})"
                   if "estimate_over_measured" in x else "") for w, x in v.items()))
