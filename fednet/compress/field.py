"""A codec's common-grid form: how its output is made to sum in secure aggregation's field
(`--compress int8|qsgd[:S]` under `--secagg full|plus`; docs/algorithms.md, "Secure
aggregation", "Compressed inputs").

A codec as it runs in the clear (compress/codecs.py) takes its scale from the client's own
update (int8 a tensor's range, QSGD a tensor's norm), and two clients' codes of different
scales do not add. Under secure aggregation the server can unmask only a sum, so a codec that
declares a FieldGrid is applied with one scale for every client of the round: each value is
clipped to [-c, c], c the bound the server sets (--secagg-clip: the run's configuration, sent
in the task, never taken from a client), and rounded stochastically (unbiased; drawn from the
run's seeded stream, (seed, "secagg-round", round, client)) onto the grid of `levels(ARG)`
steps a side of zero (int8: 127, its signed range without -128; qsgd:S: S). FedAvg's weight
goes into the values, not onto the integers: a client with n examples scales its clipped values
by n / n_top (n_top the cohort's largest, sent in the task), so that each grid integer is at
most L = 2 levels and a sum of k inputs at most k L. The client sends the grid's integers
masked; the server unmasks their sum, dequantizes it once and divides by sum_u n_u / n_top
(secagg/field.py, algorithms/secagg.py): FedAvg's weighted mean, up to the rounding. The
masked vector travels in the fewest bits any sum of the round can need, ceil(log2(k L + 1)) for
a cohort of k (a value's bits plus ceil(log2 k) at most), and one guard bit that keeps the
server's check of the unmasked sum meaningful, packed (secagg/field.wire_bits, pack).

A codec without a FieldGrid (fp16, top-k, sign: their facts in CodecSpec.why) is refused under
--secagg at validate, before any data loads (algorithms/seam.codec_secagg_problem). A plugin's
codec declares its grid with fednet.api.register_field_grid. No numpy here: validate reads the
table."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldGrid:
    """A codec's common-grid form under secure aggregation: `levels(arg)`, the grid's steps a
    side of zero for the codec's parameter (an integer >= 1; each step clip / levels)."""

    codec: str
    levels: Callable[[float], int]
    doc: str = ""


FIELD_GRIDS: dict[str, FieldGrid] = {}
"""codec name -> its common grid (only the codecs whose output can sum in the field)."""


def register_field_grid(grid: FieldGrid) -> FieldGrid:
    """Declare that a codec's output sums in the field on a common grid (a plugin's codec too);
    a codec given two different grids is a ValueError."""
    old = FIELD_GRIDS.get(grid.codec)
    if old is not None and old != grid:
        raise ValueError(f"--compress {grid.codec}: its field grid is registered twice")
    FIELD_GRIDS[grid.codec] = grid
    return grid


def _int8(arg: float) -> int:
    return 127


def _qsgd(arg: float) -> int:
    return int(arg)


for _g in (FieldGrid("int8", _int8, "127 steps a side of zero: int8's signed range"),
           FieldGrid("qsgd", _qsgd, "S steps a side of zero: QSGD's S levels of one sign")):
    register_field_grid(_g)


def grid_levels(kind: str, arg: float) -> int:
    """The grid's steps L from -c to c (2 * levels a side) of codec `kind` at parameter `arg`;
    0 when it declares no grid."""
    g = FIELD_GRIDS.get(kind)
    return 2 * int(g.levels(arg)) if g is not None else 0
