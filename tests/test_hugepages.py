"""The zygote's huge-page collapse: which mappings it picks, and that it takes effect."""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys

import pytest

from fednet.platform import hugepages

MAPS = """\
00400000-00600000 r-xp 00000000 08:01 123 /usr/bin/python3
01000000-01a00000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000500000 rw-p 00000000 00:00 0
7f0000600000-7f0000700000 rw-p 00000000 00:00 0
7f0000800000-7f0000c00000 rw-s 00000000 00:05 9 /dev/shm/x
7f0001000000-7f0001400000 rw-p 00000000 08:01 77 /usr/lib/libtorch_cpu.so
7ffc00000000-7ffc00400000 rw-p 00000000 00:00 0 [stack]
"""


def test_picks_private_writable_anonymous_and_heap_aligned_to_2mib():
    got = hugepages._writable_private_anon(MAPS)
    assert got == [(0x01000000, 0x01a00000), (0x7f0000000000, 0x7f0000400000)]
    # shared, file-backed, named and too-small (< one aligned 2 MiB page) ranges are left alone


def _kernel_can_collapse() -> bool:
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return "[never]" not in mode and (major, minor) >= (6, 1)


def _region_huge_kib(addr: int) -> int:
    """AnonHugePages of the mapping that contains addr (from /proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            a, b = (int(x, 16) for x in head.split("-"))
            inside = a <= addr < b
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _kernel_can_collapse(),
                    reason="needs Linux >= 6.1 with transparent huge pages")
def test_collapse_turns_touched_anonymous_memory_into_huge_pages():
    size = 64 << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for off in range(0, size, 4096):  # touched: 4 KiB pages until collapsed
        m[off] = 1
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        probe = (addr + hugepages.HUGE - 1) // hugepages.HUGE * hugepages.HUGE
        if libc.madvise(probe, hugepages.HUGE, hugepages.MADV_COLLAPSE) != 0:
            pytest.skip(f"this kernel refuses MADV_COLLAPSE ({os.strerror(ctypes.get_errno())})")
        done = hugepages.collapse(budget_s=30.0)
        assert done >= 32 << 20
        assert _region_huge_kib(addr) >= 32 << 10  # at least half the region is now 2 MiB pages
    finally:
        m.close()


def test_collapse_is_harmless_where_unsupported(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert hugepages.collapse() == 0
