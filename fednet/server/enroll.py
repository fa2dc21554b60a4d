"""A client process registers its whole id range in one message each way: READY(hellos) ->
one WELCOME -> READY(readys). The server's registration work then follows the processes, not
the clients (50,000 per-client hellos and WELCOMEs kept the server busy for about 14 s).

The claim is proven as a per-client hello's is (server/conns.Connections.check_batch): under
`fednet launch` an HMAC over the ids and a fresh nonce with the processes' secret derived from
the run key; under `--secure` the connection's key must be allowed every id; plaintext `fednet
server` takes ids no live connection holds. Each id is bound to the connection with its own
envelope (the message's envelope must be its first id's), so from then on each client's
messages are checked exactly as if it had registered alone. A reconnect, and a process whose
batch is refused, register client by client (client/host.py).
"""
from __future__ import annotations

import time
from operator import eq
from typing import TYPE_CHECKING

import numpy as np

from fednet.network import latency
from fednet.metrics.accounting import SERVER
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import grant_key
from fednet.transport.channels import SUB_BYTES, Received, sub_frame, sub_frames
from fednet.data.partition import part_sizes
from fednet.types import ClientInfo, client_name

if TYPE_CHECKING:
    from fednet.server.app import ZmqServer

MAX_IDS = 1 << 21  # ids in one READY(hellos)
HELLO_EVERY_S = 2.0  # one READY(hello|hellos) per connection in this time is answered


def batch_ids(got: Received, clients: int, extra: str = "") -> tuple[np.ndarray | None, str]:
    """The ids a READY(hellos|readys) names (its `cids` array: int64, 1-D, distinct, in the
    run's range), or None and why not. `extra`: another array that must match it in length."""
    a = got.msg.arrays.get("cids")
    if a is None or a.ndim != 1 or a.dtype != np.int64 or not 0 < a.size <= MAX_IDS:
        return None, f"a batch needs a 1-D int64 'cids' array of 1 to {MAX_IDS} ids"
    if extra and (got.msg.arrays.get(extra) is None or got.msg.arrays[extra].shape != a.shape
                  or got.msg.arrays[extra].dtype != np.int64):
        return None, f"'{extra}' must be an int64 array as long as 'cids'"
    if int(a.min()) < 0 or int(a.max()) >= clients:
        return None, f"client id out of range: this run has {clients} clients"
    if np.unique(a).size != a.size:
        return None, "a batch names an id twice"
    if got.route[-SUB_BYTES:] != sub_frame(int(a[0])):
        return None, "a batch whose envelope is not its first id"
    return a, ""


def on_hellos(srv: ZmqServer, got: Received) -> None:
    """READY(hellos): bind every id the process proves to (its connection, the id's envelope);
    one WELCOME answers for all of them."""
    cids, why = batch_ids(got, srv.s.cfg.clients)
    if cids is None:
        srv.chan.reject(got, why)
        return srv._send_reject(got, why)
    now = time.monotonic()
    if now - srv._hello_at.get(got.route, -1e9) < HELLO_EVERY_S:
        return srv.chan.reject(got, "repeated hello")
    b, key, base = got.msg.body, got.prop("User-Id"), got.route[:-SUB_BYTES]
    ids = cids.tolist()
    srv._read_monitor()  # an old connection of these ids may have closed just before
    why = srv.conns.check_batch(ids, base, key, b.get("nonce"), b.get("proof"), cids.tobytes())
    if why:
        srv.chan.reject(got, why)
        return srv._send_reject(got, why)
    srv._hello_at[got.route] = now
    srv.chan.accept(got, client_name(ids[0]))
    info = {"endpoint": "", "device": b.get("device", "?"), "pid": b.get("pid", 0),
            "host": b.get("host", "")}  # one record for the process's clients
    # each on this connection's fd: its close loses all of them
    srv.conns.bind_batch(ids, [base + f for f in sub_frames(cids)], key, got.fd)
    srv.hello.update(dict.fromkeys(ids, info))
    if not srv.dead.keys().isdisjoint(ids):
        for cid in ids:
            srv.dead.pop(cid, None)
    _fail_lost_tasks(srv, set(ids))
    srv._send(ids[0], welcome(srv, ids, cids))
    return None


def _fail_lost_tasks(srv: ZmqServer, ids: set[int]) -> None:
    """A client that registers again drops its queued work: the tasks it held are lost."""
    for tid, task in list(srv._pending.items()):
        holder = task.route[srv._holder.get(tid, task.hop)]
        if holder in ids:
            srv._fail(tid, f"client {holder} registered again; the task was lost with its old "
                           "connection")


