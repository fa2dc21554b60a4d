"""Protocol and server work counted in operations, and the rates that turn counts into
simulated seconds (the clock's compute half besides training's FLOPs: training/flops.py). A
leaf (plain dicts and a context variable) that secagg, training and the clock all read; the
device classes' rates are network/ops.py's.

A count is a plain dict {operation: amount} (`Ops`): the amount of each primitive a step of a
protocol or of the server's aggregation performs, computed from that work's own parameters
(clients, neighbours, vector length, threshold: fednet/secagg/cost.py, network/server_cost.py),
never timed. A device's rates say how much of each it does a second (`RATES`: one field each);
seconds = sum(amount / rate). The same counts and rates give the same seconds in every runtime.

The operations:
  x25519   X25519 scalar multiplications (a key pair's public key, a key agreement)
  kdf      HKDF-SHA256 derivations (one per agreed key)
  aead     AES-256-GCM seals or opens of one sealed share (fednet/secagg/client.SEALED_BYTES)
  prg      bytes of AES-256-CTR keystream (the masks)
  mask     masks the server expands: each keystream's key setup and call, beside its bytes
           (prg; a client's are in its prg rate's measurement: not a client rate)
  shamir   multiply-adds in Shamir's field (a share: t per chunk of a secret)
  reply    replies the server takes at the unmask stage (each checked, its rows decoded at once)
  taken    Shamir shares in them (each kept)
  secret   secrets the server rebuilds (each: its holders sorted, its bytes joined)
  rebuilt  shares read into a Shamir reconstruction (t per secret rebuilt: picked, stacked,
           weighted and summed modulo P)
  held     shares of a secret beyond the t read (each looked through, its holder checked and
           sorted, to find the first t holders)
  lagrange element operations of a secret's Lagrange weights (8 t^2 + 124 t at threshold t:
           the running products' multiply-mods and the modular inverses)
  noise    Gaussian (or discrete Gaussian) draws
  stream   element operations streamed through memory (sums, scaling, copies, numpy's
           vectorised sort's compare-moves)
  sort     compare-moves of a stable argsort or a selection (n log2 n a sorted row of n, a
           median's 2 (1 + ln 2) n: Bulyan's closest-to-median mean)
  gemm     FLOPs of dense matrix products (Krum's and Bulyan's pairwise distances)
  code     element passes of a codec over its float32 vector (fednet/compress/codecs.py: numpy's
           subtractions, scalings, roundings, casts, minima; one an element a pass; QSGD's
           uniform draws as codecs.QSGD_DRAW_PASSES each) and of compress.encode_result's own
           (the update's flattening, an error-feedback residual) and decode_result's (the
           arrays rebuilt: a client's --compress-down task or hand-off, the server's result)
  select   elements a top-k selection picks among (|x|, argpartition and the kept indices
           sorted, at 1 % kept)
  field    element passes of SecAgg's field work (fednet/secagg/field.py: quantize's float64
           clip, scale, stochastic rounding and casts, secagg/cost.QUANTIZE_PASSES a value; a
           codec grid's pack, its bits unpacked and packed again, cost.PACK_PASSES a value,
           and the server's unpack, cost.UNPACK_PASSES; the client's update flattened before,
           clipped and weighted onto a grid, or encoded by distributed DP: cost.FLATTEN_PASSES,
           GRID_PASSES, DDP_PASSES): float64 and bit-level work, timed on quantize and pack
           (secagg/rates.py), not at the float32 codec passes' code rate
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping

OPS = ("x25519", "kdf", "aead", "prg", "mask", "shamir", "reply", "taken", "secret", "rebuilt",
       "held", "lagrange", "noise", "stream", "sort", "gemm", "code", "select",
       "field")
RATES = tuple(f"{op}_per_s" for op in OPS)
"""A rate field per operation (per second; prg in bytes/s, gemm in FLOP/s)."""

CLIENT_RATES = ("x25519_per_s", "kdf_per_s", "aead_per_s", "prg_per_s", "shamir_per_s",
                "noise_per_s", "code_per_s", "select_per_s", "field_per_s")
"""The rates a client's profile carries (network/latency.Profile): a client's protocol work
uses only these primitives, its codecs' (fednet/compress/codecs.py) passes and selections
(code, select: columns added later) and SecAgg's field work (field: the column added last;
network/profiles.OLDER)."""

Ops = dict[str, float]

DISPATCH = "dispatch"
CONVOLUTION = "convolution"
"""A task's counts of dispatched aten operations and of the convolutions among them
(training/flops.py), kept in its meter's Ops beside the protocol's: training work, charged at
the profile's s_per_op and s_per_conv by network/latency.compute_time, never by `seconds`
(neither is one of OPS)."""


def add(into: Ops, more: Mapping[str, float]) -> Ops:
    """`more` added to `into` (in place; returned)."""
    for k, v in more.items():
        if v:
            into[k] = into.get(k, 0.0) + v
    return into


def seconds(ops: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """Simulated seconds of `ops` at `rates` ({op}_per_s; a missing or 0 rate: that operation
    is free), summed in OPS order (the same float in every runtime)."""
    total = 0.0
    for op in OPS:
        n = ops.get(op, 0.0)
        r = rates.get(f"{op}_per_s", 0.0)
        if n and r > 0:
            total += n / r
    return total


# ---- where a client's protocol work is counted (the task's meter, core/executor.py) ----------
_ACTIVE: contextvars.ContextVar[Ops | None] = contextvars.ContextVar("fednet_ops", default=None)


@contextlib.contextmanager
def counted() -> Iterator[Ops]:
    """An Ops that every `charge` inside the block adds to."""
    got: Ops = {}
    token = _ACTIVE.set(got)
    try:
        yield got
    finally:
        _ACTIVE.reset(token)


def charge(more: Mapping[str, float]) -> None:
    """Add `more` to the open count, if any (nothing outside one: the server's own calls)."""
    got = _ACTIVE.get()
    if got is not None:
        add(got, more)


