"""Who shares masks and secrets with whom: the complete graph (SecAgg, Bonawitz et al. 2017) or
a random k-regular one (SecAgg+, Bell et al. 2020: a Harary graph over a random order of the
participants, each node linked to its k/2 nearest on either side), drawn by the server from the
run's seeded stream and sent to every participant."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


CORRECTNESS = 2.0 ** -20
"""The default degree's bound on the chance that a round cannot be unmasked because some
client's neighbourhood lost too many shares (Bell et al.'s correctness parameter eta)."""


def default_neighbours(n: int, dropout: float = 0.1, fraction: float = 0.5) -> int:
    """SecAgg+'s default degree for n participants (even, at most n - 1): the smallest k with
    n * P[Binomial(k, 1 - dropout) <= floor(fraction * k)] <= 2^-20, i.e. with clients dropping
    out independently at rate `dropout`, a union bound over the n neighbourhoods says each keeps
    the floor(fraction * k) + 1 shares its secrets need, and at least 2 ceil(1.5 log2 n) (an
    O(log n) floor for the graph's connectivity). Bell et al. choose k from the same kind of
    bound; the floor's constant and the dropout rate (--secagg-dropout) are ours."""
    if n <= 2:
        return max(0, n - 1)
    k = 2 * math.ceil(1.5 * math.log2(n))
    while k < n - 1 and n * _short(k, dropout, fraction) > CORRECTNESS:
        k += 2
    return min(n - 1, k)


def _short(k: int, dropout: float, fraction: float) -> float:
    """P[Binomial(k, 1 - dropout) <= floor(fraction * k)]: a neighbourhood of k keeps too few."""
    keep = 1.0 - dropout
    return sum(math.comb(k, i) * keep ** i * dropout ** (k - i)
               for i in range(int(math.floor(fraction * k)) + 1))


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
