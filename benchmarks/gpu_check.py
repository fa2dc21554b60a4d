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

CPU path (no CUDA device, or --cpu-only): info, then digits/loop-cpu and digits/launch-cpu with
--cpu-clients (10) clients, --cpu-rounds (3) rounds of 1 epoch: about 15 s on 2 cores; CI runs
it (tests/test_gpu_check.py).

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
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from benchlib.util import headline_row, machine, measured, stamp, table, write_json  # noqa: E402

MiB = 1 << 20
RESERVE_S = 8.0           # kept back from every part for printing and writing
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


# ---- environment ------------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    """The environment of every part: the working tree first on PYTHONPATH (no install needed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", ""))
                                        if p)
    return env


def fednet_importable() -> str | None:
    """None when fednet's working tree imports here, else the error and what to do."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import fednet.platform.packing  # noqa: F401  (light: no torch)
        return None
    except Exception as e:  # noqa: BLE001 - whatever it is, the message says it
        return (f"fednet is not importable here ({type(e).__name__}: {e}). From the repository "
                "root: pip install --no-deps --no-build-isolation -e . (a machine without "
                "internet must already have torch, with CUDA for the GPU parts, pyzmq, msgpack, "
                "numpy, scikit-learn, click, psutil, scipy, tomli-w)")


def smi_id(gpu: int) -> str:
    """nvidia-smi's -i for torch's device `gpu` (CUDA_VISIBLE_DEVICES renumbers torch's)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None or not vis.strip():
        return str(gpu)
    ids = [v.strip() for v in vis.split(",") if v.strip()]
    return ids[gpu] if gpu < len(ids) else str(gpu)


def parse_compute_apps(text: str) -> dict[int, int]:
    """'1234, 512' lines -> {1234: 512} MiB; lines nvidia-smi cannot fill ('[N/A]') skipped."""
    got: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            got[int(parts[0])] = got.get(int(parts[0]), 0) + int(parts[1])
    return got


class DeviceMemory:
    """Device memory in MiB, from nvidia-smi or else pynvml: the device's used total and each
    process's use. `source` is None when neither answers (the figures are then None / {})."""

    def __init__(self, gpu: int) -> None:
        self.id = smi_id(gpu)
        self.smi = shutil.which("nvidia-smi")
        self.source: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        if self.smi and self.used() is not None:
            self.source = "nvidia-smi"
            return
        self.smi = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._handle = (pynvml.nvmlDeviceGetHandleByIndex(int(self.id)) if self.id.isdigit()
                            else pynvml.nvmlDeviceGetHandleByUUID(self.id))
            self._nvml = pynvml
            self.source = "pynvml"
        except Exception:  # noqa: BLE001 - no source: memory is reported as unknown
            self._nvml = None

    def _smi(self, query: str) -> str | None:
        assert self.smi is not None
        try:
            return subprocess.run([self.smi, "-i", self.id, query, "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None

    def used(self) -> int | None:
        """MiB used on the device now."""
        if self.smi:
            out = self._smi("--query-gpu=memory.used")
            try:
                return int(out.strip().splitlines()[0]) if out else None
            except (ValueError, IndexError):
                return None
        if self._nvml is not None:
            try:
                return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used) // MiB
            except Exception:  # noqa: BLE001
                return None
        return None

    def by_pid(self) -> dict[int, int]:
        """MiB per process on the device ({} when not reported)."""
        if self.smi:
            out = self._smi("--query-compute-apps=pid,used_memory")
            return parse_compute_apps(out) if out else {}
        if self._nvml is not None:
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
                return {int(p.pid): int(p.usedGpuMemory or 0) // MiB for p in procs}
            except Exception:  # noqa: BLE001
                return {}
        return {}


def descendants(pid: int) -> set[int]:
    """Every live descendant of pid (the zygote runs in its own session but is still a child)."""
    try:
        import psutil

        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except Exception:  # noqa: BLE001 - gone, or psutil missing
        return set()


class Sampler:
    """Samples a part's device memory every `every` s in a thread: the device's peak over its
    baseline (taken before the part starts) and each of the part's processes' peak: its
    descendants' (fednet launch: the clients; the server, the part's own process, apart), or
    with count_root the part's own process too (the plain loop)."""

    def __init__(self, mem: DeviceMemory, every: float = 0.5, count_root: bool = False) -> None:
        self.mem, self.every, self.count_root = mem, every, count_root
        self.baseline = mem.used()
        self.peak_used = self.baseline
        self.pid_peak: dict[int, int] = {}
        self.peak_sum, self.peak_procs = 0, 0
        self.seen_any_pid = False
        self._stop = threading.Event()
        self._th: threading.Thread | None = None
        self.root = 0
        self.root_peak: int | None = None

    def start(self, root: int) -> None:
        self.root = root
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        used = self.mem.used()
        if used is not None and (self.peak_used is None or used > self.peak_used):
            self.peak_used = used
        by_pid = self.mem.by_pid()
        self.seen_any_pid |= bool(by_pid)
        if self.root in by_pid:  # the part's own process (fednet launch: the server)
            self.root_peak = max(self.root_peak or 0, by_pid[self.root])
        ours = descendants(self.root) | ({self.root} if self.count_root else set())
        mine = {p: m for p, m in by_pid.items() if p in ours}
        for p, m in mine.items():
            self.pid_peak[p] = max(self.pid_peak.get(p, 0), m)
        if sum(mine.values()) > self.peak_sum:
            self.peak_sum, self.peak_procs = sum(mine.values()), len(mine)

    def stop(self) -> None:
        self._stop.set()
        if self._th is not None:
            self._th.join(timeout=15)

    def result(self, processes: int | None = None) -> dict[str, Any]:
        """The figures; per process from the pids when any matched, else the device's delta over
        `processes`."""
        delta = (self.peak_used - self.baseline) if self.peak_used is not None \
            and self.baseline is not None else None
        out: dict[str, Any] = {"source": self.mem.source, "baseline_mib": self.baseline,
                               "peak_used_mib": self.peak_used, "peak_delta_mib": delta,
                               "pids_matched": len(self.pid_peak),
                               "pid_peak_sum_mib": self.peak_sum,
                               "processes_at_pid_peak": self.peak_procs,
                               "part_process_mib": self.root_peak}
        if self.pid_peak:
            vals = sorted(self.pid_peak.values())
            out.update(per_process_mib=sum(vals) / len(vals), per_process_max_mib=vals[-1],
                       per_process_min_mib=vals[0], per_process_how=f"per pid ({self.mem.source})")
        elif delta is not None and processes:
            out.update(per_process_mib=delta / processes, per_process_how=(
                "device delta / processes" + (" (pids not visible here)"
                                               if self.seen_any_pid else "")))
        return out


# ---- running parts ----------------------------------------------------------------------------
class Budget:
    """The overall time budget (seconds from construction)."""

    def __init__(self, total_s: float) -> None:
        self.total_s, self.t0 = total_s, time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.total_s - self.elapsed()


def stop_tree(p: subprocess.Popen, grace_s: float = 8.0) -> None:
    """Stop a part we started and everything it started: SIGINT to its process group (fednet
    launch stops its clients on Ctrl-C), then SIGKILL to the group and to each descendant left
    by pid (the zygote has its own session)."""
    kids = descendants(p.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    kids |= descendants(p.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    for k in kids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(k, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=5)


def tail(text: str, n: int = 1500) -> str:
    return text[-n:] if text else ""


class Runner:
    """Runs parts under the budget; every part's record is kept in order."""

    def __init__(self, budget: Budget, tmp: Path, mem: DeviceMemory | None = None,
                 on_record: Callable[[], None] | None = None) -> None:
        self.budget, self.tmp, self.mem = budget, tmp, mem
        self.parts: list[dict[str, Any]] = []
        self.device_peak_mib: int | None = None
        self.on_record = on_record  # e.g. writes the JSON so far (a killed check leaves it)

    def record(self, name: str, status: str, **kw: Any) -> dict[str, Any]:
        r = {"part": name, "status": status, **kw}
        self.parts.append(r)
        print(f"[gpu_check {self.budget.elapsed():5.0f}s] {name}: {status}"
              + (f" ({kw['why']})" if kw.get("why") else ""), file=sys.stderr, flush=True)
        if self.on_record is not None:
            with contextlib.suppress(Exception):
                self.on_record()
        return r

    def run(self, name: str, argv: list[str], cap_s: float, min_s: float, *,
            sample: bool = False, count_root: bool = False,
            on_line: Callable[[str, subprocess.Popen], None] | None = None,
            processes: Callable[[], int | None] | None = None) -> dict[str, Any]:
        """Run argv as part `name` with timeout min(cap_s, budget left); its stdout, stderr,
        exit status, wall time and (sample=True) device memory."""
        left = self.budget.left() - RESERVE_S
        if left < min_s:
            return self.record(name, "not run", why=f"budget: {max(left, 0):.0f} s left, needs "
                                                    f"~{min_s:.0f} s")
        timeout = min(cap_s, left)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        out_f, err_f = self.tmp / f"{safe}.out", self.tmp / f"{safe}.err"
        sampler = Sampler(self.mem, count_root=count_root) \
            if sample and self.mem is not None and self.mem.source else None
        t0 = time.monotonic()
        with open(out_f, "w") as fo, open(err_f, "w") as fe:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE if on_line else fo, stderr=fe,
                                 stdin=subprocess.DEVNULL, env=child_env(), cwd=str(ROOT),
                                 start_new_session=True, text=True)
            if sampler:
                sampler.start(p.pid)
            timed_out = False
            try:
                if on_line:
                    watchdog = threading.Timer(timeout, lambda: stop_tree(p))
                    watchdog.start()
                    assert p.stdout is not None
                    for line in p.stdout:
                        fo.write(line)
                        on_line(line.strip(), p)
                    watchdog.cancel()
                    p.wait()
                    timed_out = time.monotonic() - t0 >= timeout
                else:
                    p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_tree(p)
            except BaseException as e:  # Ctrl-C or SIGTERM: the part goes too, then the report
                stop_tree(p, grace_s=3.0)
                if sampler:
                    sampler.stop()
                self.record(name, "stopped", why=f"interrupted ({e or 'Ctrl-C'}) after "
                                                 f"{time.monotonic() - t0:.0f} s")
                raise
            finally:
                if sampler:
                    sampler.stop()
        wall = time.monotonic() - t0
        stdout, stderr = out_f.read_text(errors="replace"), err_f.read_text(errors="replace")
        extra: dict[str, Any] = {"wall_s": wall, "rc": p.returncode, "timeout_s": timeout}
        if sampler:
            extra["memory"] = sampler.result(processes() if processes else None)
            pk = sampler.peak_used
            if pk is not None:
                self.device_peak_mib = max(self.device_peak_mib or 0, pk)
        if timed_out:
            r = self.record(name, "timed out", why=f"stopped after {timeout:.0f} s",
                            stderr_tail=tail(stderr), **extra)
        elif p.returncode != 0:
            last = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or [""]
            r = self.record(name, "failed", why=f"exit {p.returncode}: {last[0][:160]}",
                            stderr_tail=tail(stderr), **extra)
        else:
            r = self.record(name, "ok", **extra)
        r["_stdout"] = stdout
        return r


def this_script() -> list[str]:
    return [sys.executable, str(Path(__file__).resolve())]


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)
    return None


# ---- children ---------------------------------------------------------------------------------
def child_info(gpu: int) -> None:
    """torch and the device, one JSON line (the parent itself never touches CUDA)."""
    import warnings

    got: dict[str, Any] = {}
    try:
        import torch

        import fednet.cli  # noqa: F401  (the whole command line imports: zmq, msgpack, click)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"import_error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    got.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        avail = torch.cuda.is_available()
    got["cuda_available"] = bool(avail)
    got["cuda_warnings"] = [str(w.message)[:300] for w in caught]
    if avail:
        got["device_count"] = torch.cuda.device_count()
        if gpu < got["device_count"]:
            p = torch.cuda.get_device_properties(gpu)
            got.update(name=torch.cuda.get_device_name(gpu), capability=list(
                torch.cuda.get_device_capability(gpu)), total_mib=int(p.total_memory) // MiB,
                cudnn=torch.backends.cudnn.version())
    print(json.dumps(got), flush=True)


CONTEXT_MARKS = ("context", "step")


def child_context(device: str) -> None:
    """One bare process: its CUDA context, then one ResNet-18 step (marks on stdout)."""
    import torch

    from fednet.models import build_model

    d = torch.device(device)
    torch.cuda.set_device(d)
    torch.zeros(1, device=d)
    torch.cuda.synchronize(d)
    print("context", flush=True)
    time.sleep(2.5)
    m = build_model("resnet18", 10, (3, 32, 32), dataset="cifar10", seed=0).to(d)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(m(torch.randn(64, 3, 32, 32, device=d)),
                                      torch.zeros(64, dtype=torch.long, device=d)).backward()
    opt.step()
    torch.cuda.synchronize(d)
    print("step", flush=True)
    time.sleep(2.5)
    print(json.dumps({"allocated_mib": torch.cuda.max_memory_allocated(d) / MiB,
                      "reserved_mib": torch.cuda.memory_reserved(d) / MiB}), flush=True)


def child_plain(a: argparse.Namespace) -> None:
    """A plain single-process FedAvg loop (benchmarks/plain_loop.py's, on a device): the same
    dataset, partition, model and local-training settings as `fednet launch`; prints one JSON
    line with the per-round times."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from fednet.config import from_dict
    from fednet.data import load_dataset, run_partition, run_test_split
    from fednet.models import build_model
    from fednet.training.local import evaluate

    torch.set_num_threads(1)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    cfg = from_dict({"clients": a.clients, "seed": a.seed, "data": {"dataset": a.dataset},
                     "train": {"epochs": a.epochs, "batch_size": a.batch_size}})
    t = cfg.train
    ds = load_dataset(a.dataset)
    parts = run_partition(ds, cfg.data, a.clients, a.seed)
    test, _ = run_test_split(ds, cfg.data.exemplars, a.seed)
    tx, ty = torch.from_numpy(test.test_x).to(dev), torch.from_numpy(test.test_y).to(dev)
    xs, ys = torch.from_numpy(ds.train_x).to(dev), torch.from_numpy(ds.train_y).to(dev)
    idxs = [torch.from_numpy(np.asarray(p, dtype=np.int64)).to(dev) for p in parts]
    model = build_model(a.model, ds.num_classes, ds.input_shape, dataset=a.dataset,
                        seed=a.seed).to(dev)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(a.seed)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    rounds, acc = [], 0.0
    for _ in range(a.rounds):
        sync()
        r0 = time.perf_counter()
        sums = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        total = 0
        for idx in idxs:
            x, y = xs[idx], ys[idx]
            model.load_state_dict(global_state)
            opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum,
                                  weight_decay=t.weight_decay)
            model.train()
            for _ in range(t.epochs):
                for b in torch.randperm(len(y), generator=gen).split(t.batch_size):
                    b = b.to(dev)
                    opt.zero_grad()
                    F.cross_entropy(model(x[b]), y[b]).backward()
                    opt.step()
            n = len(y)
            total += n
            for k, v in model.state_dict().items():
                sums[k] += n * v.double()
        global_state = {k: (s / max(total, 1)).to(global_state[k].dtype) for k, s in sums.items()}
        model.load_state_dict(global_state)
        sync()
        r1 = time.perf_counter()
        with torch.no_grad():
            acc, _ = evaluate(model, tx, ty)
        sync()
        r2 = time.perf_counter()
        rounds.append({"round_s": r2 - r0, "train_s": r1 - r0, "test_s": r2 - r1})
    out: dict[str, Any] = {"rounds": rounds, "accuracy": float(acc), "device": str(dev),
                           "clients": a.clients}
    if cuda:
        out.update(max_allocated_mib=torch.cuda.max_memory_allocated(dev) / MiB,
                   max_reserved_mib=torch.cuda.max_memory_reserved(dev) / MiB)
    if a.cpu_eval_sample > 0:  # the server's test pass: on the CPU, one thread
        cpu_model = build_model(a.model, ds.num_classes, ds.input_shape, dataset=a.dataset,
                                seed=a.seed)
        cpu_model.load_state_dict({k: v.cpu() for k, v in global_state.items()})
        n = min(a.cpu_eval_sample, len(test.test_y))
        c0 = time.perf_counter()  # as the server: evaluate(), no no_grad
        evaluate(cpu_model, torch.from_numpy(test.test_x[:n]), torch.from_numpy(test.test_y[:n]))
        dt = time.perf_counter() - c0
        out.update(server_cpu_test_s=dt * len(test.test_y) / n, server_cpu_test_sample=n)
    print(json.dumps(out), flush=True)


# ---- figures ----------------------------------------------------------------------------------
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


def smi_versions(gpu: int) -> dict[str, Any]:
    """Driver version, the driver's CUDA version, name and memory from nvidia-smi ({} if none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    got: dict[str, Any] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, IndexError):
        out = subprocess.run([smi, "-i", smi_id(gpu), "--query-gpu=name,driver_version,"
                              "memory.total,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=15, check=True).stdout
        name, drv, total, used = [x.strip() for x in out.strip().splitlines()[0].split(",")]
        got.update(smi_name=name, driver=drv, smi_total_mib=int(total), smi_used_mib=int(used))
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run([smi], capture_output=True, text=True, timeout=15).stdout
        m = re.search(r"CUDA Version:\s*([\d.]+)", head)
        if m:
            got["driver_cuda"] = m.group(1)
    return got


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


# ---- the parts --------------------------------------------------------------------------------
def launch_argv(w: dict[str, Any], clients: int, rounds: int, out: Path, gpus: str | None,
                epochs: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "fednet.cli", "launch", "--clients", str(clients), "--rounds",
            str(rounds), "--epochs", str(epochs or w["epochs"]), "--batch-size", str(w["batch"]),
            "--dataset", w["dataset"], "--model", w["model"], "--seed", "0", "--augment", "none",
            "--register-timeout", "240", "--round-timeout", "300", "-q", "--out", str(out)]
    if gpus:
        argv += ["--gpus", gpus]
    return argv


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
            "status_run": s.get("status"), "devices": sorted(set(s.get("devices", {}).values())),
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
              gpus: str | None, cap: float, mn: float, epochs: int | None = None
              ) -> dict[str, Any]:
    out = run.tmp / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    shutil.rmtree(out, ignore_errors=True)
    holder: dict[str, Any] = {}

    def processes() -> int | None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            holder["run"] = read_run(out)
            return int(holder["run"]["choice"]["processes"])
        return None

    r = run.run(name, launch_argv(w, clients, rounds, out, gpus, epochs), cap, mn,
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


# ---- the table --------------------------------------------------------------------------------
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


# ---- main -------------------------------------------------------------------------------------
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
               ndev: int) -> None:
    r = do_launch(run, name, w, args.clients, w["rounds"], gpus, w["caps"]["launch"],
                  w["mins"]["launch"])
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
    for w in WORKLOADS:
        for part in ("loop-gpu", "launch-gpu", "launch-gpu-2slots"):
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
