"""--secure: CURVE encryption on every server and peer link; identities bound to keys.

`fednet keys init DIR` writes the server's key pair. `fednet keys add DIR NAME --ids 0-49`
issues a key pair for one client host (or one client) and records, in DIR/allowed/NAME.key,
which client ids that key may claim. The server admits only keys in DIR/allowed/ (ZAP), and
binds a client id to a connection only when the connection's key may claim it; a key holder
cannot register as, nor take over, another host's clients. A peer accepts a hand-off only from
the key that the server bound to the route's predecessor, and only with the server's grant of
that hop: TASKs carry the route's keys and one grant per hop, an HMAC over the route, keys,
endpoints and task with a key the server gave the receiver alone in its WELCOME
(protocol/proof.py), so no sender chooses the keys it is checked against.
A client host needs DIR/server.key and its own NAME.key + NAME.key_secret; only the server host
needs DIR/server.key_secret and DIR/allowed/. Key files are ZeroMQ's text certificates.
`fednet launch --secure DIR` issues a fresh key pair per client process itself (handed to the
processes through the zygote's pipe), so it needs only the server's pair.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from fednet.errors import ConfigError

log = logging.getLogger("fednet.security")


@dataclass(frozen=True)
class Keys:
    """The key material one process needs (the server's secret only on the server host)."""

    server_public: bytes
    server_secret: bytes | None
    client_public: bytes = b""
    client_secret: bytes = b""
    allowed: dict[str, frozenset[int]] = field(default_factory=dict)  # z85 key -> ids


def ids_text_to_set(text: str, where: str) -> frozenset[int]:
    """'0-3,7' -> {0, 1, 2, 3, 7}; a ConfigError naming `where` otherwise."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part, re.ASCII)
        if m is None:
            raise ConfigError(f"{where}: expected ids such as 0-49 or 0,2,4 (got '{text}')")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b < a:
            raise ConfigError(f"{where}: the range '{part}' runs backwards")
        out.update(range(a, b + 1))
    return frozenset(out)


def init_keys(folder: str | Path) -> list[Path]:
    """Create DIR/server.key(_secret) and an empty DIR/allowed/."""
    d = Path(folder)
    if (d / "server.key_secret").exists():
        raise ConfigError(f"{d} already holds keys; remove it or choose another folder")
    (d / "allowed").mkdir(parents=True, exist_ok=True)
    pub, sec = zmq.auth.create_certificates(str(d), "server")
    Path(sec).chmod(0o600)
    return [Path(pub), Path(sec)]


def add_key(folder: str | Path, name: str, ids: str) -> list[Path]:
    """Issue NAME.key(_secret) in DIR, allowed to claim `ids`; listed in DIR/allowed/."""
    d = Path(folder)
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name, re.ASCII) or name == "server":
        raise ConfigError(f"key name '{name}': use letters, digits, '-', '_' or '.' (not 'server')")
    if not (d / "server.key").exists():
        raise ConfigError(f"{d} has no server key; run `fednet keys init {d}` first")
    if (d / f"{name}.key").exists():
        raise ConfigError(f"{d}/{name}.key exists already; choose another name")
    span = ids_text_to_set(ids, "--ids")
    (d / "allowed").mkdir(exist_ok=True)
    pub, sec = zmq.auth.create_certificates(str(d), name, metadata={"ids": ids})
    Path(sec).chmod(0o600)
    allowed = d / "allowed" / f"{name}.key"
    public = zmq.auth.load_certificate(pub)[0].decode()
    allowed.write_text(f"#   fednet: the client ids that key {name} may claim\nmetadata\n"
                       f'    ids = "{ids}"\ncurve\n    public-key = "{public}"\n')
    log.info("key %s may claim %d client ids", name, len(span))
    return [Path(pub), Path(sec), allowed]


def _cert_ids(path: Path) -> frozenset[int]:
    """The `ids = "..."` metadata of a certificate (empty when it names none)."""
    m = re.search(r'^\s*ids\s*=\s*"([^"]*)"', path.read_text(errors="replace"), re.MULTILINE)
    return ids_text_to_set(m.group(1), str(path)) if m else frozenset()


def list_keys(folder: str | Path) -> dict[str, tuple[str, frozenset[int]]]:
    """allowed/NAME.key -> (z85 public key, ids)."""
    out = {}
    for p in sorted((Path(folder) / "allowed").glob("*.key")):
        pub, _ = zmq.auth.load_certificate(str(p))
        out[p.stem] = (pub.decode(), _cert_ids(p))
    return out


def _client_pair(d: Path, name: str) -> tuple[bytes, bytes]:
    if not name:
        names = sorted(p.name[:-len(".key_secret")] for p in d.glob("*.key_secret")
                       if p.name != "server.key_secret")
        if len(names) != 1:
            found = ", ".join(names) or "none"
            raise ConfigError(f"--secure {d}: say which client key is this host's with --key "
                              f"NAME (found: {found}; issue one with `fednet keys add {d} NAME "
                              "--ids 0-49`)")
        name = names[0]
    pub, sec = zmq.auth.load_certificate(str(d / f"{name}.key_secret"))
    if sec is None:
        raise ConfigError(f"--secure {d}: {name}.key_secret holds no secret key")
    return pub, sec


def load_keys(folder: str | Path, need_server_secret: bool, name: str = "",
              pair: tuple[bytes, bytes] | None = None) -> Keys:
    """The keys in DIR for the server (need_server_secret) or a client host (its key NAME, or
    the z85 `pair` that `fednet launch` issued to it)."""
    d = Path(folder)
    try:
        spub, ssec = zmq.auth.load_certificate(str(d / ("server.key_secret" if need_server_secret
                                                         else "server.key")))
        if need_server_secret:
            if ssec is None:
                raise ConfigError(f"--secure {d}: server.key_secret holds no secret key")
            allowed = {pub: ids for pub, ids in list_keys(d).values()}
            return Keys(spub, ssec, allowed=allowed)
        cpub, csec = pair if pair is not None else _client_pair(d, name)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--secure {d}: cannot read the keys ({e}); create them with "
                          f"`fednet keys init {d}` and `fednet keys add {d} NAME --ids ...`") \
            from None
    return Keys(spub, None, cpub, csec)


class _DenialsAsWarnings(logging.Filter):
    """ZAP reports refusals at DEBUG level; a refused connection deserves a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "DENIED" in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        return False


class _KeySet:
    """ZAP credentials callback: admits the public keys of a (mutable) set; None admits any
    CURVE key (peers check the sender's key against the route themselves)."""

    def __init__(self, keys: set[bytes] | None) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return self.keys is None or key in self.keys


def _zap_log() -> logging.Logger:
    zap_log = logging.getLogger("fednet.security.zap")
    zap_log.setLevel(logging.DEBUG)
    if not any(isinstance(f, _DenialsAsWarnings) for f in zap_log.filters):
        zap_log.addFilter(_DenialsAsWarnings())
    return zap_log


def start_authenticator(ctx: zmq.Context, allowed: set[bytes] | None = None
                        ) -> ThreadAuthenticator:
    """ZAP handler for this context: admits the z85 public keys in `allowed` (None: any key
    that completes the CURVE handshake); the connection's User-Id is its z85 public key."""
    auth = ThreadAuthenticator(ctx, log=_zap_log())
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_KeySet(allowed))
    return auth


