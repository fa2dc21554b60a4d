"""Secure aggregation's work counted in operations (fednet/opcount.py), from the protocol's own
parameters: a client's neighbours k, the share threshold t, the vector's length d and element
size, who survived and who dropped. The client's half charges these where it does the work
(secagg/client.py, into its task's meter); the server's are read by the round's clock
(algorithms/secagg.py) and by the benchmarks. Nothing here reads a clock.

What is counted is what fednet's implementation does (docs/usage.md, "Compute on the clock"):
a key agreement is one X25519 multiplication and one HKDF derivation; a share is t multiply-adds
per 30-bit chunk of the secret (Horner); a mask is its bytes of AES-CTR keystream; the server's
sums and mask removals are element operations ("stream"). The server's unmasking takes each
share a survivor gives back ("taken": decoded from its bytes and kept), rebuilds each secret
from its first t holders ("rebuilt": t shares stacked, weighted and summed modulo P) with the
Lagrange weights of that set of holders, computed once per distinct set in the round
(shamir._weights: "lagrange", a pass and a modular inverse per point, and 2 t multiply-adds per
point, "shamir": O(t^2) a set)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fednet.opcount import Ops, add
from fednet.secagg import shamir

CHUNKS = shamir.chunks()  # field elements of a 32-byte secret


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


def summed(inputs: int, d: int) -> Ops:
    """The server's input stage: the masked inputs added modulo 2^f."""
    return {"stream": inputs * d}


def unmasked(survivors: int, pairs: int, dropped: int, d: int, itemsize: int, taken: int = 0,
             t: Sequence[int] = (), sets: Sequence[int] = ()) -> Ops:
    """The server's unmasking: the `taken` shares the survivors gave back decoded and kept; each
    survivor's b and each dropped client's s key rebuilt (`t`: each secret's threshold, the
    shares read into its reconstruction; `sets`: the size of each distinct set of holders whose
    Lagrange weights are computed, t points each and 2 t multiply-adds a point; a rebuilt s key
    checked: one X25519 multiplication), every survivor's self mask and the `pairs` pairwise
    masks of the dropped with their surviving neighbours expanded (an agreement and d elements
    each) and taken off."""
    masks = survivors + pairs
    return {"taken": taken, "rebuilt": sum(t), "lagrange": sum(sets),
            "shamir": sum(2 * k * k for k in sets), "x25519": dropped + pairs, "kdf": pairs,
            "prg": masks * d * itemsize, "stream": masks * d}


def unmasking(agg: Any) -> Ops:
    """`unmasked` for a round's Aggregation (secagg/server.py) as it stands at its end: the
    shares it took, and each secret rebuilt from its first t holders that answered (the
    weights of a set of holders computed once in the round; the process keeps up to 4096 sets
    between rounds, which a later round with the same holders finds ready: not counted)."""
    dropped = sorted(set(agg.shared()) - agg.inputs)
    pairs = sum(sum(1 for w in agg.nbrs[v] if w in agg.inputs) for v in dropped)
    taken = sum(len(h) for h in agg.b_shares.values()) + sum(len(h) for h in agg.s_shares.values())
    ts, sets = [], set()
    for held, secrets in ((agg.b_shares, sorted(agg.inputs)), (agg.s_shares, dropped)):
        for v in secrets:
            t = agg.t[v]
            ts.append(t)
            sets.add(tuple(sorted(h for h in held.get(v, {}) if h in agg.answered)[:t]))
    return unmasked(len(agg.inputs), pairs, len(dropped), agg.total.size,
                    agg.total.dtype.itemsize, taken, ts, [len(s) for s in sets])


def of_task(stage: str, body: dict, arrays: dict, d: int, itemsize: int, prefix: str) -> Ops:
    """The work a stage's task asks of its client (as secagg/client.py charges it), from the
    task itself: its neighbours and threshold, the senders and partners of its input stage
    (arrays under `prefix`) and the masked vector's d values of `itemsize` bytes."""
    if stage == "keys":
        return keys()
    if stage == "shares":
        return shares(len(arrays["nbrs"]), int(body["t"]))
    if stage != "input":
        return {}
    out = masked(d, itemsize, len(arrays[prefix + "partners"]))
    return out if body.get("again") else add(out, open_shares(len(arrays[prefix + "from"])))


def bound(n: int, d: int) -> Ops:
    """Twice the most protocol work one client's task of a cohort of n can charge: every other
    client a neighbour and the threshold, d values of 8 bytes masked."""
    work = add(add(add(shares(n, n), open_shares(n)), masked(d, 8, n)), keys())
    return {k: 2 * v for k, v in work.items()}
