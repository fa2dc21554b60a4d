"""`fednet launch` start-up time, client memory, and overhead against `fednet local`.

Everything runs as real `fednet` commands (subprocesses) in one script, side by side:

  (a) ready time: `fednet launch --clients N --rounds 1 --epochs 1 --out TMP`, repeated. Two
      figures per run: ready_s from summary.json (run_zmq's start until all N clients registered,
      so it leaves out the interpreter start and the CLI imports) and the time from exec
      (Popen) until the server printed "N clients ready" on stderr. Their difference is the
      process-start overhead.
  (b) memory: client_pss_bytes from summary.json (sum of the PSS of the client processes, read
      right after training), total and per client, for the (a) runs and the (c) launch runs.
  (c) overhead: `fednet launch` and `fednet local` with the same seed and config (N clients,
      default rounds, or fewer with --quick), alternated launch, local, launch, local, ...; ratios
      of the training wall-clock (summary wall_clock_s) and of the whole command's wall-clock;
      final_accuracy, the byte counts and final_model.npz must be identical.
  (d) where the time goes: one more launch run (--rounds 1 --epochs 1) in a wrapper process
      that times the steps of run_zmq by wrapping its functions (fednet itself is not
      modified), with the CPU seconds (user/sys, and on-CPU/waiting from /proc schedstat) of
      the server, the zygote and the clients until all are registered; and a fork probe: the
      cost of os.fork() in a process after the zygote's warm-up vs a bare interpreter.

  Every run also records the CPU seconds of its whole process tree and the machine's CPU
  pressure (PSI "some": the share of the time some task waited for a CPU), because the machine
  is shared and its load changes from one run to the next.

    python3 benchmarks/bench_launch.py [--quick] [--json FILE]

Targets (issue): 100 clients ready within 3 s; client PSS <= 2 GB for 100 clients;
launch <= 1.5x local (goal 1.2x).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_installed, line_time, run_lines, same_model, summary  # noqa: E402
from benchlib.trace import fork_probe, trace_child  # noqa: E402
from benchlib.util import headline_row, loadavg, machine, measured, median, table, write_json  # noqa: E402

TARGET_READY_S = 3.0
TARGET_PSS_BYTES = 2e9          # "2 GB"; compared as 10^9 bytes (the stricter reading)
TARGET_RATIO, GOAL_RATIO = 1.5, 1.2
DATA_KEYS = ("server_to_client", "client_to_server", "client_to_client", "tensor_bytes", "header_bytes")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


# ---- (a)+(b) ready time and memory -----------------------------------------------------------
def bench_ready(tmp: Path, clients: int, reps: int) -> list[dict[str, Any]]:
    runs = []
    for i in range(reps):
        out = tmp / f"ready{i}"
        r = run_lines(fednet_installed("launch", "--clients", str(clients), "--rounds", "1",
                                       "--epochs", "1", "--out", str(out)))
        s = summary(out)
        t_ready = line_time(r["lines"], "clients ready in")
        t_listen = line_time(r["lines"], "server listening on")
        runs.append({"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "cpu_pressure": r["cpu_pressure"],
                     "failures": s.get("failures", []), "exec_to_ready_s": t_ready,
                     "exec_to_listening_s": t_listen, "ready_s": s["ready_s"],
                     "startup_overhead_s": (t_ready - s["ready_s"]) if t_ready else None,
                     "client_pss_bytes": s.get("client_pss_bytes"),
                     "total_wall_s": s["total_wall_s"], "status": s["status"],
                     "client_exit_codes": s.get("client_exit_codes", {}),
                     "warnings": [ln for _, ln in r["lines"] if "WARNING" in ln or "ERROR" in ln],
                     "loadavg": loadavg()})
        shutil.rmtree(out, ignore_errors=True)
    return runs


# ---- (c) launch vs local ---------------------------------------------------------------------
def bench_overhead(tmp: Path, clients: int, rounds: int, reps: int, seed: int) -> list[dict[str, Any]]:
    runs = []
    for i in range(reps):
        for rt in ("launch", "local"):
            out = tmp / f"{rt}{i}"
            r = run_lines(fednet_installed(rt, "--clients", str(clients), "--rounds", str(rounds),
                                           "--seed", str(seed), "--out", str(out)))
            s = summary(out)
            runs.append({"runtime": rt, "rep": i, "out": out, "wall_s": r["wall_s"],
                         "cpu_s": r["cpu_s"], "cpu_pressure": r["cpu_pressure"],
                         "failures": s.get("failures", []),
                         "wall_clock_s": s["wall_clock_s"], "total_wall_s": s.get("total_wall_s"),
                         "ready_s": s.get("ready_s"),
                         "exec_to_ready_s": line_time(r["lines"], "clients ready in"),
                         "client_pss_bytes": s.get("client_pss_bytes"),
                         "final_accuracy": s["final_accuracy"], "bytes": s["bytes"],
                         "messages": s["messages"], "status": s["status"], "rounds": s["rounds"],
                         "client_exit_codes": s.get("client_exit_codes", {}),
                         "warnings": [ln for _, ln in r["lines"] if "WARNING" in ln or "ERROR" in ln],
                         "loadavg": loadavg()})
    return runs


# ---- (d) breakdown: runs inside a wrapper process (benchlib/trace.py) ------------------------
def bench_fork(n: int = 30) -> list[dict[str, Any]]:
    out = []
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for warm in (True, False):
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--fork-probe", str(n),
                            "warm" if warm else "bare"], capture_output=True, text=True, env=env,
                           timeout=120, check=True)
        out.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return out


def bench_breakdown(tmp: Path, clients: int) -> dict[str, Any]:
    out = tmp / "trace"
    res_file = tmp / "trace.json"
    r = run_lines([sys.executable, str(Path(__file__).resolve()), "--trace-child", str(res_file),
                   "--", "--clients", str(clients), "--rounds", "1", "--epochs", "1",
                   "--out", str(out)])
    ev = json.loads(res_file.read_text())
    s = summary(out)
    t0 = r["t_popen"]  # CLOCK_MONOTONIC is shared by all processes of this machine

    def rel(key: str) -> float | None:
        v = ev.get(key)
        return None if v is None else v - t0

    hello, ready = ev["hello"], ev["ready"]
    steps = [
        ("interpreter up (exec -> wrapper's first line)", rel("child_main")),
        ("CLI imports done (fednet.cli, server.main, spawn)", rel("imports_done")),
        ("run_zmq starts (ready_s counts from here)", rel("run_zmq_start")),
        ("zygote process started (Popen returned)", rel("zygote_popen_done")),
        ("spawn command sent to the zygote", rel("spawn_command_sent")),
        ("server: torch imported", rel("torch_imported")),
        ("server: Session built (data, partition, model)", rel("session_done")),
        ("server: ZmqServer built; waits for the zygote", rel("server_object_done")),
        ("first client forked (psutil create_time, 10 ms res.)", rel("first_fork")),
        ("zygote warm seen (wait_warm returned)", rel("wait_warm_done")),
        ("server starts reading READYs (wait_for_clients)", rel("wait_clients_enter")),
        ("first hello READY handled (WELCOME sent)", (min(hello) - t0) if hello else None),
        ("first ready READY handled", (min(ready) - t0) if ready else None),
        ("last client forked", rel("last_fork")),
        (f"{clients}th hello READY handled", (max(hello) - t0) if hello else None),
        (f"all {clients} clients registered", rel("all_ready")),
        ("training done (1 round, 1 epoch)", rel("training_done")),
        ("client PSS read (pss_bytes)", rel("pss_done")),
        ("SHUTDOWN sent, BYEs collected", rel("shutdown_done")),
        ("zygote and clients stopped", rel("zygote_stop_done")),
        ("results written (Session.finish: files, plots)", rel("finish_done")),
        ("CLI printed the summary", rel("cli_returned")),
        ("process exited", r["wall_s"]),
    ]
    steps = sorted([x for x in steps if x[1] is not None], key=lambda x: x[1])
    cut = next((i for i, x in enumerate(steps) if x[0].startswith("all ")), len(steps) - 1)
    steps.insert(cut + 1, ("-- after ready --", None))
    durations = {
        "pss_bytes_s": _dur(ev, "pss_start", "pss_done"),
        "shutdown_s": _dur(ev, "shutdown_start", "shutdown_done"),
        "zygote_stop_s": _dur(ev, "zygote_stop_start", "zygote_stop_done"),
        "finish_s": _dur(ev, "finish_start", "finish_done"),
        "session_s": _dur(ev, "session_start", "session_done"),
        "training_s": _dur(ev, "training_start", "training_done"),
        "interpreter_exit_s": r["wall_s"] - (ev["cli_returned"] - t0),
    }
    psi = None
    if ev.get("psi_start") is not None and ev.get("psi_ready") is not None:
        psi = (ev["psi_ready"] - ev["psi_start"]) / 1e6 / (ev["all_ready"] - ev["child_main"])
    shutil.rmtree(out, ignore_errors=True)
    return {"steps": steps, "durations": durations, "zygote_warm_s": ev.get("zygote_warm_s"),
            "zygote_cpu_at_warm": ev.get("zygote_cpu_at_warm"),
            "fork_span_s": (ev["last_fork"] - ev["first_fork"]) if ev.get("first_fork") else None,
            "cpu_at_ready": ev.get("cpu_at_ready", {}), "ready_s": s["ready_s"],
            "cpu_pressure_some_fraction_until_ready": psi, "loadavg": loadavg()}


def _dur(ev: dict[str, Any], a: str, b: str) -> float | None:
    return (ev[b] - ev[a]) if a in ev and b in ev else None


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows: the issue's three targets (for 100 clients) and the whole command."""
    n, rd, mem, ov = (data.get("clients"), data.get("ready", {}), data.get("memory", {}),
                      data.get("overhead", {}))
    hundred, t = n == 100, data.get("targets", {})
    pairs = ", ".join(f"{x:.2f}" for x in ov.get("training_ratio_pairs", []))
    cmd = ", ".join(f"{x:.2f}" for x in ov.get("command_ratio_pairs", []))
    return measured(
        headline_row("start-up and memory", f"{n} clients registered after launch (ready_s, "
                     "median)", rd.get("ready_s_median"), "s",
                     f"<= {t['ready_s']:g} s" if hundred and t else "",
                     f"from exec {rd.get('exec_to_ready_s_median', float('nan')):.2f} s"),
        headline_row("start-up and memory", f"client memory, {n} clients (sum of PSS, largest)",
                     mem.get("client_pss_bytes_max", float("nan")) / 1e9, "GB",
                     f"<= {t['client_pss_bytes'] / 1e9:g} GB" if hundred and t else "",
                     f"{mem.get('per_client_mib_max', float('nan')):.1f} MiB per client"),
        headline_row("start-up and memory", f"fednet launch / fednet local training wall-clock, "
                     f"{n} clients, rounds: {data.get('rounds')}", ov.get("training_ratio"), "x",
                     f"<= {t['launch_over_local']:g}x (goal {t['launch_over_local_goal']:g}x)"
                     if hundred and t else "", f"median; pairs {pairs}"),
        headline_row("start-up and memory", f"fednet launch / fednet local whole command, "
                     f"{n} clients, rounds: {data.get('rounds')}", ov.get("command_ratio"), "x",
                     "", f"median; pairs {cmd}; CPU seconds {ov.get('cpu_ratio', 0):.2f}x"))


