"""The server's shared link (--server-bandwidth): concurrent transfers share its capacity.

Fluid model, one direction at a time (the link is full duplex: downloads and uploads each have
the whole rate R). While a set of flows is active, their rates are max-min fair (progressive
filling, as long-lived TCP flows converge to): every flow gets an equal share of R, except a
flow capped lower by the client's own link, which gets its cap, and what it leaves is shared
among the others. Rates are recomputed whenever a flow starts or finishes. Latency (rtt/2) is
not part of the sharing: it is added after the bytes are through (network/latency.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class Flow:
    """One transfer through the server's link: when it starts (simulated s), its bytes, and the
    client side's own rate cap (bytes/s; inf = no cap)."""

    start: float
    nbytes: float
    cap: float = INF


def fair_rates(caps: list[float], capacity: float) -> list[float]:
    """Max-min fair rates of flows with these caps through a link of `capacity` (water filling)."""
    rates = [0.0] * len(caps)
    left, n = capacity, len(caps)
    for i in sorted(range(len(caps)), key=lambda j: caps[j]):
        share = left / n if n else 0.0
        rates[i] = min(caps[i], share)
        left -= rates[i]
        n -= 1
    return rates


def share(flows: list[Flow], capacity: float) -> tuple[list[float], list[tuple[float, float]]]:
    """(finish time of each flow, the intervals the link was busy) for flows sharing `capacity`.

    With capacity inf every flow runs at its own cap (start + bytes/cap). A zero-byte flow
    finishes when it starts and keeps the link busy for no time."""
    finish = [f.start + (f.nbytes / f.cap if f.nbytes else 0.0) for f in flows]
    if math.isinf(capacity):
        return finish, _union([(f.start, e) for f, e in zip(flows, finish) if e > f.start])
    if capacity <= 0:
        raise ValueError("the server link's capacity must be positive")
    left = {i: float(f.nbytes) for i, f in enumerate(flows) if f.nbytes > 0}
    for i, f in enumerate(flows):
        if f.nbytes <= 0:
            finish[i] = f.start
    waiting = sorted(left, key=lambda i: (flows[i].start, i))
    active: list[int] = []
    busy: list[tuple[float, float]] = []
    now = flows[waiting[0]].start if waiting else 0.0
    while waiting or active:
        while waiting and flows[waiting[0]].start <= now:
            active.append(waiting.pop(0))
        if not active:
            now = flows[waiting[0]].start
            continue
        rates = fair_rates([flows[i].cap for i in active], capacity)
        ends = [left[i] / r for i, r in zip(active, rates)]
        step = min(ends)
        nxt = flows[waiting[0]].start - now if waiting else INF
        if nxt < step:  # a flow joins first: the rates change then
            step = nxt
        busy.append((now, now + step))
        still = []
        for i, r, e in zip(active, rates, ends):
            if e <= step * (1 + 1e-12):  # done in this interval (rounding: within one ulp or so)
                finish[i] = now + e
                left[i] = 0.0
            else:
                left[i] -= r * step
                still.append(i)
        active = still
        now += step
    return finish, _union(busy)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping or touching intervals (sorted by start)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of the intervals."""
    return math.fsum(b - a for a, b in _union(spans))
