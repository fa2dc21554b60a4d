"""The join key of a plaintext `fednet server`: the run key that its remote clients hold.

`fednet launch` draws its run key and hands it to its own clients through the zygote's pipe.
`fednet server` has no such pipe, so it keeps its run key in a file, the join key (64 hex
characters, mode 0600): RUN/join.key unless `--join-key FILE` names another one. It is drawn
when the file does not exist and read when it does (a resumed server, or a key prepared for a
SLURM job on a shared folder). `fednet clients --join-key FILE` reads the same file. With it
every socket of the run admits only key holders at the handshake (transport/gate.py), and each
client proves its id as under launch (proof.py): a connection without the key can neither make
libzmq abort the process (a routing id it chose itself colliding with one the server generates)
nor have the server buffer a byte of its frames. The key travels in PLAIN handshakes, in the
clear: on an untrusted network use --secure (CURVE), which needs no join key.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from fednet.errors import ConfigError
from fednet.protocol.proof import new_run_key

FILE_NAME = "join.key"


def _not_a_key_itself(path: str | Path) -> None:
    """--join-key (or FEDNET_JOIN_KEY) names a file; a value that is a key itself is refused
    rather than made the name of a new key file."""
    if re.fullmatch(r"[0-9a-fA-F]{64}", str(path)) and not Path(path).exists():
        raise ConfigError("--join-key (or FEDNET_JOIN_KEY) holds a key itself, not the path of "
                          "a key file: write the key into a file (mode 0600) and give its path")


def _private(path: Path) -> None:
    """A key file others can read is anyone's key: refused, as ssh refuses such a key."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(f"--join-key {path}: other users can read or change it (mode "
                          f"{mode:04o}), and whoever reads it can join the run; `chmod 600 {path}`")


def read(path: str | Path) -> bytes:
    """The key in `path`; ConfigError naming --join-key when it is not a join key, or when
    other users may read it."""
    _not_a_key_itself(path)
    try:
        _private(Path(path))
        text = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"--join-key {path}: cannot read it ({e.strerror or e})") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ConfigError(f"--join-key {path}: not a join key (64 hex characters, as `fednet "
                          "server` writes it)")
    return key


def ensure(path: str | Path) -> bytes:
    """The key in `path`, drawn and written there (mode 0600) when the file does not exist."""
    p = Path(path)
    _not_a_key_itself(path)
    if p.exists():
        return read(p)
    key = new_run_key()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.hex() + "\n")
    except FileExistsError:  # another process wrote it first: that key is the run's
        return read(p)
    except OSError as e:
        raise ConfigError(f"--join-key {path}: cannot write it ({e.strerror or e})") from None
    return key


def wait_for(path: str | Path, timeout_s: float) -> bytes:
    """The key in `path`, waiting up to timeout_s for the server to write it (clients started
    before their server, as under SLURM)."""
    _not_a_key_itself(path)
    deadline = time.monotonic() + timeout_s
    while not Path(path).exists():
        if time.monotonic() >= deadline:
            raise ConfigError(f"--join-key {path}: no such file after {timeout_s:g}s; `fednet "
                              "server` writes it at start (RUN/join.key, or its own --join-key "
                              "FILE): copy it to this host or give its path on a shared folder")
        time.sleep(0.1)
    return read(path)
