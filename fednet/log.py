"""Logging setup: the role (server, client 7, launcher) on every record."""
from __future__ import annotations

import logging
import os
import sys


def setup_logging(role: str, level: str | int = "INFO", stream=None) -> None:
    """Configure the root logger once per process, tagging records with role and pid."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    h = logging.StreamHandler(stream or sys.stderr)
    h.setFormatter(logging.Formatter(
        f"%(asctime)s {role} [{os.getpid()}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root.addHandler(h)
    root.setLevel(level if isinstance(level, int) else getattr(logging, str(level).upper(), 20))


class Throttle:
    """At most `per_s` records a second through it; a summary line counts what it held back
    (a flood of faults or of hostile messages cannot flood the log)."""

    def __init__(self, logger: logging.Logger, per_s: int = 20) -> None:
        self.log, self.per_s = logger, per_s
        self._window, self._n, self.held = 0.0, 0, 0

    def warning(self, msg: str, *args: object) -> None:
        """log.warning, unless per_s lines were written in the last second."""
        import time

        now = time.monotonic()
        if now - self._window > 1.0:
            if self.held:
                self.log.warning("... %d more like these not shown", self.held)
            self._window, self._n, self.held = now, 0, 0
        self._n += 1
        if self._n <= self.per_s:
            self.log.warning(msg, *args)
        else:
            self.held += 1
