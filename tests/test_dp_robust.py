"""Central DP with a robust rule where the order is sound (issue 58 item 3): each update clipped
to C, the rule on the fixed cohort's m rows, then Gaussian noise calibrated to the rule's
declared sensitivity S (std z S / 2, the fixed-size sampling event's z / 2); rules without a
small bound refused with their reason (test_dp_mechanisms.CONFIG_RULES)."""
from __future__ import annotations

import numpy as np

from fednet.algorithms import robust, robust_spec as S
from fednet.algorithms.checks import validate
from fednet.algorithms.dp_mean import PrivateRuleMean
from fednet.core.inproc import run_local
from tests.conftest import small_config


def _rule(name, p, share=0.2):
    def rule(x):
        out = robust.apply(name, p, share, x, np.ones(len(x)))
        return out.update, out.metrics, out.why
    return rule


def _mean(rule, std, m=3, seed=5):
    ref = {"w": np.array([1.0, -1.0], np.float32)}
    return PrivateRuleMean(ref, 1.0, std, m, lambda: np.random.default_rng(seed), rule)


def test_the_declared_sensitivities():
    tm, nb = S.defense_spec("trimmed_mean"), S.defense_spec("norm_bound")
    assert tm.sensitivity(1.0, 3, 1, S.TrimmedMeanParams()) == 2.0  # 2C / (m - 2k), k = f
    assert tm.sensitivity(0.5, 10, 0, S.TrimmedMeanParams(trim=0.2)) == 2 * 0.5 / 6  # k = 2
    assert nb.sensitivity(1.0, 4, 0, S.NormBoundParams(bound=0.5)) == 0.25  # 2 min(C, M) / m
    assert nb.sensitivity(0.2, 4, 0, S.NormBoundParams(bound=0.5)) == 0.1
    assert "median of the round's update norms" in nb.sensitivity(1.0, 4, 0, S.NormBoundParams())
    assert S.defense_spec("median").sensitivity is None


def test_norm_bounding_between_the_clipping_and_the_noise_on_three_toy_clients():
    """C = 1, M = 0.5, m = 3, z = 2: (3, 4) clipped to (0.6, 0.8), bounded to (0.3, 0.4);
    (0.3, 0) unchanged; the third client sent nothing (a zero row). The rule's mean is
    (0.2, 0.4/3); S = 2 x 0.5 / 3, the noise's std z S / 2 = 1/3."""
    p = S.NormBoundParams(bound=0.5)
    sens = S.defense_spec("norm_bound").sensitivity(1.0, 3, 0, p)
    mean = _mean(_rule("norm_bound", p), 2.0 * sens / 2)
    mean.add({"w": np.array([4.0, 3.0], np.float32)}, key=2)
    mean.add({"w": np.array([1.3, -1.0], np.float32)}, key=0)
    noise = np.random.default_rng(5).standard_normal(2) / 3
    want = np.array([1.0, -1.0]) + np.array([0.2, 0.4 / 3]) + noise
    assert mean.clipped == 1 and mean.count == 2
    assert np.allclose(mean.mean64()["w"], want, rtol=0, atol=1e-6)  # (the inputs are float32)
    assert mean.metrics["robust_bound"] == 0.5


def test_a_trimmed_mean_between_the_clipping_and_the_noise_on_three_toy_clients():
    """C = 1, m = 3, f = 1 (k = 1: the middle value of each coordinate), z = 0.5: the updates
    (3, 4) -> (0.6, 0.8), (0.5, -0.5) and (-1, 0); the middle values (0.5, 0); S = 2C / (3 - 2)
    = 2, the noise's std z S / 2 = 0.5."""
    mean = _mean(_rule("trimmed_mean", S.TrimmedMeanParams(f=1)), 0.5 * 2.0 / 2, seed=9)
    for cid, u in enumerate(([3.0, 4.0], [0.5, -0.5], [-1.0, 0.0])):
        mean.add({"w": np.array([1.0, -1.0], np.float32) + np.array(u, np.float32)}, key=cid)
    want = np.array([1.5, -1.0]) + 0.5 * np.random.default_rng(9).standard_normal(2)
    assert np.allclose(mean.mean64()["w"], want, rtol=0, atol=1e-6)


def test_a_private_robust_run_spends_what_the_plain_private_run_spends(tmp_path):
    """--dp central --dp-sampling fixed with --defense trimmed_mean: the same accountant events
    (the noise is calibrated to the rule's sensitivity, so one round is the same fixed-size
    Gaussian event), the rule's metrics and sensitivity in the rows, a model of its own."""
    import json

    def run(name, defense):
        cfg = small_config(clients=6, rounds=2, out=str(tmp_path / name), algo={"fraction": 0.5},
                           dp={"mode": "central", "noise": 0.05, "clip": 0.5,
                               "sampling": "fixed"}, defense={"name": defense})
        s = run_local(validate(cfg), quiet=True)
        assert s["status"] == "completed", s.get("error")
        rows = [json.loads(r) for r in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return s, rows

    plain, robust_run = run("plain", "none"), run("trimmed", "trimmed_mean")
    assert robust_run[0]["dp"]["epsilon"] == plain[0]["dp"]["epsilon"] > 0
    assert robust_run[0]["dp"]["events"] == plain[0]["dp"]["events"]
    row = robust_run[1][0]
    assert row["dp_sensitivity"] == 2 * 0.5 / (3 - 2)  # m = 3, f = ceil(0.2 x 3) = 1
    assert row["dp_sigma"] == 0.05 * row["dp_sensitivity"] / 2 and row["robust_f"] == 1.0
    assert plain[1][0]["dp_sigma"] == 0.05 * 0.5  # z C on the sum, as before
