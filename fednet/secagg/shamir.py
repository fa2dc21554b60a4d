"""Shamir's secret sharing over the prime field GF(P), P = 2^31 - 1, vectorised with numpy: a
secret (bytes) is cut into 30-bit chunks, each the constant term of a random polynomial of
degree t - 1 (the same evaluation points for every chunk); the share of party i is the
polynomials at x = i + 1, as one int64 per chunk; any t shares give the secret back (Lagrange
interpolation at 0), fewer reveal nothing about it (each chunk is shared on its own, uniformly).
The coefficients come from the caller's seeded generator (fednet's runs are reproducible; a
deployment draws them from the OS). Products of two field elements stay below 2^62: int64
arithmetic is exact."""
from __future__ import annotations

import functools
from collections.abc import Container, Iterable, Sequence

import numpy as np

P = (1 << 31) - 1
CHUNK_BITS = 30
SECRET_BYTES = 32  # what fednet shares: a 32-byte seed or X25519 private key


def chunks(n_bytes: int = SECRET_BYTES) -> int:
    """How many field elements a secret of n_bytes takes."""
    return -(-8 * n_bytes // CHUNK_BITS)


def split(secret: bytes) -> np.ndarray:
    """A secret's 30-bit chunks (int64, each below P)."""
    v = int.from_bytes(secret, "big")
    k = chunks(len(secret))
    return np.array([(v >> (CHUNK_BITS * i)) & ((1 << CHUNK_BITS) - 1) for i in range(k)],
                    np.int64)


def join(parts: np.ndarray, n_bytes: int = SECRET_BYTES) -> bytes:
    """The inverse of split (ValueError when a chunk is out of range: a wrong share)."""
    v = 0
    for i, c in enumerate(int(x) for x in parts):
        if not 0 <= c < (1 << CHUNK_BITS):
            raise ValueError("the shares do not rebuild a secret (a chunk out of range)")
        v |= c << (CHUNK_BITS * i)
    if v >= 1 << (8 * n_bytes):
        raise ValueError("the shares do not rebuild a secret (too large)")
    return v.to_bytes(n_bytes, "big")


def share(secret: bytes, parties: Sequence[int], t: int, rng: np.random.Generator
          ) -> dict[int, np.ndarray]:
    """Party id -> its share of `secret` (int64 per chunk); any t of them rebuild it."""
    y = share_rows(secret, parties, t, rng)
    return {int(p): y[i] for i, p in enumerate(parties)}


def share_rows(secret: bytes, parties: Sequence[int], t: int, rng: np.random.Generator
               ) -> np.ndarray:
    """share()'s shares as one (parties, chunks) int64 array, a row per party in their order
    (the same draws from rng)."""
    return _share_rows([secret], parties, t, rng)[0]


def share_rows_many(secrets: Sequence[bytes], parties: Sequence[int], t: int,
                    rng: np.random.Generator) -> np.ndarray:
    """share_rows of each secret, one after the other (the same draws from rng, in the same
    order), as one (secrets, parties, chunks) int64 array: the polynomials of every secret
    evaluated at once (Horner over all their chunks)."""
    return _share_rows(secrets, parties, t, rng)


def _share_rows(secrets: Sequence[bytes], parties: Sequence[int], t: int,
                rng: np.random.Generator) -> np.ndarray:
    if not 1 <= t <= len(parties):
        raise ValueError(f"threshold {t} for {len(parties)} parties")
    parts = [split(sec) for sec in secrets]
    if len({p.size for p in parts}) > 1:
        raise ValueError("secrets of different lengths")
    coef = np.hstack([np.vstack([p[None, :], rng.integers(0, P, size=(t - 1, p.size),
                                                          dtype=np.int64)]) for p in parts])
    x = np.array([int(p) + 1 for p in parties], np.int64)[:, None]
    y = np.zeros((x.shape[0], coef.shape[1]), np.int64)
    for c in coef[::-1]:  # Horner, every party and chunk at once
        y *= x
        y += c
        y %= P
    k = parts[0].size if parts else 0
    return y.reshape(x.shape[0], len(parts), k).transpose(1, 0, 2)


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """The weights l_j with f(0) = sum_j l_j f(x_j) for distinct points xs (mod P): lagrange_rows
    of one row."""
    return lagrange_rows(np.asarray(xs, np.int64).reshape(1, -1))[0]


def lagrange_rows(xs: np.ndarray) -> np.ndarray:
    """lagrange_at_zero of each row of xs (S sets of t distinct points each), at once: (S, t)."""
    xs = np.asarray(xs, np.int64) % P
    n, t = xs.shape
    num = np.ones((n, t), np.int64)
    den = np.ones((n, t), np.int64)
    cols = np.arange(t)
    for m in range(t):
        other = cols != m
        xm = xs[:, m:m + 1]
        num = np.where(other, num * xm % P, num)
        den = np.where(other, den * ((xm - xs) % P) % P, den)
    return num * _inverse(den) % P


def _inverse(a: np.ndarray) -> np.ndarray:
    """a^(P - 2) mod P elementwise (the inverse of each nonzero element; 0 for 0), by square
    and multiply: products below 2^62, exact in int64."""
    out = np.ones_like(a)
    base = a % P
    e = P - 2
    while e:
        if e & 1:
            out = out * base % P
        base = base * base % P
        e >>= 1
    return out


@functools.lru_cache(maxsize=4096)
def _weights(xs: tuple[int, ...]) -> np.ndarray:
    """lagrange_at_zero for these points, once per set (full SecAgg rebuilds most secrets from
    the same first t holders)."""
    w = lagrange_at_zero(np.array(xs, np.int64))
    w.flags.writeable = False
    return w


def reconstruct(shares: dict[int, np.ndarray], t: int, n_bytes: int = SECRET_BYTES) -> bytes:
    """The secret from at least t shares (party id -> share); ValueError with fewer."""
    if len(shares) < t:
        raise ValueError(f"{len(shares)} shares, {t} needed")
    picked = sorted(shares.items())[:t]
    ys = np.stack([np.asarray(y, np.int64) % P for _, y in picked])
    lam = _weights(tuple(p + 1 for p, _ in picked))
    return join((lam[:, None] * ys % P).sum(axis=0) % P, n_bytes)


def reconstruct_many(items: Sequence[tuple[dict[int, np.ndarray], int]],
                     n_bytes: int = SECRET_BYTES) -> list[bytes | ValueError]:
    """reconstruct(shares, t) of each item at once (the same first t holders, the same secret
    or the same ValueError, returned in its place, not raised): the weights of each distinct
    set of holders (once, as cost.unmasking counts them) and the sums in a few array operations
    a threshold."""
    out: list[bytes | ValueError] = [ValueError("unset")] * len(items)
    groups: dict[int, list[int]] = {}
    for i, (shares, t) in enumerate(items):
        if len(shares) < t:
            out[i] = ValueError(f"{len(shares)} shares, {t} needed")
        else:
            groups.setdefault(t, []).append(i)
    for t, idx in groups.items():
        picked = [sorted(items[i][0].items())[:t] for i in idx]
        xs = np.array([[p + 1 for p, _ in pk] for pk in picked], np.int64)
        ys = np.array([[np.asarray(y, np.int64) for _, y in pk] for pk in picked],
                      np.int64).reshape(len(idx), t, -1) % P
        sets, which = np.unique(xs, axis=0, return_inverse=True)  # (each set's weights once)
        lam = lagrange_rows(sets)[which.reshape(-1)]
        sums = (lam[:, :, None] * ys % P).sum(axis=1) % P
        for i, parts in zip(idx, sums):
            try:
                out[i] = join(parts, n_bytes)
            except ValueError as e:
                out[i] = e
    return out


SHARE_BYTES = 4 * chunks()


def encode_share(y: np.ndarray) -> bytes:
    """A share as bytes (little-endian uint32 per chunk)."""
    return np.asarray(y, np.int64).astype("<u4").tobytes()


def encode_rows(y: np.ndarray) -> np.ndarray:
    """encode_share of each row of y (rows of int64 chunks): a (rows, SHARE_BYTES) uint8 array."""
    y = np.asarray(y, np.int64)
    return y.astype("<u4").view(np.uint8).reshape(y.shape[0], SHARE_BYTES)


def decode_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """decode_share of each row of a (rows, SHARE_BYTES) uint8 array: the shares (int64) and
    which rows are shares (the others: ValueError for decode_share)."""
    rows = np.ascontiguousarray(rows, np.uint8).reshape(-1, SHARE_BYTES)
    y = rows.view("<u4").astype(np.int64)
    return y, ~np.any(y >= P, axis=1)


def decode_share(b: bytes) -> np.ndarray:
    """The inverse of encode_share; ValueError when it is not a share."""
    if len(b) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes")
    y = np.frombuffer(b, "<u4").astype(np.int64)
    if np.any(y >= P):
        raise ValueError("a share is field elements")
    return y


def first_holders(held: Iterable[int], answered: Container[int], t: int) -> tuple[int, ...]:
    """The holders whose shares rebuild a secret: the first t of those that answered, in id
    order (fewer when too few answered). One rule for the server's rebuild
    (secagg/server.Aggregation.first_windows) and its count (secagg/cost.unmasking)."""
    return tuple(sorted(h for h in held if h in answered)[:t])