# ---- main ------------------------------------------------------------------------------------
def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--fork-probe":
        fork_probe(int(sys.argv[2]), sys.argv[3] == "warm")
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--trace-child":
        rest = sys.argv[3:]
        trace_child(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs and rounds (a smoke test)")
    ap.add_argument("--json", help="write the numbers to this file")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--ready-reps", type=int, help="ready-time runs [3; quick 1]")
    ap.add_argument("--reps", type=int, help="launch/local pairs [2; quick 2]")
    ap.add_argument("--rounds", type=int, help="rounds of the launch/local runs [25; quick 3]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-breakdown", action="store_true", help="skip the traced run (d)")
    a = ap.parse_args()
    ready_reps = a.ready_reps or (1 if a.quick else 3)
    reps = a.reps or 2
    rounds = a.rounds or (3 if a.quick else 25)
    n = a.clients
    info = machine()
    print(f"bench_launch  {info['date']}  git {info['git']}  nproc={info['nproc']}  load={info['loadavg_at_start']}"
          f"  clients={n}", flush=True)
    t_all = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fednet-bench-launch-"))
    try:
        ready = bench_ready(tmp, n, ready_reps)
        bd = None if a.no_breakdown else bench_breakdown(tmp, n)
        if bd is not None:
            bd["fork_probe"] = bench_fork()
        over = bench_overhead(tmp, n, rounds, reps, a.seed)
        launch = [r for r in over if r["runtime"] == "launch"]
        local = [r for r in over if r["runtime"] == "local"]
        # identity of results: every run against the first launch run
        ref = launch[0]
        ident = []
        for r in over[1:]:
            ident.append({
                "runtime": r["runtime"], "rep": r["rep"],
                "final_accuracy_equal": r["final_accuracy"] == ref["final_accuracy"],
                "data_bytes_equal": all(r["bytes"][k] == ref["bytes"][k] for k in DATA_KEYS),
                "bytes_differing": {k: [ref["bytes"][k], r["bytes"][k]] for k in ref["bytes"]
                                    if ref["bytes"][k] != r["bytes"][k]},
                "final_model_equal": same_model(ref["out"], r["out"]),
            })
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t_all

    # ---- (a)+(b) table
    print(f"\n(a)+(b) ready time and memory: fednet launch --clients {n} --rounds 1 --epochs 1")
    rows = []
    for i, r in enumerate(ready):
        pss = r["client_pss_bytes"] or 0
        rows.append([i, r["exec_to_ready_s"], r["ready_s"], r["startup_overhead_s"],
                     r["wall_s"], pss / 2**30, pss / n / 2**20, _pct(r["cpu_pressure"])])
    med_exec = median([r["exec_to_ready_s"] for r in ready])
    med_ready = median([r["ready_s"] for r in ready])
    pss_all = [r["client_pss_bytes"] for r in ready + launch if r.get("client_pss_bytes")]
    rows.append(["median", med_exec, med_ready,
                 median([r["startup_overhead_s"] for r in ready]), median([r["wall_s"] for r in ready]),
                 median([r["client_pss_bytes"] for r in ready]) / 2**30,
                 median([r["client_pss_bytes"] for r in ready]) / n / 2**20, ""])
    print(table(["run", "exec->ready s", "ready_s", "start overhead s", "command s",
                 "client PSS GiB", "MiB/client", "CPU pressure"], rows))
    if launch:
        print(f"client PSS after {rounds} rounds (launch runs of (c)): "
              + ", ".join(f"{r['client_pss_bytes'] / 2**30:.2f} GiB "
                          f"({r['client_pss_bytes'] / n / 2**20:.1f} MiB/client)" for r in launch))
    ready_ok_summary = med_ready <= TARGET_READY_S
    ready_ok_exec = med_exec <= TARGET_READY_S
    pss_max = max(pss_all) if pss_all else float("nan")
    pss_ok = pss_max <= TARGET_PSS_BYTES
    print(f"target ready <= {TARGET_READY_S:g}s: ready_s median {med_ready:.2f}s "
          f"{'met' if ready_ok_summary else 'MISSED'}; from exec median {med_exec:.2f}s "
          f"{'met' if ready_ok_exec else 'MISSED'}")
    print(f"target client PSS <= 2 GB: largest {pss_max / 1e9:.2f} GB "
          f"({pss_max / 2**30:.2f} GiB) {'met' if pss_ok else 'MISSED'}")

    # ---- (d) table
    if bd is not None:
        print(f"\n(d) where the time goes (one traced launch run, --rounds 1 --epochs 1; seconds "
              f"after exec; ready_s {bd['ready_s']:.2f})")
        print(table(["step", "t (s)"], [[k, "" if v is None else v] for k, v in bd["steps"]]))
        c = bd["cpu_at_ready"]
        nan = float("nan")
        sv, zg, cl = (c.get("server_sched") or (nan, nan), c.get("zygote_sched") or (nan, nan),
                      c.get("clients_sched") or (nan, nan))
        print(f"zygote warm-up {bd['zygote_warm_s'] or nan:.2f}s. CPU seconds until ready "
              f"(user/sys; on-CPU/waiting-for-CPU from schedstat):")
        print(f"  server  {c.get('server_user_s', nan):.2f}/{c.get('server_sys_s', nan):.2f}"
              f"  on {sv[0]:.2f} wait {sv[1]:.2f}")
        print(f"  zygote  {c.get('zygote_user_s', nan):.2f}/{c.get('zygote_sys_s', nan):.2f}"
              f"  on {zg[0]:.2f} wait {zg[1]:.2f}")
        print(f"  {n} clients {c.get('clients_user_s', nan):.2f}/{c.get('clients_sys_s', nan):.2f}"
              f"  on {cl[0]:.2f} wait {cl[1]:.2f}  ({cl[0] / n * 1e3:.1f} ms on-CPU per client;"
              " user/sys are 10 ms ticks, schedstat is exact)")
        zw, zs = bd.get("zygote_cpu_at_warm"), c.get("zygote_status", {})
        if zw and "zygote_user_s" in c:
            print(f"  zygote CPU from warm to ready (forking {n} clients): user "
                  f"{c['zygote_user_s'] - zw[0]:.2f}s sys {c['zygote_sys_s'] - zw[1]:.2f}s; forks "
                  f"spread over {bd['fork_span_s'] or nan:.2f}s; zygote VmRSS "
                  f"{zs.get('VmRSS', 0) / 1024:.0f} MiB, VmPTE {zs.get('VmPTE', 0)} kB, "
                  f"{zs.get('maps', 0)} mappings")
        for fp in bd.get("fork_probe", []):
            print(f"  fork probe ({'after the zygote warm-up' if fp['warm'] else 'bare python'}):"
                  f" os.fork() {fp['fork_ms_median']:.2f} ms median (min {fp['fork_ms_min']:.2f}),"
                  f" parent CPU {fp['parent_user_ms_per_fork']:.2f} user + "
                  f"{fp['parent_sys_ms_per_fork']:.2f} sys ms per fork; VmRSS "
                  f"{fp.get('VmRSS', 0) / 1024:.0f} MiB, VmPTE {fp.get('VmPTE', 0)} kB")
        if bd.get("cpu_pressure_some_fraction_until_ready") is not None:
            print(f"  machine CPU pressure (PSI 'some') until ready: "
                  f"{bd['cpu_pressure_some_fraction_until_ready']:.0%} of the time")
        d = bd["durations"]
        print("after ready: " + ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in d.items() if v is not None))

    # ---- (c) table
    print(f"\n(c) launch vs local: --clients {n} --rounds {rounds} --seed {a.seed}, alternated")
    rows = []
    for r in over:
        rows.append([r["runtime"], r["rep"], r["wall_clock_s"], r["wall_s"], r["cpu_s"],
                     r["ready_s"] or "", f"{r['final_accuracy']:.4f}", r["status"],
                     _pct(r["cpu_pressure"]), r["loadavg"][0]])
    print(table(["runtime", "rep", "training s", "command s", "command CPU s", "ready_s",
                 "final acc", "status", "CPU pressure", "load1"], rows))
    train_ratio = median([r["wall_clock_s"] for r in launch]) / median([r["wall_clock_s"] for r in local])
    cmd_ratio = median([r["wall_s"] for r in launch]) / median([r["wall_s"] for r in local])
    pair_train = [la["wall_clock_s"] / lo["wall_clock_s"] for la, lo in zip(launch, local)]
    pair_cmd = [la["wall_s"] / lo["wall_s"] for la, lo in zip(launch, local)]
    cpu_ratio = median([r["cpu_s"] for r in launch]) / median([r["cpu_s"] for r in local])

    def verdict(x: float) -> str:
        return ("met, and within the 1.2x goal" if x <= GOAL_RATIO else
                "met (not the 1.2x goal)" if x <= TARGET_RATIO else "MISSED")
    print(f"launch/local training wall-clock: {train_ratio:.2f}x (per pair "
          f"{', '.join(f'{x:.2f}' for x in pair_train)}) -> {verdict(train_ratio)}")
    print(f"launch/local whole command:       {cmd_ratio:.2f}x (per pair "
          f"{', '.join(f'{x:.2f}' for x in pair_cmd)}) -> {verdict(cmd_ratio)}")
    print(f"launch/local CPU seconds (whole process tree, whole command): {cpu_ratio:.2f}x "
          "(for reference; the target is about wall-clock)")
    all_same = all(d["final_accuracy_equal"] and d["data_bytes_equal"] and d["final_model_equal"]
                   for d in ident)
    print("identical results (vs launch rep 0): final_accuracy, data bytes "
          f"({', '.join(DATA_KEYS)}) and final_model.npz: {'yes' if all_same else 'NO'}")
    for d in ident:
        diff = {k: v for k, v in d["bytes_differing"].items()}
        print(f"  {d['runtime']} rep {d['rep']}: accuracy {'=' if d['final_accuracy_equal'] else '!='},"
              f" model {'=' if d['final_model_equal'] else '!='}, bytes differing: {diff or 'none'}")
    bad_exits = {f"{r.get('runtime', 'ready')}": r["client_exit_codes"]
                 for r in ready + launch if r.get("client_exit_codes")}
    if bad_exits:
        print("note: summary.json client_exit_codes not empty (clients reported as exiting "
              "abnormally): " + "; ".join(f"{len(v)} clients in a {k} run, codes "
                                          f"{sorted(set(v.values()))}" for k, v in bad_exits.items()))
    fails = [(r.get("runtime", "ready"), f) for r in ready + over for f in r.get("failures", [])]
    if fails:
        print(f"note: {len(fails)} failure rows in summary.json failures, e.g. "
              + "; ".join(f"{k}: {f}" for k, f in fails[:3]))
    warns = [w for r in ready + over for w in r.get("warnings", [])]
    if warns:
        print(f"note: {len(warns)} WARNING/ERROR lines on stderr across the runs, e.g.:")
        for w in warns[:5]:
            print("  " + w[:160])
    print(f"\nmeasured in {elapsed:.0f}s; load average now {loadavg()}")

    for r in over:
        r["out"] = str(r["out"])
    write_json(a.json, {
        "benchmark": "launch", "machine": info, "quick": a.quick, "clients": n,
        "elapsed_s": elapsed, "loadavg_at_end": loadavg(),
        "targets": {"ready_s": TARGET_READY_S, "client_pss_bytes": TARGET_PSS_BYTES,
                    "launch_over_local": TARGET_RATIO, "launch_over_local_goal": GOAL_RATIO},
        "ready_runs": ready,
        "ready": {"ready_s_median": med_ready, "exec_to_ready_s_median": med_exec,
                  "met_ready_s": ready_ok_summary, "met_from_exec": ready_ok_exec},
        "memory": {"client_pss_bytes_max": pss_max, "per_client_mib_max": pss_max / n / 2**20,
                   "met": pss_ok},
        "breakdown": bd,
        "overhead_runs": over, "rounds": rounds,
        "overhead": {"training_ratio": train_ratio, "command_ratio": cmd_ratio,
                     "cpu_ratio": cpu_ratio,
                     "training_ratio_pairs": pair_train, "command_ratio_pairs": pair_cmd},
        "identical": {"all": all_same, "details": ident},
    }, headline)


if __name__ == "__main__":
    main()
