"""Per-client latency profiles and the virtual-clock arithmetic (the only home of simulated time)."""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fednet import rng
from fednet.config import LatencyConfig
from fednet.errors import ConfigError


@dataclass(frozen=True)
class Profile:
    """A client's compute speed (s per sample), round-trip time (s) and bandwidths (bytes/s)."""

    compute_s_per_sample: float = 0.0
    rtt_s: float = 0.0
    up_bps: float = float("inf")
    down_bps: float = float("inf")

    def to_dict(self) -> dict[str, float]:
        """Plain dict (inf bandwidths become 0 = unlimited, msgpack/JSON friendly)."""
        d = asdict(self)
        for k in ("up_bps", "down_bps"):
            d[k] = 0.0 if d[k] == float("inf") else d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> Profile:
        """Inverse of to_dict (0 bandwidth = unlimited)."""
        up, down = float(d.get("up_bps", 0)), float(d.get("down_bps", 0))
        return cls(float(d.get("compute_s_per_sample", 0)), float(d.get("rtt_s", 0)),
                   up if up > 0 else float("inf"), down if down > 0 else float("inf"))


MBIT = 1e6 / 8


def _preset(name: str, n: int, seed: int) -> list[Profile]:
    g = rng.generator(seed, "latency")
    if name == "none":
        return [Profile() for _ in range(n)]
    if name == "lan":  # 1 Gbit/s switched LAN, ~0.5 ms RTT, edge devices at ~1 ms per sample
        comp = 1e-3 * g.lognormal(0.0, 0.1, n)
        return [Profile(float(c), 0.5e-3, 1000 * MBIT, 1000 * MBIT) for c in comp]
    if name == "wan":  # home links: 20-100 Mbit/s down, 5-20 up, 20-200 ms RTT
        comp = 1e-3 * g.lognormal(0.0, 0.5, n)
        rtt = np.clip(g.lognormal(np.log(0.06), 0.5, n), 0.02, 0.2)
        down = g.uniform(20, 100, n) * MBIT
        up = g.uniform(5, 20, n) * MBIT
        return [Profile(float(c), float(r), float(u), float(d)) for c, r, u, d in zip(comp, rtt, up, down)]
    if name == "hetero":  # LAN links, 20% of clients 5x slower at compute with 10x slower uplink
        slow = np.zeros(n, dtype=bool)
        slow[g.permutation(n)[: max(1, round(0.2 * n)) if n > 1 else 0]] = True
        return [Profile(5e-3 if s else 1e-3, 0.5e-3, (100 if s else 1000) * MBIT, 1000 * MBIT)
                for s in slow]
    raise ConfigError(f"--latency '{name}' is unknown; choose none, lan, wan, hetero or a CSV/JSON file")


def _from_file(path: str, n: int) -> list[Profile]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--latency: file '{p}' does not exist (give a preset or a CSV/JSON trace)")
    try:
        if p.suffix.lower() == ".json":
            rows = json.loads(p.read_text())
        else:
            with p.open(newline="") as fh:
                rows = list(csv.DictReader(fh))
        profs = [Profile.from_dict({k: float(v) for k, v in r.items() if k != "client"}) for r in rows]
    except (ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"--latency: cannot read '{p}': {e}; expected columns compute_s_per_sample,"
                          " rtt_s, up_bps, down_bps") from None
    if not profs:
        raise ConfigError(f"--latency: '{p}' has no rows")
    return [profs[i % len(profs)] for i in range(n)]  # traces shorter than the run are cycled


def profiles(cfg: LatencyConfig, num_clients: int, seed: int) -> list[Profile]:
    """One Profile per client, deterministic in (cfg, seed)."""
    if cfg.file:
        return _from_file(cfg.file, num_clients)
    return _preset(cfg.preset, num_clients, seed)


def down_delay(p: Profile, nbytes: int) -> float:
    """Simulated seconds for nbytes to reach the client (half RTT plus serialisation)."""
    return p.rtt_s / 2 + nbytes / p.down_bps


def up_delay(p: Profile, nbytes: int) -> float:
    """Simulated seconds for nbytes to leave the client and arrive."""
    return p.rtt_s / 2 + nbytes / p.up_bps


def peer_delay(src: Profile, dst: Profile, nbytes: int) -> float:
    """Simulated seconds for a direct client-to-client hand-off (slowest side's bandwidth)."""
    return (src.rtt_s + dst.rtt_s) / 4 + nbytes / min(src.up_bps, dst.down_bps)


def compute_time(p: Profile, samples: int) -> float:
    """Simulated seconds to process `samples` examples."""
    return samples * p.compute_s_per_sample
