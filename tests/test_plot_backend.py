"""Plotting never switches the caller's matplotlib backend (issue 41 item 3): a notebook whose
backend is interactive keeps it after a run wrote its plots."""
from __future__ import annotations

import subprocess
import sys


def test_a_run_with_plots_leaves_the_backend_alone(tmp_path):
    code = f"""
import matplotlib
matplotlib.use("svg")  # stands for a notebook's inline backend: anything but Agg
from fednet.api import run
s = run(clients=3, rounds=1, out={str(tmp_path / 'run')!r}).summary
import pathlib
assert s["status"] == "completed", s
assert (pathlib.Path({str(tmp_path / 'run')!r}) / "accuracy_vs_round.png").stat().st_size > 1000
print(matplotlib.get_backend())
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "svg"
