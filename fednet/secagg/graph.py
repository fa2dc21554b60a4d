"""Who shares masks and secrets with whom: the complete graph (SecAgg, Bonawitz et al. 2017) or
a random k-regular one (SecAgg+, Bell et al. 2020: a Harary graph over a random order of the
participants, each node linked to its k/2 nearest on either side), drawn by the server from the
run's seeded stream and sent to every participant."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def default_neighbours(n: int) -> int:
    """SecAgg+'s default degree for n participants: 2 * ceil(1.5 * log2 n), an even O(log n)
    (Bell et al. take k = O(log n); the constant is ours, with room for 30% dropouts), at most
    n - 1."""
    if n <= 2:
        return max(0, n - 1)
    return min(n - 1, 2 * math.ceil(1.5 * math.log2(n)))


def neighbours(parties: Sequence[int], k: int | None, rng: np.random.Generator
               ) -> dict[int, list[int]]:
    """Each participant's neighbours (sorted ids; symmetric): all others (k None: SecAgg), or
    a Harary graph H(k, n) over a random permutation (SecAgg+; k even, below n)."""
    ids = sorted(int(p) for p in parties)
    n = len(ids)
    if k is None or k >= n - 1:
        return {c: [d for d in ids if d != c] for c in ids}
    if k % 2:
        raise ValueError(f"SecAgg+ needs an even number of neighbours (got {k})")
    order = [ids[i] for i in rng.permutation(n)]
    out: dict[int, set[int]] = {c: set() for c in ids}
    for i, c in enumerate(order):
        for j in range(1, k // 2 + 1):
            d = order[(i + j) % n]
            out[c].add(d)
            out[d].add(c)
    return {c: sorted(v) for c, v in out.items()}
