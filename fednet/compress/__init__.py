"""Compressed updates (`--compress`): what a client's result carries on the wire.

A client compresses the *update* of each floating array of its result: the array minus the
array of the same name and shape that its task brought (the model it trained from), or the
array itself when the task brought none (SCAFFOLD's control-variate deltas). The floating
arrays are taken in name order and concatenated into one vector x, which one of the codecs
(codecs.py) encodes; other arrays travel as they are. The server knows the reference (it sent
it) and the layout the result must have (Strategy.result_layout), so it decodes every result
against its own state before anything reads it: the names, dtypes and sizes of the encoded
arrays, index ranges and levels are checked (a result that does not decode is that client's
failure), and the reconstruction has the layout's shapes and dtypes. The ledger counts the
encoded arrays: what really travelled.

Error feedback (Stich et al. 2018; Karimireddy et al. 2019), for topk and sign: the client
adds what earlier compressions dropped (its residual e) before it compresses and keeps the new
residual e' = (x + e) - decode(encode(x + e)); e is client state, kept in the clients' store
with the rest (checkpointed, resumed). QSGD's stochastic rounding draws from the run's seeded
stream (seed, "compress", round, client), so `fednet local` and `fednet launch` agree bit for
bit.

Specs: none, fp16, int8 (per-tensor affine 8-bit), qsgd:S (S levels, default 16), topk:R
(the fraction R of entries kept, default 0.01), sign (scaled sign).

Under --secagg full|plus a codec is applied inside secure aggregation instead, on one grid for
every client (compress/field.py): int8 and qsgd declare such a grid; the others are refused.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from fednet import opcount
from fednet.compress.codecs import (CODECS, REGISTERED, WIRE_NAMES, CodecSpec, CompressionError,
                                    register_codec, topk_count)
from fednet.errors import ConfigError

Arrays = dict[str, np.ndarray]

__all__ = ["CompressionError", "Spec", "Codecs", "CodecSpec", "codecs", "parse", "encode_result",
           "decode_result", "decode_counted", "decode_work", "register_codec", "topk_count"]


@dataclass(frozen=True)
class Spec:
    """One --compress setting."""

    kind: str = "none"
    arg: float = 0.0

    @property
    def on(self) -> bool:
        return self.kind != "none"

    @property
    def feedback(self) -> bool:
        """Whether the client keeps an error-feedback residual (its state): its codec's fact."""
        return self.on and REGISTERED[self.kind].feedback

    @property
    def random(self) -> bool:
        """Whether its encoding draws from the seeded stream: its codec's fact."""
        return self.on and REGISTERED[self.kind].random


def parse(text: str, down: bool | str = False) -> Spec:
    """'topk:0.01' -> Spec; ConfigError naming --compress (down: --compress-down, or the option
    named, which takes only the codecs of values: none, fp16, int8, qsgd)."""
    opt = (down if isinstance(down, str) else "--compress-down") if down else "--compress"
    kind, _, arg = str(text).strip().lower().partition(":")
    c = REGISTERED.get(kind)
    if down and c is not None and not c.values:
        raise ConfigError(f"{opt} {text}: {kind} encodes a difference with error feedback, and "
                          "a client holds no reference model to take it against; choose "
                          f"{_choices(True)}")
    if c is None and kind != "none":
        raise ConfigError(f"{opt} must be one of {_choices(bool(down))} (got '{text}')")
    if c is None:
        return Spec()
    if arg and c.arg is None:
        raise ConfigError(f"{opt} {kind} takes no parameter (got '{text}')")
    try:
        value = float(arg) if arg else (c.arg or 0.0)
    except ValueError:
        raise ConfigError(f"{opt} {kind}:{arg}: not a number") from None
    why = c.check(value) if c.check is not None else ""
    if why or not math.isfinite(value):
        raise ConfigError(f"{opt} {why or f'{kind}:ARG must be finite'} (got {arg})")
    return Spec(kind, value)


def _choices(down: bool) -> str:
    """The codecs an option takes, as --help says them (down: those that encode values)."""
    names = [n + ("" if c.arg is None else f"[:{c.arg_name}]") for n, c in REGISTERED.items()
             if c.values or not down]
    return ", ".join(["none", *names])


@dataclass(frozen=True)
class Codecs:
    """A run's three codec settings, parsed: results (--compress), tasks (--compress-down) and
    hand-offs (--compress-handoff). Under --secagg, --compress is not applied to a result (the
    masked vector) but inside secure aggregation, on its common grid (compress/field.py):
    `up` is then none and `field` the codec."""

    up: Spec
    down: Spec
    handoff: Spec
    field: Spec = Spec()


@functools.lru_cache(maxsize=64)
def codecs(up: str, down: str, handoff: str, secagg: str = "off") -> Codecs:
    """The run's codecs from its three spec strings, parsed once (NetConfig.codecs; `secagg`:
    --secagg, under which --compress is secure aggregation's, Codecs.field); a ConfigError
    names the option of the first that is wrong."""
    got = parse(up)
    field = got if secagg != "off" else Spec()
    return Codecs(Spec() if field.on else got, parse(down, "--compress-down"),
                  parse(handoff, "--compress-handoff"), field)


def _reference(name: str, shape: tuple[int, ...], reference: Arrays) -> np.ndarray | None:
    r = reference.get(name)
    return r if r is not None and tuple(r.shape) == tuple(shape) and r.dtype.kind == "f" else None


