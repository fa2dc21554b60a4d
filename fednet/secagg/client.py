"""A client's half of secure aggregation (Bonawitz et al. 2017, section 4; SecAgg+ replaces
"every other client" by "its neighbours"), one function per stage, over numpy arrays:

  keys    two X25519 key pairs: c (to seal the shares it sends) and s (to agree masks);
  shares  b (its self-mask seed) and its s private key, Shamir-shared among its neighbours with
          threshold t, each share sealed (AES-GCM) for its neighbour with the key c agrees;
  input   the shares addressed to it opened and kept; its update quantized, weighted and masked:
          y = n q(x) + PRG(b) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)  (mod 2^f),
          over its neighbours that completed the shares stage; the senders whose shares did
          not open are named to the server, which may ask for the same n q(x) masked again
          with those senders left out of the partners (`remasked`);
  unmask  for each neighbour the server says survived, its share of that neighbour's b; for each
          that dropped after sharing, its share of its s key; never both for one neighbour.

A client's secrets live in a Session (keyed by client and round in this process: the stages of
one round are four tasks) and go when its unmask stage is answered or a later round starts.
Every random draw comes from the caller's seeded generators."""
from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field

import numpy as np

from fednet import opcount as ops
from fednet.secagg import cost, crypto, shamir

SB = shamir.SHARE_BYTES
SEALED_BYTES = 8 + 8 + 2 * SB + crypto.TAG_BYTES  # ids, two shares, the AES-GCM tag
_IDS = struct.Struct(">qq")


@dataclass
class Session:
    """One client's secrets and what it learned in one round."""

    cid: int
    rnd: int
    c_sk: bytes
    s_sk: bytes
    c_pk: bytes
    s_pk: bytes
    b: bytes = b""
    neighbours: list[int] = field(default_factory=list)
    pks: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # v -> (c_pk, s_pk)
    held: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # v -> (b, s)
    q: np.ndarray | None = None  # its weighted quantized update (masked again on request)
    partners: frozenset[int] = frozenset()  # whom it masked with at the input stage
    sealing: dict[int, bytes] = field(default_factory=dict)  # v -> the key c agrees with v's
    c_key: crypto.X25519PrivateKey | None = None  # c_sk and s_sk as keys (private()), built
    s_key: crypto.X25519PrivateKey | None = None  # once: each agreement then costs one exchange


SESSIONS: dict[int, Session] = {}
"""This process's clients' sessions, by client id (one round at a time each)."""


def share_info(rnd: int) -> bytes:
    return b"fednet-secagg-share|%d" % rnd


def mask_info(rnd: int) -> bytes:
    return b"fednet-secagg-mask|%d" % rnd


def nonce(rnd: int, sender: int, receiver: int) -> bytes:
    """AES-GCM's 12-byte nonce: one key per pair and round, one message each way."""
    return struct.pack(">IQ", rnd & 0xFFFFFFFF, (sender << 32) ^ receiver)[:12]


