"""LEAF's naturally federated datasets (Caldas et al. 2018, https://leaf.cmu.edu): femnist,
shakespeare and sent140, read from the JSON files LEAF's preprocess.sh writes, one user per client.

Layout: `<--data-root>/<name>/data/train/*.json` and `.../data/test/*.json`, each file
{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}. Files are
read in name order and users in each file's order: client k is the k-th user with training
samples. The arrays are converted once per host into the .npy cache (cache.py; the key holds a
fingerprint of the files' names, sizes and times, so changed files are converted again) and
memory-mapped by every process: a client's data is a range of rows, O(its size) to build.

Encodings (what LEAF's models read):
- femnist: x = 784 pixels in [0, 1] -> float32 1 x 28 x 28 as given; y = 0..61.
- shakespeare: x = 80 characters, y = the next one; each character -> its index in LEAF's
  80-letter alphabet (LETTERS; one outside it -> the space), stored as uint8.
- sent140: x = LEAF's raw fields, the tweet's text at index 4 (or a plain string); the first
  WORDS words (LEAF's tokenizer: words and . , ! ? ;), lowercased, each hashed (crc32) into
  1..VOCAB-1, 0 pads; stored as int16. y = 0 (negative) or 1 (any other value).
"""
from __future__ import annotations

import glob
import json
import os
import re
import zlib
import numpy as np

from fednet.errors import ConfigError

LEAF = {"femnist": (62, (1, 28, 28)), "shakespeare": (80, (80,)), "sent140": (2, (25,))}
"""Name -> (classes, input shape)."""
VERSION = 1
"""Part of the cache key: bump it when an encoding changes."""
LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ = 80
WORDS, VOCAB = 25, 1 << 14
_TABLE = np.full(128, LETTERS.index(" "), np.uint8)
_TABLE[[ord(c) for c in LETTERS]] = np.arange(len(LETTERS), dtype=np.uint8)
_TOKEN = re.compile(r"[\w']+|[.,!?;]")


def _chars(strings: list) -> np.ndarray:
    """Strings -> N x SEQ uint8 letter indices (the last SEQ characters, left-padded)."""
    text = "".join(str(s)[-SEQ:].rjust(SEQ) for s in strings)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.where(codes < 128, _TABLE[np.minimum(codes, 127)],
                    _TABLE[ord(" ")]).reshape(len(strings), SEQ)


def _words(text: str) -> list[int]:
    toks = _TOKEN.findall(str(text).lower())[:WORDS]
    return [zlib.crc32(t.encode()) % (VOCAB - 1) + 1 for t in toks]


