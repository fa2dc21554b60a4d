"""Proofs of identity that travel in messages: a client process's hello proof and a hand-off's tag.

Under `fednet launch` the server draws a run key and hands it to the zygote through its pipe
(never over a socket); plaintext `fednet server`'s run key is its join key file (join_key.py). The
client processes' secret is derived from it (`process_secret`); a process proves the ids it
claims at READY(hellos) with HMAC-SHA256(secret, "hellos" | nonce | ids), and the server
refuses a reused nonce. Peers tag each HANDOFF with HMAC(peer key, run | round | task | hop |
sender) truncated to 16 bytes, so only the run's own clients can hand a model on. Without a run
key (a server embedded without a join key) the tag is all zeros and carries no proof.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import os

import msgpack

from fednet.protocol.schema import MAC_BYTES

NO_MAC = b"\0" * MAC_BYTES
"""The tag of a hand-off in a run without a peer key (and the in-process placeholder)."""


def new_run_key() -> bytes:
    """32 random bytes: the launch's root secret."""
    return os.urandom(32)


def _derive(key: bytes, label: bytes) -> bytes:
    return hmac.new(key, label, hashlib.sha256).digest()


@functools.lru_cache(maxsize=4)  # every client of a process asks: one HMAC, not one each
def peer_key(run_key: bytes) -> bytes:
    """The key that tags hand-offs between the run's clients."""
    return _derive(run_key, b"fednet peers")


@functools.lru_cache(maxsize=4)
def gate_password(run_key: bytes) -> str:
    """The PLAIN password that admits a connection to any socket of a plaintext `fednet launch`
    (transport/gate.Gate): only holders of the run key complete a handshake."""
    return _derive(run_key, b"fednet gate").hex()


def process_secret(run_key: bytes) -> bytes:
    """The secret with which a client process proves the ids it claims (READY(hellos))."""
    return _derive(run_key, b"fednet processes")


def hellos_proof(secret: bytes, cids: bytes, nonce: bytes) -> bytes:
    """What a client process sends with READY(hellos) for the ids `cids` (their int64 bytes)."""
    return hmac.new(secret, b"hellos|" + nonce + b"|" + cids, hashlib.sha256).digest()


def handoff_tag(key: bytes | None, run_id: str, rnd: int, task_id: int, hop: int,
                sender: str) -> bytes:
    """The tag a HANDOFF carries (all zeros without a key)."""
    if not key:
        return NO_MAC
    msg = f"{run_id}|{rnd}|{task_id}|{hop}|{sender}".encode()
    return hmac.new(key, msg, hashlib.sha256).digest()[:MAC_BYTES]


def check_handoff(key: bytes | None, tag: bytes, run_id: str, rnd: int, task_id: int, hop: int,
                  sender: str) -> bool:
    """True when the tag is right for these fields (always, without a key)."""
    if not key:
        return True
    return hmac.compare_digest(handoff_tag(key, run_id, rnd, task_id, hop, sender), tag)


def rejoin_token(master: bytes, conn: bytes) -> bytes:
    """What the server gives a connection in its WELCOME (one token for all the clients it
    holds) and takes back in a later hello as proof that the sender is the process it welcomed
    (a reconnect), so that the ids it held are taken over at once, not refused as "already
    connected" until the server sees the old connection close."""
    return _derive(master, b"fednet rejoin " + conn)[:16]


def grant_key(master: bytes, cid: int) -> bytes:
    """Client cid's grant key under --secure: derived from the server's own secret and sent to
    cid alone, in its WELCOME (over its authenticated, encrypted link)."""
    return _derive(master, b"fednet grants %d" % cid)


def route_grant(key: bytes, run_id: str, rnd: int, task_id: int, hop: int, route: list[int],
                keys: list[str], endpoints: list[str], kind: str, body: object,
                stage: str = "") -> bytes:
    """The server's grant of hop `hop` of a task: an HMAC with the receiver's grant key over
    everything a hand-off tells its receiver (route, keys, endpoints, kind, the task body and
    the protocol stage the ledger files its bytes under), so that a sender can choose none of
    it. One per hop travels in the TASK and its HANDOFFs."""
    fields = [run_id, int(rnd), int(task_id), int(hop), [int(c) for c in route], list(keys),
              list(endpoints), kind, body, stage]
    data = msgpack.packb(fields, use_bin_type=True, use_single_float=False)
    return hmac.new(key, data, hashlib.sha256).digest()[:MAC_BYTES]


def route_grants(master: bytes, run_id: str, rnd: int, task_id: int, route: list[int],
                 keys: list[str], endpoints: list[str], kind: str, body: object,
                 stage: str = "") -> list[bytes]:
    """Every hop's grant (hop 0, which the server itself sends, holds NO_MAC)."""
    return [NO_MAC] + [route_grant(grant_key(master, int(route[h])), run_id, rnd, task_id, h,
                                   route, keys, endpoints, kind, body, stage)
                       for h in range(1, len(route))]


def check_grant(key: bytes | None, grant: bytes, run_id: str, rnd: int, task_id: int, hop: int,
                route: list[int], keys: list[str], endpoints: list[str], kind: str,
                body: object, stage: str = "") -> bool:
    """True when `grant` is the server's for these fields and this receiver's key."""
    if not key:
        return False
    return hmac.compare_digest(route_grant(key, run_id, rnd, task_id, hop, route, keys,
                                           endpoints, kind, body, stage), grant)
