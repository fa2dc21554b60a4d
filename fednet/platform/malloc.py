"""Keep freed memory for reuse in processes that move big models (glibc's mallopt).

A received model is joined from its 256 KiB frames into new arrays (protocol.codec.decode).
By default glibc serves every allocation above a dynamic threshold (at most 32 MiB) with a
fresh mmap and gives it back to the kernel when freed, and trims the top of its heap: every
model a process receives then lands in never-touched pages, one page fault per 4 KiB (or per
2 MiB page, which numpy requests for arrays of 4 MiB and more). With several processes faulting
at once those faults cost 10-25 us each on the benchmark machine: decoding one ResNet-18 (44.7 MB)
took 60-100 ms of CPU, 90% of it in the kernel, against 4-11 ms into reused memory
(BENCHMARKS.md section 15).

`reuse_freed_memory(model_bytes)` fixes the mmap threshold at its maximum and stops trimming
when the model is big (>= BIG_MODEL_BYTES): freed buffers stay in the process and the next
model is joined into pages already mapped. The price: a process's resident memory stays at its
high-water mark instead of shrinking between tasks, which the memory rule of
--clients-per-process auto (packing.py) already assumes (it counts peak copies per process).
Small models keep glibc's defaults (their decode is cheap; 500 digits clients keep their PSS).
Not glibc (musl, macOS): nothing is changed.
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

BIG_MODEL_BYTES = 8 << 20
"""Models of at least this many bytes switch their process to keeping freed memory."""

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = (1 << 31) - 1  # an int: never trim the heap's top in practice

_done = False


def reuse_freed_memory(model_bytes: int) -> bool:
    """For a model of `model_bytes`: keep freed memory in this process (once; inherited by
    forked children). True when the setting is (now or already) in effect."""
    global _done
    if _done:
        return True
    if model_bytes < BIG_MODEL_BYTES:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own libc (no ldconfig subprocess)
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD,
                                                                     TRIM_THRESHOLD) == 1
    if ok:
        _done = True
        log.debug("malloc: freed memory is kept for reuse (a %d-byte model)", model_bytes)
    return ok