FLAT_PASSES = (3, 8)
"""encode_result's own passes ("code", opcount) per value of an array without a reference and of
one with: its copy (and the reference's, and the difference) and the concatenation; measured on
ResNet-18's 62 tensors (11.2 M values) at 2.4-4.5 and 7.9-8.9 times an int8 pass's seconds
(secagg/rates.py's code rate, same minutes; once at 284fde0, not at run time)."""
FEEDBACK_PASSES = 4
"""And an error-feedback codec's: the residual added (1.8 measured) and the new residual, x less
the decoding (~2)."""


def _flat(arrays: Arrays, names: list[str], reference: Arrays) -> np.ndarray:
    parts = []
    passes = 0
    for n in names:
        a = np.asarray(arrays[n])
        r = _reference(n, a.shape, reference)
        d = a.astype(np.float32) if r is None else a.astype(np.float32) - r.astype(np.float32)
        parts.append(d.reshape(-1))
        passes += FLAT_PASSES[r is not None] * a.size
    opcount.charge({"code": float(passes)})
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def encode_result(spec: Spec, arrays: Arrays, reference: Arrays, residual: np.ndarray | None,
                  rng: np.random.Generator | None) -> tuple[Arrays, np.ndarray | None]:
    """(the arrays to send, the new residual or None) for a result's `arrays`; `reference`: the
    task's arrays as received (copied before training changed them)."""
    names = sorted(n for n, a in arrays.items() if np.asarray(a).dtype.kind == "f")
    sizes = [int(np.asarray(arrays[n]).size) for n in names]
    x = _flat(arrays, names, reference)  # (each charges the open task meter: opcount)
    if spec.feedback:
        opcount.charge({"code": float(FEEDBACK_PASSES * x.size)})
    if spec.feedback and residual is not None and residual.shape == x.shape:
        x = x + residual
    encode, decode = CODECS[spec.kind]
    wire = encode(x, sizes, rng, spec.arg)
    floating = set(names)
    out = {n: a for n, a in arrays.items() if n not in floating}
    out.update(wire)
    return out, (x - decode(wire, sizes, spec.arg) if spec.feedback else None)


DECODE_PASSES = (2, 4)
"""decode_result's own passes ("code", opcount) per value it rebuilds, beside its codec's decode
(codecs.codec_work): without a reference (a --compress-down task, a hand-off; the server's copy
of the tasks' decoded arrays) the copy into the layout's dtype, into arrays it allocates: new
memory every task, first touched by that copy; with one (a result) the reference's float32 copy,
the sum and the cast. Measured on ResNet-18's 62 tensors (11.2 M values), decode_result's CPU
seconds less its codec's, at the code rate of the same minutes (secagg/rates.py). With a
reference 4.0-4.9 passes (at 64337f8). Without, the copy alone was 0.7-1.3 into arrays already
touched (64337f8; 0.7-1.0 at 79a1e01), where a client's are not: downlink.decode's CPU seconds
less its codec decode's, both timed in one process (7 reps' medians, three runs at 79a1e01):
2.1-2.6 after fp16's decode, 1.1-1.5 after int8's, 0.75-1.4 after QSGD's; the copy alone into
fresh arrays in a new process 2.4-3.8. Counting it 1 left the client's --compress-down decode
about 20 % low against its CPU seconds in every bench_compute run (issue 52's follow-up);
not at run time."""


def decode_work(n: int, referenced: bool) -> opcount.Ops:
    """decode_result's own work rebuilding n values (`referenced`: against a reference)."""
    return {"code": float(DECODE_PASSES[referenced] * n)} if n > 0 else {}


def decode_counted(spec: Spec, wire: Arrays, expect: dict | None, reference: Arrays
                   ) -> tuple[Arrays, opcount.Ops]:
    """decode_result, and the work it did counted (the codec's decode and its own passes): the
    server's, which no task meter holds (core/replies.py: the round's server work,
    core/server_clock.py). Counted up to a CompressionError, which it raises."""
    with opcount.counted() as got:
        out = decode_result(spec, wire, expect, reference)
    return out, dict(got)


def decode_result(spec: Spec, wire: Arrays, expect: dict | None, reference: Arrays) -> Arrays:
    """The result's arrays rebuilt from `wire` against the server's own `expect` (the result
    layout) and `reference` (the task's arrays it sent); CompressionError when they do not
    decode (names, dtypes, sizes, values). Its work, and its codec's, charge the open count
    (opcount: a client's task meter; the server's, decode_counted)."""
    if expect is None:
        raise CompressionError("the algorithm declares no result layout, so --compress cannot "
                               "decode its results")
    names = sorted(n for n, (_, dt) in expect.items() if np.dtype(dt).kind == "f")
    raw = set(expect) - set(names)
    extra = set(wire) - WIRE_NAMES[spec.kind] - raw
    if extra:
        raise CompressionError(f"unexpected array(s) {sorted(extra)[:3]} in a {spec.kind} result")
    sizes = [math.prod(expect[n][0]) for n in names]
    x = CODECS[spec.kind][1](wire, sizes, spec.arg)
    out = {n: wire[n] for n in raw if n in wire}
    at = 0
    for n, size in zip(names, sizes):
        shape, dtype = expect[n]
        part = x[at:at + size].reshape(shape)
        r = _reference(n, shape, reference)
        out[n] = (part if r is None else r.astype(np.float32) + part).astype(dtype)
        opcount.charge(decode_work(size, r is not None))
        at += size
    return out
