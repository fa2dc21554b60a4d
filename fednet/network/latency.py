"""Per-client latency profiles and the virtual-clock arithmetic (the only home of simulated time)."""
from __future__ import annotations

import csv
import functools
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fednet import rng
from fednet.config import LatencyConfig
from fednet.errors import ConfigError
from fednet.network import ops
from fednet.network.ops import CLIENT_RATES
from fednet.opcount import CONVOLUTION, DISPATCH
from fednet.network.profiles import COLUMNS as COLUMNS, FIXED_COSTS, Profile as Profile, Profiles as Profiles

log = logging.getLogger("fednet")

LINK_COLUMNS = ("rtt_s", "up_bps", "down_bps")
"""The columns every trace has, besides at least one of COMPUTE_COLUMNS (a missing one is 0; a
row gives at most one above 0) and optionally `client` (ids)."""

COMPUTE_COLUMNS = ("train_flops_per_s", "compute_s_per_sample")


MBIT = 1e6 / 8

_RATE_UNITS = {  # unit -> bytes per second (case matters only for the b/B distinction)
    "b": 1 / 8, "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
    "B": 1.0, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024.0, "MiB": 1024.0 ** 2,
    "GiB": 1024.0 ** 3,
}
RATE_HELP = ("a rate: a plain number is bytes/s; or with a unit: 100Mbit, 1Gbit, 500kbit "
             "(bits/s) or 12.5MB, 2MiB (bytes/s); 0 or 'unlimited' for no limit")


