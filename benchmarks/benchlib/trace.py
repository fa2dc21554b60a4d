"""`fednet launch` in a process of its own whose steps are time-stamped, without changing fednet:
functions of run_zmq, the Session, the ZmqServer, the Zygote and the RoundDriver are wrapped as
their modules are imported (a meta-path hook), and the CPU seconds of the server, the zygote and
the clients are read when every client has registered. bench_launch.py (d) and bench_many.py's
scale part run it as `python3 benchmarks/bench_launch.py --trace-child RESULT -- ARGS`; the keys
of RESULT (a JSON object of CLOCK_MONOTONIC times, shared by every process of the machine) are
what they read. Also the fork probe: what os.fork() costs in a process like the zygote."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchlib.util import cpu_pressure_us, median


def _schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting for a CPU) summed over all threads of pid."""
    run = wait = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                    r, w, _ = fh.read().split()
                run, wait = run + int(r), wait + int(w)
            except (OSError, ValueError):
                pass
    except OSError:
        pass
    return run / 1e9, wait / 1e9


def _vm_status(pid: int) -> dict[str, Any]:
    """VmRSS and VmPTE (kB) and the number of mappings of pid: what a fork has to copy."""
    out: dict[str, Any] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmPTE:")):
                out[line.split(":")[0]] = int(line.split()[1])
        out["maps"] = len(Path(f"/proc/{pid}/maps").read_text().splitlines())
    except (OSError, ValueError):
        pass
    return out


def fork_probe(n: int, warm: bool) -> None:
    """Print the parent-side cost of os.fork() in a process like the zygote (warm=True: after
    fednet's zygote warm-up, torch and all) or a bare interpreter; children exit at once."""
    import resource

    if warm:
        from fednet.launch.zygote import warm_up
        warm_up("digits", "")
    times = []
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(n):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        times.append(time.perf_counter() - t0)
        os.waitpid(pid, 0)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"warm": warm, "n": n, "fork_ms_median": median(times) * 1e3,
                      "fork_ms_min": min(times) * 1e3,
                      "parent_user_ms_per_fork": (ru1.ru_utime - ru0.ru_utime) / n * 1e3,
                      "parent_sys_ms_per_fork": (ru1.ru_stime - ru0.ru_stime) / n * 1e3,
                      **_vm_status(os.getpid())}))


