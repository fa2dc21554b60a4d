"""What benchmarks/golden.py hashes: arrays (sha256 over names, dtypes, shapes and bytes), every
client's model and tensor state after an in-process run, and the InprocDispatcher that run_local
created (recorded to read those clients afterwards)."""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np


def sha256_arrays(arrays: dict[str, Any]) -> str:
    """sha256 over sorted names: name, dtype, shape and the C-order bytes of each array."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{list(a.shape)}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _tensors(prefix: str, obj: Any, out: dict[str, np.ndarray]) -> None:
    """The tensors and arrays inside a client's state (dataclass fields, dicts, lists, tuples),
    by path."""
    import dataclasses

    import torch

    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _tensors(f"{prefix}/{f.name}", getattr(obj, f.name), out)
    elif isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().cpu().numpy()
    elif isinstance(obj, np.ndarray):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k in obj:
            _tensors(f"{prefix}/{k}", obj[k], out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _tensors(f"{prefix}/{i}", v, out)


def client_arrays(dispatcher) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(every client's model state_dict, every client's tensor state), names prefixed by client.

    Reaches into the in-process runtime (InprocDispatcher.executors[cid].ctx); adapt this one
    function if that layout changes."""
    models: dict[str, np.ndarray] = {}
    state: dict[str, np.ndarray] = {}
    for cid, ex in sorted(dispatcher.executors.items()):
        for k, v in ex.ctx.model.state_dict().items():
            models[f"c{cid}/{k}"] = v.detach().cpu().numpy()
        _tensors(f"c{cid}", ex.ctx.state, state)
        if ex.codec.residual is not None:  # --compress's error feedback
            state[f"c{cid}/compress/residual"] = ex.codec.residual
    return models, state


@contextlib.contextmanager
def capture_dispatcher() -> Iterator[list]:
    """Record the InprocDispatcher that run_local creates (to read the clients afterwards)."""
    import fednet.core.inproc as inproc

    seen: list = []
    original = inproc.InprocDispatcher

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, session) -> None:
            super().__init__(session)
            seen.append(self)

    inproc.InprocDispatcher = Recording
    try:
        yield seen
    finally:
        inproc.InprocDispatcher = original
