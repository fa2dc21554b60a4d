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
