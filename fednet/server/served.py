"""How `fednet server`'s clients reach it (RUN/server.json): the endpoint they connect to, where
the run's join key lives and the --secure folder, written once the server listens. A resumed
server reads it back, so that `--resume RUN` needs nothing the run did not record: it listens
where its live clients reconnect, with the key they hold (never a new one drawn beside it), and
an interrupted run prints the exact command (`resume_args`)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics.files import write_json

FILE = "server.json"


def record(out: str | Path, endpoint: str, join_key: str, secure: str) -> None:
    """Write RUN/server.json (the endpoint with the port the server really bound)."""
    write_json(Path(out) / FILE, {"bind": endpoint, "join_key": os.path.abspath(join_key)
                                  if join_key else "", "secure": secure})


def recorded(out: str | Path) -> dict[str, Any] | None:
    """RUN/server.json, or None when the run has none (a run of `fednet launch`, or of an older
    fednet); a damaged one is a ConfigError naming it."""
    path = Path(out) / FILE
    if not path.is_file():
        return None
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume {out}: {path}: not valid JSON ({e})") from None
    if not isinstance(got, dict) or not all(isinstance(got.get(k), str)
                                            for k in ("bind", "join_key", "secure")):
        raise ConfigError(f"--resume {out}: {path}: damaged (bind, join_key and secure expected)")
    return got


def resume_join_key(out: str | Path, given: str, secure: str) -> str:
    """The join key file of a resumed plaintext server: the one the run recorded (its live
    clients hold that key) unless --join-key names a file holding the same key; a key the run
    never had would lock them out, so it is refused."""
    from fednet.protocol import join_key as join

    rec = recorded(out)
    had = rec["join_key"] if rec else ""
    if secure or not had:
        return given or ("" if secure else str(Path(out) / join.FILE_NAME))
    if not Path(had).exists():
        raise ConfigError(f"--resume {out}: the run's join key {had} is gone, and its clients "
                          "hold that key; put it back there (or give --join-key FILE with the "
                          "same key)")
    if given and os.path.abspath(given) != had:
        if not Path(given).exists() or join.read(given) != join.read(had):
            raise ConfigError(f"--join-key {given}: this run's clients hold the join key in "
                              f"{had}, and this file does not hold that key; drop --join-key "
                              "(the run's own is used)")
        return given
    return had


def resume_args(out: str | Path) -> str:
    """The options a `fednet server --resume RUN` needs beside it: where to listen and the join
    key file (nothing for other commands' runs)."""
    try:
        rec = recorded(out)
    except ConfigError:
        return ""
    if rec is None:
        return ""
    args = f" --bind {rec['bind']}"
    if rec["join_key"] and Path(rec["join_key"]) != Path(out).absolute() / "join.key":
        args += f" --join-key {rec['join_key']}"
    return args
