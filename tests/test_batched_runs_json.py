"""benchmarks/bench_batched_runs.py --json FILE merges: a run of some cells keeps the cells of
FILE it did not run (keyed by spec), each with the commit, command and peak that measured it."""
from __future__ import annotations

import json

from tests.harness import bench


def _cell(spec: str, loop: float, batched: float) -> dict:
    runs = {"loop": {"round_s": loop, "wall_s": 10.0, "accuracy": [0.5]},
            "local-batched": {"round_s": batched, "wall_s": 5.0, "accuracy": [0.5]}}
    return {"spec": spec, "dataset": spec.split(":")[0], "clients": int(spec.split(":")[1]),
            "per_round": 100, "rounds": 2, "repeats": 1, "runs": runs}


def test_a_run_of_some_cells_keeps_the_files_others(tmp_path):
    m = bench("bench_batched_runs")
    path = tmp_path / "runs.json"
    old = {"script": "bench_batched_runs.py", "commit": "aaaaaaa", "matmul_peak_gflops": 100.0,
           "command": "python3 benchmarks/bench_batched_runs.py --cells digits:100,digits:1000 "
                      "--json runs.json", "machine": {"git": "aaaaaaa", "date": "2026-01-01"},
           "cells": [_cell("digits:100", 2.0, 0.5), _cell("digits:1000", 1.0, 0.5)]}
    path.write_text(json.dumps(old))
    new_cmd = "python3 benchmarks/bench_batched_runs.py --cells digits:1000,cifar:10 --json x"
    new = [dict(_cell(s, 1.0, 0.25), commit="bbbbbbb", date="2026-02-02", command=new_cmd,
                matmul_peak_gflops=120.0) for s in ("digits:1000", "cifar:10")]
    got = m.merged(path, {"args": {}, "matmul_peak_gflops": 120.0, "cells": new})
    assert [c["spec"] for c in got["cells"]] == ["digits:100", "digits:1000", "cifar:10"]
    kept = got["cells"][0]
    assert (kept["commit"], kept["matmul_peak_gflops"], kept["runs"]) == (
        "aaaaaaa", 100.0, old["cells"][0]["runs"])
    assert got["cells"][1]["runs"]["local-batched"]["round_s"] == 0.25  # replaced
    assert got["commit"] == "aaaaaaa (digits:100), bbbbbbb (digits:1000, cifar:10)"
    assert got["command"] == old["command"] + " && " + new_cmd
    rows = m.headline(got)
    assert [r["value"] for r in rows] == [0.25, 0.25, 0.25]
    assert "matmul peak 100.0" in rows[0]["note"] and "matmul peak 120.0" in rows[1]["note"]
    m.write(path, got)  # the file keeps the merged commit and command (stamp has its own)
    written = json.loads(path.read_text())
    assert (written["commit"], written["command"]) == (got["commit"], got["command"])
    assert written["script"] == "bench_batched_runs.py" and len(written["headline"]) == 3
    other = tmp_path / "other.json"  # another script's file, or none: this run only
    other.write_text(json.dumps({**old, "script": "bench_batched.py"}))
    assert m.merged(other, {"cells": new})["cells"] == new
    assert m.merged(tmp_path / "absent.json", {"cells": new})["cells"] == new
