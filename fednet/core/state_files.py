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

import errno
import json
import logging
import os
import stat
import zipfile
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

import numpy as np

if TYPE_CHECKING:  # (an annotation only: this module does not need torch)
    import torch

from fednet.algorithms.state import Shapes, check_model, decode, encode
from fednet.metrics.files import atomic_file, make_dir
from fednet.types import client_name

log = logging.getLogger("fednet.client")
META = "__meta__"
LINEAGE = 16  # the first hex digits of a run id: the run's, kept across --resume (the rest: the session's)
HOMES = ("checkpoint", "checkpoint.old", "checkpoint.tmp")  # clients/ moves with the server's swap


def client_dirs(out: str | Path) -> list[Path]:
    """Where a run's client files may be: RUN/checkpoint/clients first (see server/checkpoint)."""
    return [Path(out) / h / "clients" for h in HOMES]


def home(out: str | Path) -> Path:
    """The clients folder to write into: the one that exists (else RUN/checkpoint/clients)."""
    dirs = client_dirs(out)
    return next((d for d in dirs if d.is_dir()), dirs[0])


def find(out: str | Path, name: str) -> Path | None:
    """The entry `name` in the first clients folder that has one (a link or a folder too:
    the reader refuses them, never skips them)."""
    return next((d / name for d in client_dirs(out) if os.path.lexists(d / name)), None)


def write(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """np.savez of arrays plus the JSON meta, atomically."""
    make_dir(path.parent)
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic_file(path) as fh:
        np.savez(fh, allow_pickle=False, **arrays, **{META: blob})  # (numbers only)


def _open(path: Path) -> BinaryIO:
    """The file itself, never a symbolic link (or a folder, a device...) in its place."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("a symbolic link, not a state file (links are never followed)"
                             ) from None
        raise ValueError(e.strerror or str(e)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    return os.fdopen(fd, "rb")


def _members(z: zipfile.ZipFile, bound: int) -> None:
    """Every member a plain stored .npy within `bound` bytes in all, before any is read (a small
    file cannot make the reader allocate a large array)."""
    total = 0
    for info in z.infolist():
        if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
            raise ValueError(f"member {info.filename[:60]!r} is not a stored .npy array "
                             "(fednet writes np.savez archives)")
        total += info.file_size
        if total > bound:
            raise ValueError(f"its arrays hold more than {bound} bytes, more than this "
                             "algorithm's client state can")


def read(path: Path, bound: int = 1 << 40) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of a client file, which must be a regular file (no link followed) of at
    most `bound` bytes of arrays; ValueError naming the file when it cannot be used."""
    try:
        with _open(path) as fh, zipfile.ZipFile(fh) as z:
            _members(z, bound)
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}  # every member read: its CRC checked
        meta = json.loads(arrays.pop(META).tobytes().decode())
        if not isinstance(meta, dict) or not isinstance(meta.get("round"), int):
            raise ValueError("no round tag")
    except ValueError as e:  # our own checks, and numpy's on a damaged array
        raise ValueError(f"{path}: unusable client state ({e})") from None
    except Exception as e:  # noqa: BLE001 - zip, format, JSON and key errors alike
        raise ValueError(f"{path}: damaged client state ({type(e).__name__}: {e})") from None
    return arrays, meta


def state_bound(model_bytes: int, examples: int) -> int:
    """The most bytes of arrays a client's state file may hold: a few copies of the model
    (control variates, gradients, a personal model, optimizer moments, a residual) and a few
    arrays over its examples (index splits), with room to spare."""
    return 8 * model_bytes + 16 * examples + (1 << 20)


def lineage(run_id: str) -> str:
    """The part of a run id that a --resume keeps (core/session.py): the run, not the session."""
    return run_id[:LINEAGE]


def check_tags(path: Path, meta: dict[str, Any], cid: int, algorithm: str,
               run: str | None) -> None:
    """The file is client cid's, of this algorithm and (run: its lineage, None for a checkpoint
    of an older fednet that kept none) of this run; ValueError naming the file otherwise."""
    got = meta.get("cid", cid), meta.get("algorithm", algorithm)
    if got[0] != cid:
        raise ValueError(f"{path}: the state of client {got[0]!r}, not of client {cid}")
    if got[1] != algorithm:
        raise ValueError(f"{path}: a state of algorithm {got[1]!r}, this run is {algorithm!r}")
    if run is not None and lineage(str(meta.get("run", ""))) != run:
        raise ValueError(f"{path}: the state of another run (run id {str(meta.get('run'))[:32]!r})")


