"""Centered clipping's radius on the scale of the round's updates (issue 53, item 4): radius 0,
the default, is the median of the updates' distances to the center at each iteration, so one
huge update moves the aggregate by at most that median / n; an explicit radius is kept."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.algorithms import robust as R
from fednet.algorithms import robust_spec as S


def test_default_radius_is_the_median_distance_by_hand():
    # center 0; distances 1, 2, 3, 1e30: tau = median = 2.5. (1,0) and (0,2) pass, (3,0) is
    # scaled to 2.5, the outlier to 2.5 along its own direction (0,1): v = (1+2.5, 2+2.5) / 4
    x = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 1e30]])
    v, tau = R.centered_clip(x, np.zeros(2), 0.0, 1)
    assert tau == 2.5 and np.allclose(v, [3.5 / 4, 4.5 / 4], rtol=0, atol=1e-15)
    v, tau = R.centered_clip(x, np.zeros(2), 1e6, 1)  # an explicit radius is used as given
    assert tau == 1e6 and v[1] == (2 + 1e6) / 4  # (0,2) and the outlier at 1e6 along y


def test_one_huge_update_moves_the_default_aggregate_by_at_most_a_median_over_n():
    gen = np.random.default_rng(0)
    honest = gen.normal(0.0, 0.01, (7, 1000)) + 0.05
    for bad in (np.full(1000, 1e30), -1e30 * honest[0], gen.normal(0.0, 1e30, 1000)):
        x = np.vstack([honest[:3], bad, honest[3:]])
        out = R.apply("centered_clip", S.CenteredClipParams(), 0.2, x, np.ones(8))
        tau = out.metrics["robust_radius"]
        moved = np.linalg.norm(out.update - R.centered_clip(honest, np.zeros(1000), tau, 1)[0]
                               * 7 / 8)
        assert moved <= tau / 8 * (1 + 1e-9)
        assert np.linalg.norm(out.update - honest.mean(axis=0)) < 0.5 * np.linalg.norm(
            honest.mean(axis=0))
        old = R.apply("centered_clip", S.CenteredClipParams(radius=10.0), 0.2, x, np.ones(8))
        assert np.linalg.norm(old.update - honest.mean(axis=0)) > 1.0  # tau / n = 1.25 of harm


def test_radius_zero_is_the_default_and_a_negative_radius_is_refused():
    from fednet.errors import ConfigError
    from tests.conftest import small_config

    assert S.CenteredClipParams().radius == 0.0
    cfg = small_config(defense={"name": "centered_clip", "params": {"radius": -1.0}})
    with pytest.raises(ConfigError, match="radius"):
        S.defense_params(cfg)


def _run(tmp_path, name, *more):
    from fednet.cli import local

    local.main(["--clients", "8", "--rounds", "7", "--epochs", "1", "--seed", "0", "--attack",
                "signflip", "--param", "flip=1e30", "--malicious", "ids:3", "--defense",
                "centered_clip", *more, "--out", str(tmp_path / name), "-q"],
               standalone_mode=False)
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r["accuracy"] for r in rows], [r["robust_radius"] for r in rows]


def test_the_default_defends_one_attacker_of_8_sending_a_huge_update(tmp_path):
    """Digits, 8 clients, one epoch a round, client 3 sends -1e30 x its update (issue 53's
    case): the old default tau = 10 stays at chance (the attacker moves the model by
    tau / n = 1.25 each round, more than the honest updates' own size), the median radius
    learns (0.63 after 7 rounds on this machine; FedAvg without attack or defense: 0.67)."""
    acc, radius = _run(tmp_path, "default")
    assert acc[-1] >= 0.4 and acc[-1] > acc[0] + 0.3, acc
    assert all(0 < r < 10 for r in radius), radius
    acc, radius = _run(tmp_path, "tau10", "--param", "radius=10")
    assert max(acc) <= 0.2 and radius == [10.0] * 7, acc
