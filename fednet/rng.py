"""Seeded random streams: every draw comes from generator(seed, purpose, round, client)."""
from __future__ import annotations

import zlib

import numpy as np


def _key(seed: int, purpose: str, rnd: int, client: int) -> list[int]:
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(purpose.encode()), int(rnd) + 1, int(client) + 1]


def generator(seed: int, purpose: str, rnd: int = -1, client: int = -1) -> np.random.Generator:
    """A numpy Generator that depends only on (seed, purpose, round, client)."""
    return np.random.default_rng(np.random.SeedSequence(_key(seed, purpose, rnd, client)))


def int_seed(seed: int, purpose: str, rnd: int = -1, client: int = -1) -> int:
    """A 63-bit integer seed (for torch.Generator) derived like generator()."""
    ss = np.random.SeedSequence(_key(seed, purpose, rnd, client))
    return int(ss.generate_state(1, dtype=np.uint64)[0]) >> 1
