"""Secure aggregation's work counted in operations (fednet/opcount.py), from the protocol's own
parameters: a client's neighbours k, the share threshold t, the vector's length d and element
size, who survived and who dropped. The client's half charges these where it does the work
(secagg/client.py, into its task's meter); the server's are read by the round's clock
(algorithms/secagg.py) and by the benchmarks. Nothing here reads a clock.

What is counted is what fednet's implementation does (docs/usage.md, "Compute on the clock"):
a key agreement is one X25519 multiplication and one HKDF derivation; a share is t multiply-adds
per 30-bit chunk of the secret (Horner); a mask is its bytes of AES-CTR keystream; the server's
sums and mask removals are element operations ("stream"). The server's unmasking takes each
reply of a survivor ("reply": checked, its rows decoded at once) and each share in it ("taken":
kept), then
rebuilds every secret from its first t holders at once (shamir.reconstruct_many: "secret", its
holders sorted and its bytes joined, "rebuilt", t shares picked, stacked, weighted and summed
modulo P; "lagrange", the element
operations of each secret's Lagrange weights: shamir.lagrange_rows, LAGRANGE_PAIR per pair of
its t points and LAGRANGE_INVERSE per point for the modular inverse: O(t^2) a secret; "held",
the shares of a secret beyond its t, each looked through for the first t holders). A client's
input also flattens its update (flattened), clips and weights it onto a codec's grid (weighted)
or encodes it for distributed DP (ddp_encoded) before it is masked; the server unpacks a grid's
inputs before it sums them (summed's packed): "field" passes, measured (the constants below)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fednet.opcount import Ops, add
from fednet.secagg import shamir

CHUNKS = shamir.chunks()  # field elements of a 32-byte secret
LAGRANGE_PAIR = 8  # shamir.lagrange_rows, per point and other point: the numerator's and the
# denominator's multiply-mods (num * x % P; (x_m - x) % P; den * that % P) and two selects
LAGRANGE_INVERSE = 4 * (shamir.P - 2).bit_length()  # shamir._inverse, per point: a square and a
# multiply, each modulo P, per bit of the exponent P - 2 (31)


def keys() -> Ops:
    """Stage keys: two key pairs (a public key is one X25519 multiplication)."""
    return {"x25519": 2}


def shares(k: int, t: int) -> Ops:
    """Stage shares: b and the s key shared among k neighbours at threshold t (Horner: t
    multiply-adds per chunk and party), one agreement and one seal per neighbour."""
    return {"shamir": 2 * k * t * CHUNKS, "x25519": k, "kdf": k, "aead": k}


def open_shares(m: int) -> Ops:
    """Stage input, first: the m sealed shares addressed to it opened (an agreement each)."""
    return {"x25519": m, "kdf": m, "aead": m}


def masked(d: int, itemsize: int, partners: int) -> Ops:
    """Stage input: d values masked with the self mask and one pairwise mask per partner (an
    agreement and d elements of keystream each, added)."""
    return {"prg": (1 + partners) * d * itemsize, "x25519": partners, "kdf": partners,
            "stream": (1 + partners) * d}


QUANTIZE_PASSES = 42
"""secagg/field.quantize's passes ("field", opcount: its own operation and rate since the
code rate, timed on float32 codec passes, moved 2.0-3.7e9 between runs while this work did not;
secagg/rates.py times quantize and pack themselves) a value: float64 copy, clip, shift, scale,
a uniform float64 draw, floor, clip, the uint64 cast, the weight, the field's cast. Measured
(secagg/rates.py's code rate, same minutes, at 8d6ae13): 36 passes a value on 1 M values and
47 on 11.2 M (plain SecAgg); 50-55 with the grid's clip and weight before it (its caller's)."""
PACK_PASSES = 70
"""secagg/field.pack's passes a value (unpack's: UNPACK_PASSES): the 64 bits of each value unpacked into
bytes, the low w kept, packed again (~64 + w byte operations a value; not a function of w
measurably). Measured likewise: 55 (1 M values, w 13 and 18), 82-96 (11.2 M). The two
counts weigh quantize against pack; the field rate (secagg/rates.py) is their sum over both
functions' CPU seconds on one vector."""


