"""Defaults that learn: every built-in algorithm, given only --algo and --partition, learns on
digits with 100 clients, the scale its tuned defaults were chosen at (docs/algorithms.md §0.2;
the full-length runs are in docs/benchmarks/history.md section 10).

The runs go through `fednet sweep` (two cells at a time, one `fednet local` process each), so a
cell's configuration is exactly what `fednet local --clients 100 --algo A --partition P` gives,
except that --rounds is cut to what shows learning, to keep the suite short. A cell must complete,
its best accuracy over those rounds (the clients' mean for personalized algorithms) must clear
its floor (chance is 0.10), and the tuned defaults must have reached the run (summary `tuned`).
"""
from __future__ import annotations

import os

import pytest

from fednet.algorithms.registry import REGISTRY
from tests.integration.conftest import read_json

pytestmark = [pytest.mark.slow, pytest.mark.long]

BUILTIN = [n for n, s in REGISTRY.items() if s.server.startswith("fednet.algorithms.")]

# (partition, algorithm) -> (rounds run here, floor of the best accuracy). Each floor sits about
# 25% below what seed 0 reached with the tuned defaults (docs/benchmarks/history.md section 10 has the whole
# curves); on shards the FedAvg family climbs slowly and unevenly, so it runs longest.
PLAN: dict[str, dict[str, tuple[int, float]]] = {
    "iid": {
        "fedavg": (10, 0.55), "fedprox": (10, 0.55), "scaffold": (10, 0.45),
        "feddyn": (10, 0.55), "standalone": (10, 0.27), "centralized": (3, 0.9),
        "fedseq": (5, 0.8), "fedseq_inter": (5, 0.6), "factorized": (10, 0.22),
        "factorized_beta": (10, 0.22), "pfedpara": (10, 0.25), "cfl": (10, 0.23),
        "fedfomo": (10, 0.17), "perfedavg": (20, 0.3), "fedavgm": (10, 0.55),
        "fedadam": (10, 0.35), "fedyogi": (10, 0.35), "fedadagrad": (10, 0.6),
        "fedasync": (10, 0.5), "fedbuff": (10, 0.45),
    },
    "shards": {
        "fedavg": (40, 0.33), "fedprox": (40, 0.33), "scaffold": (40, 0.18),
        "feddyn": (40, 0.18), "standalone": (3, 0.9), "centralized": (3, 0.85),
        "fedseq": (30, 0.65), "fedseq_inter": (30, 0.55), "factorized": (3, 0.9),
        "factorized_beta": (3, 0.9), "pfedpara": (3, 0.9), "cfl": (8, 0.9),
        "fedfomo": (3, 0.9), "perfedavg": (3, 0.9), "fedavgm": (40, 0.18),
        "fedadam": (40, 0.5), "fedyogi": (40, 0.5), "fedadagrad": (30, 0.55),
        "fedasync": (40, 0.16), "fedbuff": (40, 0.2),
    },
}


def test_the_plan_covers_every_builtin_algorithm():
    for partition, plan in PLAN.items():
        assert sorted(plan) == sorted(BUILTIN), partition


CI_PARTITIONS = ("shards",)
"""FEDNET_LONG=ci (what .ci/run sets, to keep CI under 40 minutes): the shards sweep only, where
the tuned defaults differ most from the generic ones and the FedAvg family climbs slowest; the
iid sweep (about 5 minutes on 2 cores) runs everywhere else."""


@pytest.mark.parametrize("partition", sorted(PLAN))
def test_every_algorithm_learns_with_its_defaults(fed, tmp_path, partition):
    if os.environ.get("FEDNET_LONG") == "ci" and partition not in CI_PARTITIONS:
        pytest.skip(f"FEDNET_LONG=ci runs the {', '.join(CI_PARTITIONS)} sweep only")
    plan = PLAN[partition]
    methods = [a for algo, (r, _) in plan.items()
               for a in ("--method", f"{algo}=--algo {algo} --rounds {r}")]
    res = fed.run("sweep", "--out", "learn", "--jobs", "2", "--metric", "best_accuracy",
                  *methods, "--", "--clients", "100", "--partition", partition, "-q",
                  timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    cells = {c["method"]: c for c in read_json(tmp_path / "learn" / "sweep.json")["cells"]}
    assert sorted(cells) == sorted(plan)
    low = []
    for algo, (rounds, floor) in plan.items():
        c = cells[algo]
        best = c["best_accuracy"]
        print(f"{partition} {algo}: {c['status']}, best accuracy {best} in {rounds} rounds")
        summary = read_json(tmp_path / "learn" / c["folder"] / "summary.json")
        tuned = {k: v for k, v in REGISTRY[algo].tuned_for(partition).items() if k != "rounds"}
        assert set(summary.get("tuned", [])) == {f"{k}={v}" for k, v in tuned.items()}, algo
        if c["status"] != "completed" or best is None or best < floor:
            low.append(f"{algo}: {c['status']}, {best} < {floor}")
    assert not low, f"{partition}: defaults that do not learn: " + "; ".join(low)
