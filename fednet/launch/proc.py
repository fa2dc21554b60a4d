"""Process helpers: parent-death signals and memory readings (Linux)."""
from __future__ import annotations

import ctypes
import sys

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


def pss_bytes(pids: list[int]) -> int:
    """Sum of proportional set size of the given live processes (0 for the ones gone)."""
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total
