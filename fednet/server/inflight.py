"""Which queued task the server sends next: at most --max-inflight tasks out, and, for big
models, at most PROCESS_CAP tasks out to any one client process.

A client process runs its tasks one at a time. Tasks sent to it beyond the one it runs and the
next one only wait in its memory, a whole model each: 10 ResNet-18 tasks sent at once to a
process of 10 clients put 447 MB into its receive queue, all in fresh pages. So with a model of
platform.malloc.BIG_MODEL_BYTES or more, unless --max-inflight or --real-time is given, a
process gets at most two tasks at once; the next is sent when one of its results returns. As
with --max-inflight, nothing simulated changes (tasks carry their simulated times); only the
real order of sends. The cap counts processes by the (host, pid) of each client's hello.

`reserve_bytes`: how much heap the server touches while its clients register (platform/malloc.
reserve), so that a first round's results land in mapped pages: room for the results that may
arrive at once (the tasks out: --max-inflight, else a round's clients), at most RESERVE_MODELS
models and RESERVE_SHARE of MemAvailable. Results arrive faster than one thread folds them
only while the clients are quick; measured with ResNet-18 and 20 tasks out (transfers alone),
a first round mapped 0.45-0.74 GB of fresh pages, 10-16 models.
"""
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable

from fednet.config import RunConfig
from fednet.platform.malloc import BIG_MODEL_BYTES
from fednet.platform.packing import mem_available
from fednet.types import Task

PROCESS_CAP = 2
RESERVE_MODELS = 16   # results the server makes room for before a first round, at most ...
RESERVE_SHARE = 0.125  # ... and at most this share of MemAvailable


def process_cap(cfg: RunConfig, model_bytes: int) -> int:
    """Tasks out at once per client process: PROCESS_CAP for big models under the defaults,
    else 0 (no cap)."""
    if cfg.net.max_inflight or cfg.latency.real or model_bytes < BIG_MODEL_BYTES:
        return 0
    return PROCESS_CAP


def next_task(queue: deque[Task], pending: dict[int, Task], max_inflight: int, cap: int,
              process_of: Callable[[int], Hashable]) -> Task | None:
    """Take from `queue` the first task that may be sent now, or None: none while
    `max_inflight` (0: no limit) tasks are out; with `cap`, the first whose client's process
    has fewer than `cap` tasks out."""
    if not queue or (max_inflight and len(pending) >= max_inflight):
        return None
    if not cap:
        return queue.popleft()
    out = Counter(process_of(t.cid) for t in pending.values())
    for i, task in enumerate(queue):
        if out[process_of(task.cid)] < cap:
            del queue[i]
            return task
    return None


def reserve_bytes(cfg: RunConfig, model_bytes: int, available: int | None = None) -> int:
    """Heap the server reserves before its first round (0 for models below BIG_MODEL_BYTES)."""
    if model_bytes < BIG_MODEL_BYTES:
        return 0
    per_round = max(1, round(cfg.algo.fraction * cfg.clients))
    out = min(cfg.net.max_inflight or per_round, per_round, RESERVE_MODELS)
    cap = int(RESERVE_SHARE * (mem_available() if available is None else available))
    return min(out * model_bytes, cap)
