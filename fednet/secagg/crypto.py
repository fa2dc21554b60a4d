"""The primitives of secure aggregation, all from the `cryptography` library (no home-made
cipher or PRG): X25519 key agreement, HKDF-SHA256 to derive keys from the agreed secret,
AES-256-GCM to seal the secret shares a client sends another one through the server, and
AES-256-CTR as the pseudo-random generator of the masks.

Keys come from the caller's seed bytes (fednet derives them from the run's seeded streams, so
that `fednet local` and `fednet launch` agree bit for bit); a deployment draws them from the OS.
"""
from __future__ import annotations

import threading

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
TAG_BYTES = 16  # AES-GCM's


def keypair(seed: bytes) -> tuple[bytes, bytes]:
    """(private, public) X25519 key bytes from 32 seed bytes."""
    sk = X25519PrivateKey.from_private_bytes(seed[:KEY_BYTES])
    return seed[:KEY_BYTES], sk.public_key().public_bytes_raw()


def private(sk: bytes) -> X25519PrivateKey:
    """The X25519 private key of 32 key bytes, to agree many keys with (building it is an
    X25519 multiplication of its own, as long as an agreement: build it once per key)."""
    return X25519PrivateKey.from_private_bytes(sk[:KEY_BYTES])


def public(key: X25519PrivateKey) -> bytes:
    """The public key bytes of a private() key (keypair's second half)."""
    return key.public_key().public_bytes_raw()


def agree(key: bytes | X25519PrivateKey, public: bytes, info: bytes, own: bytes = b"") -> bytes:
    """A 32-byte key both ends derive: HKDF-SHA256 of the X25519 shared secret of `key` (its
    bytes, or private()'s object) and `public`, bound to `info`; ValueError for a public key
    that is not one (a low-order point). `own`: the public key of `key`, when the caller has
    it (else derived from `key`).

    The two ends of a pair derive the same key, and an emulator often runs both in one process
    (`fednet local`; a client process of `fednet launch` with several clients): the key is kept
    (PAIRS) for the other end, which takes it in place of its own exchange. Only a holder of
    one of the two private keys gets it: the look-up is by the pair of public keys, the
    caller's own derived from the key it passes (a set of bytes nobody else can name as their
    own); and the key is the one the other end's exchange gives, X25519 being symmetric, so the
    bytes are the same. A deployment's client holds one end only and always exchanges."""
    return _agree(key, [public], info, own)[0]


def agree_many(key: bytes | X25519PrivateKey, publics: list[bytes], info: bytes,
               own: bytes = b"") -> list[bytes]:
    """agree(key, p, info) of each public key p, in their order: the same keys, the kept ones
    (PAIRS) taken under one lock and the others' kept under another. `own`: the public key of
    `key`, when the caller has it: the look-up is then by the public key the caller passes,
    so it must be `key`'s (secagg/client's Session keeps both)."""
    return _agree(key, publics, info, own)


def _agree(key: bytes | X25519PrivateKey, publics: list[bytes], info: bytes, own: bytes
           ) -> list[bytes]:
    sk = key if isinstance(key, X25519PrivateKey) else private(key)
    if not own or not isinstance(key, X25519PrivateKey):  # (bytes: the key's own, derived)
        own = sk.public_key().public_bytes_raw()
    others = [bytes(p) for p in publics]
    pairs = [(own, o) if own < o else (o, own) for o in others]
    kept: list[bytes | None] = [None] * len(others)
    if SHARE_ENDS:
        with _PAIRS_LOCK:
            memo = PAIRS.get(info)
            if memo is not None:
                kept = [memo.pop(pair, None) for pair in pairs]  # (the second end's)
    out: list[bytes] = []
    fresh: list[tuple[tuple[bytes, bytes], bytes]] = []
    try:
        for other, pair, got in zip(others, pairs, kept):
            if got is None:
                shared = sk.exchange(X25519PublicKey.from_public_bytes(other))
                got = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                           info=info).derive(shared)
                if other != own:  # (a key agreed with its own public key has no other end)
                    fresh.append((pair, got))
            out.append(got)
    finally:  # (those agreed before an exchange that failed are kept, as one by one)
        if SHARE_ENDS and fresh:
            _keep(info, fresh)
    return out


SHARE_ENDS = True
"""True (the default): the two ends of a pair in one process share their agreed key (PAIRS) and
their pairwise mask (secagg/client.MASKS), an emulator's shortcut that changes no bit. False:
each end exchanges and expands on its own, as a deployment's client does; the CPU a client then
takes is what the simulated clock counts (benchmarks/bench_compute.py measures it so)."""


PAIRS: dict[bytes, dict[tuple[bytes, bytes], bytes]] = {}
"""agree()'s keys kept for the other end of their pair, by `info` (a round and a purpose), then
by the pair's public keys in byte order; taken away when the other end asks. At most
PAIRS_INFOS infos and PAIRS_MOST keys each (the oldest info dropped first; a full one
emptied): a key not kept only costs its other end an exchange."""
PAIRS_INFOS, PAIRS_MOST = 4, 1 << 17


