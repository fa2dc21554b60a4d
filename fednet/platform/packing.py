"""`--clients-per-process auto`: how many logical clients share one client process.

The rule (docs/usage.md, `fednet launch --help`):
- one process per client while that is cheap: at most PROCESSES_PER_CORE processes per core
  (each costs ~14 ms of CPU to fork and ~11 MiB of PSS, docs/benchmarks/history.md sections 8 and 15, while
  the clients of one process share one connection and register in one message: section 21)
  and at most half the available memory at PROCESS_BYTES plus HOST_MODEL_COPIES of the model
  each;
- beyond PROCESSES_PER_CORE, at most GROUPED_PER_CORE processes per core (within the memory
  limit), the clients shared evenly among them (20 clients on 2 cores: 10 processes of 2):
  once the processes outnumber the cores many times over,
  each further process only costs a fork, an interpreter and a share of the run queue
  (docs/benchmarks/history.md section 15: 1,000 digits clients on 2 cores start and train fastest in 16
  processes of 63); beyond the memory limit alone, the fewest clients per process within it;
- with --gpus, also device memory: every process holds its own CUDA context
  (CUDA_CONTEXT_BYTES) and allocator workspace (DEVICE_WORKSPACE_BYTES), and every client its
  model and data on the device; the processes of each device must fit DEVICE_SHARE of its memory;
- every process within its open-files limit when the algorithm hands models between clients
  (FILES_PER_CLIENT per logical client: its peer socket, its mailbox and connections; the
  server link is one per process): beyond it, more processes of fewer clients each;
- --real-time keeps one process per client (grouped clients would wait out each other's delays);
- --batch-clients (an algorithm that batches): one process per core but the server's, the
  clients shared evenly: a process trains the tasks it holds as blocks, and the fewer blocks a
  round is cut into the less each pays (`fednet launch --dataset synthetic-fedprox --clients
  1000000 --fraction 0.001 --rounds 4 --epochs 1 --batch-clients 1000` on 2 cores under load
  ~10: a round ~3.6 s in 1 or 2 processes against ~6 s in 16, the command 32 s against 72 s);
- an explicit number always wins.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fednet.platform.proc import FILES_PER_CLIENT, FILES_RESERVE

MiB = 1 << 20
PROCESSES_PER_CORE = 8             # 16 clients on 2 cores stay 16 processes; 100 make 15 of 7
#                                    (a process's clients share its link and register at once:
#                                    100 digits clients, 10 rounds, 1 epoch: 6.2 s in 15
#                                    processes, 8.9-9.6 s in 100; docs/benchmarks/history.md section 21)
GROUPED_PER_CORE = 8               # processes per core once clients are grouped
PROCESS_BYTES = 32 * MiB           # one client process (PSS ~11-13 MiB on digits) with headroom
MEMORY_SHARE = 0.5                 # of MemAvailable, for the client processes' own overhead
CUDA_CONTEXT_BYTES = 512 * MiB     # per process; PyTorch measured 287 MB (lazy module loading,
#                                    the default since CUDA 12.2) to 667 MB (eager): pytorch#86509
DEVICE_WORKSPACE_BYTES = 256 * MiB  # caching allocator blocks, cuBLAS/cuDNN workspaces
DEVICE_SHARE = 0.9                 # of each device's memory
MODEL_COPIES = 4                   # parameters, gradients, optimizer buffer, received model
HOST_MODEL_COPIES = 3              # per process beyond its clients' models: the heap it keeps
#                                    from received, replaced and trained models (BENCHMARKS 15)
CLIENT_DEVICE_BYTES = 192 * MiB    # a client's share when its model is unknown (fednet clients):
#                                    ResNet-18 (44.7 MB x 4) and a CIFAR-sized partition


@dataclass(frozen=True)
class Machine:
    """What the rule looks at: CPU cores, available memory, each used device's memory."""

    cores: int
    mem_available: int
    device_bytes: tuple[int, ...] = ()
    files: int = 1 << 20  # the soft limit of open files a client process inherits


@dataclass(frozen=True)
class Choice:
    """Logical clients per process, how many processes that makes, and why."""

    per_process: int
    processes: int
    auto: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """For summary.json."""
        return asdict(self)

    def line(self, clients: int) -> str:
        """The start-up line."""
        each = "one client per process" if self.per_process == 1 else \
            f"{self.per_process} clients per process"
        return f"{clients} clients in {self.processes} processes ({each}): {self.reason}"


def client_device_bytes(model_bytes: int, data_bytes: int) -> int:
    """One client's device memory: its model's copies and its training data."""
    return MODEL_COPIES * model_bytes + data_bytes


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


