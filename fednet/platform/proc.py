"""Process helpers: parent-death signals, SIGTERM as an interrupt, memory readings (Linux)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

PR_SET_PDEATHSIG = 1


def set_pdeathsig(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def raise_fd_limit() -> int:
    """Raise this process's soft limit of open files towards its hard limit, to at most 65,536
    (children inherit it): the server holds one connection per client, a process of several
    clients about 8 files each, and a common soft limit of 1024 is too few for a few hundred
    clients. Returns the limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, 1 << 16)  # plenty; not the hard limit itself, which may be ~1e9
    target = want if hard == resource.RLIM_INFINITY else min(hard, want)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


FILES_RESERVE = 64  # a client process's own files beyond its clients' (libraries, logs, pipes)
FILES_PER_CLIENT = 8  # a client of a hand-off run: peer socket, mailbox, listener, connections
#                      (without hand-offs a client holds no file: the server link is shared)


def check_files_per_process(per_process: int, handoffs: bool = True) -> None:
    """ConfigError if one process of `per_process` clients of a run with hand-offs would run out
    of open files."""
    import resource

    from fednet.errors import ConfigError

    if not handoffs:  # the clients hold no files of their own
        return
    need = FILES_PER_CLIENT * per_process + FILES_RESERVE
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit < need:
        raise ConfigError(f"--clients-per-process {per_process}: one process of that many clients "
                          f"needs about {need} open files, the limit is {limit} (ulimit -n); use "
                          "fewer clients per process or raise the limit")


def seed_routing_ids() -> None:
    """Seed the C library's rand() from the OS's randomness. libzmq draws the routing ids a
    ROUTER gives its connections from rand(), which nothing seeds: the first id in every process
    was 00 6b 8b 45 67, so a peer could claim it ahead of time (and libzmq aborts the process
    when a generated id is already taken; issue 23). Call it in every process that opens sockets,
    and again after fork (a child inherits its parent's sequence)."""
    try:
        ctypes.CDLL(None).srand(int.from_bytes(os.urandom(4), "little"))
    except (OSError, AttributeError):  # no C library to seed: nothing to predict either
        pass


SERVER_FILES_RESERVE = 256  # its own files: the dataset cache, logs, zmq's mailboxes, the zygote


def server_files_problem(connections: int, what: str) -> str:
    """Why the server could not hold `connections` client connections (one per client process:
    its clients share it) within its open-files limit, '' when it can (call after
    raise_fd_limit). `what`: the option that sets how many there are."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = connections + SERVER_FILES_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return ""
    return (f"{what}: the server holds one connection per client process, {connections} here, "
            f"and needs about {need} open files; the limit is {soft} (hard limit "
            f"{'unlimited' if hard == resource.RLIM_INFINITY else hard}, ulimit -Hn); put more "
            "clients in each process (--clients-per-process) or raise the hard limit "
            "(limits.conf, or LimitNOFILE under systemd)")


def check_server_connections(clients: int, per_process: int, launch: bool) -> str:
    """Before anything starts: ConfigError when launch's client processes (`per_process`
    clients each; 0: auto, which stays far below) would need more connections than the server
    can hold; `fednet server` only warns, since the client hosts choose how they group their
    clients; returns that warning ('' if none)."""
    import logging

    from fednet.errors import ConfigError

    if launch and per_process:
        why = server_files_problem(-(-clients // per_process), "--clients-per-process")
        if why:
            raise ConfigError(why)
    elif not launch and (why := server_files_problem(clients, "--clients")):
        why += " (if every client host runs one process per client)"
        logging.getLogger("fednet.server").warning("%s", why)
        return why  # the warning
    return ""


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB, macOS bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _pss(pid: int) -> int:
    """One process's proportional set size in bytes (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def pss_bytes(pids: list[int]) -> int:
    """Sum of proportional set size of the given live processes (0 for the ones gone).

    The kernel walks each process's page tables to compute it (about 6.6 ms for a client): the
    reads run on a few threads (300 client-sized processes on 2 cores: 1.63 s -> 0.63 s).
    """
    if not pids:
        return 0
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):  # not Linux 4.14+: psutil
        import psutil

        total = 0
        for pid in pids:
            try:
                total += psutil.Process(pid).memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
                pass
        return total
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as ex:
        return sum(ex.map(_pss, pids))


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, a scheduler's time limit), handled like Ctrl-C so the results are written."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def sigterm_interrupts() -> Callable[[], None]:
    """Make SIGTERM raise Terminated; returns a function that puts the previous handler back.

    Only the main thread can set handlers; elsewhere this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    prev = signal.signal(signal.SIGTERM, _raise_terminated)

    def restore() -> None:
        signal.signal(signal.SIGTERM, prev if prev is not None else signal.SIG_DFL)
    return restore


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while the block runs (a round being aggregated and logged:
    an interrupt then comes at its end, where the round can be checkpointed). Main thread only;
    elsewhere nothing is held.

    The hold is in Python's handlers, not the thread's signal mask: a process-directed signal
    (`kill PID`, a terminal's Ctrl-C) goes to any thread that does not block it, so masking
    the main thread alone held nothing in a server with threads; Python runs every handler on
    the main thread whichever thread the signal came to. Each signal held is raised again at
    the block's end, under the handler from before: every distinct one, in the order they
    first came (both a Ctrl-C and a SIGTERM: redeliver)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)
    before = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        redeliver(list(dict.fromkeys(held)))  # delivered now, to the handlers from before


def redeliver(signals: list[int]) -> None:
    """Raise each of `signals` in turn under its handler now (main thread: Python runs it
    inside raise_signal). An exception a handler raises does not keep the later ones from
    theirs (SIGTERM's Terminated after a Ctrl-C's KeyboardInterrupt): the last one raised
    propagates, with the one before as its context, as when the signals come one after
    another unheld."""
    err: BaseException | None = None
    for s in signals:
        try:
            signal.raise_signal(s)
        except BaseException as e:  # noqa: BLE001 (a handler's; raised below, after the rest)
            if err is not None and e.__context__ is None:
                e.__context__ = err
            err = e
    if err is not None:
        raise err