UNPACK_PASSES = 52
"""secagg/field.unpack's passes a value (the server's, each masked input of a codec's grid taken
in: its bytes unpacked into bits, widened to 64 and packed again), in the field rate's units
(quantize and pack together QUANTIZE_PASSES + PACK_PASSES a value): measured 50.8-52.7 on
11.2 M values at w 16 and 19 (cohorts of 100 and 1,000 on int8's grid), two runs, against the
field rate of the same minutes (secagg/rates.py), at 64337f8; pack itself measured 46-60 there."""
FLATTEN_PASSES = 29
"""A SecAgg client's update flattened before it is quantized or encoded
(algorithms/secagg_client.py): the task's model and the trained one each concatenated and cast
to float64, their difference, the loss appended. Measured 26.9-30.5 field passes a value
(11.2 M values in 62 tensors, three runs at 64337f8, the field rate of the same minutes)."""
GRID_PASSES = 7
"""A codec grid's clip to [-c, c] and weight n / n_top before quantize (its caller's,
algorithms/secagg_client.py): measured 6.8-7.0 field passes a value, likewise."""
DDP_PASSES = 150
"""Distributed DP's encoding of a value besides its draws (privacy/distributed.encode: its norm,
scalings, conditional rounding's floor, fraction, compare and sum, the discrete Gaussian's
attempts' element work: subtract, cast, exp of the acceptance test, scatter of the kept, then
the noise added), in field passes: its CPU seconds less its draws' at the noise rate (charged
by distributed.py, "noise": a uniform a value a rounding try, three draws a value an attempt),
over the field rate of the same minutes: measured 153 (11.2 M values, z 1, t 3, at 64337f8)."""
DDP_DRAWS = 4.95
"""The draws distributed.encode makes a value, expected (of_task's count; the client's meter
charges those made): one uniform for the rounding (one try: its norm bound is met at once at
fednet's grid) and three an attempt of the discrete Gaussian, 1.315 attempts a value (measured:
3.946 draws a value on 11.2 M at sigma z 2^40 / sqrt(3); the large-sigma limit)."""


def flattened(d: int) -> Ops:
    """A SecAgg client's update of d values flattened against its task's model."""
    return {"field": float(FLATTEN_PASSES * d)} if d > 0 else {}


def weighted(d: int) -> Ops:
    """d values clipped and weighted onto a codec's common grid, before quantize."""
    return {"field": float(GRID_PASSES * d)} if d > 0 else {}


def ddp_encoded(d: int, draws: bool = False) -> Ops:
    """Distributed DP's encoding of d values (privacy/distributed.encode): its element work;
    with `draws`, the draws it is expected to make too (DDP_DRAWS: what distributed.py charges
    as it draws them)."""
    if d <= 0:
        return {}
    return {"field": float(DDP_PASSES * d), **({"noise": DDP_DRAWS * d} if draws else {})}


def unpacked(d: int) -> Ops:
    """d masked values of a codec's grid unpacked from their wire bits (the server's)."""
    return {"field": float(UNPACK_PASSES * d)} if d > 0 else {}


def quantized(d: int) -> Ops:
    """A client's update of d values quantized onto the field (secagg/field.quantize)."""
    return {"field": float(QUANTIZE_PASSES * d)} if d > 0 else {}


def packed(d: int) -> Ops:
    """d masked values packed into w bits each (secagg/field.pack; unpacking them: unpacked)."""
    return {"field": float(PACK_PASSES * d)} if d > 0 else {}


def summed(inputs: int, d: int, packed: bool = False) -> Ops:
    """The server's input stage: the masked inputs added modulo 2^f (`packed`: each unpacked
    first from a codec grid's wire bits, as secagg/field.unpack does it on the server)."""
    out: Ops = {"stream": inputs * d}
    return add(out, unpacked(inputs * d)) if packed else out


def lagrange(t: int) -> int:
    """The element operations of one secret's Lagrange weights at threshold t."""
    return LAGRANGE_PAIR * t * t + LAGRANGE_INVERSE * t


