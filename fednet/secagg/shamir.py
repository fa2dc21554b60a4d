"""Shamir's secret sharing over the prime field GF(P), P = 2^521 - 1 (a Mersenne prime, so that
any 64-byte secret is a field element): a secret is the constant term of a random polynomial of
degree t - 1; the share of party i is the polynomial at x = i + 1; any t shares give the secret
back (Lagrange interpolation at 0), fewer reveal nothing about it. The coefficients come from
the caller's seeded generator (fednet's runs are reproducible; a deployment draws them from the
OS)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

P = (1 << 521) - 1
SECRET_BYTES = 64  # at most: any such secret is below P


def _coefficients(rng: np.random.Generator, k: int) -> list[int]:
    """k uniform field elements (rejection sampling over 66-byte draws)."""
    out: list[int] = []
    while len(out) < k:
        v = int.from_bytes(rng.bytes(66), "big") & ((1 << 521) - 1)
        if v < P:
            out.append(v)
    return out


def share(secret: int, parties: Sequence[int], t: int, rng: np.random.Generator
          ) -> dict[int, int]:
    """Party id -> its share of `secret` (0 <= secret < P); any t of them reconstruct it."""
    if not 0 <= secret < P:
        raise ValueError("a secret must be a field element")
    if not 1 <= t <= len(parties):
        raise ValueError(f"threshold {t} for {len(parties)} parties")
    coef = [secret, *_coefficients(rng, t - 1)]
    out: dict[int, int] = {}
    for p in parties:
        x, y = p + 1, 0
        for c in reversed(coef):  # Horner
            y = (y * x + c) % P
        out[int(p)] = y
    return out


def reconstruct(shares: dict[int, int], t: int) -> int:
    """The secret from at least t shares (party id -> share); ValueError with fewer."""
    if len(shares) < t:
        raise ValueError(f"{len(shares)} shares, {t} needed")
    pts = [(p + 1, y % P) for p, y in sorted(shares.items())[:t]]
    secret = 0
    for j, (xj, yj) in enumerate(pts):
        num, den = 1, 1
        for m, (xm, _) in enumerate(pts):
            if m != j:
                num = num * (-xm) % P
                den = den * (xj - xm) % P
        secret = (secret + yj * num * pow(den, P - 2, P)) % P
    return secret


def to_int(secret: bytes) -> int:
    """A secret of at most SECRET_BYTES bytes as a field element."""
    if len(secret) > SECRET_BYTES:
        raise ValueError("secret too long")
    return int.from_bytes(secret, "big")


def to_bytes(value: int, n: int) -> bytes:
    """The inverse of to_int for a secret of n bytes."""
    return value.to_bytes(n, "big")


def encode_share(y: int) -> bytes:
    """A share as 66 bytes (big-endian)."""
    return y.to_bytes(66, "big")


def decode_share(b: bytes) -> int:
    """The inverse of encode_share; ValueError when it is not a field element."""
    if len(b) != 66:
        raise ValueError("a share is 66 bytes")
    y = int.from_bytes(b, "big")
    if y >= P:
        raise ValueError("a share is a field element")
    return y