_PAIRS_LOCK = threading.Lock()


def _keep(info: bytes, kept: list[tuple[tuple[bytes, bytes], bytes]]) -> None:
    with _PAIRS_LOCK:
        memo = PAIRS.get(info)
        if memo is None:
            while len(PAIRS) >= PAIRS_INFOS:
                del PAIRS[next(iter(PAIRS))]
            memo = PAIRS[info] = {}
        for pair, derived in kept:
            if len(memo) >= PAIRS_MOST:
                memo.clear()
            memo[pair] = derived


_P = 2 ** 255 - 19
LOW_ORDER = frozenset(u.to_bytes(KEY_BYTES, "little") for u in (
    0, 1, _P - 1, _P, _P + 1,  # orders 4, 1, 2 and the non-canonical encodings of 0 and 1
    325606250916557431795983626356110631294008115727848805560023387167927233504,  # order 8
    39382357235489614581723060781553021112529911719440698176882885853963445705823))  # order 8
"""The u-coordinates of Curve25519's points of small order, as encoded (libsodium's
has_small_order list): every X25519 agreement with one of them gives the all-zero secret, which
`cryptography` refuses. X25519 ignores the top bit, so it is cleared before the look-up."""


def usable(public: bytes) -> bool:
    """True when `public` is an X25519 public key that a key agreement can use: 32 bytes and
    not a point of small order (LOW_ORDER: the all-zero key among them), so that no
    neighbour's agreement with it can fail. A set look-up, not an agreement (54 us each)."""
    b = bytearray(bytes(public))
    if len(b) != KEY_BYTES:
        return False
    b[31] &= 0x7F
    return bytes(b) not in LOW_ORDER


def seal(key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM: ciphertext and tag."""
    return AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
    """The plaintext of seal(); ValueError when it was changed or is not for this key."""
    try:
        return AESGCM(key).decrypt(nonce, sealed, aad)
    except InvalidTag:
        raise ValueError("a sealed share that does not open (changed, or not for this key)"
                         ) from None


def mask(seed: bytes, n: int, dtype: np.dtype) -> np.ndarray:
    """n pseudo-random integers of `dtype` (uint32 or uint64: uniform modulo 2^32 or 2^64),
    the AES-256-CTR keystream under the 32-byte `seed`."""
    dt = np.dtype(dtype)
    buf = _stream(seed, n * dt.itemsize, bytearray(n * dt.itemsize + 15))
    return np.frombuffer(buf, dtype=dt.newbyteorder("<"), count=n).astype(dt, copy=False)


def mask_view(seed: bytes, n: int, dtype: np.dtype) -> np.ndarray:
    """mask(seed, n, dtype) in this thread's scratch buffer (add_mask's), without a copy: valid
    until the thread's next mask_view or add_mask."""
    return _scratch_mask(seed, n, dtype)


def _scratch_mask(seed: bytes, n: int, dtype: np.dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    n_bytes = n * dt.itemsize
    scratch = getattr(_LOCAL, "buf", None)
    if scratch is None or len(scratch) < n_bytes + 15:
        scratch = _LOCAL.buf = bytearray(n_bytes + 15)
    _stream(seed, n_bytes, scratch)
    return np.frombuffer(scratch, dtype=dt.newbyteorder("<"), count=n)


def add_mask(y: np.ndarray, seed: bytes, sign: int = 1) -> np.ndarray:
    """y + mask(seed, y.size, y.dtype) (sign -1: minus), in place (y: a 1-d unsigned array of
    its own); y. The keystream goes through one scratch buffer a thread."""
    m = _scratch_mask(seed, y.size, y.dtype)
    (np.add if sign > 0 else np.subtract)(y, m, out=y, casting="unsafe")
    return y


_LOCAL = threading.local()
_ZEROS: dict[int, bytes] = {}
try:  # the AES context without Cipher()'s checks (9 us where Cipher().encryptor() takes 23)
    from cryptography.hazmat.bindings._rust import openssl as _rust

    _CONTEXT = getattr(getattr(_rust, "ciphers", None), "create_encryption_ctx", None)
except ImportError:  # (another build of `cryptography`: Cipher, the same keystream)
    _CONTEXT = None


_CTR0 = modes.CTR(bytes(16))  # (the mode and its counter block 0: one object for every stream)


def _stream(seed: bytes, n_bytes: int, buf: bytearray) -> bytearray:
    """n_bytes of AES-256-CTR keystream under `seed` (counter block 0 first) written to the
    start of buf (at least n_bytes + 15 long: update_into's room); buf."""
    zeros = _ZEROS.get(n_bytes)
    if zeros is None:
        if len(_ZEROS) > 8:
            _ZEROS.clear()
        zeros = _ZEROS[n_bytes] = bytes(n_bytes)
    aes = algorithms.AES(seed[:KEY_BYTES])
    enc = _CONTEXT(aes, _CTR0) if _CONTEXT is not None else Cipher(aes, _CTR0).encryptor()
    enc.update_into(zeros, buf)
    return buf
