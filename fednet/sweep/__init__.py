"""`fednet sweep`: a grid of runs (grid.py: options -> cells and their checks; runner.py: run
them as subprocesses, resume, tabulate with metrics/sweep_table.py)."""