def keys(cid: int, rnd: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Stage keys: a new session, its two public keys."""
    ops.charge(cost.keys())  # (the task's meter: its protocol work on the clock)
    c_sk = rng.bytes(32)
    c_key = crypto.private(c_sk)
    s_sk = rng.bytes(32)
    s_key = crypto.private(s_sk)
    c_pk, s_pk = crypto.public(c_key), crypto.public(s_key)
    SESSIONS[cid] = Session(cid, rnd, c_sk, s_sk, c_pk, s_pk, c_key=c_key, s_key=s_key)
    return {"c_pk": np.frombuffer(c_pk, np.uint8).copy(),
            "s_pk": np.frombuffer(s_pk, np.uint8).copy()}


def session(cid: int, rnd: int) -> Session:
    """The session of client cid for round rnd; ValueError when it has none."""
    s = SESSIONS.get(cid)
    if s is None or s.rnd != rnd:
        raise ValueError(f"client {cid} has no secure-aggregation session for round {rnd + 1} (its "
                         "keys stage did not run here)")
    return s


def shares(s: Session, nbrs: np.ndarray, c_pks: np.ndarray, s_pks: np.ndarray, t: int,
           rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Stage shares: b drawn; b and the s key shared among the neighbours, sealed for each."""
    ids = [int(v) for v in nbrs]
    s.neighbours = ids
    c_list, s_list = [bytes(k) for k in c_pks], [bytes(k) for k in s_pks]
    s.pks = {v: (c_list[i], s_list[i]) for i, v in enumerate(ids)}
    s.b = rng.bytes(32)
    ops.charge(cost.shares(len(ids), t))
    b_sh, s_sh = shamir.share_rows_many([s.b, s.s_sk], ids, t, rng)  # (b's draws, then s's)
    pairs = np.empty((len(ids), 2), ">i8")  # (cid, v): the plaintext's head and the AAD
    pairs[:, 0], pairs[:, 1] = s.cid, ids
    heads = pairs.view(np.uint8).reshape(len(ids), 16)
    plains = np.hstack([heads, shamir.encode_rows(b_sh), shamir.encode_rows(s_sh)]).tobytes()
    head_bytes = heads.tobytes()
    c_key = s.c_key or crypto.private(s.c_sk)
    keys = crypto.agree_many(c_key, c_list, share_info(s.rnd), s.c_pk if s.c_key else b"")
    s.sealing.update(zip(ids, keys))  # (kept: the shares v seals for it open with them)
    n_plain = 16 + 2 * SB
    seal, rnd, cid = crypto.seal, s.rnd, s.cid
    sealed = [seal(key, nonce(rnd, cid, v), plains[i * n_plain:(i + 1) * n_plain],
                   head_bytes[i * 16:(i + 1) * 16]) for i, (v, key) in enumerate(zip(ids, keys))]
    return {"to": np.array(ids, np.int64),
            "sealed": np.frombuffer(b"".join(sealed), np.uint8).reshape(len(ids), SEALED_BYTES
                                                                        ).copy()}


def open_shares(s: Session, senders: np.ndarray, sealed: np.ndarray) -> list[int]:
    """The shares the neighbours sealed for this client, opened and kept; the senders whose
    share does not open (or names other parties than its sender and this client) are returned,
    not raised: they are the senders' fault, which the server is told (ValueError only for a
    sender that is no neighbour: the server's routing)."""
    bad = []
    ops.charge(cost.open_shares(len(senders)))
    opened: list[tuple[int, bytes]] = []
    c_key = s.c_key or crypto.private(s.c_sk)
    unseal, rnd, cid = crypto.unseal, s.rnd, s.cid
    for v, row in zip((int(x) for x in senders), _rows(sealed)):
        if v not in s.pks:
            raise ValueError(f"a share from client {v}, who is not a neighbour")
        key = s.sealing.get(v) or crypto.agree(c_key, s.pks[v][0], share_info(rnd))
        ids = _IDS.pack(v, cid)
        try:
            plain = unseal(key, nonce(rnd, v, cid), row, ids)
        except ValueError:
            bad.append(v)
            continue
        if len(plain) != 16 + 2 * SB or plain[:16] != ids:
            bad.append(v)  # (names other parties, or is no pair of shares)
            continue
        opened.append((v, plain))
    if opened:  # the shares decoded at once: a row whose chunks are no field elements is bad
        y, ok = shamir.decode_rows(np.frombuffer(b"".join(p[16:] for _, p in opened), np.uint8
                                                 ).reshape(len(opened) * 2, SB))
        for i, (v, _) in enumerate(opened):
            if ok[2 * i] and ok[2 * i + 1]:
                s.held[v] = (y[2 * i], y[2 * i + 1])
            else:
                bad.append(v)
    if len(bad) > 1:  # (in the senders' order, as they were found)
        at = {int(x): i for i, x in enumerate(senders)}
        bad.sort(key=at.__getitem__)
    return bad


def _rows(sealed: np.ndarray) -> list[bytes]:
    """bytes(row) of each row of `sealed` (a C-ordered 2-d uint8 array: slices of its bytes)."""
    if isinstance(sealed, np.ndarray) and sealed.ndim == 2 and sealed.dtype == np.uint8 \
            and sealed.flags.c_contiguous:
        raw, w = sealed.tobytes(), sealed.shape[1]
        return [raw[i * w:(i + 1) * w] for i in range(sealed.shape[0])]
    return [bytes(row) for row in sealed]


def pair_key(s_sk: bytes | crypto.X25519PrivateKey, other_pk: bytes, rnd: int) -> bytes:
    """The key of the pairwise mask both ends of an edge derive (their s keys agreed), the seed
    of its AES-CTR keystream (crypto.mask, crypto.add_mask)."""
    return crypto.agree(s_sk, other_pk, mask_info(rnd))


def masked(s: Session, values: np.ndarray, partners: np.ndarray) -> np.ndarray:
    """Stage input: values (elements of Z_2^f, the weighted quantized update) masked with the
    self mask and one pairwise mask per partner (its neighbours that completed the shares
    stage): added for a partner of a larger id, subtracted for a smaller one.

    In one process (crypto.SHARE_ENDS), a pairwise mask is expanded once: the end that masks
    first adds it to its own vector and to the other end's sum of kept masks (MASKS), signed as
    the other end adds it; the other end adds that sum once, in place of each mask it holds.
    The sum modulo 2^f does not depend on the order of its terms: the same bytes."""
    ops.charge(cost.masked(values.size, values.dtype.itemsize, len(partners)))
    y = np.array(values, copy=True)  # (its own: the masks are added in place)
    crypto.add_mask(y, s.b)
    ids = [int(x) for x in partners]
    for v in ids:
        if v not in s.pks:
            raise ValueError(f"a mask partner {v} who is not a neighbour")
    s_key = s.s_key or crypto.private(s.s_sk)
    keys = crypto.agree_many(s_key, [s.pks[v][1] for v in ids], mask_info(s.rnd),
                             s.s_pk if s.s_key else b"")
    if not crypto.SHARE_ENDS:  # (each end expands its own, as in a deployment)
        for v, key in zip(ids, keys):
            crypto.add_mask(y, key, 1 if s.cid < v else -1)
        return y
    done = MASKS.take(s.rnd, s.cid, keys, y)  # (the partners' masks kept for it: added)
    for v, key in zip(ids, keys):
        if key in done:
            continue
        sign = 1 if s.cid < v else -1
        other = SESSIONS.get(v)
        if other is not None and other.rnd == s.rnd and other.q is None and MASKS.room(y):
            m = crypto.mask_view(key, y.size, y.dtype)  # (v masks here later: kept for it)
            (np.add if sign > 0 else np.subtract)(y, m, out=y)
            MASKS.keep(s.rnd, v, key, m, -sign, y)
        else:
            crypto.add_mask(y, key, sign)
    return y


class _Masks:
    """Pairwise masks kept for the other end of their pair when it runs in this process and
    has not masked yet (`fednet local`; a launch client process's own clients): for each such
    client, the sum of the masks its partners expanded for it, each signed as it adds it, and
    their keys; it adds the sum once in place of expanding each. For one round at a time (a
    new round's first keep empties it), a client's sum taken away when it masks, at most
    BUDGET bytes (past it, nothing more is kept: the other end expands its own)."""

    BUDGET = 256 << 20

    def __init__(self) -> None:
        self.rnd = -1
        self.held: dict[int, tuple[np.ndarray, set[bytes]]] = {}  # client -> (sum, keys)
        self.size = 0
        self.lock = threading.Lock()

    def room(self, y: np.ndarray) -> bool:
        """Whether one more client's sum of y's size may be kept (a rough check: keep()
        decides)."""
        return self.size + y.nbytes <= self.BUDGET

    def take(self, rnd: int, cid: int, keys: list[bytes], y: np.ndarray) -> set[bytes]:
        """The keys of the masks kept for client cid, their sum added to y in place; an empty
        set when none is kept, or when the sum holds a mask of another key than `keys` or
        another size than y's (then it is dropped: the client expands each of its own)."""
        if rnd != self.rnd or not self.held:
            return set()
        with self.lock:
            got = self.held.pop(cid, None)
            if got is not None:
                self.size -= got[0].nbytes
        if got is None:
            return set()
        total, done = got
        if total.shape != y.shape or total.dtype != y.dtype or not done <= set(keys):
            return set()
        np.add(y, total, out=y)
        return done

    def keep(self, rnd: int, cid: int, key: bytes, m: np.ndarray, sign: int,
             like: np.ndarray) -> None:
        """sign * m (m = mask(key, ...), like's size and type) added to client cid's sum, within
        BUDGET."""
        with self.lock:
            if rnd != self.rnd:
                self.rnd, self.held, self.size = rnd, {}, 0
            got = self.held.get(cid)
            if got is None:
                if self.size + like.nbytes > self.BUDGET:
                    return
                total = m.copy() if sign > 0 else np.negative(m)
                self.held[cid] = (total, {key})
                self.size += total.nbytes
                return
            total, done = got
            if key in done or total.shape != m.shape:
                return
            (np.add if sign > 0 else np.subtract)(total, m, out=total)
            done.add(key)


MASKS = _Masks()


def remasked(s: Session, partners: np.ndarray) -> np.ndarray:
    """The input stage asked again (some survivor could not open a sender's shares, and the
    server left the sender out): the same weighted quantized update, masked with the partners
    the server names now. The two masked vectors differ only by the pairwise masks of the
    partners left out (the self mask and the update cancel), which those partners know; it is
    refused (ValueError) unless the partners are some of the first ones (none would leave the
    update under its self mask alone)."""
    if s.q is None:
        raise ValueError(f"client {s.cid} has no masked input of round {s.rnd + 1} to send again")
    asked = {int(v) for v in partners}
    if not asked or not asked < s.partners:  # only some of its first, and never none
        raise ValueError("the partners asked again are not some of its first ones")
    return masked(s, s.q, partners)


def unmask(s: Session, survivors: np.ndarray, dropped: np.ndarray) -> dict[str, np.ndarray]:
    """Stage unmask: the b shares of the survivors and the s shares of the dropped; refused
    (ValueError) when one neighbour is named in both, which would reveal its update."""
    alive, gone = {int(v) for v in survivors}, {int(v) for v in dropped}
    if alive & gone:
        raise ValueError(f"the server asks both shares of client(s) {sorted(alive & gone)}")
    missing = sorted((alive | gone) - set(s.held))
    if missing:
        raise ValueError(f"no share held of client(s) {missing[:5]}")
    b = sorted(alive)
    d = sorted(gone)
    SESSIONS.pop(s.cid, None)
    return {"b_of": np.array(b, np.int64),
            "b_share": _encoded([s.held[v][0] for v in b]),
            "s_of": np.array(d, np.int64),
            "s_share": _encoded([s.held[v][1] for v in d])}


def _encoded(shares: list[np.ndarray]) -> np.ndarray:
    """The shares' bytes, a row each (shamir.encode_rows)."""
    return shamir.encode_rows(np.array(shares, np.int64).reshape(len(shares), -1)) if shares \
        else np.zeros((0, SB), np.uint8)
