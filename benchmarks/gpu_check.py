#!/usr/bin/env python3
"""The prepared device check (issue 27): fednet's clients on CUDA, measured on a real GPU in one
short command that prints one table. A device is lent to some tasks only, for ~15 minutes in
all, so everything that needs one is here, bounded, and runs in one call.

    python3 benchmarks/gpu_check.py [--json FILE] [--budget-s 480] [--gpu 0] [--clients 100]
                                    [--reps 1] [--cpu-only] [--only PART ...] [--skip PART ...]

On a device machine (one GPU, nothing outside reachable), from the repository root:

    (pip install --no-deps --no-build-isolation -e . || true) && \\
        python3 benchmarks/gpu_check.py --json "$OUT/gpu.json"

That machine must already have a CUDA build of torch (and fednet's other dependencies): it has
no internet, so pip cannot fetch them; the script puts the working tree on PYTHONPATH, so the
install is optional, and it says plainly when fednet or torch cannot be imported. PyPI's torch
2.14.1 (setup.cfg's pin) is the CUDA 13 build, which needs an NVIDIA driver that supports CUDA
13; the `gpu info` row gives torch's CUDA version beside the driver's.

Parts, in this order, each a subprocess with its own timeout (so one hanging part cannot eat
the budget) and never started when the budget left is below what it needs (it then says so):

info           torch's version and CUDA build, the device's name, capability and memory;
               nvidia-smi's driver and CUDA versions. Decides the path: without a usable CUDA
               device (or with --cpu-only) every part that needs one is marked "skipped: no
               CUDA device" and only the CPU path runs (below).
pytest-gpu     `pytest -m gpu tests`: every CUDA test, including tests/test_gpu_resume.py
               (resume of runs whose client state, SCAFFOLD's c_k and FedDyn's gradients, is on
               CUDA: in-process and through `fednet launch --gpus 0` killed after a
               checkpoint). Passed / failed / skipped from its JUnit XML.
context        one bare process on the device: memory after its CUDA context, then after one
               ResNet-18 step, against the rule's 512 MiB context + 256 MiB workspace.
W/loop-gpu     a plain single-process PyTorch FedAvg loop on the same GPU training the same
               clients (fednet's dataset, partition, model and local-training defaults, all
               data on the device, the global model tested on the device after every round),
               timed per round (synchronized); its train and test split, its peak
               max_memory_allocated; and the server's CPU test pass timed on a sample (fednet's
               server evaluates on the CPU, one thread), scaled to the test set.
W/launch-gpu   `fednet launch --clients 100 --gpus 0` (default --clients-per-process auto),
               interleaved with W/loop-gpu (loop, launch, loop, launch, ... with --reps). Per
               round: metrics.jsonl's wall_s, the mean of the rounds after round 0. What auto
               chose (summary.json clients_per_process) and device memory sampled every 0.5 s
               (nvidia-smi --query-compute-apps per pid of the run's processes, else pynvml; when
               no pid matches, e.g. in a PID namespace, the device's used memory over its
               baseline divided by the processes): the mean peak per process against the rule's
               estimate for it (platform/packing.py: CUDA_CONTEXT_BYTES +
               DEVICE_WORKSPACE_BYTES + k x core/footprint.py's device_bytes_per_client).
W/launch-gpu-batched  the same with --batch-clients CLIENTS (issue 56: each client process trains
               the tasks it holds as one batch on the device; auto then makes one process a core
               but the server's).
W/launch-gpu-2slots   the same with --gpus 0,0 (two slots on one device), or "refused" when
               fednet's --gpus parser refuses a repeated index (checked first, no device time).
W/launch-cpu   the same run without --gpus (after all GPU parts: the CPU runs are the slowest).

W is each workload (100 clients, IID, seed 0, --augment none so the plain loop does the same
work; the rounds are few to fit the budget):
    digits     digits, its default model (digits_cnn), 5 epochs, batch 8, 5 rounds
    cifar      synthetic-cifar10 (generated, not CIFAR), its default model (fedseq_cnn), 1 epoch,
               batch 32, 3 rounds (CPU: 2)
    resnet18   synthetic-cifar10 with ResNet-18, 1 epoch, batch 64, 2 rounds (CPU: 1)
A round's time is the mean of the rounds after round 0 (round 0 holds the warm-up), or round 0's
when there is only one.

CPU path (no CUDA device, or --cpu-only): info, then digits/loop-cpu, digits/launch-cpu and
digits/launch-cpu-batched (--batch-clients) with --cpu-clients (10) clients, --cpu-rounds (3)
rounds of 1 epoch: about 20 s on 2 cores; CI runs it (tests/test_gpu_check.py).

Targets (issue 27), printed under the table: every gpu test passes on CUDA; 100 clients on one
GPU: a round within 1.3x of the plain GPU loop's round; the auto rule's estimate of device memory
per process within 25% of the measured one.

--json FILE writes every part's figures (per-round times, summaries' fields, memory samples'
peaks, stderr tails of failed parts) and the targets; it is rewritten after every part
("complete": false until the end), so a check killed from outside leaves what it had. SIGTERM
or Ctrl-C stops the running part (and its processes) and still prints the table. The table is
always printed; the exit status is 0 when the check ran (whatever it found), 2 when fednet or
torch cannot be imported.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.gpu_children import child_context, child_info, child_plain  # noqa: E402
from benchlib.gpu_device import MiB, DeviceMemory, parse_compute_apps, smi_id, smi_versions  # noqa: E402
from benchlib.gpu_parts import (do_context, do_launch, do_plain, do_pytest, gpus_refusal,  # noqa: E402
                                junit_counts, last_json, loop_round, per_round, rule_estimate,
                                this_script)
from benchlib.gpu_report import (MEMORY_TARGET, NO_CUDA, ROUND_TARGET, WORKLOADS, f1,  # noqa: E402
                                 mean_round, print_report, rows_of, targets)
from benchlib.parts import Budget, Runner, fednet_importable  # noqa: E402
from benchlib.util import headline_row, machine, measured, stamp, write_json  # noqa: E402

__all__ = ["NO_CUDA", "Budget", "Runner", "junit_counts", "loop_round", "parse_compute_apps",
           "per_round", "rows_of", "smi_id", "targets"]
"""What tests/test_gpu_check.py reads (as `gc`, through tests/harness.py's bench("gpu_check"))."""


def headline(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: on the GPU path the issue's three targets (the round and memory
    rows: the workload farthest from its target); on the CPU path the CPU round only."""
    parts, t = res.get("parts", []), res.get("targets", {})
    if res.get("mode") != "gpu":
        loop, launch = mean_round(parts, "digits/loop-cpu"), mean_round(parts, "digits/launch-cpu")
        return measured(headline_row(
            "GPU", "no CUDA device: digits on the CPU, fednet launch round / plain loop's",
            launch / loop if loop and launch else None, "x", "",
            f"{res.get('no_gpu_reason', '')}; the GPU targets are not measured"))
    py = t.get("gpu_tests_pass", {})
    rounds = {k: v["ratio"] for k, v in t.get("round_within_1.3x", {}).items() if "ratio" in v}
    mem = {k: v["estimate_over_measured"] for k, v in
           t.get("memory_estimate_within_25pct", {}).items() if "estimate_over_measured" in v}
    worst_r = max(rounds, key=rounds.get) if rounds else None
    worst_m = max(mem, key=lambda k: abs(mem[k] - 1)) if mem else None
    return measured(
        headline_row("GPU", "pytest -m gpu on CUDA: tests passed",
                     f"{py['passed']} of {py['tests']}" if "tests" in py else None, "",
                     "all pass", f"{py.get('failed', 0)} failed, {py.get('skipped', 0)} skipped"),
        headline_row("GPU", f"{res.get('clients')} clients on one GPU: a round / the plain GPU "
                     "loop's, the slowest workload", rounds.get(worst_r), "x",
                     f"<= {ROUND_TARGET:g}x",
                     ", ".join(f"{k} {v:.2f}x" for k, v in rounds.items())),
        headline_row("GPU", "the auto rule's device memory per process / measured, the farthest "
                     "workload", mem.get(worst_m), "x", f"within {MEMORY_TARGET:.0%} of 1",
                     ", ".join(f"{k} {v:.2f}" for k, v in mem.items())))


def write_partial(path: str | None, res: dict[str, Any]) -> None:
    """The JSON so far (rewritten after every part), quietly, with the common keys."""
    if path:
        Path(path).write_text(json.dumps(stamp(res, headline(res), Path(__file__).name),
                                         indent=2, default=str) + "\n")


def gpu_path(run: Runner, args: argparse.Namespace, want: Callable[[str], bool],
             mem: DeviceMemory) -> None:
    g = args.gpu
    if want("pytest-gpu"):
        do_pytest(run)
    if want("context"):
        c = do_context(run, g, mem)
        ctx = c.get("context", {})
        c["note"] = (f"context {f1(ctx.get('context'), 0)} MiB (rule 512), after a ResNet-18 "
                     f"step {f1(ctx.get('step'), 0)} MiB (rule 512+256)")
    two_slots = f"{g},{g}"
    refused = gpus_refusal(two_slots)
    cpu_runs = []
    for w in WORKLOADS:
        k = w["key"]
        for _ in range(args.reps):
            if want(f"{k}/loop-gpu"):
                r = do_plain(run, f"{k}/loop-gpu", w, args.clients, w["rounds"], f"cuda:{g}",
                             w["caps"]["loop"], w["mins"]["loop"], cpu_eval=args.cpu_eval_sample)
                if r["status"] == "ok":
                    lp = r["loop"]
                    r["note"] = (f"train {f1(r['train_s'])} + test {f1(r['test_s'])} s/round; "
                                 f"allocated {f1(lp.get('max_allocated_mib'), 0)} MiB; server's "
                                 f"CPU test pass ~{f1(lp.get('server_cpu_test_s'))} s")
            if want(f"{k}/launch-gpu"):
                launch_gpu(run, f"{k}/launch-gpu", w, args, str(g), 1)
            if want(f"{k}/launch-gpu-batched"):
                launch_gpu(run, f"{k}/launch-gpu-batched", w, args, str(g), 1,
                           batched=args.clients)
        if want(f"{k}/launch-gpu-2slots"):
            if refused:
                run.record(f"{k}/launch-gpu-2slots", "refused", why=f"fednet: {refused}")
            else:
                launch_gpu(run, f"{k}/launch-gpu-2slots", w, args, two_slots, 2)
        if want(f"{k}/launch-cpu"):
            cpu_runs.append(w)
    for w in cpu_runs:
        k = w["key"]
        r = do_launch(run, f"{k}/launch-cpu", w, args.clients, w["cpu_rounds"], None,
                      w["caps"]["cpu"], w["mins"]["cpu"])
        if r["status"] == "ok":
            r["note"] = f"ready {f1(r.get('ready_s'), 1)} s; {w['cpu_rounds']} rounds"


def launch_gpu(run: Runner, name: str, w: dict[str, Any], args: argparse.Namespace, gpus: str,
               ndev: int, batched: int = 0) -> None:
    """A fednet launch on the device(s) `gpus`; batched > 0: with --batch-clients batched."""
    r = do_launch(run, name, w, args.clients, w["rounds"], gpus, w["caps"]["launch"],
                  w["mins"]["launch"], extra=_batch_clients(batched))
    choice = r.get("choice") or (r.get("partial") or {}).get("choice")
    if choice:
        with contextlib.suppress(Exception):
            r["estimate"] = rule_estimate(w["dataset"], w["model"], args.clients,
                                          int(choice["per_process"]), int(choice["processes"]),
                                          ndev)
    if r["status"] == "ok":
        mem = r.get("memory") or {}
        pss = r.get("client_pss_bytes")
        r["note"] = (f"ready {f1(r.get('ready_s'), 1)} s; devices {','.join(r['devices'])}; "
                     f"memory {mem.get('per_process_how', 'not measured')}"
                     + (f"; host PSS {pss / MiB / max(1, r['choice']['processes']):.0f} MiB/proc"
                        if pss else ""))


def _batch_clients(n: int) -> list[str]:
    """--batch-clients N (issue 56: a round's clients trained together), or nothing."""
    return ["--batch-clients", str(n)] if n > 0 else []


def cpu_path(run: Runner, args: argparse.Namespace, want: Callable[[str], bool]) -> None:
    for name in ["pytest-gpu", "context"]:
        if want(name):
            run.record(name, NO_CUDA)
    refused = gpus_refusal(f"{args.gpu},{args.gpu}")
    small = dict(WORKLOADS[0], rounds=args.cpu_rounds)
    if want("digits/loop-cpu"):
        r = do_plain(run, "digits/loop-cpu", small, args.cpu_clients, args.cpu_rounds, "cpu", 90,
                     5, epochs=1)
        if r["status"] == "ok":
            r["note"] = f"train {f1(r['train_s'])} + test {f1(r['test_s'], 3)} s/round"
    if want("digits/launch-cpu"):
        r = do_launch(run, "digits/launch-cpu", small, args.cpu_clients, args.cpu_rounds, None,
                      120, 5, epochs=1)
        if r["status"] == "ok":
            r["note"] = (f"{args.cpu_clients} clients, {args.cpu_rounds} rounds of 1 epoch; ready "
                         f"{f1(r.get('ready_s'), 1)} s; {r['choice'].get('reason', '')}")
    if want("digits/launch-cpu-batched"):
        r = do_launch(run, "digits/launch-cpu-batched", small, args.cpu_clients, args.cpu_rounds,
                      None, 120, 5, epochs=1, extra=_batch_clients(args.cpu_clients))
        if r["status"] == "ok":
            r["note"] = (f"--batch-clients {args.cpu_clients}; {r['choice'].get('reason', '')}")
    for w in WORKLOADS:
        for part in ("loop-gpu", "launch-gpu", "launch-gpu-batched", "launch-gpu-2slots"):
            if not want(f"{w['key']}/{part}"):
                continue
            why = f"fednet would refuse --gpus {args.gpu},{args.gpu}: {refused}" \
                if part.endswith("2slots") and refused else ""
            run.record(f"{w['key']}/{part}", NO_CUDA, **({"why": why} if why else {}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="FILE", help="write the results here")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="overall time budget in seconds (default 480 = 8 minutes)")
    ap.add_argument("--gpu", type=int, default=0, help="the CUDA device (torch's index)")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--reps", type=int, default=1, help="loop/launch pairs per workload")
    ap.add_argument("--cpu-only", action="store_true",
                    help="run the CPU path even when a CUDA device is visible")
    ap.add_argument("--cpu-clients", type=int, default=10, help="clients of the CPU path")
    ap.add_argument("--cpu-rounds", type=int, default=3, help="rounds of the CPU path")
    ap.add_argument("--cpu-eval-sample", type=int, default=512,
                    help="test images the server's CPU test pass is timed on (0: not timed)")
    ap.add_argument("--only", nargs="+", metavar="PART",
                    help="run only these parts (prefixes: digits, resnet18/launch-gpu, ...)")
    ap.add_argument("--skip", nargs="+", metavar="PART", default=[],
                    help="do not run these parts (prefixes as --only)")
    ap.add_argument("--child", choices=["info", "plain", "context"], help=argparse.SUPPRESS)
    ap.add_argument("--dataset", default="digits", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "info":
        child_info(args.gpu)
        return 0
    if args.child == "plain":
        child_plain(args)
        return 0
    if args.child == "context":
        child_context(args.device)
        return 0

    def want(part: str) -> bool:
        def hit(sel: str) -> bool:
            return part == sel or part.startswith(sel.rstrip("/") + "/")
        return (not args.only or any(hit(s) for s in args.only)) and \
            not any(hit(s) for s in args.skip)

    budget = Budget(args.budget_s)
    res: dict[str, Any] = {"machine": machine(), "budget_s": args.budget_s, "argv": sys.argv[1:],
                           "clients": args.clients, "mode": "none", "gpu": {}, "parts": []}

    def snapshot(final: bool) -> dict[str, Any]:
        res["parts"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in run.parts]
        res["elapsed_s"] = budget.elapsed()
        res["device_peak_mib"] = run.device_peak_mib
        res["targets"] = targets(res["parts"], res["mode"] == "gpu")
        res["complete"] = final
        return res

    def save_partial() -> None:
        write_partial(args.json, snapshot(False))

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    with contextlib.suppress(ValueError):  # not the main thread: Ctrl-C only
        signal.signal(signal.SIGTERM, on_term)
    rc = 0
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as t:
        run = Runner(budget, Path(t), on_record=save_partial)
        try:
            rc = check(run, res, args, want)
        except KeyboardInterrupt as e:
            res["interrupted"] = str(e) or "Ctrl-C"
            print(f"gpu_check: interrupted ({res['interrupted']}); the parts so far:",
                  file=sys.stderr, flush=True)
        snapshot(True)
        print_report(res)
        write_json(args.json, res, headline(res))
    return rc


def check(run: Runner, res: dict[str, Any], args: argparse.Namespace,
          want: Callable[[str], bool]) -> int:
    """Every part, in order; 2 when fednet or torch cannot be imported, else 0."""
    problem = fednet_importable()
    if problem:
        print(problem, file=sys.stderr)
        run.record("info", "not run", why=problem[:200])
        return 2
    info_r = run.run("info", this_script() + ["--child", "info", "--gpu", str(args.gpu)], 90, 5)
    info = last_json(info_r.pop("_stdout", "")) or {}
    info.update(smi_versions(args.gpu))
    res["gpu"] = info
    if "import_error" in info:
        problem = (f"torch or fednet's dependencies cannot be imported "
                   f"({info['import_error']}); nothing else can run")
        print(problem, file=sys.stderr)
        info_r.update(status="failed", why=problem[:200])
        return 2
    why = None
    if info_r["status"] != "ok":
        why = f"the info probe {info_r['status']}"
    elif args.cpu_only:
        why = "--cpu-only"
    elif not info.get("torch_cuda"):
        why = f"torch {info.get('torch')} is a CPU build (a CUDA build is needed)"
    elif not info.get("cuda_available"):
        why = "torch sees no CUDA device" + (f" ({info['cuda_warnings'][0]})"
                                              if info.get("cuda_warnings") else "")
    elif args.gpu >= info.get("device_count", 0):
        why = f"no device {args.gpu} (torch sees {info.get('device_count')})"
    info_r["note"] = (f"{info.get('name', '-')}, {info.get('total_mib', '-')} MiB; torch "
                      f"{info.get('torch', '-')} CUDA {info.get('torch_cuda') or '-'}; driver "
                      f"{info.get('driver', '-')} CUDA {info.get('driver_cuda', '-')}"
                      if not why else why)
    if why:
        res["mode"], res["no_gpu_reason"] = "cpu", why
        print(f"gpu_check: no CUDA device used ({why}); running the CPU path only",
              file=sys.stderr, flush=True)
        cpu_path(run, args, want)
    else:
        res["mode"] = "gpu"
        mem = DeviceMemory(args.gpu)
        run.mem = mem
        res["memory_source"] = mem.source
        if mem.source is None:
            print("gpu_check: neither nvidia-smi nor pynvml answers: device memory is not "
                  "measured", file=sys.stderr, flush=True)
        gpu_path(run, args, want, mem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
