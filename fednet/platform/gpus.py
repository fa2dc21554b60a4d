"""Device pinning: client i runs on cuda:gpus[i % len(gpus)], or on the CPU without --gpus. A
device listed twice (`--gpus 0,0`) is two slots on it: its clients in twice as many processes
(their memory shares the device: platform/packing.py)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fednet.errors import ConfigError


def parse_gpus(text: str | None) -> tuple[int, ...]:
    """'0,1' -> (0, 1); '' or None -> (); anything else names --gpus in a ConfigError."""
    if text is None or str(text).strip() in ("", "none", "cpu"):
        return ()
    try:
        ids = tuple(int(t) for t in str(text).split(",") if t.strip() != "")
    except ValueError:
        raise ConfigError(f"--gpus expects comma-separated device indices such as 0,1 (got '{text}')") \
            from None
    if any(i < 0 for i in ids):
        raise ConfigError(f"--gpus expects non-negative device indices (got '{text}')")
    return ids


def device_for(cid: int, gpus: Sequence[int]) -> str:
    """The device string of client cid."""
    return f"cuda:{gpus[cid % len(gpus)]}" if gpus else "cpu"


def gpu_counts(cids: np.ndarray, gpus: Sequence[int]) -> dict[str, int]:
    """Clients per device (device_for of each of `cids`), counted without a loop."""
    if not gpus:
        return {"cpu": int(cids.size)} if cids.size else {}
    n = np.bincount(cids % len(gpus), minlength=len(gpus))
    counts: dict[str, int] = {}
    for slot, k in enumerate(n.tolist()):
        if k:
            name = device_for(slot, gpus)
            counts[name] = counts.get(name, 0) + k
    return counts


def check_gpus(gpus: Sequence[int], available: int | None = None) -> None:
    """Fail at once, clearly, when a requested GPU does not exist (available: device count)."""
    if not gpus:
        return
    if available is None:
        import torch
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available == 0:
        raise ConfigError(f"--gpus {','.join(map(str, gpus))}: no CUDA device is visible on this "
                          "machine; run without --gpus to use the CPU")
    bad = [g for g in gpus if g >= available]
    if bad:
        raise ConfigError(f"--gpus: device {bad[0]} does not exist (this machine has {available} "
                          f"CUDA device(s): 0..{available - 1})")
