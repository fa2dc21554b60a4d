"""The integers a client's update becomes before it is masked, and back.

Each floating value x of a client's update (its model minus the model its task brought) is
clipped to [-c, c] and mapped to {0, ..., L} with L = 2^b - 1 by stochastic rounding (the
fraction drawn from the run's seeded stream: unbiased, and the same under every runtime); the
client multiplies it by its sample count n (the weight FedAvg gives it), so that the sum the
server unmasks is sum_u n_u q_u and its weighted mean sum_u n_u q_u / sum_u n_u. Sums are taken
modulo 2^32 or 2^64 (the masks' group): the server picks the smaller one that holds
(sum of the cohort's n) * L, from its own partition sizes.

Under --compress int8|qsgd (a codec's common grid, compress/field.py) L is the codec's (254 for
int8, 2S for qsgd:S), each client puts its weight into its values instead (n / the cohort's
largest n, so every input counts 1), and the masked values travel modulo 2^w, w = sum_bits(k, L)
+ GUARD_BITS for a cohort of k (wire_bits), packed w bits each (pack, unpack): a masked value
reduced modulo 2^w is still uniformly masked, and the sum modulo 2^w is the clients' sum, which
is below 2^(w - 1)."""
from __future__ import annotations

import math

import numpy as np

from fednet import opcount
from fednet.secagg import cost


def field_bits(total_weight: int, bits: int, forced: int = 0, levels: int = 0) -> int:
    """32 or 64: the masks' modulus 2^f, the smallest that holds total_weight * (2^bits - 1)
    (`forced`: a size asked for, refused when it does not hold the sum; `levels`: the grid's
    steps L in place of 2^bits - 1, a codec's common grid: --compress under --secagg)."""
    need = sum_bits(total_weight, levels or (1 << bits) - 1)
    if forced:
        if need > forced:
            raise ValueError(f"a field of 2^{forced} cannot hold the sum ({need} bits needed)")
        return forced
    if need > 64:
        raise ValueError(f"{need} bits needed for the sum: fewer quantization bits, please")
    return 32 if need <= 32 else 64


def sum_bits(total_weight: int, levels: int) -> int:
    """The fewest bits that hold every sum a round can make, total_weight * L (L the grid's
    steps): a quantized value's bits plus those of the summands' total weight."""
    return math.ceil(math.log2(max(1, total_weight) * levels + 1))


GUARD_BITS = 1
"""Bits a packed masked value carries above the largest honest sum's (wire_bits): without them
the honest sums [0, k L] would fill nearly all of Z_{2^w}, and the server's check that the
unmasked sum lies there (a wrong masked input or share leaves masks in, uniform modulo 2^w)
would catch almost nothing; with one, each such value falls outside with probability >= 1/2."""


def wire_bits(cohort: int, levels: int) -> int:
    """The bits a masked value travels in under a codec's grid (every input counts 1): the
    fewest that hold cohort * L, plus GUARD_BITS."""
    return sum_bits(cohort, levels) + GUARD_BITS


def dtype_of(fbits: int) -> np.dtype:
    """The unsigned integer type whose wrap-around is arithmetic modulo 2^fbits."""
    return np.dtype(np.uint32 if fbits == 32 else np.uint64)


def quantize(x: np.ndarray, clip: float, bits: int, weight: int, fbits: int,
             rng: np.random.Generator, levels: int = 0) -> np.ndarray:
    """weight * q(x) as elements of Z_{2^fbits} (x: float64, any shape, flattened; `levels`:
    the grid's steps L in place of 2^bits - 1)."""
    opcount.charge(cost.quantized(x.size))  # (a client's, on its task's meter: secagg/cost.py)
    levels = levels or (1 << bits) - 1
    scaled = (np.clip(x.astype(np.float64).ravel(), -clip, clip) + clip) * (levels / (2 * clip))
    q = np.floor(scaled + rng.random(scaled.size))
    q = np.clip(q, 0, levels).astype(np.uint64)
    return (q * np.uint64(weight)).astype(dtype_of(fbits))


def dequantize(total: np.ndarray, weight: int, clip: float, bits: int, levels: int = 0
               ) -> np.ndarray:
    """The weighted mean of the clients' clipped values from sum_u n_u q_u (float64)."""
    levels = levels or (1 << bits) - 1
    return total.astype(np.float64) / weight * (2 * clip / levels) - clip


# ---- a common grid's sums sent in the fewest bits (--compress int8|qsgd under --secagg) ------
def packed_size(n: int, wbits: int) -> int:
    """The bytes of n values of wbits bits each, packed."""
    return (n * wbits + 7) // 8


def pack(y: np.ndarray, wbits: int) -> np.ndarray:
    """y (elements of Z_{2^f}, f >= wbits) reduced modulo 2^wbits, each in wbits bits, packed
    little-endian into bytes (uint8, packed_size long). Reducing a masked value modulo 2^wbits
    keeps it masked: the masks, uniform modulo 2^f, are uniform modulo 2^wbits, and sums
    modulo 2^f reduce to sums modulo 2^wbits."""
    opcount.charge(cost.packed(y.size))  # (a client's, on its task's meter)
    v = np.ascontiguousarray(y, dtype=np.uint64).astype("<u8", copy=False).ravel()
    out = np.empty(packed_size(v.size, wbits), np.uint8)
    for i in range(0, v.size, PACK_CHUNK):  # (a chunk's bits: 64 bytes a value)
        bits = np.unpackbits(v[i:i + PACK_CHUNK].view(np.uint8).reshape(-1, 8), axis=1,
                             bitorder="little")
        part = np.packbits(bits[:, :wbits].reshape(-1), bitorder="little")
        start = i * wbits // 8  # (whole bytes: a chunk is a multiple of 8 values)
        out[start:start + part.size] = part
    return out


def unpack(buf: np.ndarray, wbits: int, n: int, dtype: np.dtype) -> np.ndarray:
    """pack's n values (each < 2^wbits) as `dtype`. Its work, UNPACK_PASSES a value unpacked
    (cost.unpacked), goes to an open meter; the server's, which none holds, is counted by its
    input stage (cost.summed's packed, algorithms/secagg.py), as this charges it."""
    opcount.charge(cost.unpacked(n))
    raw = np.asarray(buf, np.uint8)
    out = np.empty(n, np.dtype(dtype))
    for i in range(0, n, PACK_CHUNK):
        m = min(PACK_CHUNK, n - i)
        start = i * wbits // 8
        bits = np.unpackbits(raw[start:start + packed_size(m, wbits)], count=m * wbits,
                             bitorder="little")
        full = np.zeros((m, 64), np.uint8)
        full[:, :wbits] = bits.reshape(m, wbits)
        out[i:i + m] = np.packbits(full, axis=1, bitorder="little").reshape(-1).view("<u8")
    return out


PACK_CHUNK = 1 << 18
"""Values packed or unpacked at a time (a multiple of 8, so that each chunk starts on a whole
byte): the bit arrays take 64 bytes a value, 16 MiB a chunk rather than 715 MB for ResNet-18's
11.2 M values at once. The same bytes as one pass."""
