"""Keep freed memory for reuse in processes that move big models (glibc's mallopt).

A received model is joined from its 256 KiB frames into new arrays (protocol.codec.decode).
By default glibc serves every allocation above a dynamic threshold (at most 32 MiB) with a
fresh mmap and gives it back to the kernel when freed, and trims the top of its heap: every
model a process receives then lands in never-touched pages, one page fault per 4 KiB (or per
2 MiB page, which numpy requests for arrays of 4 MiB and more). With several processes faulting
at once those faults cost 10-25 us each on the benchmark machine: decoding one ResNet-18 (44.7 MB)
took 60-100 ms of CPU, 90% of it in the kernel, against 4-11 ms into reused memory
(docs/benchmarks/history.md section 15).

`reuse_freed_memory(model_bytes)` fixes the mmap threshold at its maximum and stops trimming
when the model is big (>= BIG_MODEL_BYTES): freed buffers stay in the process and the next
model is joined into pages already mapped. The price: a process's resident memory stays at its
high-water mark instead of shrinking between tasks, which the memory rule of
--clients-per-process auto (packing.py) already assumes (it counts peak copies per process).
Small models keep glibc's defaults (their decode is cheap; 500 digits clients keep their PSS).

Two more settings make a first round as fast as the later ones (docs/benchmarks/history.md section 15):
- `one_arena()`, at the start of every fednet process: all threads allocate from glibc's main
  heap. ZeroMQ's I/O thread allocates every received frame; in a heap of its own (glibc's
  default, one arena per thread), a heap left empty at the end of a round is unmapped whatever
  the trim threshold, so the next round's frames faulted fresh pages again (17-90 k faults per
  round in the server). In the main heap, with trimming off, frames and decoded models reuse
  the same pages.
- `reserve(nbytes)` touches and frees nbytes of that heap, so that the first models a process
  receives land in mapped pages. The server reserves room for the results it may hold at once
  while it waits for its clients to register (server/inflight.reserve_bytes), when it is idle;
  a client process reserves CLIENT_RESERVE_MODELS models while it registers (core/executor).
Not glibc (musl, macOS): nothing is changed.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

BIG_MODEL_BYTES = 8 << 20
"""Models of at least this many bytes switch their process to keeping freed memory."""

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt (malloc.h)
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
    mallopt = _libc_fn("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    if mallopt is None:
        return False
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD,
                                                                     TRIM_THRESHOLD) == 1
    if ok:
        _done = True
        log.debug("malloc: freed memory is kept for reuse (a %d-byte model)", model_bytes)
    return ok


def _libc_fn(name: str, argtypes: list[Any], restype: Any) -> Any:
    """A function of the process's own libc (no ldconfig subprocess), or None (not glibc)."""
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = argtypes, restype
    return fn


def one_arena() -> bool:
    """All threads of this process (and of its forked children) allocate from the main heap.
    Call it before any thread other than the main one allocates (before zmq.Context())."""
    mallopt = _libc_fn("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    return mallopt is not None and mallopt(M_ARENA_MAX, 1) == 1


CLIENT_RESERVE_MODELS = 2  # within the 3 copies per process of packing.py's memory rule
RESERVE_PIECE = 16 << 20  # below MMAP_THRESHOLD: the pieces come from the heap, and stay there


def reserve(nbytes: int) -> int:
    """Touch about nbytes of the heap once and free them again, so that later allocations of
    this process find those pages mapped. Only once freed memory is kept (reuse_freed_memory
    in effect; otherwise the heap would give the pages back): returns the bytes touched."""
    if not _done or nbytes <= 0:
        return 0
    malloc = _libc_fn("malloc", [ctypes.c_size_t], ctypes.c_void_p)
    free = _libc_fn("free", [ctypes.c_void_p], None)
    if malloc is None or free is None:
        return 0
    pieces = []
    try:
        for _ in range(-(-nbytes // RESERVE_PIECE)):
            p = malloc(RESERVE_PIECE)
            if not p:
                break
            ctypes.memset(p, 0, RESERVE_PIECE)  # ctypes releases the GIL meanwhile
            pieces.append(p)
    finally:
        for p in pieces:
            free(p)
    log.debug("malloc: %d bytes of heap reserved", len(pieces) * RESERVE_PIECE)
    return len(pieces) * RESERVE_PIECE


class Reserve:
    """reserve(nbytes) in a thread of its own (the caller goes on: the server keeps
    registering clients meanwhile); join() waits for it and returns the bytes touched."""

    def __init__(self, nbytes: int) -> None:
        self.done = 0
        self._thread: threading.Thread | None = None
        if nbytes > 0 and _done:
            self._thread = threading.Thread(target=self._run, args=(nbytes,),
                                            name="fednet-reserve", daemon=True)
            self._thread.start()

    def _run(self, nbytes: int) -> None:
        self.done = reserve(nbytes)

    def join(self) -> int:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.done


_background: Reserve | None = None


def reserve_once(nbytes: int) -> None:
    """Reserve(nbytes) in the background, the first time this process calls it only (a process
    of several clients reserves once, for all of them)."""
    global _background
    if _background is None:
        _background = Reserve(nbytes)