def welcome(srv: ZmqServer, ids: list[int], cids: np.ndarray) -> Message:
    """One WELCOME for a process's clients: the run's configuration once, and per client (in
    arrays, in the order of `cids`) its partition, profile, rejoin token and, under --secure,
    its grant key."""
    s, conns = srv.s, srv.conns
    body = {"config": srv._config_dict(), "run_id": s.run_id, "peers": s.handoffs}
    arrays = {"cids": cids, "client_profiles": latency.to_array(s.profiles.subset(ids))}
    if not conns.ident.proven:  # plaintext `fednet server`: a reconnect proves itself so
        arrays["tokens"] = _rows([conns.token(c) for c in ids], 16)
    if not callable(getattr(s.parts, "size", None)):  # natural clients build their own rows
        parts = [np.asarray(s.parts[c], dtype=np.int64) for c in ids]
        sizes = np.fromiter((len(p) for p in parts), np.int64, len(parts))
        arrays["indices"] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        arrays["offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if conns.ident.key_ids:  # --secure: the grant keys, and the keys the peer ports admit
        arrays["grants"] = _rows([grant_key(conns.ident.grants, c) for c in ids], 32)
        body["peer_keys"] = list(conns.ident.key_ids)
    from fednet.core.plugin_check import welcome_plugins
    needed = welcome_plugins(s.cfg)
    if needed:
        body["plugins"] = needed
    arrays.update(srv._traces(ids))
    return Message(MsgKind.WELCOME, SERVER, s.run_id, body=body, arrays=arrays)


def _rows(values: list[bytes], width: int) -> np.ndarray:
    return np.frombuffer(b"".join(values), np.uint8).reshape(len(values), width)


def on_readys(srv: ZmqServer, got: Received) -> None:
    """READY(readys): the clients of a welcomed process say how many examples each holds."""
    cids, why = batch_ids(got, srv.s.cfg.clients, extra="n")
    if cids is None:
        return srv.chan.reject(got, why)
    base = got.route[:-SUB_BYTES]
    ids = cids.tolist()
    routes = [base + f for f in sub_frames(cids)]
    if (not all(map(eq, map(srv.conns.route_of.get, ids), routes))
            or not all(map(srv.hello.__contains__, ids))):
        return srv.chan.reject(got, "READY(readys) for a client not registered on this connection")
    n = got.msg.arrays["n"]
    if int(n.min()) < 0:
        return srv.chan.reject(got, "a negative number of examples")
    sizes = part_sizes(srv.s.parts, cids)  # the server's own counts, every client's at once
    wrong = np.flatnonzero(n != sizes)
    if wrong.size:
        bad = int(wrong[0])
        why = srv.examples_problem(ids[bad], int(n[bad]))
        srv.chan.reject(got, why)
        return srv._send_reject(got, why)
    srv.chan.accept(got, client_name(ids[0]))
    hellos = {id(h): h for h in map(srv.hello.__getitem__, ids)}  # one per registration
    if len(hellos) == 1:  # (a process's batch: every client's the same)
        h = next(iter(hellos.values()))  # one record for them all (server/book.py)
        srv.clients.add_process(cids, str(h.get("device", "?")), int(h.get("pid", 0)),
                                str(h.get("host", "")))
        return None
    for cid, size in zip(ids, sizes.tolist()):
        h = srv.hello[cid]
        srv.clients[cid] = ClientInfo(cid, size, str(h.get("device", "?")), "",
                                      int(h.get("pid", 0)), str(h.get("host", "")))
    return None


def on_byes(srv: ZmqServer, got: Received) -> None:
    """BYE for a process's clients (its `cids`, each bound on this connection): the body is
    their ledgers' totals added up, kept with the first id (so the clients' view still adds up)."""
    cids, why = batch_ids(got, srv.s.cfg.clients)
    if cids is None:
        return srv.chan.reject(got, why)
    base, ids = got.route[:-SUB_BYTES], cids.tolist()
    if not all(map(eq, map(srv.conns.route_of.get, ids), [base + f for f in sub_frames(cids)])):
        return srv.chan.reject(got, "BYE for a client not registered on this connection")
    srv.chan.accept(got, client_name(ids[0]))
    srv.byes[ids[0]] = dict(got.msg.body)
    srv.byes.update(dict.fromkeys(ids[1:], NO_TOTALS))
    return None


def late_byes(srv: ZmqServer, got: Received, late: int) -> None:
    """A BYE read after its client's connection was released (its process's exit reported
    first): client `late`'s own, and, for a process's BYE, every id it names that was released
    from this same connection."""
    srv.chan.accept(got, client_name(late))
    ids = [late]
    cids, _ = batch_ids(got, srv.s.cfg.clients) if "cids" in got.msg.arrays else (None, "")
    if cids is not None:
        base = got.route[:-SUB_BYTES]
        ids = [c for c in cids.tolist() if srv.conns.released.get(base + sub_frame(c)) == c]
    for i, c in enumerate(ids):
        srv.byes.setdefault(c, dict(got.msg.body) if i == 0 else NO_TOTALS)


NO_TOTALS: dict = {}  # the BYE record of a client whose totals came added into another's


def by_connection(route_of: dict[int, bytes], cids: list[int]) -> list[list[int]]:
    """`cids` grouped by the connection they are bound to (one message per process)."""
    groups: dict[bytes, list[int]] = {}
    for c in cids:
        route = route_of.get(c)
        groups.setdefault(route[:-SUB_BYTES] if route else b"%d" % c, []).append(c)
    return list(groups.values())