class StateStore:
    """A process's clients' states between their tasks, one file per client (c0007.npz).

    The store is where a stateful client's state lives: the client's objects are dropped after
    each task and built again from its file at the next one, so a process holds the states of
    the clients it is training, not of every client it has (issue 22). Every file is tagged
    with the round, the client, the algorithm and the server session (run id) that wrote it.
    take() gives a client's state for a task: its latest file if this session wrote it; else,
    in a resumed session (the task carries the checkpoint's rounds `ckpt`), the newest of its
    two files from before ckpt (chosen()); else None (its initial state). put() writes the state
    after a task; before it overwrites a file older than ckpt it keeps it as c0007.prev.npz, so
    the newest state from before any checkpoint the server may resume from is always on disk.
    The checkpoint is this store (the server's manifest names each file's round: Manifest).

    A file that cannot be used (damaged, a link, another client's, run's or algorithm's, over
    `bound` bytes) is moved aside (c0007.npz.refused) and its task fails once, naming it."""

    __slots__ = ("out", "algorithm", "bound")

    def __init__(self, out: str | Path, algorithm: str, bound: int = 1 << 40) -> None:
        self.out, self.algorithm, self.bound = str(out), algorithm, bound

    def _path(self, cid: int, which: str) -> Path:
        return home(self.out) / (client_name(cid) + (".npz" if which == "latest" else ".prev.npz"))

    def _load(self, cid: int, name: str, run_id: str
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """One of cid's files, checked (None when absent, or another run's: never taken, and
        overwritten by the next put); an unusable one is moved aside (ValueError naming it)."""
        path = find(self.out, name)
        if path is None:
            return None
        try:
            got = read(path, self.bound)
            check_tags(path, got[1], cid, self.algorithm, None)
        except ValueError as e:
            aside = path.with_name(path.name + ".refused")
            try:
                os.replace(path, aside)
            except OSError:
                aside = path
            raise ValueError(f"{e}; moved to {aside.name}: client {cid} goes on from an "
                             "earlier state of its own or its initial one") from None
        if lineage(str(got[1].get("run", ""))) != lineage(run_id):
            _foreign(path)
            return None
        return got

    def take(self, cid: int, run_id: str, ckpt: int | None
             ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """(arrays, meta) of the state client cid starts a task with, or None for its initial
        one; ValueError naming the file when the file it needs cannot be used."""
        name = client_name(cid)
        latest = self._load(cid, name + ".npz", run_id)
        if latest is not None and latest[1].get("run") == run_id:
            return latest
        if not ckpt:
            return None  # a fresh session: whatever is there is not this run's
        if latest is not None and latest[1]["round"] < ckpt:
            return latest
        got = self._load(cid, name + ".prev.npz", run_id)  # read only when the latest is too new
        return got if got is not None and got[1]["round"] < ckpt else None

    def cids(self) -> list[int]:
        """The clients that have a latest file in the store, in id order."""
        folder = home(self.out)
        return sorted(int(f.name[1:-4]) for f in folder.glob("c*.npz")
                      if f.name[1:-4].isdigit()) if folder.is_dir() else []

    def unsaved(self, cid: int) -> None:
        """Client cid's state could not be written (a full disk): mark it, so that no resume
        takes its older file for it (an empty c0007.unsaved, else its file renamed to
        c0007.unsaved.npz: a rename needs no free space)."""
        name = client_name(cid)
        try:
            os.close(os.open(home(self.out) / f"{name}.unsaved", os.O_WRONLY | os.O_CREAT, 0o644))
            return
        except OSError:
            pass
        src = find(self.out, name + ".npz")
        try:
            if src is not None:
                os.replace(src, src.with_name(f"{name}.unsaved.npz"))
        except OSError as e:
            log.error("client %d: cannot mark its state unsaved in %s (%s): a --resume may "
                      "restore an older state for it", cid, home(self.out), e)

    def put(self, cid: int, rnd: int, run_id: str, ckpt: int | None,
            arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Write client cid's state after its task of round rnd (OSError when it cannot)."""
        name = client_name(cid)
        src = find(self.out, name + ".npz")
        if ckpt and src is not None:
            kept = round_of(src)
            if kept is not None and kept < ckpt:  # the newest before the checkpoint: keep it
                os.replace(src, self._path(cid, "prev"))
        write(self._path(cid, "latest"), arrays, {**meta, "round": rnd, "run": run_id,
                                                  "cid": cid, "algorithm": self.algorithm})


_FOREIGN_SEEN: set[str] = set()


def _foreign(path: Path) -> None:
    """Another run's file where this run keeps a client's state: said once per folder."""
    if str(path.parent) not in _FOREIGN_SEEN:
        _FOREIGN_SEEN.add(str(path.parent))
        log.warning("%s is another run's client state: not taken (this run's clients start "
                    "from their own state, and overwrite such files)", path)


def unsaved_marks(out: str | Path) -> dict[int, Path]:
    """Clients whose state could not be written (StateStore.unsaved): id -> its mark."""
    found: dict[int, Path] = {}
    for d in client_dirs(out):
        for p in d.glob("c*.unsaved*") if d.is_dir() else ():
            head = p.name.split(".", 1)[0]
            if head[1:].isdigit():
                found.setdefault(int(head[1:]), p)
    return found


def round_of(path: Path) -> int | None:
    """The round tag of a client file, read alone (None when it cannot be read)."""
    try:
        with _open(path) as fh, np.load(fh, allow_pickle=False) as z:
            meta = json.loads(z[META].tobytes().decode())
        return int(meta["round"])
    except Exception:  # noqa: BLE001 - a damaged file is replaced, not kept
        return None


def chosen(out: str | Path, cid: int, ckpt: int) -> tuple[Path, int] | None:
    """(file, round) that a session resumed from a checkpoint after `ckpt` rounds gives client
    cid (StateStore.take: the newest of its two files from before ckpt), from the round tags
    alone; None when it starts from its initial state."""
    best: tuple[Path, int] | None = None
    for name in (client_name(cid) + ".npz", client_name(cid) + ".prev.npz"):
        path = find(out, name)
        rnd = round_of(path) if path is not None else None
        if path is not None and rnd is not None and rnd < ckpt and (best is None
                                                                    or rnd > best[1]):
            best = (path, rnd)
    return best


def files_of(out: str | Path, cid: int) -> list[Path]:
    """Client cid's files in the store as take() finds them (latest, then prev), whatever they
    are (a link, a folder: take() refuses them)."""
    found = (find(out, client_name(cid) + ext) for ext in (".npz", ".prev.npz"))
    return [p for p in found if p is not None]


def stored_cids(out: str | Path) -> set[int]:
    """Every client with a file (latest or prev) in the run's store."""
    found: set[int] = set()
    for d in client_dirs(out):
        if d.is_dir():
            for f in os.scandir(d):
                head = f.name.split(".", 1)[0]
                if head[:1] == "c" and head[1:].isdigit() and f.name in (
                        head + ".npz", head + ".prev.npz"):
                    found.add(int(head[1:]))
    return found


class Manifest:
    """The clients' store as a checkpoint names it: client id -> the round of the state file a
    session resumed from that checkpoint takes (chosen()). The server keeps it for a store on
    its own disk (fednet local and launch): at each checkpoint the clients given work since the
    last one are looked up again (round tags only), so its cost follows the cohort; --resume
    then checks every file against it (core/checkpoint.check_store) before anything runs."""

    __slots__ = ("rounds", "touched")

    def __init__(self, rounds: dict[int, int] | None = None) -> None:
        self.rounds: dict[int, int] = dict(rounds or {})
        self.touched: set[int] = set()

    def touch(self, cids: Iterable[int]) -> None:
        """Clients given work: their files may change before the next checkpoint."""
        self.touched.update(cids)

    def refresh(self, out: str | Path, ckpt: int) -> None:
        """Look up the files of the clients touched since the last checkpoint."""
        for cid in self.touched:
            got = chosen(out, cid, ckpt)
            if got is None:
                self.rounds.pop(cid, None)
            else:
                self.rounds[cid] = got[1]
        self.touched = set()

    def arrays(self) -> dict[str, np.ndarray]:
        """As checkpoint arrays (store/cids, store/rounds)."""
        cids = np.array(sorted(self.rounds), dtype=np.int64)
        return {"store/cids": cids,
                "store/rounds": np.array([self.rounds[c] for c in cids.tolist()], np.int64)}

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray]) -> Manifest:
        """From a checkpoint's arrays (checked by core/checkpoint)."""
        cids, rounds = arrays["store/cids"].tolist(), arrays["store/rounds"].tolist()
        return cls(dict(zip(cids, rounds)))


class NoManifest(Manifest):
    """The manifest of a run whose clients' store is not on this disk (or that has none):
    it keeps nothing."""

    __slots__ = ()

    def touch(self, cids: Iterable[int]) -> None:
        pass


NO_MANIFEST = NoManifest()


def encode_client(state: Any, model: dict[str, np.ndarray] | None
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A client's typed state (and personal model) as arrays and JSON."""
    arrays, meta = encode(state, lambda n: n)
    if model is not None:
        arrays.update({f"model/{k}": v for k, v in model.items()})
    return arrays, {"fields": meta}


def decode_client(cls: type, arrays: dict[str, np.ndarray], meta: dict[str, Any], shapes: Shapes,
                  fail: Callable[[str], NoReturn], device: torch.device | str | None = None,
                  finite: bool = False
                  ) -> tuple[Any, dict[str, np.ndarray] | None]:
    """The inverse of encode_client, every array checked (fail(message) raises; finite: no
    NaN or inf either, as --resume checks the store)."""
    model = {k[6:]: a for k, a in arrays.items() if k.startswith("model/")}
    rest = {k: a for k, a in arrays.items() if not k.startswith("model/")}
    fields = meta.get("fields", {})
    state, used = decode(cls, rest, fields if isinstance(fields, dict) else {}, lambda n: n,
                         shapes, fail, fail, device, finite)
    for k in sorted(set(rest) - used):
        fail(f"array '{k}' does not belong to this client's state")
    return state, check_model("model", model, shapes, fail, finite) if model else None