def _encode(name: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    """One user's (x, y) in the dataset's array form (module docstring)."""
    if name == "femnist":
        xa = np.asarray(x, dtype=np.float32).reshape(len(x), 1, 28, 28)
        return xa, np.asarray(y, dtype=np.int64)
    if name == "shakespeare":
        return _chars(x), _chars(y)[:, -1].astype(np.int64)
    xa = np.zeros((len(x), WORDS), np.int16)
    for i, e in enumerate(x):
        ids = _words(e[4] if isinstance(e, list) and len(e) > 4 else e[-1] if isinstance(e, list)
                     else e)
        xa[i, :len(ids)] = ids
    return xa, (np.asarray([float(v) for v in y]) != 0).astype(np.int64)


def split_dir(name: str, data_root: str | None, split: str) -> str:
    """The folder of LEAF's JSON files of one split."""
    from fednet.data.torchvision_sets import DEFAULT_ROOT

    root = os.path.abspath(os.path.expanduser(data_root or DEFAULT_ROOT))
    return os.path.join(root, name, "data", split)


def _files(name: str, data_root: str | None, split: str) -> list[str]:
    folder = split_dir(name, data_root, split)
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        raise ConfigError(
            f"--dataset {name}: no LEAF JSON files in {folder}; run LEAF's preprocessing "
            f"(github.com/TalwalkarLab/leaf, data/{name}/preprocess.sh, e.g. -s niid --sf 0.05 -k 0 "
            "-t sample) and give --data-root the folder that holds its data folders "
            f"(<root>/{name}/data/train and test); --download cannot fetch LEAF's data")
    return files


def _user_arrays(name: str, files: list[str]
                 ) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Users in file order, and each one's encoded (x, y)."""
    order: list[str] = []
    data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            users, per_user = doc["users"], doc["user_data"]
            for u in users:
                u = str(u)
                if u in data:
                    raise ConfigError(f"LEAF file {path}: user {u!r} appears twice in the split")
                x, y = per_user[u]["x"], per_user[u]["y"]
                if len(x) != len(y):
                    raise ValueError(f"user {u!r} has {len(x)} x but {len(y)} y")
                data[u] = _encode(name, x, y) if len(y) else (None, None)  # type: ignore[assignment]  # an empty user
                order.append(u)
        except ConfigError:
            raise
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise ConfigError(f"--dataset {name}: {path} is not a LEAF JSON file of {name} "
                              f"({type(e).__name__}: {e})") from None
    return order, data


def _stack(parts: list[np.ndarray], like: np.ndarray) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty((0, *like.shape[1:]), like.dtype)


def convert(name: str, data_root: str | None) -> tuple[dict[str, np.ndarray], dict]:
    """The cache's arrays of a LEAF dataset: train and test x/y in client order, and the
    offsets of each client's rows (train_offsets, test_offsets: clients + 1 entries each; test
    rows of users without training samples come after test_offsets[-1])."""
    train_users, train = _user_arrays(name, _files(name, data_root, "train"))
    test_users, test = _user_arrays(name, _files(name, data_root, "test"))
    users = [u for u in train_users if train[u][0] is not None]
    if not users:
        raise ConfigError(f"--dataset {name}: the training files under "
                          f"{split_dir(name, data_root, 'train')} hold no samples")
    like_x, like_y = train[users[0]]
    tr = [train[u] for u in users]
    te = [test[u] for u in users if u in test and test[u][0] is not None]
    te_sizes = [len(test[u][1]) if u in test and test[u][0] is not None else 0 for u in users]
    te += [test[u] for u in test_users if u not in train and test[u][0] is not None]
    arrays = {"train_x": _stack([a for a, _ in tr], like_x), "train_y": _stack([b for _, b in tr], like_y),
              "test_x": _stack([a for a, _ in te], like_x), "test_y": _stack([b for _, b in te], like_y),
              "train_offsets": np.concatenate(([0], np.cumsum([len(b) for _, b in tr]))).astype(np.int64),
              "test_offsets": np.concatenate(([0], np.cumsum(te_sizes))).astype(np.int64)}
    k = LEAF[name][0]
    for split in ("train", "test"):
        y = arrays[f"{split}_y"]
        if y.size and (int(y.min()) < 0 or int(y.max()) >= k):
            raise ConfigError(f"--dataset {name}: {split} labels outside 0..{k - 1} "
                              f"({int(y.min())}..{int(y.max())}) under {split_dir(name, data_root, split)}")
    return arrays, {"num_classes": k, "input_shape": list(LEAF[name][1]), "users": len(users)}


def fingerprint(name: str, data_root: str | None) -> str:
    """A short hash of the JSON files' names, sizes and modification times (both splits)."""
    h = 0
    for split in ("train", "test"):
        for path in _files(name, data_root, split):
            st = os.stat(path)
            h = zlib.crc32(f"{split}/{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns}".encode(), h)
    return f"{h:08x}"


class Source:
    """The users of a LEAF dataset (natural.Natural): client k holds the k-th user's rows."""

    described = 0  # every client is described (its rows are in the arrays)

    def __init__(self, name: str, train_offsets: np.ndarray, test_offsets: np.ndarray) -> None:
        self.name = name
        self.train_offsets = np.asarray(train_offsets, np.int64)
        self.test_offsets = np.asarray(test_offsets, np.int64)
        self.users = len(self.train_offsets) - 1

    def check(self, d) -> None:
        pass

    def train_size(self, ds, d, seed: int, cid: int) -> int:
        return int(self.train_offsets[cid + 1] - self.train_offsets[cid])

    def rows(self, ds, d, seed: int, cid: int) -> np.ndarray:
        return np.arange(self.train_offsets[cid], self.train_offsets[cid + 1], dtype=np.int64)

    def client(self, ds, d, seed: int, cid: int) -> tuple[np.ndarray, ...]:
        rows = self.rows(ds, d, seed, cid)
        trows = np.arange(self.test_offsets[cid], self.test_offsets[cid + 1], dtype=np.int64)
        return ds.train_x, rows, ds.train_y[rows], ds.test_x, trows, ds.test_y[trows]

    def test(self, ds, d, clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """The test samples of the run's users; a user split (no run user has any): all."""
        end = int(self.test_offsets[clients])
        return (ds.test_x[:end], ds.test_y[:end]) if end else (ds.test_x, ds.test_y)

    def without_tests(self, clients: int) -> int:
        """How many of the first `clients` users have no test samples."""
        return int(np.count_nonzero(np.diff(self.test_offsets[:clients + 1]) == 0))

    def histograms(self, ds, d, clients: int, seed: int) -> np.ndarray:
        """clients x classes training label counts of the run's users."""
        end = int(self.train_offsets[clients])
        owner = np.repeat(np.arange(clients), np.diff(self.train_offsets[:clients + 1]))
        flat = owner * ds.num_classes + np.asarray(ds.train_y[:end])
        return np.bincount(flat, minlength=clients * ds.num_classes).reshape(clients, -1)


def load(name: str, data_root: str | None, download: bool):
    """The Dataset of a LEAF dataset, from the host's cache (converted there on a miss)."""
    from fednet.data.cache import cached
    from fednet.data.base import Dataset

    key = f"{name}-leaf-{fingerprint(name, data_root)}-v{VERSION}"
    a, meta = cached(key, data_root, lambda: convert(name, data_root))
    k = int(meta["num_classes"])
    return Dataset(name=name, train_x=a["train_x"], train_y=a["train_y"], test_x=a["test_x"],
                   test_y=a["test_y"], num_classes=k,
                   input_shape=tuple(int(v) for v in meta["input_shape"]),
                   class_names=tuple(str(i) for i in range(k)),
                   natural=Source(name, a["train_offsets"], a["test_offsets"]))
