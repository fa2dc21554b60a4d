"""Defaults that learn: every built-in algorithm, given only --algo and --partition, learns on
digits with 100 clients, the scale its tuned defaults were chosen at (docs/algorithms.md §0.2;
the full-length runs are in BENCHMARKS.md section 10).

The runs go through `fednet sweep` (two cells at a time, one `fednet local` process each), so a
cell's configuration is exactly what `fednet local --clients 100 --algo A --partition P` gives,
except that --rounds is cut to keep the suite short: each cell's accuracy after those rounds (the
clients' mean for personalized algorithms) must clear its floor, far above chance (0.10), and the
tuned defaults must have reached the run (summary.json `tuned`).
"""
from __future__ import annotations

import pytest

from fednet.algorithms.registry import REGISTRY
from tests.integration.conftest import read_json

pytestmark = pytest.mark.slow

BUILTIN = [n for n, s in REGISTRY.items() if s.server.startswith("fednet.algorithms.")]

# partition -> rounds run here; (partition, algorithm) -> accuracy floor after those rounds. A
# floor sits about 0.1 below what seed 0 reached when it was set (the test prints each value).
ROUNDS = {"iid": 10, "shards": 30}
FLOOR: dict[tuple[str, str], float] = {}
DEFAULT_FLOOR = 0.3


@pytest.mark.parametrize("partition", sorted(ROUNDS))
def test_every_algorithm_learns_with_its_defaults(fed, tmp_path, partition):
    rounds = ROUNDS[partition]
    res = fed.run("sweep", "--out", "learn", "--jobs", "2", "--algo", ",".join(BUILTIN), "--",
                  "--clients", "100", "--partition", partition, "--rounds", str(rounds), "-q",
                  timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    cells = {c["method"]: c for c in read_json(tmp_path / "learn" / "sweep.json")["cells"]}
    assert sorted(cells) == sorted(BUILTIN)
    low = []
    for algo in BUILTIN:
        c = cells[algo]
        acc = c["final_accuracy"]
        print(f"{partition} {algo}: {c['status']}, accuracy {acc} after {rounds} rounds")
        summary = read_json(tmp_path / "learn" / c["folder"] / "summary.json")
        tuned = {k: v for k, v in REGISTRY[algo].tuned_for(partition).items() if k != "rounds"}
        assert set(summary.get("tuned", [])) == {f"{k}={v}" for k, v in tuned.items()}, algo
        floor = FLOOR.get((partition, algo), DEFAULT_FLOOR)
        if c["status"] != "completed" or acc is None or acc < floor:
            low.append(f"{algo}: {c['status']}, {acc} < {floor}")
    assert not low, f"{partition}: defaults that do not learn: " + "; ".join(low)
