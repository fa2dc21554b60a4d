"""--secure: CURVE encryption on every server and peer link, ZAP authentication of clients.

`fednet keys init DIR` writes a server key pair and one cluster key pair for the clients, and
puts the cluster's public key in DIR/allowed/. The server accepts only clients whose public key
is in DIR/allowed/; each client's peer socket accepts only those keys too, so peers
authenticate each other the same way. Key files are ZeroMQ's text certificates (no pickle).
A client host needs DIR/server.key, DIR/client.key, DIR/client.key_secret and DIR/allowed/;
only the server host needs DIR/server.key_secret.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

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
    client_public: bytes
    client_secret: bytes
    allowed: Path


def init_keys(folder: str | Path) -> list[Path]:
    """Create DIR/server.key(_secret), DIR/client.key(_secret) and DIR/allowed/client.key."""
    d = Path(folder)
    if (d / "server.key_secret").exists():
        raise ConfigError(f"{d} already holds keys; remove it or choose another folder")
    (d / "allowed").mkdir(parents=True, exist_ok=True)
    made = []
    for name in ("server", "client"):
        pub, sec = zmq.auth.create_certificates(str(d), name)
        Path(sec).chmod(0o600)
        made += [Path(pub), Path(sec)]
    shutil.copy(d / "client.key", d / "allowed" / "client.key")
    made.append(d / "allowed" / "client.key")
    return made


def load_keys(folder: str | Path, need_server_secret: bool) -> Keys:
    """The keys in DIR; a missing file is a ConfigError that says how to make them."""
    d = Path(folder)
    try:
        spub, ssec = zmq.auth.load_certificate(str(d / ("server.key_secret" if need_server_secret
                                                         else "server.key")))
        cpub, csec = zmq.auth.load_certificate(str(d / "client.key_secret"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"--secure {d}: cannot read the keys ({e}); create them with "
                          f"`fednet keys init {d}` and copy the folder to every host") from None
    if csec is None or (need_server_secret and ssec is None):
        raise ConfigError(f"--secure {d}: a secret key file is missing")
    if not (d / "allowed").is_dir():
        raise ConfigError(f"--secure {d}: no allowed/ folder of client public keys")
    return Keys(spub, ssec, cpub, csec, d / "allowed")


class _DenialsAsWarnings(logging.Filter):
    """ZAP reports refusals at DEBUG level; a refused client deserves a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "DENIED" in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        return False


def start_authenticator(ctx: zmq.Context, keys: Keys) -> ThreadAuthenticator:
    """ZAP handler for this context: only the public keys in keys.allowed may connect."""
    zap_log = logging.getLogger("fednet.security.zap")
    zap_log.setLevel(logging.DEBUG)
    if not any(isinstance(f, _DenialsAsWarnings) for f in zap_log.filters):
        zap_log.addFilter(_DenialsAsWarnings())
    auth = ThreadAuthenticator(ctx, log=zap_log)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.allowed))
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
