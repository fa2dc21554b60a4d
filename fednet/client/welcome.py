"""A client process's WELCOME as it keeps it (client/enroll.py takes it): the run's settings
once, and each client's partition, profile and grant as rows of its arrays, read as a client
needs them. An idle client is such a row, never an object.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednet.client.table import IdIndex
from fednet.core.executor import welcome_config, welcome_tables
from fednet.core.plugin_check import checked_welcome
from fednet.errors import ConfigError
from fednet.network.latency import COLUMNS, Profile
from fednet.protocol import Message
from fednet.config import RunConfig


@dataclass
class Welcome:
    """The process's WELCOME, kept for the clients that have no object yet: the run's settings
    once, and each client's row of its arrays (rows: cid -> row, client/table.IdIndex)."""

    cfg: RunConfig
    body: dict
    tables: tuple
    cids: np.ndarray
    rows: IdIndex
    offsets: np.ndarray | None
    indices: np.ndarray | None
    profiles: np.ndarray  # (n, 4) float64: latency.COLUMNS
    grants: np.ndarray | None  # per client: its route grant (None without one)
    peers: bool
    shared: dict = field(default_factory=dict)  # profiles by value: equal ones are one object

    def row(self, cid: int) -> int:
        """Client cid's row of the arrays, -1 if the WELCOME does not name it."""
        return self.rows.row(cid)

    def profile(self, i: int) -> Profile:
        row = tuple(self.profiles[i].tolist())
        got = self.shared.get(row)
        if got is None:
            got = self.shared[row] = Profile.from_dict(dict(zip(COLUMNS, row)))
        return got

    def part(self, i: int) -> Any:
        if self.indices is None or self.offsets is None:
            return None  # natural clients build their own rows
        return self.indices[self.offsets[i]:self.offsets[i + 1]]


def read_welcome(msg: Message) -> Welcome:
    """A process's WELCOME as a Welcome; ConfigError when it cannot be used."""
    b = checked_welcome(msg.body)
    cfg = welcome_config(b)
    a, peers = msg.arrays, bool(b.get("peers"))
    try:
        cids, off = a["cids"], a.get("offsets")
        if cids.ndim != 1 or cids.dtype.kind not in "iu":
            raise TypeError("'cids' is not a 1-D integer array")
        return Welcome(cfg, b, welcome_tables(cfg, a, peers), cids, IdIndex(cids),
                       off.astype(np.int64) if off is not None else None, a.get("indices"),
                       a["client_profiles"], a.get("grants"), peers)
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise ConfigError(f"the server sent a WELCOME this process cannot use ({e}); are "
                          "both on the same fednet version?") from None