def parse_rate(text: object, where: str) -> float:
    """Bytes per second from `text` (RATE_HELP); inf for 0/'unlimited'. A trailing '/s' is
    allowed; 'bps'-style units are refused (tc reads 'mbps' as megabytes, networking as
    megabits): the error names `where` and the spellings that are accepted."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        raw, unit, num = float(text), "", ""
    else:
        s = str(text).strip()
        if s.lower() in ("unlimited", "inf", "none"):
            return float("inf")
        s = s[:-2] if s.endswith("/s") else s
        i = len(s)
        while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
            i -= 1
        num, unit = s[:i].strip(), s[i:].strip()
        try:
            raw = float(num)
        except ValueError:
            raise ConfigError(f"{where}: '{text}' is not {RATE_HELP}") from None
    if unit.lower().endswith("bps"):
        raise ConfigError(f"{where}: '{text}' is ambiguous ('bps' means bits to some tools and "
                          f"bytes to others); write {num}{unit[:-3]}bit for bits/s or "
                          f"{num}{unit[:-3]}B for bytes/s")
    scale = 1.0 if not unit else _RATE_UNITS.get(unit, _RATE_UNITS.get(unit.lower()
                                                                       if "bit" in unit.lower()
                                                                       else unit))
    if scale is None:
        raise ConfigError(f"{where}: unknown unit '{unit}' in '{text}'; {RATE_HELP}")
    if not math.isfinite(raw) or raw < 0:
        raise ConfigError(f"{where}: '{text}' must be a finite rate >= 0; {RATE_HELP}")
    return float("inf") if raw == 0 else raw * scale


EDGE_FLOPS = 8e9
"""The presets' typical client's training FLOP/s: a Raspberry Pi 4's Linpack figure (HPL, about
8 GFLOP/s: Feiereisen 2022); that training reaches it, and the presets' spreads, are assumptions
(docs/usage.md, "Client compute", gives the sources; `fednet calibrate` measures a host)."""

EDGE_S_PER_OP = 20e-6
EDGE_S_PER_CONV = 400e-6
"""The presets' typical client's fixed seconds per dispatched tensor operation and per
convolution call (training/flops.py's counts: each operator call's cost in torch's dispatcher,
autograd and the training loop's Python; a convolution's kernel setup and reorders). Estimates:
about 4x what `fednet calibrate` measures on this project's x86 machine (4-8 us an operation,
~0.1 ms a convolution, one thread), the single-core speed ratio assumed for a Cortex-A72 at 1.5
GHz against an x86 server core; a client k times slower at FLOPs is k times slower here too."""


def _preset(name: str, n: int, seed: int) -> Profiles:
    g = rng.generator(seed, "latency")
    inf = float("inf")
    if name == "none":
        return _columns(np.zeros(n), 0.0, inf, inf, 0.0)
    if name == "lan":  # 1 Gbit/s switched LAN, ~0.5 ms RTT, edge devices (EDGE_FLOPS, +-10 %)
        flops = EDGE_FLOPS / g.lognormal(0.0, 0.1, n)
        return _columns(np.zeros(n), 0.5e-3, 1000 * MBIT, 1000 * MBIT, flops)
    if name == "wan":  # home links: 20-100 Mbit/s down, 5-20 up, 20-200 ms RTT
        flops = EDGE_FLOPS / g.lognormal(0.0, 0.5, n)
        rtt = np.clip(g.lognormal(np.log(0.06), 0.5, n), 0.02, 0.2)
        down = g.uniform(20, 100, n) * MBIT
        up = g.uniform(5, 20, n) * MBIT
        return _columns(np.zeros(n), rtt, up, down, flops)
    if name == "hetero":  # LAN links, 20% of clients 5x slower at compute with 10x slower uplink
        slow = np.zeros(n, dtype=bool)
        slow[g.permutation(n)[: max(1, round(0.2 * n)) if n > 1 else 0]] = True
        return _columns(np.zeros(n), 0.5e-3, np.where(slow, 100 * MBIT, 1000 * MBIT),
                        1000 * MBIT, np.where(slow, EDGE_FLOPS / 5, EDGE_FLOPS))
    raise ConfigError(f"--latency '{name}' is unknown; choose none, lan, wan, hetero or a CSV/JSON file")


def _columns(comp: Any, rtt: Any, up: Any, down: Any, flops: Any) -> Profiles:
    """Profiles from five columns (arrays, or one value for every client), the protocol rates
    derived from the FLOP/s (edge_rates)."""
    n = len(comp)
    rates = edge_rates(flops)
    return Profiles(cols=tuple(np.broadcast_to(np.asarray(c, np.float64), (n,))
                               for c in (comp, rtt, up, down, flops,
                                         *(rates[k] for k in (*CLIENT_RATES, *FIXED_COSTS)))))


def edge_rates(flops: Any) -> dict[str, Any]:
    """The protocol rates, s_per_op and s_per_conv of a device of the edge class
    (network/ops.EDGE, EDGE_S_PER_OP, EDGE_S_PER_CONV) scaled by its training rate over
    EDGE_FLOPS: a client k times slower at training is k times slower at the protocol's
    primitives and at each tensor operation (0 FLOP/s: free, as its training)."""
    scale = np.asarray(flops, np.float64) / EDGE_FLOPS
    slower = np.where(scale > 0, 1.0 / np.where(scale > 0, scale, 1.0), 0.0)
    return {**{k: ops.EDGE[k] * scale for k in CLIENT_RATES},
            "s_per_op": EDGE_S_PER_OP * slower, "s_per_conv": EDGE_S_PER_CONV * slower}


def _from_file(path: str, n: int) -> list[Profile]:
    """A CSV (header row) or JSON (a list of objects) trace, each row checked by _row. Length
    rule: one row is every client's profile; otherwise row i is client i (with a `client`
    column, the row whose id is i), rows past the run's clients are not used, and fewer rows
    than clients are refused (fednet does not guess how to repeat them)."""
    p = Path(path)
    where = f"--latency {p}"
    if not p.exists():
        raise ConfigError(f"--latency: file '{p}' does not exist (give a preset or a CSV/JSON trace)")
    named = trace_rows(p, where, (*LINK_COLUMNS, "train_flops_per_s (or compute_s_per_sample)"))
    if not named:
        raise ConfigError(f"{where}: the trace has no rows")
    profs: list[Profile] = []
    ids: list[int] = []
    for at, r in named:
        profs.append(_row(r, f"{where}: {at}"))
        if "client" in r:
            cid = _number(r["client"], f"{where}: {at}: client")
            if cid != int(cid):
                raise ConfigError(f"{where}: {at}: client must be an integer id (got {r['client']!r})")
            ids.append(int(cid))
    if len(profs) == 1:
        return profs * n
    if ids:
        if len(ids) != len(profs) or len(set(ids)) != len(ids):
            raise ConfigError(f"{where}: the client column must give every row a distinct id")
        by_id = dict(zip(ids, profs))
        lack = [c for c in range(n) if c not in by_id]
        if lack:
            raise ConfigError(f"{where}: no row for client(s) {', '.join(map(str, lack[:5]))}"
                              f"{' ...' if len(lack) > 5 else ''}; give one row per client 0.."
                              f"{n - 1}, or one row for all")
        return [by_id[c] for c in range(n)]
    if len(profs) < n:
        raise ConfigError(f"{where}: {len(profs)} rows for {n} clients; give one row per client "
                          "(row i is client i), or a single row for all of them")
    return profs[:n]


_PER_SAMPLE_NOTED = False  # the note on traces of seconds per example: once per process


def _row(r: dict, where: str) -> Profile:
    """One row of a trace: LINK_COLUMNS, at least one of COMPUTE_COLUMNS and at most `client`
    besides, each value a finite number >= 0 (a bandwidth may have a unit: parse_rate)."""
    extra = sorted(str(k) for k in r if k not in COLUMNS and k != "client")
    missing = [c for c in LINK_COLUMNS if c not in r]
    if not any(c in r for c in COMPUTE_COLUMNS):
        missing.append(" or ".join(COMPUTE_COLUMNS))
    if extra or missing:
        raise ConfigError(f"{where}: " + "; ".join(
            ([f"unknown column(s) {', '.join(extra)}"] if extra else [])
            + ([f"missing column(s) {', '.join(missing)}"] if missing else []))
            + f"; a trace has the columns {', '.join(LINK_COLUMNS)}, one of "
            f"{' or '.join(COMPUTE_COLUMNS)} (and optionally client)")
    vals = {c: (_rate if c in RATE_COLUMNS else _number)(r[c], f"{where}: {c}")
            for c in COLUMNS if c in r}
    if vals.get("train_flops_per_s", 0) > 0 and vals.get("compute_s_per_sample", 0) > 0:
        raise ConfigError(f"{where}: give the compute as train_flops_per_s (FLOP/s) or as "
                          "compute_s_per_sample (s per example), not both")
    if vals.get("compute_s_per_sample", 0) > 0:
        global _PER_SAMPLE_NOTED
        if not _PER_SAMPLE_NOTED:
            _PER_SAMPLE_NOTED = True
            log.warning("%s gives compute_s_per_sample: those clients' compute is charged per "
                        "example whatever the model and method (the older form); give "
                        "train_flops_per_s (FLOP/s) to charge the FLOPs a task counts, or write "
                        "this host's with `fednet calibrate` (docs/usage.md, Client compute)",
                        where.rsplit(":", 1)[0])
    derived = edge_rates(vals.get("train_flops_per_s", 0.0))  # a rate not given: the edge
    for k in (*CLIENT_RATES, *FIXED_COSTS):  # class's at this FLOP/s (a per-example row: free)
        vals.setdefault(k, float(derived[k]))
    return Profile.from_dict(vals)


RATE_COLUMNS = ("up_bps", "down_bps")
"""Bytes per second (the historical names); a cell may give a unit instead (parse_rate)."""


def _rate(v: object, where: str) -> float:
    """A bandwidth cell in bytes/s (0 = unlimited, as Profile.from_dict reads it)."""
    if isinstance(v, str) and not v.strip():
        raise ConfigError(f"{where} is empty; give {RATE_HELP}")
    rate = parse_rate(v, where)
    return 0.0 if math.isinf(rate) else rate


def trace_rows(p: Path, where: str, columns: tuple[str, ...]) -> list[tuple[str, dict]]:
    """The rows of a CSV (header row) or JSON (a list of objects) trace, each with where it is
    ("line N" / "entry N"); ConfigError naming `where` when the file cannot be read as one.
    Shared by the latency and availability traces (network/availability_trace.py)."""
    try:
        if p.suffix.lower() == ".json":
            rows = json.loads(p.read_text())
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise ConfigError(f"{where}: a JSON trace is a list of objects with the keys "
                                  f"{', '.join(columns)}")
            return [(f"entry {i}", r) for i, r in enumerate(rows)]
        with p.open(newline="") as fh:
            rows = [(f"line {i + 2}", r) for i, r in enumerate(csv.DictReader(fh))]
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as e:
        raise ConfigError(f"{where}: cannot read it ({e})") from None
    for at, r in rows:  # every row complete: a short row is not "the rest unlimited"
        header = [k for k in r if k is not None]
        if None in r:
            raise ConfigError(f"{where}: {at}: {len(header) + len(r[None])} cells, but the header "
                              f"has {len(header)} columns ({', '.join(header)})")
        empty = [k for k in header if r[k] is None]
        if empty:
            raise ConfigError(f"{where}: {at}: no cell for column(s) {', '.join(empty)} (the "
                              f"row has {len(header) - len(empty)} of {len(header)} cells)")
    return rows


def _number(v: object, where: str) -> float:
    """A finite number >= 0 (a CSV cell is text)."""
    try:
        x = float(v) if not isinstance(v, bool) else float("nan")  # type: ignore[arg-type]  # errors caught
    except (TypeError, ValueError):
        x = float("nan")
    if not math.isfinite(x) or x < 0:
        raise ConfigError(f"{where} must be a finite number >= 0 (got {v!r})")
    return x


def profiles(cfg: LatencyConfig, num_clients: int, seed: int) -> Profiles:
    """One Profile per client, deterministic in (cfg, seed)."""
    if cfg.file:
        return Profiles.of(_from_file(cfg.file, num_clients))
    return _preset(cfg.preset, num_clients, seed)


def down_delay(p: Profile, nbytes: int) -> float:
    """Simulated seconds for nbytes to reach the client (half RTT plus serialisation)."""
    return p.rtt_s / 2 + nbytes / p.down_bps


def up_delay(p: Profile, nbytes: int) -> float:
    """Simulated seconds for nbytes to leave the client and arrive."""
    return p.rtt_s / 2 + nbytes / p.up_bps


def peer_delay(src: Profile, dst: Profile, nbytes: int) -> float:
    """Simulated seconds for a direct client-to-client hand-off: one pipelined flow from src's
    uplink into dst's downlink. Each rtt_s is a round trip to the server; the peer path is taken
    as half of each end's, one way (rtt_src + rtt_dst)/4; the bytes flow at the slower of the two
    links. With equal profiles this is down_delay to the last bit ((r + r)/4 == r/2)."""
    return (src.rtt_s + dst.rtt_s) / 4 + nbytes / min(src.up_bps, dst.down_bps)


def receive_delay(dst: Profile, nbytes: int, src: Profile | None = None) -> float:
    """Simulated seconds for nbytes to reach client dst: from the server (src None: down_delay)
    or handed on by the peer src (peer_delay: src's uplink and latency are paid too)."""
    return down_delay(dst, nbytes) if src is None else peer_delay(src, dst, nbytes)


def wire_time(dst: Profile, nbytes: int, src: Profile | None = None) -> float:
    """The bandwidth part of receive_delay (no latency): what a shaped network makes real."""
    return nbytes / (dst.down_bps if src is None else min(src.up_bps, dst.down_bps))


@functools.lru_cache(maxsize=4)
def _rebuilt(cfg: LatencyConfig, num_clients: int, seed: int) -> Profiles:
    """profiles() once per process (the clients of one process share the list; none changes it)."""
    return profiles(cfg, num_clients, seed)


def to_array(profs: Sequence[Profile]) -> np.ndarray:
    """Profiles as an (n, len(COLUMNS)) float64 array in COLUMNS order (0 bandwidth = unlimited)."""
    cols = (profs if isinstance(profs, Profiles) else Profiles.of(profs)).cols
    a = np.empty((len(cols[0]), len(cols)), np.float64)
    for j, c in enumerate(cols):  # column by column (a million clients' WELCOME: 0.55 s as
        if j in (2, 3):           # np.stack and a masked write, 0.2 s so)
            c = np.where(np.isinf(c), 0.0, c)
        a[:, j] = c
    return a


def links(cfg: LatencyConfig, num_clients: int, seed: int, arrays: dict[str, np.ndarray]
          ) -> Profiles | None:
    """Every client's profile on a client host: from WELCOME's `profiles` array (a trace: the
    host needs no copy of the file), else rebuilt from the preset; None for a trace that WELCOME
    did not carry (the algorithm hands no model between clients: no peer link is needed)."""
    a = arrays.get("profiles")
    if a is None:
        return None if cfg.file else _rebuilt(cfg, num_clients, seed)
    return Profiles.from_array(a)


def compute_time(p: Profile, samples: int, flops: int = 0,
                 protocol: dict[str, float] | None = None) -> float:
    """Simulated seconds of a task that processed `samples` examples in `flops` FLOPs (counted
    by training/flops.py): flops / train_flops_per_s plus its dispatched tensor operations and
    convolutions (`protocol`'s opcount.DISPATCH and CONVOLUTION entries, counted with the FLOPs)
    x s_per_op and s_per_conv, or samples x
    compute_s_per_sample for a profile in the older per-example form; plus its `protocol` work
    (network/ops.py counts: secure aggregation's primitives, noise draws) at the profile's
    rates (protocol_time)."""
    if p.train_flops_per_s > 0:
        train = flops / p.train_flops_per_s
        if protocol:
            train += protocol.get(DISPATCH, 0.0) * p.s_per_op
            train += protocol.get(CONVOLUTION, 0.0) * p.s_per_conv
    else:
        train = samples * p.compute_s_per_sample
    return train + protocol_time(p, protocol) if protocol else train


def protocol_time(p: Profile, protocol: dict[str, float] | None) -> float:
    """Simulated seconds of the protocol work `protocol` (network/ops counts) at p's rates."""
    return ops.seconds(protocol, p.rates()) if protocol else 0.0
