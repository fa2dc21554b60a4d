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
from collections.abc import Sequence

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
    if not 1 <= t <= len(parties):
        raise ValueError(f"threshold {t} for {len(parties)} parties")
    s = split(secret)
    coef = np.vstack([s[None, :], rng.integers(0, P, size=(t - 1, s.size), dtype=np.int64)])
    x = np.array([int(p) + 1 for p in parties], np.int64)[:, None]
    y = np.zeros((x.shape[0], s.size), np.int64)
    for c in coef[::-1]:  # Horner, every party and chunk at once
        y = (y * x + c) % P
    return {int(p): y[i] for i, p in enumerate(parties)}


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """The weights l_j with f(0) = sum_j l_j f(x_j) for distinct points xs (mod P)."""
    t = xs.size
    num = np.ones(t, np.int64)
    den = np.ones(t, np.int64)
    for m in range(t):
        other = np.arange(t) != m
        num = np.where(other, num * xs[m] % P, num)
        den = np.where(other, den * ((xs[m] - xs) % P) % P, den)
    inv = np.array([pow(int(d), P - 2, P) for d in den], np.int64)
    return num * inv % P


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


SHARE_BYTES = 4 * chunks()


def encode_share(y: np.ndarray) -> bytes:
    """A share as bytes (little-endian uint32 per chunk)."""
    return np.asarray(y, np.int64).astype("<u4").tobytes()


def decode_share(b: bytes) -> np.ndarray:
    """The inverse of encode_share; ValueError when it is not a share."""
    if len(b) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes")
    y = np.frombuffer(b, "<u4").astype(np.int64)
    if np.any(y >= P):
        raise ValueError("a share is field elements")
    return y
