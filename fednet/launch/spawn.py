"""Start the zygote, fork N clients through it, watch their exits, stop them all."""
from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

import numpy as np

import fednet
from fednet import plugins
from fednet.config.liveness import DEFAULT as LIVENESS, Liveness
from fednet.errors import FednetError
from fednet.platform.gpus import device_for
from fednet.types import id_array

log = logging.getLogger("fednet.launch")


class Zygote:
    """A warm fork server in its own session; clients are its children."""

    def __init__(self, dataset: str = "digits", data_root: str = "", log_file: BinaryIO | None = None,
                 warm_timeout_s: float = 120.0, unknown_run: bool = False,
                 batch_size: int = 8) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1")  # `-m` puts no cwd on the path:
        # a plugin named copy.py or random.py in it would shadow the standard library; this
        # process's own fednet is found through PYTHONPATH instead
        here = str(Path(fednet.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [env.get("PYTHONPATH")] if p])
        # the --plugin modules this process imported (the run's): the zygote imports them before
        # it warms up, so every forked client has them (installed plugins load by themselves)
        plugin_args = [a for ref in plugins.LOADED for a in ("--plugin", ref)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fednet.launch.zygote", "--dataset", dataset, "--data-root",
             data_root, "--parent", str(os.getpid()), "--batch-size", str(int(batch_size))]
            + (["--unknown-run"] if unknown_run else [])
            + plugin_args,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log_file if log_file is not None else None, env=env, start_new_session=True)
        assert self.proc.stdout is not None  # stdout=PIPE
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf = b""
        self.procs: dict[int, Sequence[int]] = {}  # pid -> its clients (a range where one)
        self.codes: dict[int, int] = {}  # pid -> exit code (of the processes that exited)
        self._new_dead: list[tuple[Sequence[int], str]] = []  # (a process's ids, why): exits
        self.warm_timeout_s = warm_timeout_s
        self.warm_s: float | None = None

    def wait_warm(self) -> None:
        """Block until the zygote has warmed up (it starts in parallel with the server). While
        it has not, this process imports what it would import later anyway (server_imports):
        the wait is otherwise idle, on a core the zygote does not use."""
        deadline = time.monotonic() + self.warm_timeout_s
        later = list(SERVER_IMPORTS)
        while self.warm_s is None:
            self._events()
            if self.warm_s is not None:
                return
            if later:
                _import_quietly(later.pop(0))
                continue
            if self.proc.poll() is not None:
                raise FednetError(f"the client zygote exited during start-up (code "
                                  f"{self.proc.returncode}); see the client log")
            if time.monotonic() > deadline:
                self.stop()
                raise FednetError("the client zygote did not warm up in time")
            time.sleep(0.01)

    def _events(self) -> list[dict[str, Any]]:
        while True:  # all that is there: a 64 KiB read per call held the zygote's events
            try:    # (and its forks) back by a server poll each (6 s for 16 processes of 1M)
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)  # type: ignore[union-attr]  # Popen(stdout=PIPE)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buf += chunk
        out = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            out.append(ev)
            if ev.get("event") == "warm":
                self.warm_s = float(ev.get("seconds", 0))
            elif ev.get("event") == "spawned":  # a process and all its clients: one line
                ids = event_ids(ev)
                self.procs[int(ev["pid"])] = ids if isinstance(ids, range) else list(ids)
            elif ev.get("event") == "exit":
                code = int(ev["code"])
                why = (f"process exited with code {code}" if code >= 0
                       else f"process killed by signal {-code}")
                pid = int(ev["pid"])
                self.codes[pid] = code
                self._new_dead.append((self.procs.get(pid, ()), why))
        return out

    def spawn(self, specs: list[dict[str, Any]], template: dict[str, Any] | None = None,
              batched: bool = False) -> None:
        """Fork one process per spec (cids, connect, device, threads, ...); with `template`
        (the run's model: name, num_classes, input_shape, dataset, seed) the zygote builds that
        model once and the clients copy it (`batched`: the run trains its clients in blocks,
        whose engine the zygote warms for that model)."""
        if not specs:
            return
        own = ("cids", "device", "curve")  # what differs between processes
        common = {k: v for k, v in specs[0].items() if k not in own}
        groups: dict[str, Any] = {"ranges": [[s["cids"][0], s["cids"][-1] + 1] for s in specs]}
        if not all(map(_consecutive, (s["cids"] for s in specs))):  # else a few bytes
            groups = {"groups": [[int(c) for c in s["cids"]] for s in specs]}
        cmd = {"cmd": "spawn_many", "common": common, **groups,
               "devices": [s["device"] for s in specs],
               "curves": [s.get("curve") for s in specs], "template": template,
               "batched": batched}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())  # a few KB even for 500 clients
        self.proc.stdin.flush()

    def exits(self) -> list[tuple[Sequence[int], str]]:
        """The processes that exited since the last call: (their ids, why), one entry each (a
        range of ids stays one); the zygote dying kills all."""
        self._events()
        if self.proc.poll() is not None:
            for pid, ids in self.procs.items():
                if pid not in self.codes:
                    self.codes[pid] = -9
                    self._new_dead.append((ids, "the client zygote died"))
        out, self._new_dead = self._new_dead, []
        return out

    def child_pids(self) -> list[int]:
        """PIDs of client processes still running (each once, whatever it holds)."""
        self._events()
        return sorted(p for p in self.procs if p not in self.codes)

    def exited(self) -> int:
        """Clients whose process has exited."""
        return sum(len(self.procs.get(p, ())) for p in self.codes)

    def failed(self) -> dict[int, int]:
        """cid -> exit code of every client whose process exited other than with 0."""
        return {c: code for p, code in self.codes.items() if code != 0
                for c in self.procs.get(p, ())}

    def stop(self, grace_s: float = 8.0, wait_for: Sequence[int] | np.ndarray | None = None,
             wait_s: float = 2.0) -> None:
        """Ask the zygote to stop its children and exit; kill it if it does not.

        Clients in wait_for (those that said BYE) get up to wait_s to exit by themselves first,
        so a clean exit is not recorded as killed by SIGTERM. A zygote still warming up has no
        children: it is terminated at once instead of finishing its warm-up.
        """
        deadline = time.monotonic() + wait_s
        self._events()
        waiting = holding(self.procs, wait_for if wait_for is not None else ())  # their processes
        while waiting and self.proc.poll() is None and time.monotonic() < deadline:
            self._events()
            waiting = [p for p in waiting if p not in self.codes]
            if waiting:
                time.sleep(0.01)
        self._events()
        if self.proc.poll() is None:
            if self.warm_s is None and not self.procs:
                self.proc.terminate()  # its SIGTERM handler stops any child and exits
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"cmd": "stop"}\n')
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._events()