def as_server(sock: zmq.Socket, public: bytes, secret: bytes) -> None:
    """Make sock a CURVE server (before bind)."""
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def as_client(sock: zmq.Socket, server_public: bytes, keys: Keys) -> None:
    """Make sock a CURVE client of the server with that public key (before connect)."""
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = server_public


def server_guard(ctx: zmq.Context, secure: str, key_ids: dict[str, frozenset[int]], run_key: bytes | None
                 ) -> tuple[Callable[[zmq.Socket], None] | None, Any]:
    """(setup of the server's ROUTER, its ZAP handler): under --secure a CURVE server whose
    ZAP admits only the allowed keys; under plaintext `fednet launch` the run key's gate;
    plaintext `fednet server` admits anyone (its threat model says so). Either handler has
    stop()."""
    if secure:
        keys = load_keys(secure, need_server_secret=True)
        auth = start_authenticator(ctx, {k.encode() for k in key_ids})
        secret = keys.server_secret
        assert secret is not None  # need_server_secret: load_keys refused a folder without it
        return (lambda s: as_server(s, keys.server_public, secret)), auth
    if run_key:
        from fednet.protocol.proof import gate_password
        from fednet.transport import gate

        return gate.server, gate.Gate(ctx, gate_password(run_key))
    return None, None
