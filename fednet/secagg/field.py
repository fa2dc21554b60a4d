"""The integers a client's update becomes before it is masked, and back.

Each floating value x of a client's update (its model minus the model its task brought) is
clipped to [-c, c] and mapped to {0, ..., L} with L = 2^b - 1 by stochastic rounding (the
fraction drawn from the run's seeded stream: unbiased, and the same under every runtime); the
client multiplies it by its sample count n (the weight FedAvg gives it), so that the sum the
server unmasks is sum_u n_u q_u and its weighted mean sum_u n_u q_u / sum_u n_u. Sums are taken
modulo 2^32 or 2^64 (the masks' group): the server picks the smaller one that holds
(sum of the cohort's n) * L, from its own partition sizes."""
from __future__ import annotations

import math

import numpy as np


def field_bits(total_weight: int, bits: int, forced: int = 0) -> int:
    """32 or 64: the masks' modulus 2^f, the smallest that holds total_weight * (2^bits - 1)
    (`forced`: a size asked for, refused when it does not hold the sum)."""
    need = math.ceil(math.log2(max(1, total_weight) * ((1 << bits) - 1) + 1))
    if forced:
        if need > forced:
            raise ValueError(f"a field of 2^{forced} cannot hold the sum ({need} bits needed)")
        return forced
    if need > 64:
        raise ValueError(f"{need} bits needed for the sum: fewer quantization bits, please")
    return 32 if need <= 32 else 64


def dtype_of(fbits: int) -> np.dtype:
    """The unsigned integer type whose wrap-around is arithmetic modulo 2^fbits."""
    return np.dtype(np.uint32 if fbits == 32 else np.uint64)


def quantize(x: np.ndarray, clip: float, bits: int, weight: int, fbits: int,
             rng: np.random.Generator) -> np.ndarray:
    """weight * q(x) as elements of Z_{2^fbits} (x: float64, any shape, flattened)."""
    levels = (1 << bits) - 1
    scaled = (np.clip(x.astype(np.float64).ravel(), -clip, clip) + clip) * (levels / (2 * clip))
    q = np.floor(scaled + rng.random(scaled.size))
    q = np.clip(q, 0, levels).astype(np.uint64)
    return (q * np.uint64(weight)).astype(dtype_of(fbits))


def dequantize(total: np.ndarray, weight: int, clip: float, bits: int) -> np.ndarray:
    """The weighted mean of the clients' clipped values from sum_u n_u q_u (float64)."""
    levels = (1 << bits) - 1
    return total.astype(np.float64) / weight * (2 * clip / levels) - clip
