"""Console progress: a bar per round on a terminal, one line per round otherwise; each line has the
accuracy, the mean training loss and the time left. A run whose model loss has not fallen after a
few rounds gets one hint naming the options to look at."""
from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

SHOWN_REASONS = 10  # distinct failure reasons printed on the terminal, at most

HINT_ROUNDS = 5  # rounds after which a loss that has not fallen gets the hint
HINT_FALL = 0.05  # "fallen": at least 5% below the first round's


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: float) -> str:
    """1234567 -> '1.23M' (k, M, G: thousands, millions, billions)."""
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            v = n / div
            return f"{v:.3g}{unit}" if abs(v) < 999.5 else f"{v:.0f}{unit}"
    return f"{n:.0f}"


def human_seconds(s: float) -> str:
    """75 -> '1m15s'."""
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def stalled_hint(first: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The hint when the model's loss (the evaluated one: global on the test set, or the clients'
    own) is not HINT_FALL below round 0's, or is not finite, while the accuracy is below 50%
    (a model that converged in round 0 gets none, nor does one at 99% whose loss overflowed on
    a few confidently wrong samples); None otherwise."""
    a, b = _num(first.get("loss")), _num(now.get("loss"))
    acc = _num(now.get("accuracy"))
    if a is None or b is None or (math.isfinite(b) and b < (1 - HINT_FALL) * a):
        return None
    if acc is not None and acc >= 0.5:
        return None
    t0, t1 = _num(first.get("train_loss")), _num(now.get("train_loss"))
    r = now["round"] + 1
    head = (f"hint: after {r} rounds the model's loss has not fallen ({a:.3f} -> {b:.3f}"
            + (f"; clients' training loss {t0:.3f} -> {t1:.3f})" if t0 is not None and
               t1 is not None else ")"))
    if not math.isfinite(b):
        if _num(now.get("epsilon")) is not None:  # differential privacy's noise
            return head + (": it diverged; under differential privacy the noise is the likely "
                           "cause (see the warning before round 1): more clients a round, a "
                           "larger --dp-epsilon or fewer --rounds; else a smaller --lr")
        return head + ": it diverged; try a smaller --lr (or --param clip=... where supported)"
    acc0 = _num(first.get("accuracy"))
    if acc is not None and acc0 is not None and acc - acc0 >= 0.05 and b > a:
        return (head + f", but the accuracy rose ({acc0:.3f} -> {acc:.3f}): the models learn and "
                "grow overconfident; if the accuracy stalls, look at fewer --epochs, "
                "--weight-decay and --lr")
    if t1 is not None and t0 is not None and t1 < 0.5 * t0:
        return (head + ": the clients fit their own data but the evaluated model does not learn "
                "(common with --partition shards or a small --alpha); try fewer --epochs and a "
                "smaller --lr, e.g. --epochs 1 --lr 0.05, or an algorithm made for non-IID data")
    return (head + ": look at --lr (larger, or smaller if the loss jumps), --epochs, "
            "--batch-size and --momentum")


class Progress:
    """Prints round progress to stderr; quiet=True prints nothing."""

    def __init__(self, total: int, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.total, self.quiet = total, quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._open_line = False  # a bar was drawn with \r and no newline yet
        self._last_len = 0  # that bar's length (a shorter one is padded over it)
        self._first: dict[str, Any] | None = None  # the first row this process saw
        self._hinted = False
        self.reasons: set[str] = set()  # failure reasons shown (failure)

    def eta(self, row: dict[str, Any]) -> float | None:
        """Wall-clock seconds left, from the pace since the first row seen (a resumed run starts
        its pace at its first new round)."""
        first, r = self._first, row["round"] + 1
        if first is None or r >= self.total:
            return None
        done = r - (first["round"] + 1)
        if done > 0:
            per = (row["wall_s"] - first["wall_s"]) / done
        else:
            per = row["wall_s"] / r
        return max(0.0, per * (self.total - r))

    def update(self, row: dict[str, Any]) -> None:
        """Show the state after one round (and the hint, once, when the loss is stuck)."""
        if self._first is None:
            self._first = row
        if self.quiet:
            return
        r = row["round"] + 1
        width = 24
        done = int(width * min(r, self.total) / max(self.total, 1))
        bar = "#" * done + "." * (width - done)
        acc = row.get("accuracy")
        acc_s = f"{acc:.3f}" if isinstance(acc, float) else "  -  "
        line = f"[{bar}] round {r}/{self.total}  acc {acc_s}"
        tl = _num(row.get("train_loss"))
        if tl is not None:
            line += f"  train loss {tl:.3f}"
        line += f"  wall {row['wall_s']:.1f}s"
        left = self.eta(row)
        if left is not None:
            line += f" (~{human_seconds(left)} left)"
        line += f"  sim {row['sim_s']:.2f}s  traffic {human_bytes(row['bytes_total'])}"
        if row.get("failures"):
            line += f"  failures {row['failures']}"
        for key, label in (("epsilon", "eps"), ("dp_sgd_epsilon", "example eps")):
            if _num(row.get(key)) is not None:  # differential privacy spent so far
                line += f"  {label} {row[key]:.3g}"
        if self.tty:  # padded over the last line's length: no old characters left behind
            pad, self._last_len = max(0, self._last_len - len(line)), len(line)
            self.stream.write("\r" + line + " " * pad + ("\n" if r == self.total else ""))
            self._open_line = r != self.total
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        if not self._hinted and r >= HINT_ROUNDS and self._first["round"] == 0:
            self._hinted = True
            hint = stalled_hint(self._first, row)
            if hint:
                self.message(hint)

    def message(self, text: str) -> None:
        """A status line (not overwritten by the bar)."""
        if not self.quiet:
            self.stream.write(("\n" if self._open_line else "") + text + "\n")
            self._open_line = False
            self.stream.flush()

    def failure(self, rnd: int, cid: int, reason: str, hint: str = "") -> None:
        """Print each distinct failure reason once (its first line; numbers do not make a reason
        distinct), the first SHOWN_REASONS of them; summary.json has every failure. `hint`:
        where the clients' tracebacks are."""
        line = (reason.strip().splitlines() or ["unknown"])[0][:300]
        key = re.sub(r"\d+", "#", line)
        if key in self.reasons or len(self.reasons) > SHOWN_REASONS:
            return
        self.reasons.add(key)
        if len(self.reasons) > SHOWN_REASONS:
            self.message(f"more distinct failure reasons: see {hint or 'the log'} and summary.json")
            return
        where = "setup stage" if rnd < 0 else f"round {rnd + 1}"
        self.message(f"{where}: client {cid} failed: {line}" + (f" ({hint})" if hint else ""))

    def counter(self, total: int, what: str, every_s: float = 5.0) -> Callable[[Any], list]:
        """A reply callback for a long stage of `total` tasks: a line every `every_s` seconds
        (`setup stage: 2,400/10,000 tasks done, ~1m 10s left`); it releases no tasks."""
        t0 = last = time.monotonic()
        done = 0

        def count(_reply: Any) -> list:
            nonlocal done, last
            done += 1
            now = time.monotonic()
            if now - last >= every_s and done < total:
                last = now
                left = (now - t0) / done * (total - done)
                self.message(f"{what}: {done:,}/{total:,} tasks done, ~{human_seconds(left)} left")
            return []
        return count


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table."""
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, sep] + body)
