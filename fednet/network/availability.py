"""Client availability: when each client is online, in simulated seconds from the run's start.

`--availability` (LatencyConfig.availability) is a preset or a trace file:
- always (the default, also ""): every client online all the time (no Availability at all);
- offline:F[:S]: simulated time is cut into windows of S seconds (default 1); in each window a
  seeded set of round(F * n) clients is offline (rng stream "availability", window index);
- diurnal[:DAY[:ON]]: a compressed day of DAY seconds (default 60); each client is online for
  the fraction ON (default 0.5) of every day, from its own seeded phase;
- a CSV/JSON trace of online intervals (network/availability_trace.py).

Deterministic in (spec, clients, seed), so every host can rebuild a preset; a trace travels in
WELCOME (to_arrays / from_welcome), so `fednet clients` on another host needs no copy of the file.
How the runtimes use it (docs/architecture.md, "Client availability"): selection among the
clients online at a round's start; a task fails at the moment its client goes offline; a ring
skips a peer that is offline when the hand-off is sent (next_online_hop).
"""
from __future__ import annotations

import bisect
import functools
import math
from pathlib import Path

import numpy as np

from fednet import rng
from fednet.errors import ConfigError
from fednet.network.availability_trace import Intervals, read_trace

PRESETS = ("always", "offline:F[:S]", "diurnal[:DAY[:ON]]")
HELP = ("always, offline:F[:S] (a fraction F offline in each window of S simulated seconds), "
        "diurnal[:DAY[:ON]] (online ON of every DAY seconds) or a CSV/JSON trace "
        "(client,start,end)")
SCAN = 100_000  # windows looked at before a stretch counts as endless (offline:F)


class Availability:
    """Online stretches per client. Subclasses give `until` and `next_start`."""

    spec = ""
    from_file = False

    def until(self, cid: int, t: float) -> float | None:
        """None when client `cid` is offline at t, else the end of its online stretch (inf)."""
        raise NotImplementedError

    def next_start(self, cid: int, t: float) -> float | None:
        """The first moment >= t at which `cid` is online (t itself if online); None: never."""
        raise NotImplementedError

    def online(self, cid: int, t: float) -> bool:
        """Whether client `cid` is online at simulated time t."""
        return self.until(cid, t) is not None

    def offline_in(self, cid: int, t0: float, t1: float) -> float | None:
        """The first moment in [t0, t1] at which `cid` is offline (t0 when it is offline
        already; the end of its online stretch when that is <= t1), else None."""
        end = self.until(cid, t0)
        if end is None:
            return t0
        return end if end <= t1 else None

    def next_online(self, cids: list[int], t: float) -> float | None:
        """The first moment >= t at which any of `cids` is online; None when none ever is."""
        starts = [s for s in (self.next_start(c, t) for c in cids) if s is not None]
        return min(starts) if starts else None


class Trace(Availability):
    """Online intervals [start, end) per client (from a file, or from WELCOME's arrays)."""

    from_file = True

    def __init__(self, spans: list[Intervals], spec: str = "") -> None:
        self.spans, self.spec = spans, spec
        self.starts = [[s for s, _ in sp] for sp in spans]

    def until(self, cid: int, t: float) -> float | None:
        i = bisect.bisect_right(self.starts[cid], t) - 1
        if i >= 0 and t < self.spans[cid][i][1]:
            return self.spans[cid][i][1]
        return None

    def next_start(self, cid: int, t: float) -> float | None:
        if self.until(cid, t) is not None:
            return t
        i = bisect.bisect_right(self.starts[cid], t)
        return self.spans[cid][i][0] if i < len(self.spans[cid]) else None

    def to_arrays(self, clients: list[int] | None = None) -> dict[str, np.ndarray]:
        """The intervals (of `clients`, default all) as three flat arrays (client, start, end;
        end inf = for good)."""
        ids = range(len(self.spans)) if clients is None else clients
        rows = [(c, s, e) for c in ids for s, e in self.spans[c]]
        return {"avail_client": np.array([r[0] for r in rows], dtype=np.int64),
                "avail_start": np.array([r[1] for r in rows], dtype=np.float64),
                "avail_end": np.array([r[2] for r in rows], dtype=np.float64)}


