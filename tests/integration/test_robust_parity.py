"""Byzantine clients under `fednet launch` are real client processes whose results travel and
are counted like any other; every attack and every defense gives the same model, bytes,
simulated time and rows as `fednet local`, bit for bit (issue 40)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.core.inproc import run_local
from fednet.server.main import run_zmq
from tests.conftest import small_config
from tests.harness import BYTE_KEYS

pytestmark = [pytest.mark.net, pytest.mark.slow]
# every attack once, every defense at least once (centered clipping under FedAdam: the FedOpt
# family reads the defense's aggregate too)
PAIRS = [("labelflip", "median", "fedavg"), ("signflip", "krum", "fedavg"),
         ("noise", "trimmed_mean", "fedavg"), ("backdoor", "norm_bound", "fedavg"),
         ("alie", "multikrum", "fedprox"), ("ipm", "centered_clip", "fedadam"),
         ("minmax", "bulyan", "fedavg"), ("minsum", "none", "fedavg")]


def _model(out):
    with np.load(out / "final_model.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("attack,defense,algo", PAIRS, ids=[f"{a}+{d}" for a, d, _ in PAIRS])
def test_attack_and_defense_local_equals_launch(tmp_path, attack, defense, algo):
    cfg = small_config(clients=8, rounds=2, data={"partition": "dirichlet", "alpha": 0.5},
                       algo={"name": algo}, attack={"name": attack, "malicious": "0.25"},
                       defense={"name": defense, "params": {"f": 1} if defense == "bulyan"
                                else {}})
    a = run_local(cfg.replace(out=str(tmp_path / "local")), quiet=True)
    b = run_zmq(cfg.replace(out=str(tmp_path / "launch")), quiet=True)
    assert a["status"] == b["status"] == "completed" and not b["failures"]
    ma, mb = _model(tmp_path / "local"), _model(tmp_path / "launch")
    assert ma.keys() == mb.keys() and all(np.array_equal(ma[k], mb[k]) for k in ma)
    assert {k: a["bytes"][k] for k in BYTE_KEYS} == {k: b["bytes"][k] for k in BYTE_KEYS}
    assert a["sim_time_s"] == b["sim_time_s"] and a["final_accuracy"] == b["final_accuracy"]
    assert a["attack"]["malicious"] == b["attack"]["malicious"] and len(a["attack"]["malicious"]) == 2
    ra, rb = _rows(tmp_path / "local"), _rows(tmp_path / "launch")
    drop = ("wall_s",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in ra] == \
        [{k: v for k, v in r.items() if k not in drop} for r in rb]
    # the attackers are clients of the run: every one of the 8 sent its result each round
    assert all(r["results"] == 8 for r in rb)
    assert b["bytes_client_view"]["client_to_server"] == b["bytes"]["client_to_server"]
    if attack == "backdoor":
        assert "attack_success" in ra[-1] and a["final_attack_success"] == b["final_attack_success"]
