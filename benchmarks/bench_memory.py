"""Client memory on CIFAR-shaped data: the sum of the client processes' PSS of `fednet launch` on
synthetic-cifar10 (FedSeq CNN, its default model), and what generating the data costs.

  (a) generation: synthetic.generate (in memory), the first load_dataset (generate + write the
      host's .npy cache) and a second load in a fresh process (map the cache), in seconds.
  (b) memory: `fednet launch --clients N --dataset synthetic-cifar10 --rounds 1 --fraction 1/N
      --clients-per-process P` (one client trains, on its 50,000/N images; the server evaluates
      once), reading client_pss_bytes from summary.json (the sum of the client processes' PSS,
      read by the server right after training: shared pages count once, divided among their
      sharers). For every N in --clients and P in --per-process.
  (c) before/after: with --baseline-tree DIR (a checkout of the code before the arrays were
      shared, e.g. `git worktree add /tmp/before 8641519`), the same command at --baseline-clients
      runs with that code (synthetic-cifar10 registered by benchmarks/synthetic_plugin.py from
      this checkout's generator) and with this checkout, alternated. The older code copies the
      test split (116 MiB) into every client, so 500 of its clients need about 60 GiB: run it at
      a size the machine holds and compare per client.

A watchdog stops a run (and says so) when the machine's MemAvailable falls under --min-free-gib.

    python3 benchmarks/bench_memory.py [--clients 500] [--per-process 1 10]
        [--baseline-tree /tmp/before --baseline-clients 30] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_inline, mem_available, summary  # noqa: E402
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGET_1, TARGET_10 = 8e9, 2e9  # issue 14: <= 8 GB one process per client, <= 2 GB 10 per process


def _env(tree: Path, cache: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT / 'benchmarks'}",
                FEDNET_CACHE=str(cache), OMP_NUM_THREADS="1")


def generation(cache: Path) -> dict[str, float]:
    """(a): seconds to generate in memory, to load with a cache miss, to map the cache."""
    code = ("import time,sys; t=time.perf_counter(); {body}; "
            "print(time.perf_counter()-t)")
    gen = "from fednet.data import synthetic; synthetic.generate('synthetic-cifar10')"
    load = ("from fednet.data import load_dataset; d=load_dataset('synthetic-cifar10'); "
            "float(d.train_x[::4096].sum())")
    out = {}
    for key, body in (("generate_s", gen), ("first_load_s", load), ("mapped_load_s", load)):
        r = subprocess.run([sys.executable, "-c", code.format(body=body)], env=_env(ROOT, cache),
                           cwd=ROOT, capture_output=True, text=True, check=True)
        out[key] = float(r.stdout.strip().splitlines()[-1])
    return out


def launch(tree: Path, cache: Path, clients: int, per_process: int, min_free: float,
           baseline: bool) -> dict[str, Any]:
    """(b): one fednet launch; its summary figures, or why it stopped."""
    out = Path(tempfile.mkdtemp(prefix="bench_memory_"))
    argv = fednet_inline("launch", "--clients", str(clients), "--rounds", "1", "--fraction",
                         repr(1.0 / clients), "--dataset", "synthetic-cifar10",
                         "--clients-per-process", str(per_process), "--epochs", "1", "--out",
                         str(out), "-q")
    if baseline:
        argv += ["--plugin", "synthetic_plugin"]
    low = {"min": mem_available(), "killed": False}
    t0 = time.perf_counter()
    # cwd=tree: `python -c` and `-m` put the working directory first on sys.path
    proc = subprocess.Popen(argv, env=_env(tree, cache), cwd=tree, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)

    def watch() -> None:
        while proc.poll() is None:
            free = mem_available()
            low["min"] = min(low["min"], free)
            if free < min_free * 2**30:
                low["killed"] = True
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.2)
    w = threading.Thread(target=watch, daemon=True)
    w.start()
    _, err = proc.communicate(timeout=1800)
    w.join()
    row: dict[str, Any] = {"code": "before" if baseline else "after", "clients": clients,
                           "per_process": per_process, "wall_s": time.perf_counter() - t0,
                           "min_available_gib": low["min"] / 2**30}
    if low["killed"] or proc.returncode != 0:
        row["error"] = ("stopped: MemAvailable under the floor" if low["killed"] else
                        f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}")
        return row
    s = summary(out)
    pss = int(s.get("client_pss_bytes", 0))
    row.update(processes=-(-clients // per_process), client_pss_bytes=pss,
               pss_gib=pss / 2**30, pss_per_client_mib=pss / clients / 2**20,
               ready_s=s.get("ready_s"))
    return row


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: client PSS of this code's runs (issue 14's targets at 500 clients:
    <= 8 GB one per process, <= 2 GB ten per process; at most 3) and loading the mapped data."""
    out = []
    for r in [r for r in data.get("runs", []) if r["code"] == "after"][:3]:
        n, p = r["clients"], r["per_process"]
        target = {1: "<= 8 GB", 10: "<= 2 GB"}.get(p, "") if n == 500 else ""
        out.append(headline_row(
            "start-up and memory", f"client PSS, {n} synthetic-cifar10 clients, {p} per process",
            r["client_pss_bytes"] / 1e9 if "client_pss_bytes" in r else None, "GB", target,
            f"{r.get('pss_per_client_mib', 0):.1f} MiB per client; registered in "
            f"{r.get('ready_s') or 0:.1f} s"))
    gen = data.get("generation", {})
    out.append(headline_row(
        "start-up and memory", "synthetic-cifar10: a later load (maps the host's cache)",
        gen.get("mapped_load_s"), "s", "", f"generating it {gen.get('generate_s', 0):.1f} s; "
        f"the first load (generate, write the cache) {gen.get('first_load_s', 0):.1f} s"))
    return measured(*out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="*", default=[500])
    ap.add_argument("--per-process", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--baseline-tree", type=Path, default=None)
    ap.add_argument("--baseline-clients", type=int, default=30)
    ap.add_argument("--min-free-gib", type=float, default=3.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory(prefix="bench_memory_cache_") as tmp:
        cache = Path(tmp)
        gen = generation(cache)
        print("(a) synthetic-cifar10: " + ", ".join(f"{k} {v:.2f}" for k, v in gen.items()))
        rows = []
        if a.baseline_tree:
            for baseline in (True, False):
                rows.append(launch(a.baseline_tree if baseline else ROOT, cache,
                                   a.baseline_clients, 1, a.min_free_gib, baseline))
                print(rows[-1], flush=True)
        for n in a.clients:
            for p in a.per_process:
                rows.append(launch(ROOT, cache, n, p, a.min_free_gib, False))
                print(rows[-1], flush=True)
    print(table(["code", "clients", "per process", "client PSS GiB", "MiB/client", "wall s",
                 "min avail GiB", "target"],
                [[r["code"], r["clients"], r["per_process"], r.get("pss_gib", r.get("error")),
                  r.get("pss_per_client_mib", ""), r["wall_s"], r["min_available_gib"],
                  ("<= 8 GB" if r["per_process"] == 1 else "<= 2 GB" if r["per_process"] == 10
                   else "") if r["clients"] == 500 else ""] for r in rows]))
    for r in rows:
        if r["clients"] == 500 and "client_pss_bytes" in r and r["per_process"] in (1, 10):
            goal = TARGET_1 if r["per_process"] == 1 else TARGET_10
            print(f"500 clients, {r['per_process']} per process: {r['client_pss_bytes'] / 1e9:.2f} GB "
                  f"{'<=' if r['client_pss_bytes'] <= goal else '>'} {goal / 1e9:.0f} GB")
    data = {"machine": info, "generation": gen, "runs": rows}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
