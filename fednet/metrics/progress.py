"""Console progress: a bar per round on a terminal, one line per round otherwise."""
from __future__ import annotations

import sys
from typing import Any, TextIO


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    """Prints round progress to stderr; quiet=True prints nothing."""

    def __init__(self, total: int, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.total, self.quiet = total, quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._open_line = False  # a bar was drawn with \r and no newline yet

    def update(self, row: dict[str, Any]) -> None:
        """Show the state after one round."""
        if self.quiet:
            return
        r = row["round"] + 1
        width = 24
        done = int(width * r / self.total)
        bar = "#" * done + "." * (width - done)
        acc = row.get("accuracy")
        acc_s = f"{acc:.3f}" if isinstance(acc, float) else "  -  "
        sent = row["bytes_total"]
        line = (f"[{bar}] round {r}/{self.total}  acc {acc_s}  wall {row['wall_s']:.1f}s"
                f"  sim {row['sim_s']:.2f}s  traffic {human_bytes(sent)}")
        if row.get("failures"):
            line += f"  failures {row['failures']}"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if r == self.total else ""))
            self._open_line = r != self.total
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A status line (not overwritten by the bar)."""
        if not self.quiet:
            self.stream.write(("\n" if self._open_line else "") + text + "\n")
            self._open_line = False
            self.stream.flush()
