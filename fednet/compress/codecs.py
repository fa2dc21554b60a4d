"""The compressors: a flat float32 vector (a result's floating arrays, concatenated) <-> the
arrays that travel. Pure numpy; every decode checks what it reads (CompressionError).

Wire forms (N elements in T tensors of sizes `sizes`):
  fp16   @fp16        float16 (N,)
  int8   @q8          uint8 (N,)   per-tensor affine: x = lo + q * step
         @q8.scale    float32 (T, 2)  (lo, step) per tensor
  qsgd   @qsgd.norm   float32 (T,)    the tensor's L2 norm
         @qsgd.nz     uint8 (ceil(N/8),)  bitmap of the nonzero levels (np.packbits)
         @qsgd.lvl    int8 (M,)       the M nonzero signed levels in -s..s (Alistarh et al. 2017:
                                      x_i = norm * sign * level / s, level stochastically rounded)
  topk   @topk.idx    int16 or int32 (K,)  increasing indices into the N (K = ceil(ratio N))
         @topk.val    float32 (K,)
  sign   @sign        uint8 (ceil(N/8),)  the signs (1: >= 0), packed
         @sign.scale  float32 (T,)    per tensor the mean |x| (scaled sign, Karimireddy et al. 2019)

Each encode and decode charges its work to the open count (fednet/opcount.py: a client's
encoding, its decoding of a --compress-down task or a hand-off, and a feedback codec's decoding
of its own output, are on the clock at its code, select rates; the server's decoding of a
result is counted by compress.decode_counted and charged at the server's rates): numpy's passes over the
vector ("code": one an element a pass; QSGD's uniform draws as QSGD_DRAW_PASSES passes each),
top-k's selection among the N ("select"). The counts are the vector's sizes' (and K's, and the nonzero levels'),
never timed: codec_work. A tiny vector's cost is numpy's calls, not its elements: not counted.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fednet import opcount

Arrays = dict[str, np.ndarray]


class CompressionError(ValueError):
    """A compressed array that does not decode (the sender's failure)."""


def _bounds(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _per_tensor(values: np.ndarray, sizes: list[int]) -> np.ndarray:
    """One value per element, from one per tensor."""
    return np.repeat(values, sizes)


def _get(wire: Arrays, name: str, dtype: str | tuple[str, ...], shape: tuple[int, ...]
         ) -> np.ndarray:
    a = wire.get(name)
    dtypes = (dtype,) if isinstance(dtype, str) else dtype
    if a is None:
        raise CompressionError(f"compressed array {name!r} missing")
    if a.dtype.name not in dtypes or tuple(a.shape) != shape:
        raise CompressionError(f"compressed array {name!r}: expected {'/'.join(dtypes)} {shape}, "
                               f"got {a.dtype.name} {tuple(a.shape)}")
    return a


def _finite(a: np.ndarray, name: str, nonneg: bool = False) -> np.ndarray:
    if not np.isfinite(a).all() or (nonneg and (a < 0).any()):
        raise CompressionError(f"compressed array {name!r} holds values that are not finite"
                               + (" and non-negative" if nonneg else ""))
    return a


# ---- the work each codec does, counted (opcount) ----------------------------------------------
FP16_PASSES = 6
"""A float32 -> float16 conversion counted as this many passes: numpy's conversion of ResNet-18's
11.2 M values alone took 6.4-7.1 times an int8 pass's seconds (secagg/rates.py's code rate, same
minutes), but ~4.5-5 within compress.encode_result against its int8 encoding's (bench_compute's
codec cells, two runs at 08c5b87): 6 between (measured, not at run time)."""
PASSES = {  # numpy's passes over the N elements ("code"), encode and decode, per codec
    "fp16": (FP16_PASSES, 4),    # a float16 conversion: FP16_PASSES | a conversion back, isfinite
    # (measured 3.3-4.2: DECODE_MEASURED)
    "int8": (9, 6),    # per tensor min and max, two repeats, subtract, divide, rint, clip,
    # astype | two repeats, astype, multiply, add, astype (measured 5.9-6.1)
    "qsgd": (22, 5),   # per tensor a float64 copy and its norm (3: one BLAS thread), repeat (3),
    # abs, divide, scale (5), add the uniform, floor, clip (5), sign, multiply, astype (4), != 0,
    # pack, pick the nonzero (2) (and the draws: QSGD_DRAW_PASSES) | unpack twice, astype, sum,
    # zeros, scatter, repeat, multiply: byte- and bit-wide passes, measured 4.4-4.9 with the
    # levels' (and a pass over the M levels: 5 M)
    "topk": (0, 1),    # (the selection: "select"; and 3 K: pick, two astypes) | zeros (and 5 K:
    # astype, isfinite, diff, compare, scatter)
    "sign": (3, 7),    # abs, per tensor mean, compare (and a pack) | unpack, astype, scale,
    # shift, repeat, multiply, astype
}
DECODE_MEASURED = "at 64337f8"
"""The decode counts of fp16 and QSGD (never on the clock before the server's and a
--compress-down client's decoding were charged) measured on ResNet-18's 62 tensors (11.2 M
values; QSGD:16's nonzero levels 1.4 % of them), three runs each against the code rate of the
same minutes (secagg/rates.py): fp16 3.3-4.2 passes, int8 5.9-6.1, QSGD 4.4-4.9, top-k 0.6-0.9
(with its 5 K), sign 5.5; not at run time."""
QSGD_DRAW_PASSES = 8
"""QSGD's uniform float32 draws (Generator.random(dtype=float32)), counted as this many passes
("code") each: 7.3-8.2 times an int8 pass's seconds on 11.2 M draws (same minutes), where a
Gaussian draw ("noise", the mechanisms') is ~36: not the noise rate's draw."""


def codec_work(name: str, n: int, decode: bool = False, k: int = 0, m: int = 0) -> opcount.Ops:
    """The work of codec `name` encoding (decode: decoding) a vector of n values: K kept
    (top-k), M nonzero levels (QSGD's decode). A codec of another name (a plugin's): none."""
    passes = PASSES.get(name)
    if passes is None or n <= 0:
        return {}
    out: opcount.Ops = {"code": float(passes[decode] * n)}
    if name == "topk":
        out["code"] += (5 if decode else 3) * k
        if not decode:
            out["select"] = float(n)
    elif name == "qsgd":
        out["code"] += 5 * m if decode else (QSGD_DRAW_PASSES + 1 / 8) * n
    elif name == "sign" and not decode:
        out["code"] += n / 8
    return out


# ---- fp16 ---------------------------------------------------------------------------------------
def fp16_encode(x: np.ndarray, sizes: list[int], rng: np.random.Generator | None = None,
                arg: float = 0.0) -> Arrays:
    opcount.charge(codec_work("fp16", x.size))
    return {"@fp16": x.astype(np.float16)}


def fp16_decode(wire: Arrays, sizes: list[int], arg: float = 0.0) -> np.ndarray:
    a = _get(wire, "@fp16", "float16", (sum(sizes),))
    opcount.charge(codec_work("fp16", a.size, decode=True))
    return _finite(a.astype(np.float32), "@fp16")


# ---- 8-bit affine -------------------------------------------------------------------------------
def q8_encode(x: np.ndarray, sizes: list[int], rng: np.random.Generator | None = None,
              arg: float = 0.0) -> Arrays:
    opcount.charge(codec_work("int8", x.size))
    b = _bounds(sizes)
    lo = np.array([x[b[i]:b[i + 1]].min() for i in range(len(sizes))], np.float32)
    hi = np.array([x[b[i]:b[i + 1]].max() for i in range(len(sizes))], np.float32)
    step = ((hi - lo) / 255).astype(np.float32)
    safe = np.where(step > 0, step, 1).astype(np.float32)
    q = np.rint((x - _per_tensor(lo, sizes)) / _per_tensor(safe, sizes))
    return {"@q8": np.clip(q, 0, 255).astype(np.uint8),
            "@q8.scale": np.stack([lo, step], axis=1)}


def q8_decode(wire: Arrays, sizes: list[int], arg: float = 0.0) -> np.ndarray:
    q = _get(wire, "@q8", "uint8", (sum(sizes),))
    sc = _finite(_get(wire, "@q8.scale", "float32", (len(sizes), 2)), "@q8.scale")
    if (sc[:, 1] < 0).any():
        raise CompressionError("compressed array '@q8.scale': a negative step")
    opcount.charge(codec_work("int8", q.size, decode=True))
    with np.errstate(over="ignore"):  # finite scales can still overflow: the result is vetted
        return (_per_tensor(sc[:, 0], sizes) + q.astype(np.float32)
                * _per_tensor(sc[:, 1], sizes)).astype(np.float32)


# ---- QSGD ---------------------------------------------------------------------------------------
def qsgd_encode(x: np.ndarray, sizes: list[int], rng: np.random.Generator | None = None,
                arg: float = 16) -> Arrays:
    s = int(arg)
    opcount.charge(codec_work("qsgd", x.size))
    b = _bounds(sizes)
    norm = np.array([np.linalg.norm(x[b[i]:b[i + 1]].astype(np.float64))
                     for i in range(len(sizes))], np.float32)
    scale = _per_tensor(np.where(norm > 0, norm, 1).astype(np.float32), sizes)
    r = np.abs(x) / scale * s  # in [0, s]
    assert rng is not None, "QSGD rounds stochastically: it needs the run's seeded stream"
    lvl = np.floor(r + rng.random(r.shape, dtype=np.float32)).clip(0, s)
    lvl = (np.sign(x) * lvl).astype(np.int8)
    nz = lvl != 0
    return {"@qsgd.norm": norm, "@qsgd.nz": np.packbits(nz), "@qsgd.lvl": lvl[nz]}


def qsgd_decode(wire: Arrays, sizes: list[int], arg: float = 16) -> np.ndarray:
    s, n = int(arg), sum(sizes)
    norm = _finite(_get(wire, "@qsgd.norm", "float32", (len(sizes),)), "@qsgd.norm", True)
    nz = np.unpackbits(_get(wire, "@qsgd.nz", "uint8", (math.ceil(n / 8),)), count=n).astype(bool)
    if np.unpackbits(wire["@qsgd.nz"])[n:].any():
        raise CompressionError("compressed array '@qsgd.nz': bits set past the last element")
    lvl = _get(wire, "@qsgd.lvl", "int8", (int(nz.sum()),))
    if (lvl == 0).any() or (np.abs(lvl.astype(np.int16)) > s).any():
        raise CompressionError(f"compressed array '@qsgd.lvl': levels must be nonzero in -{s}..{s}")
    opcount.charge(codec_work("qsgd", n, decode=True, m=lvl.size))
    out = np.zeros(n, np.float32)
    out[nz] = lvl.astype(np.float32) / s
    return out * _per_tensor(norm, sizes)


# ---- top-k --------------------------------------------------------------------------------------
def topk_count(n: int, ratio: float) -> int:
    """How many of n entries top-k keeps: ceil(ratio n), at least 1."""
    return max(1, min(n, math.ceil(ratio * n)))


def _index_dtype(n: int) -> str:
    return "int16" if n <= np.iinfo(np.int16).max + 1 else "int32"


def topk_encode(x: np.ndarray, sizes: list[int], rng: np.random.Generator | None = None,
                arg: float = 0.01) -> Arrays:
    k = topk_count(x.size, arg)
    opcount.charge(codec_work("topk", x.size, k=k))
    idx = np.sort(np.argpartition(np.abs(x), x.size - k)[x.size - k:])
    return {"@topk.idx": idx.astype(_index_dtype(x.size)), "@topk.val": x[idx].astype(np.float32)}


def topk_decode(wire: Arrays, sizes: list[int], arg: float = 0.01) -> np.ndarray:
    n = sum(sizes)
    k = topk_count(n, arg)
    idx = _get(wire, "@topk.idx", _index_dtype(n), (k,)).astype(np.int64)
    val = _finite(_get(wire, "@topk.val", "float32", (k,)), "@topk.val")
    if k and (idx[0] < 0 or idx[-1] >= n or (np.diff(idx) <= 0).any()):
        raise CompressionError(f"compressed array '@topk.idx': indices must increase within 0..{n - 1}")
    opcount.charge(codec_work("topk", n, decode=True, k=k))
    out = np.zeros(n, np.float32)
    out[idx] = val
    return out


# ---- scaled sign --------------------------------------------------------------------------------
def sign_encode(x: np.ndarray, sizes: list[int], rng: np.random.Generator | None = None,
                arg: float = 0.0) -> Arrays:
    opcount.charge(codec_work("sign", x.size))
    b = _bounds(sizes)
    scale = np.array([np.abs(x[b[i]:b[i + 1]]).mean() if sizes[i] else 0.0
                      for i in range(len(sizes))], np.float32)
    return {"@sign": np.packbits(x >= 0), "@sign.scale": scale}


def sign_decode(wire: Arrays, sizes: list[int], arg: float = 0.0) -> np.ndarray:
    n = sum(sizes)
    bits = np.unpackbits(_get(wire, "@sign", "uint8", (math.ceil(n / 8),)), count=n)
    scale = _finite(_get(wire, "@sign.scale", "float32", (len(sizes),)), "@sign.scale", True)
    opcount.charge(codec_work("sign", n, decode=True))
    return ((bits.astype(np.float32) * 2 - 1) * _per_tensor(scale, sizes)).astype(np.float32)


Encode = Callable[..., Arrays]
"""encode(x, sizes, rng, arg) -> the arrays that travel (each named "@..."): x the float32
vector of the result's floating values, sizes its tensors' sizes, rng the client's numpy
Generator of (seed, "compress", round, client) for a codec that declares random (else None),
arg the codec's parameter (NAME:ARG, or its default)."""
Decode = Callable[..., np.ndarray]
"""decode(wire, sizes, arg) -> the float32 vector; CompressionError when `wire` does not fit
(a sender's failure: check every array's name, dtype and shape, and its values)."""


@dataclass(frozen=True)
class CodecSpec:
    """A compressor of a result's update (--compress NAME[:ARG]), registered in one table with
    the facts its users read: whether its output sums in secure aggregation's field (and why
    not), whether it keeps an error-feedback residual (client state), draws from the seeded
    stream, encodes values (a task, a hand-off: --compress-down, --compress-handoff) or only
    differences, and its parameter's default and check. A plugin registers one through
    fednet.api.register_codec (docs/extending.md)."""

    name: str
    encode: Encode
    decode: Decode
    wire: frozenset[str]  # the names of the arrays it sends
    arg: float | None = None  # its parameter's default; None: it takes none
    arg_name: str = "ARG"  # its parameter as --help names it (NAME[:ARG])
    check: Callable[[float], str] | None = None  # why ARG is no parameter of it ('' if it is)
    summable: bool = False  # its output sums in secure aggregation's field
    why: str = "its output does not sum in secure aggregation's field"  # (when not summable)
    feedback: bool = False  # it keeps an error-feedback residual
    random: bool = False  # its encoding draws from the seeded stream
    values: bool = True  # it encodes values too, not only differences (tasks, hand-offs)


REGISTERED: dict[str, CodecSpec] = {}
CODECS: dict[str, tuple[Encode, Decode]] = {}
"""name -> (encode(x, sizes, rng, arg) -> arrays, decode(arrays, sizes, arg) -> x)."""
NOT_SUMMABLE: dict[str, str] = {}
"""Why a codec's output does not sum in secure aggregation's field (each one's fact: under
--secagg the masked vector must add up value by value; secure aggregation quantizes each value
itself, with one scale for every client: --secagg-bits and --secagg-clip)."""
WIRE_NAMES: dict[str, set[str]] = {}


def register_codec(spec: CodecSpec) -> CodecSpec:
    """Add a codec (a plugin's too); the tables above are derived from its facts. A name taken
    by another codec, or a wire name another codec sends, is a ValueError."""
    old = REGISTERED.get(spec.name)
    if spec.name == "none" or (old is not None and old != spec):
        raise ValueError(f"--compress {spec.name} is registered twice (a plugin's name must be "
                         "new)")
    taken = {w for n, names in WIRE_NAMES.items() if n != spec.name for w in names}
    if not spec.wire or any(not w.startswith("@") or w in taken for w in spec.wire):
        raise ValueError(f"--compress {spec.name}: its arrays' names must start with '@' and be "
                         "its own")
    REGISTERED[spec.name] = spec
    CODECS[spec.name] = (spec.encode, spec.decode)
    WIRE_NAMES[spec.name] = set(spec.wire)
    if not spec.summable:
        NOT_SUMMABLE[spec.name] = spec.why
    return spec


def _levels(s: float) -> str:
    return "" if s == int(s) and 1 <= s <= 127 else "qsgd:S needs S levels, an integer in 1..127"


def _ratio(r: float) -> str:
    return "" if 0 < r <= 1 else "topk:R needs the fraction kept, 0 < R <= 1"


for _c in (
    CodecSpec("fp16", fp16_encode, fp16_decode, frozenset({"@fp16"}),
              why="its floats do not add in secure aggregation's integer field"),
    CodecSpec("int8", q8_encode, q8_decode, frozenset({"@q8", "@q8.scale"}),
              why="each client's codes carry its own scale, so two clients' codes do not add"),
    CodecSpec("qsgd", qsgd_encode, qsgd_decode,
              frozenset({"@qsgd.norm", "@qsgd.nz", "@qsgd.lvl"}), 16.0, "S", _levels,
              why="each client's levels carry its own norm, so two clients' levels do not add",
              random=True),
    CodecSpec("topk", topk_encode, topk_decode, frozenset({"@topk.idx", "@topk.val"}), 0.01,
              "R", _ratio, why="each client keeps other coordinates, so the sparse vectors do not "
              "add position by position", feedback=True, values=False),
    CodecSpec("sign", sign_encode, sign_decode, frozenset({"@sign", "@sign.scale"}),
              why="each client's signs carry its own scale, so they do not add to the mean",
              feedback=True, values=False)):
    register_codec(_c)
