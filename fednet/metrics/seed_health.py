"""Which finished runs are no sound result though they completed: the one rule that marks a seed
of a sweep (its tables, plot and sweep.json) or a run folder of `fednet report --plot`.

A run whose status is `completed` (or `budget_spent`) is marked

- **diverged** when its last evaluated loss is not finite (NaN or inf), or has grown above
  LOSS_GROWTH x its first round's while its accuracy fell below its first round's (a loss that
  grows while the accuracy holds or rises is a model growing confident, not a divergence);
- **collapsed** when its final accuracy is at or below chance, 1 / the dataset's classes +
  CHANCE_MARGIN (summary.json's `num_classes`; runs older than that key skip this test), or at
  most COLLAPSE_FRACTION of its own best accuracy (it learned, then lost it).

A marked seed stays in the statistics (its numbers are what happened: a collapsed seed that
crossed the target before collapsing counts as reached); the mark says it is suspect.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fednet.metrics.history import read_rows

CHANCE_MARGIN = 0.02  # accuracy this close to 1 / classes is no better than guessing
COLLAPSE_FRACTION = 0.5  # a final accuracy at most half the run's best: it collapsed
LOSS_GROWTH = 3.0  # a loss this many times its first round's, with the accuracy fallen: diverged
KINDS = ("collapsed", "diverged")


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _loss(row: dict[str, Any]) -> float | None:
    """A row's loss; null (JSON has no NaN: metrics/files.clean_json) is not a number."""
    return math.nan if "loss" in row and row["loss"] is None else _num(row.get("loss"))


def seed_flag(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, str] | None:
    """{'kind': 'collapsed' | 'diverged', 'why': one line with the numbers} for a finished run
    that the rule above marks; None for a sound one (or one with nothing evaluated)."""
    evals = [r for r in rows if not r.get("interim") and _num(r.get("accuracy")) is not None]
    last = _loss(evals[-1]) if evals else _num(summary.get("final_loss"))
    if last is not None and not math.isfinite(last):
        return {"kind": "diverged", "why": "its final loss is not a number"}
    if evals and last is not None:
        first, acc0, acc = _loss(evals[0]), float(evals[0]["accuracy"]), float(evals[-1]["accuracy"])
        if first is not None and 0 < first and LOSS_GROWTH * first < last and acc < acc0:
            return {"kind": "diverged", "why": f"loss {first:.3g} -> {last:.3g} (over "
                    f"{LOSS_GROWTH:g}x its first round's), accuracy {acc0:.4f} -> {acc:.4f}"}
    final, best = _num(summary.get("final_accuracy")), _num(summary.get("best_accuracy"))
    if final is None:
        return None
    classes = _num(summary.get("num_classes"))
    if classes and classes >= 2 and final <= 1 / classes + CHANCE_MARGIN:
        return {"kind": "collapsed", "why": f"final accuracy {final:.4f}, at or below chance "
                f"(1/{classes:g} + {CHANCE_MARGIN:g})"}
    if best is not None and best > 0 and final <= COLLAPSE_FRACTION * best:
        return {"kind": "collapsed", "why": f"final accuracy {final:.4f}, at most "
                f"{COLLAPSE_FRACTION:g} x its best {best:.4f}"}
    return None


def folder_flag(folder: Path, summary: dict[str, Any]) -> dict[str, str] | None:
    """seed_flag of a run folder (its metrics.jsonl read here)."""
    return seed_flag(summary, read_rows(folder))


def flag_text(flag: dict[str, str] | None) -> str:
    """'collapsed: final accuracy 0.1000, ...' (a CSV cell, a footnote); '' for none."""
    return f"{flag['kind']}: {flag['why']}" if flag else ""
