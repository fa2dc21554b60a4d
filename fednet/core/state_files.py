"""The clients' state store (RUN/checkpoint/clients/): where per-client algorithm state lives.

An algorithm whose clients keep state between rounds (SCAFFOLD's c_k, FedDyn's gradients,
personal models, optimizer moments, Factorized-FL's v and mu) keeps each client's state in a
file of this store between the client's tasks, under `fednet local` and every client process
of `fednet launch`/`fednet clients` alike: after each task the client writes its state (the
typed ClientUpdate state and, for personal models, the model) to c0007.npz, and its objects
are dropped until it is selected again. Every task also carries `ckpt`, the rounds done at the
server's last checkpoint (--checkpoint-every N) or else at the start of the step (where a Ctrl-C
writes one: Session.checkpoint_interrupted), and the store keeps the newest state from before
it (StateStore). When a task arrives from a new server session (another run id: the
server was restarted with --resume), the client takes back the newest of its two files whose
round is before `ckpt` (or its initial state if it has none). Files are np.savez archives of
plain arrays (the tags are JSON text in a uint8 array), written atomically, read with
allow_pickle=False and checked before use.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from fednet.algorithms.state import Shapes, check_model, decode, encode
from fednet.metrics.files import atomic_file, make_dir
from fednet.types import client_name

log = logging.getLogger("fednet.client")
META = "__meta__"
HOMES = ("checkpoint", "checkpoint.old", "checkpoint.tmp")  # clients/ moves with the server's swap


def client_dirs(out: str | Path) -> list[Path]:
    """Where a run's client files may be: RUN/checkpoint/clients first (see server/checkpoint)."""
    return [Path(out) / h / "clients" for h in HOMES]


def home(out: str | Path) -> Path:
    """The clients folder to write into: the one that exists (else RUN/checkpoint/clients)."""
    dirs = client_dirs(out)
    return next((d for d in dirs if d.is_dir()), dirs[0])


def find(out: str | Path, name: str) -> Path | None:
    """The file `name` in the first clients folder that has it."""
    return next((d / name for d in client_dirs(out) if (d / name).is_file()), None)


def write(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """np.savez of arrays plus the JSON meta, atomically."""
    make_dir(path.parent)
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic_file(path) as fh:
        np.savez(fh, **arrays, **{META: blob})


def read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of a client file; ValueError naming the file when it is damaged."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop(META).tobytes().decode())
        if not isinstance(meta, dict) or not isinstance(meta.get("round"), int):
            raise ValueError("no round tag")
    except Exception as e:  # noqa: BLE001 - zip, format, JSON and key errors alike
        raise ValueError(f"{path}: damaged client state ({type(e).__name__}: {e})") from None
    return arrays, meta


class StateStore:
    """A process's clients' states between their tasks, one file per client (c0007.npz).

    The store is where a stateful client's state lives: the client's objects are dropped after
    each task and built again from its file at the next one, so a process holds the states of
    the clients it is training, not of every client it has (issue 22). Every file is tagged
    with the round and the server session (run id) that wrote it. take() gives a client's state
    for a task: its latest file if this session wrote it; else, in a resumed session (the task
    carries the checkpoint's rounds `ckpt`), the newest of its two files from before ckpt; else
    None (its initial state). put() writes the state after a task; before it overwrites a file
    older than ckpt it keeps it as c0007.prev.npz, so the newest state from before any
    checkpoint the server may resume from is always on disk. The checkpoint is this store."""

    __slots__ = ("out", "algorithm")

    def __init__(self, out: str | Path, algorithm: str) -> None:
        self.out, self.algorithm = str(out), algorithm

    def _path(self, cid: int, which: str) -> Path:
        return home(self.out) / (client_name(cid) + (".npz" if which == "latest" else ".prev.npz"))

    def take(self, cid: int, run_id: str, ckpt: int | None
             ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """(arrays, meta) of the state client cid starts a task with, or None for its initial
        one; ValueError naming the file when the file it needs is damaged."""
        name = client_name(cid)
        path = find(self.out, name + ".npz")
        latest = read(path) if path is not None else None
        if latest is not None and latest[1].get("run") == run_id:
            return latest
        if not ckpt:
            return None  # a fresh session: whatever is there is not this run's
        if latest is not None and latest[1]["round"] < ckpt:
            return latest
        prev = find(self.out, name + ".prev.npz")  # read only when the latest is too new
        got = read(prev) if prev is not None else None
        return got if got is not None and got[1]["round"] < ckpt else None

    def cids(self) -> list[int]:
        """The clients that have a latest file in the store, in id order."""
        folder = home(self.out)
        return sorted(int(f.name[1:-4]) for f in folder.glob("c*.npz")
                      if f.name[1:-4].isdigit()) if folder.is_dir() else []

    def put(self, cid: int, rnd: int, run_id: str, ckpt: int | None,
            arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Write client cid's state after its task of round rnd (OSError when it cannot)."""
        name = client_name(cid)
        src = find(self.out, name + ".npz")
        if ckpt and src is not None:
            kept = _round_of(src)
            if kept is not None and kept < ckpt:  # the newest before the checkpoint: keep it
                os.replace(src, self._path(cid, "prev"))
        write(self._path(cid, "latest"), arrays, {**meta, "round": rnd, "run": run_id,
                                                  "cid": cid, "algorithm": self.algorithm})


def _round_of(path: Path) -> int | None:
    """The round tag of a client file, read alone (None when it cannot be read: it is
    overwritten)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z[META].tobytes().decode())
        return int(meta["round"])
    except Exception:  # noqa: BLE001 - a damaged file is replaced, not kept
        return None


def encode_client(state: Any, model: dict[str, np.ndarray] | None
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A client's typed state (and personal model) as arrays and JSON."""
    arrays, meta = encode(state, lambda n: n)
    if model is not None:
        arrays.update({f"model/{k}": v for k, v in model.items()})
    return arrays, {"fields": meta}


def decode_client(cls: type, arrays: dict[str, np.ndarray], meta: dict[str, Any], shapes: Shapes,
                  fail: Any, device: Any = None) -> tuple[Any, dict[str, np.ndarray] | None]:
    """The inverse of encode_client, every array checked (fail(message) raises)."""
    model = {k[6:]: a for k, a in arrays.items() if k.startswith("model/")}
    rest = {k: a for k, a in arrays.items() if not k.startswith("model/")}
    fields = meta.get("fields", {})
    state, used = decode(cls, rest, fields if isinstance(fields, dict) else {}, lambda n: n,
                         shapes, fail, fail, device)
    for k in sorted(set(rest) - used):
        fail(f"array '{k}' does not belong to this client's state")
    return state, check_model("model", model, shapes, fail) if model else None
