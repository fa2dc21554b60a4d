"""Device memory for gpu_check.py, in MiB, from nvidia-smi or else pynvml: the device's used total
and each process's use, sampled while a part runs; nvidia-smi's versions of the driver and CUDA.
Without a device none of it is called (the CPU path)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
from typing import Any

from benchlib.runner import descendants

MiB = 1 << 20


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
