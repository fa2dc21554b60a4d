"""The host's array cache: a dataset's normalized arrays as .npy files, memory-mapped by every
process, so the page cache holds one copy per host however many clients read them.

Folder: $FEDNET_CACHE if set, else `<--data-root>/fednet-cache`, else
~/.cache/fednet/data/fednet-cache. One sub-folder per dataset and key (e.g.
synthetic-cifar10-s0-v1, cifar10-v1) holds train_x.npy, train_y.npy, test_x.npy, test_y.npy and
meta.json (a dataset with more arrays, e.g. LEAF's user offsets, lists them in meta["arrays"]);
it is written once under a lock (the first process generates or converts, the others wait),
into a temporary folder renamed into place, so a reader never sees half a cache. Delete a
folder to rebuild it.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable

import numpy as np

ARRAYS = ("train_x", "train_y", "test_x", "test_y")
ENV = "FEDNET_CACHE"


def cache_root(data_root: str | None) -> str:
    """The cache folder for a run with this --data-root (see the module docstring)."""
    env = os.environ.get(ENV, "")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    from fednet.data.torchvision_sets import DEFAULT_ROOT

    return os.path.join(os.path.abspath(os.path.expanduser(data_root or DEFAULT_ROOT)),
                        "fednet-cache")


def _open(folder: str) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays of a complete cache folder, memory-mapped copy-on-write (pages shared with
    every other process reading them; a write would stay private), and its meta."""
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    arrays = {k: np.asarray(np.load(os.path.join(folder, k + ".npy"), mmap_mode="c"))
              for k in meta.get("arrays", ARRAYS)}
    return arrays, meta


def cached(key: str, data_root: str | None, make: Callable[[], tuple[dict[str, np.ndarray], dict]]
           ) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, meta) of `key` from the host's cache, made by make() (arrays, JSON-able meta) and
    written there by the first process that asks; when the folder cannot be written the arrays
    are returned in memory (each process then holds its own)."""
    root = cache_root(data_root)
    folder = os.path.join(root, key)
    if os.path.isfile(os.path.join(folder, "meta.json")):
        return _open(folder)
    try:
        os.makedirs(root, exist_ok=True)
        lock = open(os.path.join(root, f".{key}.lock"), "a")  # noqa: SIM115 - held below
    except OSError:
        return make()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer per host; the others wait, then map
        if os.path.isfile(os.path.join(folder, "meta.json")):
            return _open(folder)
        arrays, meta = make()
        tmp = tempfile.mkdtemp(prefix=f".{key}.", dir=root)
        try:
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide a shared --data-root's cache
            for k in arrays:
                np.save(os.path.join(tmp, k + ".npy"), np.ascontiguousarray(arrays[k]))
            if set(arrays) != set(ARRAYS):
                meta = {**meta, "arrays": list(arrays)}
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump(meta, f)
            os.rename(tmp, folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            return arrays, meta
    del arrays  # the generated copy: this process maps the files like every other one
    return _open(folder)