SERVER_IMPORTS = ("matplotlib.figure", "matplotlib.axes", "matplotlib.ticker",
                  "matplotlib.font_manager", "matplotlib.backends.backend_agg")
"""What a launching server imports only at its run's end (metrics/plots.py draws the plots
with them: ~0.4 s), imported while it waits for the zygote's warm-up instead."""


def _import_quietly(name: str) -> None:
    """Import module `name` if it can be (nothing happens when it cannot: its user reports)."""
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - e.g. matplotlib not installed: the plots say so later
        pass


def _consecutive(ids: Sequence[int]) -> bool:
    """Whether `ids` are lo, lo + 1, ..., hi (one or more)."""
    if isinstance(ids, range):
        return ids.step == 1 and len(ids) > 0
    return len(ids) > 0 and bool((np.diff(np.asarray(ids, np.int64)) == 1).all())


def holding(procs: dict[int, Sequence[int]], cids: Iterable[int] | np.ndarray) -> list[int]:
    """The processes of `procs` (pid -> its ids) that hold one of `cids` or more: a range's
    test is two binary searches over the sorted ids, not a set of a million."""
    wanted = np.sort(id_array(cids) if isinstance(cids, (np.ndarray, range))
                     else np.fromiter(cids, np.int64))
    out = []
    for pid, ids in procs.items():
        if isinstance(ids, range) and ids.step == 1:
            hit = bool(np.searchsorted(wanted, ids.stop) > np.searchsorted(wanted, ids.start))
        else:
            hit = bool(np.isin(np.fromiter(ids, np.int64), wanted).any())
        if hit:
            out.append(pid)
    return out


def event_ids(ev: dict[str, Any]) -> Any:
    """The ids a zygote event names (zygote.ids_field): its range, or its list."""
    return range(*ev["range"]) if "range" in ev else map(int, ev["cids"])


def client_specs(n: int, connect: str, gpus: tuple[int, ...], threads: int,
                 ids: Sequence[int] | None = None, advertise: str = "127.0.0.1",
                 log_level: str = "WARNING", register_timeout: float = 60.0,
                 secure: str = "", per_process: int = 1, run_key: bytes | None = None,
                 key_name: str = "", curve_pairs: list[tuple[str, str]] | None = None,
                 liveness: Liveness = LIVENESS) -> list[dict[str, Any]]:
    """One spawn spec per process: `per_process` consecutive client ids each (the last may hold
    fewer), processes pinned round-robin to the GPUs (or the CPU); consecutive ids are a range
    and each process's a range of it (10,000,000 ids: no list of them). `run_key` (the
    launcher's secret, from which each client derives its own) travels only through the
    zygote's pipe; `liveness`: the run's timers (a client's link needs them before WELCOME)."""
    cids: Sequence[int] = range(n) if ids is None else ids
    if not isinstance(cids, range) and _consecutive(cids):  # a range: its slices are ranges
        cids = range(cids[0], cids[-1] + 1)
    k = max(1, per_process)
    groups = [cids[i:i + k] for i in range(0, len(cids), k)]
    return [{"cids": g, "connect": connect, "device": device_for(g[0] if k == 1 else i, gpus),
             "threads": threads, "advertise": advertise, "log_level": log_level,
             "register_timeout": register_timeout, "secure": secure,
             "run_key": run_key.hex() if run_key else "", "key_name": key_name,
             "curve": list(curve_pairs[i]) if curve_pairs else None,
             "liveness": liveness.to_dict()}
            for i, g in enumerate(groups)]


def open_client_log(out: Path | None) -> BinaryIO | None:
    """The shared log file of all client processes (inside the run folder)."""
    if out is None:
        return None
    (out / "logs").mkdir(parents=True, exist_ok=True)
    return (out / "logs" / "clients.log").open("ab", buffering=0)