def _device_need(clients: int, k: int, ndev: int, per_client: int) -> int:
    """Bytes on the busiest device with k clients per process, processes round-robin."""
    procs = -(-clients // k)
    procs_dev = -(-procs // ndev)
    clients_dev = min(clients, procs_dev * k)
    return procs_dev * (CUDA_CONTEXT_BYTES + DEVICE_WORKSPACE_BYTES) + clients_dev * per_client


_GROUPED = "\0grouped"


def _cores(cores: int) -> str:
    return f"{cores} core{'' if cores == 1 else 's'}"


def _grouped(clients: int, k: int, cores: int) -> str:
    """Why clients were grouped, with the processes that makes per core (at most 8)."""
    procs = -(-clients // k)
    return (f"over {PROCESSES_PER_CORE} processes per core on {_cores(cores)}: grouped, "
            f"{procs / cores:.3g} processes per core (at most {GROUPED_PER_CORE})")


def choose(clients: int, machine: Machine, requested: int = 0, gpus: Sequence[int] = (),
           per_client_device: int = CLIENT_DEVICE_BYTES, real_time: bool = False,
           model_bytes: int = 0, handoffs: bool = True, batched: bool = False) -> Choice:
    """The number of clients per process for `clients` clients (requested > 0 wins).
    batched: the run trains its clients in blocks (--batch-clients), each process the tasks it
    holds: one process a core but the server's, so that its blocks are large.
    model_bytes: the run's model state; a process also holds HOST_MODEL_COPIES of it beyond its
    clients' own models (memory its allocator keeps from received and replaced models).
    handoffs: whether the algorithm hands models between clients; only then does a client hold
    files of its own (its peer socket and connections); the server link is the process's."""
    n = max(1, clients)
    if requested > 0:
        return Choice(requested, -(-n // requested), False,
                      f"--clients-per-process {requested} as given")
    if real_time:
        return Choice(1, n, True, "auto: --real-time keeps one process per client")
    cores = max(1, machine.cores)
    procs, why = _processes(n, machine, model_bytes, batched)
    k = -(-n // procs)
    if gpus and machine.device_bytes:
        # a device listed k times (--gpus 0,0) is k slots sharing its memory
        budget = int(DEVICE_SHARE * min(b / list(gpus).count(g)
                                        for g, b in zip(gpus, machine.device_bytes)))
        ndev = len(gpus)
        k_cpu = k
        while k < n and _device_need(n, k, ndev, per_client_device) > budget:
            k += 1
        need = _device_need(n, k, ndev, per_client_device)
        dev = (f"{_gib(need)} on the busiest of {ndev} device(s) of "
               f"{_gib(min(machine.device_bytes))} ({CUDA_CONTEXT_BYTES // MiB} MiB CUDA context "
               f"+ {DEVICE_WORKSPACE_BYTES // MiB} MiB workspace per process, "
               f"{per_client_device / MiB:.0f} MiB per client; at most "
               f"{DEVICE_SHARE:.0%} used)")
        if need > budget:
            dev = "does not fit even so: " + dev
        if k > k_cpu:
            why = dev
        else:
            why += "; " + dev
    k_files = max(1, (machine.files - FILES_RESERVE) // FILES_PER_CLIENT) if handoffs else n
    if k > k_files:  # e.g. 50,000 clients in 16 processes: 25,064 files each, the limit 20,000
        k = k_files
        why += (f"; at most {k_files} clients per process within the open-files limit of "
                f"{machine.files} ({FILES_PER_CLIENT} per client)")
    why = why.replace(_GROUPED, _grouped(n, k, cores))
    if k == 1:
        return Choice(1, n, True, f"auto: one process per client ({why})")
    return Choice(k, -(-n // k), True, f"auto: {why}")


def _processes(n: int, machine: Machine, model_bytes: int, batched: bool) -> tuple[int, str]:
    """The processes that the cores and the memory allow for n clients, and why (before devices
    and open files)."""
    cores = max(1, machine.cores)
    cpu_cap = PROCESSES_PER_CORE * cores
    proc_bytes = PROCESS_BYTES + HOST_MODEL_COPIES * model_bytes
    mem_cap = max(1, int(MEMORY_SHARE * machine.mem_available) // proc_bytes)
    grouped = n > cpu_cap  # else only the memory limit groups: the fewest per process within it
    wanted = max(1, cores - 1) if batched else GROUPED_PER_CORE * cores if grouped else cpu_cap
    procs = min(mem_cap, wanted)
    if mem_cap < wanted:
        return procs, (f"{mem_cap} processes of {proc_bytes / MiB:.0f} MiB fit half of the "
                       f"{_gib(machine.mem_available)} available")
    if batched:
        return procs, (f"--batch-clients: {_cores(cores)}, one process a core but the server's, "
                       "each training its clients' tasks in large blocks")
    if grouped:
        return procs, _GROUPED  # said once k is final (devices and open files may raise it)
    return procs, f"at most {PROCESSES_PER_CORE} processes per core, {_cores(cores)}"


def mem_available() -> int:
    """MemAvailable from /proc/meminfo (bytes); elsewhere the physical memory, or 8 GiB."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def device_bytes(gpus: Sequence[int]) -> tuple[int, ...]:
    """Total memory of each device, from nvidia-smi (which creates no CUDA context here), else
    from torch's device properties; () when neither answers."""
    if not gpus:
        return ()
    smi = shutil.which("nvidia-smi")
    if smi and "CUDA_VISIBLE_DEVICES" not in os.environ:  # else its indices are not torch's
        try:
            out = subprocess.run([smi, "--query-gpu=index,memory.total",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10, check=True).stdout
            total = {int(a): int(b) * MiB for a, b in
                     (line.split(",") for line in out.splitlines() if "," in line)}
            if all(g in total for g in gpus):
                return tuple(total[g] for g in gpus)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    try:
        import torch

        return tuple(int(torch.cuda.get_device_properties(g).total_memory) for g in gpus)
    except Exception:  # noqa: BLE001 - no device information: the rule counts cores and memory
        return ()


def this_machine(gpus: Sequence[int] = ()) -> Machine:
    """The machine the client processes run on (the open-files limit as this process has it,
    which its client processes inherit)."""
    import resource

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    files = 1 << 20 if files == resource.RLIM_INFINITY else int(files)
    return Machine(cores or 1, mem_available(), device_bytes(gpus), files)


def auto_for_host(clients: int, gpus_text: str | None) -> int:
    """`fednet clients --clients-per-process auto`: the rule on this host (the model is not known
    before WELCOME: CLIENT_DEVICE_BYTES per client). `fednet clients` prints the processes it
    starts once its other options are checked."""
    from fednet.platform.gpus import parse_gpus

    g = parse_gpus(gpus_text)
    return choose(clients, this_machine(g), 0, g).per_process