class Diurnal(Availability):
    """Online for `on * day` seconds of every `day`, from a seeded phase per client."""

    def __init__(self, n: int, seed: int, day: float, on: float, spec: str) -> None:
        self.day, self.len, self.spec = day, on * day, spec
        self.phase = rng.generator(seed, "availability").uniform(0.0, day, n)

    def until(self, cid: int, t: float) -> float | None:
        if self.len >= self.day:
            return math.inf
        s = self.phase[cid] + math.floor((t - self.phase[cid]) / self.day) * self.day
        return float(s + self.len) if t < s + self.len else None

    def next_start(self, cid: int, t: float) -> float | None:
        if self.until(cid, t) is not None:
            return t
        return float(self.phase[cid] + (math.floor((t - self.phase[cid]) / self.day) + 1) * self.day)


class Windows(Availability):
    """A seeded set of round(F * n) clients offline in each window of `width` seconds."""

    def __init__(self, n: int, seed: int, frac: float, width: float, spec: str) -> None:
        self.n, self.seed, self.k, self.width, self.spec = n, seed, round(frac * n), width, spec
        self._off: dict[int, frozenset[int]] = {}

    def off(self, w: int) -> frozenset[int]:
        """The clients offline in window w."""
        got = self._off.get(w)
        if got is None:
            if len(self._off) > 50_000:
                self._off.clear()
            perm = rng.generator(self.seed, "availability", w).permutation(self.n)
            got = self._off[w] = frozenset(int(c) for c in perm[:self.k])
        return got

    def until(self, cid: int, t: float) -> float | None:
        w = math.floor(t / self.width)
        if self.k == 0:  # offline:0: nobody is ever offline
            return math.inf
        if cid in self.off(w):
            return None
        for j in range(w + 1, w + SCAN):
            if cid in self.off(j):
                return j * self.width
        return math.inf

    def next_start(self, cid: int, t: float) -> float | None:
        w = math.floor(t / self.width)
        if cid not in self.off(w):
            return t
        for j in range(w + 1, w + SCAN):
            if cid not in self.off(j):
                return j * self.width
        return None


def build(spec: str, n: int, seed: int, option: str = "--availability") -> Availability | None:
    """The Availability of `spec` for n clients (None: always online); ConfigError names the
    option and the accepted forms."""
    s = (spec or "").strip()
    if s in ("", "always"):
        return None
    name, _, rest = s.partition(":")
    args = rest.split(":") if rest else []
    if name == "offline" and 1 <= len(args) <= 2:
        frac = _arg(args[0], s, option, "F")
        width = _arg(args[1], s, option, "S") if len(args) > 1 else 1.0
        if not 0 <= frac < 1 or width <= 0:
            raise ConfigError(f"{option} '{s}': offline:F[:S] needs 0 <= F < 1 and S > 0")
        return Windows(n, seed, frac, width, s)
    if name == "diurnal" and len(args) <= 2:
        day = _arg(args[0], s, option, "DAY") if args else 60.0
        on = _arg(args[1], s, option, "ON") if len(args) > 1 else 0.5
        if day <= 0 or not 0 < on <= 1:
            raise ConfigError(f"{option} '{s}': diurnal[:DAY[:ON]] needs DAY > 0 and 0 < ON <= 1")
        return Diurnal(n, seed, day, on, s)
    if name in ("offline", "diurnal") or not Path(s).is_file():
        raise ConfigError(f"{option} '{s}' is neither a preset nor an existing trace file; "
                          f"give {HELP}")
    return Trace(read_trace(s, n, option), s)


def _arg(text: str, spec: str, option: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise ConfigError(f"{option} '{spec}': {what} must be a number (got '{text}'); give {HELP}")
    return x


@functools.lru_cache(maxsize=4)
def _shared_preset(spec: str, n: int, seed: int) -> Availability | None:
    """build() once per (spec, clients, seed) in this process (presets are read-only, apart from
    caches that depend only on those)."""
    return build(spec, n, seed)


def from_welcome(spec: str, n: int, seed: int, arrays: dict[str, np.ndarray]
                 ) -> Availability | None:
    """A client's copy: a preset rebuilt from the configuration (once per process: the logical
    clients of a process share it, as its per-client arrays cost O(population)), a trace from
    WELCOME's arrays."""
    if "avail_client" not in arrays:
        return _shared_preset(spec, n, seed)
    spans: list[Intervals] = [[] for _ in range(n)]
    for c, s, e in zip(arrays["avail_client"].tolist(), arrays["avail_start"].tolist(),
                       arrays["avail_end"].tolist()):
        if 0 <= c < n:
            spans[int(c)].append((float(s), float(e)))
    return Trace(spans, spec)
