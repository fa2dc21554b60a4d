"""A client's device profile (Profile) and every client's, held as columns (Profiles): the
types of the clock's tables; the presets, traces and the arithmetic are network/latency.py's."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from fednet.opcount import CLIENT_RATES

COLUMNS = ("compute_s_per_sample", "rtt_s", "up_bps", "down_bps", "train_flops_per_s",
           *CLIENT_RATES, "s_per_op", "s_per_conv")
"""A profile's fields in the order of its table (Profiles, WELCOME's arrays, population.npz):
the compute rate, the links, the protocol primitives' rates (network/ops.py), then the fixed
seconds of one dispatched tensor operation and of one convolution (the columns added last)."""

FIXED_COSTS = ("s_per_op", "s_per_conv")
"""The fixed seconds of a dispatched operation and of a convolution (training/flops.Work)."""

CODEC_RATES = ("code_per_s", "select_per_s")
"""The client rates added later (a codec's element operations and selections)."""

FIELD_RATES = ("field_per_s",)
"""The client rate added last (SecAgg's field work: secagg/field.quantize and pack)."""

_BEFORE_FIELD = tuple(c for c in COLUMNS if c not in FIELD_RATES)
_BEFORE = tuple(c for c in _BEFORE_FIELD if c not in CODEC_RATES)
OLDER: dict[int, tuple[str, ...]] = {
    5: COLUMNS[:5],  # no protocol rates
    len(_BEFORE) - len(FIXED_COSTS): _BEFORE[:-len(FIXED_COSTS)],  # no fixed costs
    len(_BEFORE): _BEFORE,  # no codec rates
    len(_BEFORE_FIELD): _BEFORE_FIELD}  # no field rate
"""The columns of tables written before a column was added, by their width: the missing
columns read as 0 (free)."""
OLDER_WIDTHS = tuple(OLDER)


@dataclass(frozen=True)
class Profile:
    """A client's compute rate, round-trip time (s), bandwidths (bytes/s) and protocol rates.
    The compute rate is train_flops_per_s (FLOP/s; a task's compute is the FLOPs its batches
    count, divided by it) or, where that is 0, compute_s_per_sample (seconds per example
    processed, whatever the model: the older form); both 0: compute is free. The protocol
    rates (network/ops.CLIENT_RATES: X25519 agreements, key derivations, sealed shares, mask
    bytes, Shamir multiply-adds, noise draws a second) turn the protocol work a task counts
    into seconds (0: that primitive is free). s_per_op is the fixed cost of one dispatched
    tensor operation and s_per_conv the further fixed cost of one convolution call
    (training/flops.py counts a batch's), charged beside the FLOPs of a profile in FLOP/s (0:
    free)."""

    compute_s_per_sample: float = 0.0
    rtt_s: float = 0.0
    up_bps: float = float("inf")
    down_bps: float = float("inf")
    train_flops_per_s: float = 0.0
    x25519_per_s: float = 0.0
    kdf_per_s: float = 0.0
    aead_per_s: float = 0.0
    prg_per_s: float = 0.0
    shamir_per_s: float = 0.0
    noise_per_s: float = 0.0
    code_per_s: float = 0.0
    select_per_s: float = 0.0
    field_per_s: float = 0.0
    s_per_op: float = 0.0
    s_per_conv: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """Plain dict (inf bandwidths become 0 = unlimited, msgpack/JSON friendly); the fields
        read directly (asdict's deep copy was most of the end of a million-client run, py-spy)."""
        inf = float("inf")
        return {"compute_s_per_sample": self.compute_s_per_sample, "rtt_s": self.rtt_s,
                "up_bps": 0.0 if self.up_bps == inf else self.up_bps,
                "down_bps": 0.0 if self.down_bps == inf else self.down_bps,
                "train_flops_per_s": self.train_flops_per_s, **self.rates(),
                "s_per_op": self.s_per_op, "s_per_conv": self.s_per_conv}

    def rates(self) -> dict[str, float]:
        """The protocol primitives' rates (network/ops.seconds reads them)."""
        return {k: getattr(self, k) for k in CLIENT_RATES}

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> Profile:
        """Inverse of to_dict (0 bandwidth = unlimited)."""
        up, down = float(d.get("up_bps", 0)), float(d.get("down_bps", 0))
        return cls(float(d.get("compute_s_per_sample", 0)), float(d.get("rtt_s", 0)),
                   up if up > 0 else float("inf"), down if down > 0 else float("inf"),
                   float(d.get("train_flops_per_s", 0)),
                   **{k: float(d.get(k, 0)) for k in (*CLIENT_RATES, *FIXED_COSTS)})


BUILT_KEPT = 1 << 14
"""Profiles.__getitem__ keeps at most this many built Profiles (then starts again)."""


class Profiles(Sequence[Profile]):
    """Every client's Profile, held as float64 columns in COLUMNS order (inf: an unlimited
    link) and built on access: a million clients' profiles are at most 32 MB and one numpy
    draw, not a million objects (about 1.5 s and 200 MB; on the server and every client
    process). A column with one value for every client (a preset's link) is a broadcast view
    that holds one number: ten million clients of `--latency lan` are 80 MB, not 320."""

    __slots__ = ("cols", "_built")

    def __init__(self, table: Any = None, cols: tuple[np.ndarray, ...] | None = None) -> None:
        if cols is None:
            t = _widened(np.asarray(table, dtype=np.float64))
            cols = tuple(t[:, j] for j in range(len(COLUMNS)))
        self.cols = cols
        # the Profiles built lately, by index: a round reads each of its clients' about six
        # times (its task's bounds, compute, reply, arrival); a Profile is frozen and the
        # columns are never written once held here
        self._built: dict[int, Profile] = {}

    @property
    def table(self) -> np.ndarray:
        """The (n, len(COLUMNS)) table (a new array)."""
        return np.stack(self.cols, axis=1)

    @classmethod
    def of(cls, profs: Sequence[Profile]) -> Profiles:
        """From Profile objects."""
        return cls([tuple(getattr(p, k) for k in COLUMNS) for p in profs])

    @classmethod
    def from_array(cls, a: np.ndarray) -> Profiles:
        """From to_array's form (0 bandwidth, or less: unlimited), as Profile.from_dict reads it."""
        t = _widened(np.array(a, dtype=np.float64))
        links = t[:, 2:4]
        links[links <= 0] = np.inf
        return cls(t)

    def __len__(self) -> int:
        return len(self.cols[0])

    @overload
    def __getitem__(self, i: int) -> Profile: ...
    @overload
    def __getitem__(self, i: slice) -> Profiles: ...

    def __getitem__(self, i: int | slice) -> Profile | Profiles:
        if isinstance(i, slice):
            return Profiles(cols=tuple(c[i] for c in self.cols))
        got = self._built.get(i)
        if got is None:
            got = Profile(*(float(col[i]) for col in self.cols))
            if len(self._built) >= BUILT_KEPT:
                self._built.clear()
            self._built[i] = got
        return got

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Profiles):
            return len(self) == len(other) and all(
                np.array_equal(a, b) for a, b in zip(self.cols, other.cols))
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (mutable columns: equal by value)

    def __add__(self, other: Profiles) -> Profiles:
        """Concatenated, as lists are (profs[1:] + profs[:1])."""
        if not isinstance(other, Profiles):
            return NotImplemented
        return Profiles(cols=tuple(np.concatenate([a, b]) for a, b in zip(self.cols, other.cols)))

    def subset(self, ids: Sequence[int] | np.ndarray) -> Profiles:
        """The profiles of clients `ids`, in that order (consecutive ids: views of the columns,
        no copy; a process of a million clients' WELCOME)."""
        at = np.asarray(ids, dtype=np.int64)
        if at.ndim == 1 and len(at) > 1 and 0 <= at[0] and at[-1] < len(self) \
                and int(at[-1]) - int(at[0]) == len(at) - 1 and bool((np.diff(at) == 1).all()):
            return self[int(at[0]):int(at[-1]) + 1]
        return Profiles(cols=tuple(c[at] for c in self.cols))


def _widened(t: np.ndarray) -> np.ndarray:
    """A profile table as (n, len(COLUMNS)): one of an older width (OLDER_WIDTHS: a
    population.npz or checkpoint of an older run) gets the later columns at 0 (free)."""
    if t.ndim == 2 and t.shape[1] in OLDER:
        at = {c: j for j, c in enumerate(OLDER[t.shape[1]])}
        out = np.zeros((len(t), len(COLUMNS)))
        for j, c in enumerate(COLUMNS):
            if c in at:
                out[:, j] = t[:, at[c]]
        return out
    return t.reshape(-1, len(COLUMNS))
