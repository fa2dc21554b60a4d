"""A client process's own state files for `fednet launch --resume` (RUN/checkpoint/clients/).

With --checkpoint-every N (and an algorithm whose clients keep state) every task carries `ckpt`,
the rounds done at the server's last checkpoint. After each task the client writes its state
(the typed ClientUpdate state and, for personal models, the model) to c0007.npz, tagged with the
task's round; before it overwrites a state older than the last checkpoint it keeps it as
c0007.prev.npz. So the newest state from before any checkpoint the server may resume from is
always on disk. When a task arrives from a new server session (another run id: the server was
restarted with --resume), the client takes back the newest of its two files whose round is
before `ckpt` (or its initial state if it has none). Files are np.savez archives of plain
arrays (the tags are JSON text in a uint8 array), written atomically, read with
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


class StateFiles:
    """One client's latest and kept states on disk, and the rule for taking one back."""

    def __init__(self, out: str, cid: int, algorithm: str) -> None:
        self.out, self.cid, self.algorithm = out, cid, algorithm
        self.name = client_name(cid)
        self.rounds: dict[str, int] = {}  # "latest" / "prev" -> the round of that file
        self.run_id: str | None = None    # the server session whose tasks we have seen
        self.warned = False

    def _path(self, which: str) -> Path:
        return home(self.out) / (self.name + (".npz" if which == "latest" else ".prev.npz"))

    def before(self, ckpt: int, run_id: str, restore: Any) -> None:
        """Before a task: on a new server session take back the newest state from before ckpt
        (restore(arrays, meta), or restore(None, None) for the initial state); then keep the
        latest file as prev when it is older than ckpt."""
        if self.run_id != run_id:
            if not (self.run_id is None and ckpt == 0):  # not the first task of a fresh run
                self._take_back(ckpt, restore)  # a damaged file fails this task (and the next)
            self.run_id = run_id
        latest = self.rounds.get("latest")
        if latest is not None and latest < ckpt and self.rounds.get("prev") != latest:
            src = find(self.out, self.name + ".npz")
            if src is not None:
                os.replace(src, self._path("prev"))
                self.rounds["prev"] = self.rounds.pop("latest")

    def _take_back(self, ckpt: int, restore: Any) -> None:
        self.rounds = {}
        chosen = None
        for which, suffix in (("latest", ".npz"), ("prev", ".prev.npz")):
            path = find(self.out, self.name + suffix)
            if path is None:
                continue
            arrays, meta = read(path)
            self.rounds[which] = int(meta["round"])
            if chosen is None and meta["round"] < ckpt:
                chosen = (arrays, meta)
        restore(*(chosen or (None, None)))

    def after(self, rnd: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """After a task of round rnd: write the state as the latest file (a failed write is
        logged once; the run goes on, but a resume would start this client afresh)."""
        try:
            write(self._path("latest"), arrays, {**meta, "round": rnd, "cid": self.cid,
                                                 "algorithm": self.algorithm})
            self.rounds["latest"] = rnd
        except OSError as e:
            if not self.warned:
                log.warning("client %d: cannot save its state for --resume (%s)", self.cid, e)
                self.warned = True


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
