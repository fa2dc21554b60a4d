"""The liveness timers: how soon a dead, frozen or cut-off peer is noticed, and how often a
registration is retried. A section of RunConfig (config/settings.py; `[liveness]` in a TOML
file), declared like every setting. One option, hidden from --help, sets them all: --liveness
SCALE, the defaults times SCALE (the liveness tests run them at a tenth).

The server reads them from its RunConfig. A client process needs them before it connects (they
set its link's heartbeat), so before any WELCOME: `fednet launch` passes them in each process's
spawn spec (launch/spawn.client_specs), `fednet clients` takes the same --liveness SCALE.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from fednet.config.declare import setting
from fednet.errors import ConfigError

OPTION = "--liveness"
_OPT: dict[str, Any] = {"option": OPTION, "metavar": "SCALE", "shown": "1", "hidden": True}


@dataclass(frozen=True)
class Liveness:
    """The liveness timers of a run's server and client processes (milliseconds where libzmq
    takes them, else seconds)."""

    heartbeat_ms: int = setting(
        1000, "Every link pings its peer this often (ZMTP heartbeats); a server of more than "
        "1,000 clients less often (transport/channels.server_heartbeat_ms)", ge=1, **_OPT)
    heartbeat_timeout_ms: int = setting(
        3000, "A server drops a connection that answered no ping within this", ge=1, **_OPT)
    link_timeout_ms: int = setting(
        6000, "A client drops its server link when no ping is answered within this: a server "
        "busy with thousands of handshakes answered pings 3 s late (19,000 clients), a frozen "
        "one never", ge=1, **_OPT)
    handshake_ms: int = setting(
        5000, "The server closes a connection that has not finished its handshake by then (1 ms "
        "more per client beyond 5,000)", ge=1, **_OPT)
    connect_handshake_ms: int = setting(
        30_000, "... on the connecting side: libzmq's default (a server may be busy with "
        "thousands of handshakes; giving up reconnects, a storm)", ge=1, **_OPT)
    reconnect_max_ms: int = setting(
        5000, "A client tries to reach a lost server again at most this long after its last "
        "try (ZeroMQ's back-off from 0.1 s); a server that itself stalled past its peers' "
        "timeouts waits this long before it counts their lost connections", ge=1, **_OPT)
    lost_grace_s: float = setting(
        1.0, "A client whose connection has been lost for this long is gone (three times this "
        "under fednet launch, whose launcher reports a dead process at once)", gt=0, **_OPT)
    hello_every_s: float = setting(
        2.0, "The server answers one registration per connection in this time", gt=0, **_OPT)
    rehello_s: float = setting(
        2.0, "A client whose registration again was refused (its old connection still bound) "
        "tries again after this", gt=0, **_OPT)
    recheck_s: float = setting(
        1.0, "While it registers, a client process looks at its link this often (a link that "
        "dropped and came back: hello again)", gt=0, **_OPT)
    check_s: float = setting(
        0.05, "A client process checks its launcher and its server link at most this often",
        gt=0, **_OPT)

    def scaled(self, factor: float) -> Liveness:
        """Every timer times `factor` (milliseconds rounded, at least 1)."""
        return replace(self, **{f.name: max(1, round(v * factor)) if isinstance(v, int)
                                else round(v * factor, 9)
                                for f in fields(self) for v in [getattr(self, f.name)]})

    def to_dict(self) -> dict[str, Any]:
        """The timers by name (a spawn spec's JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Liveness:
        """The record a spawn spec carries (None: the defaults)."""
        return cls(**d) if d else DEFAULT


DEFAULT = Liveness()


def scale_of(text: str | float) -> float:
    """--liveness SCALE as a number; ConfigError naming the option when it is not a positive
    one."""
    try:
        f = float(text)
    except (TypeError, ValueError):
        f = math.nan
    if not (math.isfinite(f) and f > 0):
        raise ConfigError(f"{OPTION} must be a positive number, the factor on every liveness "
                          f"timer (got '{text}')")
    return f


def overrides(text: str | float) -> dict[str, Any]:
    """The dotted settings --liveness SCALE gives (cli/options_extra.overrides)."""
    return {f"liveness.{k}": v for k, v in DEFAULT.scaled(scale_of(text)).to_dict().items()}
