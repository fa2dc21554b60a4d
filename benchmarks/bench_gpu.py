"""GPU run: `fednet launch --gpus 0` with 100 clients, one process per client against several
logical clients per process and `auto`; time per round and GPU memory per process (the CUDA
context cost).

    python3 benchmarks/bench_gpu.py [--clients 100] [--rounds 3] [--per-process 1 10 auto]
                                    [--dataset synthetic-cifar10] [--model auto] [--gpu 0]
                                    [--json F]

Needs a CUDA device and `nvidia-smi`. First it measures the CUDA context of one bare process
(`import torch; torch.zeros(1, device=...)`, then one ResNet-18 step: the memory nvidia-smi
reports for that pid), the figure --clients-per-process auto assumes 512 MiB for
(platform/packing.py). Then, for each `--per-process` value, one `fednet launch` (the dataset,
IID, 1 epoch, seed 0), sampling `nvidia-smi --query-compute-apps` every 0.25 s. The table gives
the registration time, the mean wall-clock of a round after round 0, the peak GPU memory of all
client processes together, that peak per process and per client, and what auto chose. Every run
must end with the same accuracy (checked): the option changes where clients run, not what they
compute.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import headline_row, machine, measured, table, write_json  # noqa: E402


def gpu_memory_by_pid() -> dict[int, int]:
    """MiB of device memory per process, as nvidia-smi reports it (every visible GPU)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True).stdout
    return parse_compute_apps(out)


def parse_compute_apps(text: str) -> dict[int, int]:
    """'1234, 512' lines -> {1234: 512}; lines nvidia-smi cannot fill ('[N/A]') are skipped."""
    got: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            got[int(parts[0])] = got.get(int(parts[0]), 0) + int(parts[1])
    return got


CONTEXT_PROBE = """
import sys, time, torch
d = torch.device(sys.argv[1])
torch.zeros(1, device=d)
print("context", flush=True)
time.sleep(2.0)
from fednet.models import build_model
m = build_model("resnet18", 10, (3, 32, 32), dataset="cifar10", seed=0).to(d)
torch.nn.functional.cross_entropy(m(torch.randn(8, 3, 32, 32, device=d)),
                                  torch.zeros(8, dtype=torch.long, device=d)).backward()
torch.cuda.synchronize(d)
print("step", flush=True)
time.sleep(2.0)
"""


def context_mib(gpu: int) -> dict:
    """Device memory of one bare process: after its CUDA context, after one ResNet-18 step."""
    p = subprocess.Popen([sys.executable, "-c", CONTEXT_PROBE, f"cuda:{gpu}"],
                         stdout=subprocess.PIPE, text=True)
    got = {}
    assert p.stdout is not None
    for line in p.stdout:
        time.sleep(1.0)
        got[line.strip()] = gpu_memory_by_pid().get(p.pid, 0)
    p.wait()
    return {"context_mib": got.get("context", 0), "after_resnet18_step_mib": got.get("step", 0)}


def run(args: argparse.Namespace, per_process: str, out: Path) -> dict:
    """One launch with memory sampling; its summary plus the memory figures."""
    argv = [sys.executable, "-m", "fednet.cli", "launch", "--clients", str(args.clients),
            "--rounds", str(args.rounds), "--epochs", "1", "--gpus", str(args.gpu), "--seed", "0",
            "--dataset", args.dataset, "--model", args.model,
            "-q", "--out", str(out), "--clients-per-process", str(per_process)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_total, peak_each, procs = 0, 0, 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_total, peak_each, procs
        while not stop.is_set():
            try:
                mem = gpu_memory_by_pid()
            except (OSError, subprocess.CalledProcessError):
                mem = {}
            mem.pop(proc.pid, None)  # the server process evaluates on the CPU
            if sum(mem.values()) > peak_total:
                peak_total, procs = sum(mem.values()), len(mem)
            peak_each = max([peak_each, *mem.values()])
            stop.wait(0.25)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, err = proc.communicate()
    stop.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"fednet launch failed (exit {proc.returncode}):\n{err[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    walls = [r["wall_s"] for r in rows]
    per_round = [b - a for a, b in zip(walls, walls[1:])]
    return {"per_process": per_process, "ready_s": s.get("ready_s"),
            "chosen": s.get("clients_per_process", {}),
            "round_s": sum(per_round) / len(per_round) if per_round else float("nan"),
            "gpu_mib_total": peak_total, "gpu_processes": procs, "gpu_mib_per_process": peak_each,
            "gpu_mib_per_client": peak_total / args.clients if peak_total else 0.0,
            "final_accuracy": s["final_accuracy"], "server_peak_rss_bytes": s.get("server_peak_rss_bytes")}


def headline(data: dict) -> list[dict]:
    """The dashboard's rows: one bare process's CUDA context (auto assumes 512 MiB + 256 MiB) and
    the seconds per round of each --clients-per-process value (at most 3)."""
    ctx, n = data.get("bare_process") or {}, data.get("clients")
    return measured(
        headline_row("GPU", "CUDA context of one bare process", ctx.get("context_mib"), "MiB", "",
                     f"after one ResNet-18 step: {ctx.get('after_resnet18_step_mib')} MiB"),
        *(headline_row("GPU", f"{n} clients on one GPU, --clients-per-process "
                       f"{p['per_process']}: seconds per round after round 0", p["round_s"], "s",
                       "", f"{p['gpu_mib_per_process']} MiB per process, chosen "
                       f"{p['chosen'].get('per_process', '?')} per process; ready "
                       f"{p['ready_s']:.1f} s") for p in data.get("points", [])[:3]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-process", nargs="+", default=["1", "10", "auto"])
    ap.add_argument("--dataset", default="synthetic-cifar10")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device is visible here; nothing to measure")
    ctx = context_mib(args.gpu)
    print(f"one bare process on cuda:{args.gpu}: CUDA context {ctx['context_mib']} MiB, after one "
          f"ResNet-18 step {ctx['after_resnet18_step_mib']} MiB (auto assumes 512 MiB + 256 MiB)")
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.per_process:
            points.append(run(args, k, Path(tmp) / f"k{k}"))
            print(f"--clients-per-process {k} done", file=sys.stderr, flush=True)
    print(f"{args.clients} clients on cuda:{args.gpu} ({torch.cuda.get_device_name(args.gpu)}), "
          f"{args.dataset}, {args.rounds} rounds of 1 epoch")
    print(table(["per process", "chosen", "ready s", "s / round (after r0)", "GPU MiB, all clients",
                 "processes seen", "MiB per process", "MiB per client", "accuracy"],
                [[p["per_process"], p["chosen"].get("per_process", "?"), f"{p['ready_s']:.1f}",
                  f"{p['round_s']:.2f}", p["gpu_mib_total"], p["gpu_processes"],
                  p["gpu_mib_per_process"], f"{p['gpu_mib_per_client']:.0f}",
                  f"{p['final_accuracy']:.4f}"] for p in points]))
    same = len({p["final_accuracy"] for p in points}) == 1
    print("same accuracy in every run:", same)
    data = {"machine": machine(), "clients": args.clients, "points": points,
            "same_accuracy": same, "bare_process": ctx}
    write_json(args.json, data, headline(data))


if __name__ == "__main__":
    main()