def unmasked(survivors: int, pairs: int, dropped: int, d: int, itemsize: int, replies: int = 0,
             taken: int = 0, t: Sequence[int] = (), sets: Sequence[int] | None = None,
             held: int = 0) -> Ops:
    """The server's unmasking: the survivors' `replies` and the `taken` shares in them; each
    survivor's b and each dropped client's s key rebuilt (`t`: each secret's threshold: its
    shares read into the reconstruction; a rebuilt s key checked: one X25519 multiplication;
    `held`: the shares of those secrets beyond their t, looked through for the first t
    holders), the Lagrange weights' element operations (`lagrange`) of each distinct set of
    holders (`sets`: each set's threshold; None: one set a secret), every survivor's self mask
    and the `pairs` pairwise masks of the dropped with their surviving neighbours expanded (an
    agreement and d elements each: its keystream's setup, "mask", and bytes, "prg") and taken
    off."""
    masks = survivors + pairs
    return {"reply": replies, "taken": taken, "secret": len(t), "rebuilt": sum(t),
            "held": held, "lagrange": sum(lagrange(k) for k in (t if sets is None else sets)),
            "x25519": dropped + pairs, "kdf": pairs, "prg": masks * d * itemsize,
            "mask": masks, "stream": masks * d}


def unmasking(agg: Any) -> Ops:
    """`unmasked` for a round's Aggregation (secagg/server.py) as it stands at its end: the
    shares it took, and each secret rebuilt from its first t holders, the weights once per
    distinct set of them, as shamir.reconstruct_many computes them (full SecAgg: t + 1 sets a
    round; SecAgg+: about one a secret): the sets the server used (agg.windows), else found
    as it finds them. A round whose shares disagree rebuilds again, holder by holder: not
    counted."""
    shared = agg.shared()
    dropped = sorted(set(shared) - agg.inputs)
    pairs = sum(sum(1 for w in agg.nbrs[v] if w in agg.inputs) for v in dropped)
    taken = sum(len(h) for h in agg.b_shares.values()) + sum(len(h) for h in agg.s_shares.values())
    secrets = [(v, "b", agg.b_shares) for v in sorted(agg.inputs)] + [(v, "s", agg.s_shares)
                                                                     for v in dropped]
    ts = [agg.t[v] for v, _, _ in secrets]
    windows = getattr(agg, "windows", {})
    sets = {(agg.t[v], windows.get((v, w))
             or shamir.first_holders(shares.get(v, {}), agg.answered, agg.t[v]))
            for v, w, shares in secrets}
    held = sum(max(0, len(shares.get(v, {})) - agg.t[v]) for v, _, shares in secrets)
    return unmasked(len(agg.inputs), pairs, len(dropped), agg.total.size,
                    agg.total.dtype.itemsize, len(agg.answered | set(agg.liars)), taken, ts,
                    [k for k, _ in sorted(sets)], held)


def of_task(stage: str, body: dict, arrays: dict, d: int, itemsize: int, prefix: str,
            ddp: bool = False) -> Ops:
    """The work a stage's task asks of its client (as secagg/client.py, secagg/field.py and
    algorithms/secagg_client.py charge it), from the task itself: its neighbours and threshold,
    the senders and partners of its input stage (arrays under `prefix`), the masked vector's d
    values of `itemsize` bytes, flattened and quantized (an input stage's first ask; under a
    codec's grid, its body's levels, clipped and weighted first) and, under a codec's grid
    (its body's wbits), packed. `ddp`: distributed DP's inputs, its own encoding in place of
    quantize (privacy/distributed.encode: its element work and its expected draws)."""
    if stage == "keys":
        return keys()
    if stage == "shares":
        return shares(len(arrays["nbrs"]), int(body["t"]))
    if stage != "input":
        return {}
    out = masked(d, itemsize, len(arrays[prefix + "partners"]))
    if body.get("wbits"):
        add(out, packed(d))
    if body.get("again"):
        return out
    add(out, flattened(d))
    if ddp:
        add(out, ddp_encoded(d, draws=True))
    else:
        add(add(out, quantized(d)), weighted(d) if body.get("levels") else {})
    return add(out, open_shares(len(arrays[prefix + "from"])))


def bound(n: int, d: int) -> Ops:
    """Twice the most protocol work one client's task of a cohort of n can charge: every other
    client a neighbour and the threshold, d values of 8 bytes flattened, clipped and weighted,
    quantized or DP-encoded (each counted), masked and packed."""
    work = add(add(add(add(shares(n, n), open_shares(n)), masked(d, 8, n)), keys()),
               add(quantized(d), packed(d)))
    add(add(add(work, flattened(d)), weighted(d)), ddp_encoded(d, draws=True))
    return {k: 2 * v for k, v in work.items()}