class _PostImport:
    """A meta-path finder that calls hook(module) right after the named modules are executed,
    so the wrapper can patch fednet's lazily imported modules without importing them early."""

    def __init__(self, hooks: dict[str, Any]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        import importlib.util

        if name not in self.hooks:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        orig, hook = spec.loader.exec_module, self.hooks.pop(name)

        def exec_module(module: Any) -> None:
            orig(module)
            hook(module)
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def trace_child(result_file: str, launch_args: list[str]) -> None:
    """Run `fednet launch` in this process with timestamps around the steps of run_zmq."""
    t_main = time.monotonic()
    ev: dict[str, Any] = {"child_main": t_main, "hello": [], "ready": [],
                          "psi_start": cpu_pressure_us()}
    state: dict[str, Any] = {}

    def wrap(obj: Any, name: str, before: str | None, after: str | None, post: Any = None) -> None:
        orig = getattr(obj, name)

        def w(*a: Any, **k: Any) -> Any:
            if before:
                ev[before] = time.monotonic()
            res = orig(*a, **k)
            if after:
                ev[after] = time.monotonic()
            if post is not None:
                post(a, res)
            return res
        setattr(obj, name, w)

    def at_ready(a: Any, res: Any) -> None:
        import resource

        import psutil

        ev["psi_ready"] = cpu_pressure_us()
        zyg = state.get("zyg")
        ru = resource.getrusage(resource.RUSAGE_SELF)
        cpu: dict[str, Any] = {"server_user_s": ru.ru_utime, "server_sys_s": ru.ru_stime,
                               "server_sched": _schedstat(os.getpid())}
        if zyg is not None:
            ev["zygote_warm_s"] = zyg.warm_s
            pz = psutil.Process(zyg.proc.pid)
            # Fork times relative to the zygote's own start (both create_times share the same
            # coarse boot-time offset, so only their difference is exact, to 10 ms), placed at
            # the moment its Popen returned.
            offset = pz.create_time() - ev["zygote_popen_done"]
            t = pz.cpu_times()
            cpu["zygote_user_s"], cpu["zygote_sys_s"] = t.user, t.system
            cpu["zygote_sched"] = _schedstat(zyg.proc.pid)
            cpu["zygote_status"] = _vm_status(zyg.proc.pid)
            created, users, syss, runs, waits = [], [], [], [], []
            for pid in zyg.child_pids():
                try:
                    p = psutil.Process(pid)
                    ct = p.cpu_times()
                    created.append(p.create_time() - offset)
                except psutil.NoSuchProcess:
                    continue
                users.append(ct.user)
                syss.append(ct.system)
                r, w = _schedstat(pid)
                runs.append(r)
                waits.append(w)
            cpu.update(clients_user_s=sum(users), clients_sys_s=sum(syss),
                       clients_sched=(sum(runs), sum(waits)),
                       client_cpu_s_median=median([u + s for u, s in zip(users, syss)]))
            ev["first_fork"] = min(created) if created else None
            ev["last_fork"] = max(created) if created else None
        ev["cpu_at_ready"] = cpu

    def hook_app(m: Any) -> None:
        wrap(m.ZmqServer, "__init__", None, "server_object_done")
        wrap(m.ZmqServer, "wait_for_clients", "wait_clients_enter", "all_ready", at_ready)
        wrap(m.ZmqServer, "shutdown", "shutdown_start", "shutdown_done")

    def hook_registrar(m: Any) -> None:
        orig_on_ready, orig_on_hello = m.Registrar.on_ready, m.Registrar.on_hellos

        def on_ready(self: Any, got: Any) -> None:  # READY(readys): a Received
            ev["ready"].append(time.monotonic())
            return orig_on_ready(self, got)

        def on_hello(self: Any, got: Any) -> None:  # READY(hellos)
            ev["hello"].append(time.monotonic())
            return orig_on_hello(self, got)
        m.Registrar.on_ready, m.Registrar.on_hellos = on_ready, on_hello

    def hook_session(m: Any) -> None:
        wrap(m.Session, "__init__", "session_start", "session_done")
        wrap(m.Session, "finish", "finish_start", "finish_done")

    def hook_rounds(m: Any) -> None:
        wrap(m.RoundDriver, "run", "training_start", "training_done")

    sys.meta_path.insert(0, _PostImport({
        "torch": lambda m: ev.__setitem__("torch_imported", time.monotonic()),
        "fednet.server.app": hook_app, "fednet.server.registrar": hook_registrar,
        "fednet.core.session": hook_session,
        "fednet.core.rounds": hook_rounds}))

    import fednet.cli as cli
    import fednet.launch.spawn as spawn
    import fednet.server.main as smain
    ev["imports_done"] = time.monotonic()

    wrap(smain, "run_zmq", "run_zmq_start", "run_zmq_done")
    wrap(spawn.Zygote, "__init__", None, "zygote_popen_done",
         lambda a, r: state.__setitem__("zyg", a[0]))
    wrap(spawn.Zygote, "spawn", None, "spawn_command_sent")
    def at_warm(a: Any, res: Any) -> None:
        import psutil

        t = psutil.Process(a[0].proc.pid).cpu_times()
        ev["zygote_cpu_at_warm"] = (t.user, t.system)
    wrap(spawn.Zygote, "wait_warm", "wait_warm_enter", "wait_warm_done", at_warm)
    wrap(spawn.Zygote, "stop", "zygote_stop_start", "zygote_stop_done")
    wrap(smain, "pss_bytes", "pss_start", "pss_done")
    try:
        cli.main(["launch", *launch_args], standalone_mode=False)
    finally:
        ev["cli_returned"] = time.monotonic()
        Path(result_file).write_text(json.dumps(ev))
