"""Small LEAF datasets written in LEAF's own JSON format (users, num_samples, user_data with x/y
per user; <root>/<name>/data/train/*.json and .../test/*.json), for tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TEXT = ("From fairest creatures we desire increase, That thereby beauty's rose might never die, "
        "But as the riper should by time decease, His tender heir might bear his memory: ")


def _sample(name: str, rng: np.random.Generator, n: int) -> tuple[list, list]:
    if name == "femnist":
        x = rng.random((n, 784)).round(3).tolist()
        return x, [int(v) for v in rng.integers(0, 62, n)]
    if name == "shakespeare":
        starts = rng.integers(0, len(TEXT) - 81, n)
        return [TEXT[s:s + 80] for s in starts], [TEXT[s + 80] for s in starts]
    words = ["good", "bad", "happy", "sad", "day", "night", "love", "hate", "!", "fun"]
    x = [["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", f"user{i}",
          " ".join(rng.choice(words, int(rng.integers(3, 12)))), "extra"] for i in range(n)]
    return x, [int(v) for v in rng.integers(0, 2, n)]


def write_leaf(root: Path, name: str, users: int = 6, files: int = 2, seed: int = 0,
               test_users: int | None = None) -> dict[str, dict[str, tuple[list, list]]]:
    """Write a LEAF dataset under root; returns {split: {user: (x, y)}} as written. Users are
    spread over `files` files per split; each has 4-12 train and 1-3 test samples; test_users:
    how many of them have test data (default all)."""
    rng = np.random.default_rng(seed)
    names = [f"f{i:04d}_{int(rng.integers(0, 99)):02d}" for i in range(users)]
    written: dict[str, dict[str, tuple[list, list]]] = {"train": {}, "test": {}}
    for split, (lo, hi) in (("train", (4, 13)), ("test", (1, 4))):
        folder = root / name / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        chosen = names if split == "train" or test_users is None else names[:test_users]
        for f in range(files):
            mine = chosen[f::files]
            doc = {"users": mine, "num_samples": [], "user_data": {}}
            for u in mine:
                x, y = _sample(name, rng, int(rng.integers(lo, hi)))
                doc["num_samples"].append(len(y))
                doc["user_data"][u] = {"x": x, "y": y}
                written[split][u] = (x, y)
            (folder / f"all_data_{f}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return written


def user_order(written: dict) -> list[str]:
    """The users in the order fednet makes them clients: files in name order, users in order."""
    return list(written["train"])  # write_leaf writes file 0's users first
