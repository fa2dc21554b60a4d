"""`fednet clients`: run a set of client ids on this host through the warm zygote."""
from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping

from fednet.config.liveness import DEFAULT as LIVENESS, Liveness
from fednet.errors import ConfigError
from fednet.platform.gpus import parse_gpus
from fednet.platform.proc import raise_fd_limit
from fednet.launch.spawn import Zygote, client_specs


def slurm_share(text: str, env: Mapping[str, str]) -> list[int]:
    """'slurm:N' -> this SLURM task's share of the ids 0..N-1; errors name --ids.

    Task 0 runs `fednet server`; tasks 1..T-1 split the ids in contiguous blocks whose sizes
    differ by at most one (SLURM_PROCID is the task, SLURM_NTASKS is T)."""
    n_text = text.partition(":")[2].strip()
    if not n_text.isdigit() or int(n_text) < 1:
        raise ConfigError(f"--ids {text}: write slurm:N with N the run's --clients, e.g. "
                          "slurm:100 (this task takes its share of the ids 0..N-1)")
    n = int(n_text)
    procid, ntasks = env.get("SLURM_PROCID", ""), env.get("SLURM_NTASKS", "")
    if not (procid.isdigit() and ntasks.isdigit()):
        raise ConfigError(f"--ids {text}: SLURM_PROCID and SLURM_NTASKS are not set; run it as a "
                          "task of srun (or give the ids, e.g. --ids 0-49)")
    task, tasks = int(procid), int(ntasks)
    if tasks < 2 or task >= tasks:
        raise ConfigError(f"--ids {text}: SLURM_NTASKS={tasks}, SLURM_PROCID={task}: needs at "
                          "least 2 tasks (task 0 runs `fednet server`, tasks 1.. the clients)")
    if task == 0:
        raise ConfigError(f"--ids {text}: this is SLURM task 0, which runs `fednet server`; "
                          "clients run on tasks 1..")
    workers, k = tasks - 1, task - 1
    if n < workers:
        raise ConfigError(f"--ids {text}: {n} clients cannot fill the {workers} client tasks "
                          f"(SLURM_NTASKS={tasks}, task 0 is the server); ask for at most "
                          f"{n + 1} tasks")
    return list(range(k * n // workers, (k + 1) * n // workers))


def parse_ids(text: str, env: Mapping[str, str] | None = None) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7]; 'slurm:N' -> this SLURM task's share (slurm_share); errors
    name --ids."""
    if text.strip().lower().startswith("slurm"):
        return slurm_share(text.strip(), os.environ if env is None else env)
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a:
                    raise ConfigError(f"--ids: the range '{part}' runs backwards; write it as {b}-{a}")
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise ConfigError(f"--ids expects ranges and numbers such as 0-49 or 0,2,4 (got '{text}')") \
            from None
    if not out or min(out) < 0 or len(set(out)) != len(out):
        raise ConfigError(f"--ids must name distinct non-negative client ids (got '{text}')")
    return out


def check_connect(connect: str) -> tuple[str, int]:
    """(host, port) of --connect, which must be tcp://HOST:PORT; errors name --connect (the
    server's --bind is checked the same way)."""
    host, _, port = connect[6:].rpartition(":")
    if not connect.startswith("tcp://") or not host:
        raise ConfigError(f"--connect expects tcp://HOST:PORT, e.g. tcp://10.0.0.1:5555 (got "
                          f"'{connect}')")
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"--connect: port '{port}' is not a number in 1..65535")
    return host.strip("[]"), int(port)


def wait_listening(connect: str, timeout_s: float) -> None:
    """Retry a plain TCP connection to the server until it accepts one or timeout_s passes.

    Clients may be started before the server; without this a wrong address would only show as
    every client timing out on its own, one log line each.
    """
    hp = check_connect(connect)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(hp, timeout=max(0.1, min(2.0, left))):
                return
        except OSError as e:
            why = e.strerror or type(e).__name__
        if left <= 0:
            raise ConfigError(f"--connect {connect}: no server is listening there ({why.lower()}, "
                              f"tried for {timeout_s:g}s); check the address and port, start "
                              "`fednet server` first, or raise --timeout")
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def run_clients(connect: str, ids: list[int], gpus: str | None, advertise: str, threads: int,
                timeout_s: float = 60.0, secure: str = "", per_process: int = 1,
                key_name: str = "", join_key: str = "", liveness: Liveness = LIVENESS) -> int:
    """Fork the clients, wait for all of them to exit; exit code 0 only if all exited cleanly.
    `join_key`: the plaintext server's join key file (protocol/join_key.py); needed unless
    `secure`. `liveness`: the clients' timers (the server's own: --liveness on both)."""
    check_connect(connect)  # before anything starts
    if not secure and not join_key:
        raise ConfigError("--join-key: a plaintext `fednet server` admits only clients holding "
                          "its join key; give --join-key FILE (the server printed its path at "
                          "start: RUN/join.key unless its own --join-key; copy it to this host), "
                          "or run both with --secure DIR")
    if timeout_s <= 0:
        raise ConfigError(f"--timeout must be positive (got {timeout_s:g})")
    if per_process < 1:
        raise ConfigError(f"--clients-per-process must be at least 1 (got {per_process})")
    raise_fd_limit()
    # the open files a process needs: checked by each Host at WELCOME (if the run hands over)
    g = parse_gpus(gpus)
    if g:
        from fednet.platform.gpus import check_gpus
        check_gpus(g)
    if secure:  # fail now, in this process, if the keys are not there
        from fednet.transport.security import load_keys
        load_keys(secure, need_server_secret=False, name=key_name)
    wait_listening(connect, timeout_s)
    run_key = None
    if not secure:  # the server wrote it before it listened (on a shared folder: give it time)
        from fednet.protocol import join_key as join
        run_key = join.wait_for(join_key, timeout_s)
    zyg = Zygote(log_file=None, unknown_run=True)  # the dataset and model come at WELCOME
    zyg.spawn(client_specs(len(ids), connect, g, threads, ids=ids, advertise=advertise,
                           log_level="WARNING", register_timeout=timeout_s, secure=secure,
                           per_process=per_process, key_name=key_name, run_key=run_key,
                           liveness=liveness))
    procs = -(-len(ids) // per_process)
    print(f"started {len(ids)} client{'' if len(ids) == 1 else 's'} ({procs} "
          f"process{'' if procs == 1 else 'es'}) connecting to {connect}", file=sys.stderr)
    try:
        while zyg.exited() < len(ids):
            zyg.exits()
            if zyg.proc.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        zyg.stop()
    bad = zyg.failed()
    if bad:
        print(f"{len(bad)} of {len(ids)} clients exited with errors (client: exit code "
              f"{dict(sorted(bad.items())[:10])}); see their log lines above", file=sys.stderr)
    return 0 if not bad and zyg.exited() == len(ids) else 1
