"""Differential privacy's failure modes, named as what they are (issue 54): every DP value that
cannot be used refused in one line naming its option (exit code 2, nothing written: no run
folder), a calibration that cannot be solved refused the same way, the default delta below 1/N
and a warning for a given one that is not, the neighbouring relation of each epsilon, and NaN
results and divergence that the noise caused put down to the noise, not to --lr."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("dp_accounting")

from fednet.algorithms.layout import NON_FINITE  # noqa: E402
from fednet.cli.commands import main  # noqa: E402
from fednet.core.replies import accept_reply  # noqa: E402
from fednet.core.status import RunStatus  # noqa: E402
from fednet.core.verdict import Verdict  # noqa: E402
from fednet.errors import ConfigError  # noqa: E402
from fednet.network.latency import Profile  # noqa: E402
from fednet.privacy import plan  # noqa: E402
from fednet.privacy.accountant import Z_MAX, Z_MIN  # noqa: E402
from fednet.protocol import Message, MsgKind  # noqa: E402
from fednet.types import Failure  # noqa: E402
from tests.conftest import run_for_model, small_config  # noqa: E402


def _refused(tmp_path, *args: str, command: str = "local") -> str:
    """The one line of a command refused with exit code 2, having written nothing."""
    out = tmp_path / "run"
    res = CliRunner().invoke(main, [command, "--rounds", "3", "-q", "--out", str(out), *args])
    assert res.exit_code == 2, (res.exit_code, res.output, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fednet: error: "), res.stderr
    assert "Traceback" not in res.output + res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
    return lines[0][len("fednet: error: "):]


CASES = [
    # non-finite numbers: a range check lets inf through, and each broke the run somewhere else
    (["--dp", "central", "--dp-epsilon", "inf"],
     "--dp-epsilon inf: a privacy budget is a finite number"),  # was NoBracketIntervalFoundError
    (["--dp", "local", "--dp-noise", "1", "--dp-epsilon", "inf"], "--dp-epsilon inf"),
    (["--dp", "central", "--dp-noise", "inf"], "--dp-noise inf: give a finite number"),
    (["--dp", "central", "--dp-noise", "1", "--dp-clip", "inf"], "--dp-clip inf: give a finite"),
    (["--dp", "central", "--dp-noise", "1", "--dp-adaptive", "--dp-count-noise", "inf"],
     "--dp-count-noise inf: give a finite number"),
    (["--dp", "central", "--dp-noise", "1", "--dp-adaptive", "--dp-clip-lr", "inf"],
     "--dp-clip-lr inf: give a finite number"),
    (["--dp-sgd-noise", "inf"], "--dp-sgd-noise inf: give a finite number"),
    (["--dp-sgd-noise", "1", "--dp-sgd-clip", "inf"], "--dp-sgd-clip inf: give a finite number"),
    (["--dp", "central", "--dp-epsilon", "nan"], "--dp-epsilon must be >= 0"),
    (["--dp", "central", "--dp-noise", "1", "--dp-delta", "nan"], "--dp-delta must be in [0, 1)"),
    (["--dp", "central", "--dp-noise", "1", "--dp-delta", "inf"], "--dp-delta must be in [0, 1)"),
    (["--dp", "central", "--dp-noise", "1", "--dp-quantile", "nan"], "--dp-quantile must be"),
    # noise multipliers the accountant cannot take (were ZeroDivisionError, OverflowError)
    (["--dp", "central", "--dp-noise", "1e-300"],
     "--dp-noise 1e-300: a noise multiplier is in [0.001, 1e+08] (0: calibrated); below, the "
     "accountant divides by almost 0"),
    (["--dp", "central", "--dp-noise", "1e300", "--dp-clip", "1e-300"], "--dp-noise 1e+300: "),
    (["--dp-sgd-noise", "1e-300"], "--dp-sgd-noise 1e-300: a noise multiplier is in [0.001, "
     "1e+08] (0: off)"),
    # adaptive clipping's step exp(-L (b - Q)) beyond float range (was an OverflowError)
    (["--dp", "central", "--dp-noise", "0.5", "--dp-adaptive", "--dp-clip-lr", "1e6"],
     "--dp-clip-lr 1e+06: adaptive clipping's step C exp(-L (b - Q)) can overflow"),
    (["--dp", "central", "--dp-noise", "0.5", "--dp-adaptive", "--dp-count-noise", "1e300"],
     "--dp-clip-lr 0.2: adaptive clipping's step"),
    # a noise beyond a float32 model's range: inf at once
    (["--dp", "central", "--dp-noise", "2", "--dp-clip", "1e300"],
     "--dp-clip 1e+300: the noise's standard deviation (noise multiplier x clip = 2e+300) is "
     "beyond a float32 model's range"),
    # calibrations that cannot be solved: named, not dp-accounting's exception
    (["--dp", "central", "--dp-epsilon", "1e9"],
     "--dp-epsilon 1e+09: 3 rounds spend only epsilon"),
    (["--dp", "local", "--dp-epsilon", "1e12"], "--dp-epsilon 1e+12: 3 rounds spend only epsilon "
     "6.6e+06 at a noise multiplier of 0.001 (no noise to speak of), so there is no noise to "
     "calibrate"),
    (["--dp", "central", "--dp-epsilon", "0.001", "--dp-delta", "1e-300"],
     "--dp-epsilon 0.001 at delta 1e-300: no noise multiplier in [0.001, 2.15e+09] meets it; "
     "give a larger --dp-epsilon or --dp-delta"),
    (["--dp", "central", "--dp-epsilon", "1", "--dp-adaptive"],
     "--dp-adaptive with --dp-epsilon 1: the calibrated noise multiplier 7.007 is not below "
     "twice the count's noise (2 x 0.5)"),
    # (was refused only after the data loaded)
    (["--dp", "central", "--dp-noise", "3", "--dp-adaptive"],
     "--dp-noise 3 needs a count noise above 1.5 with --dp-adaptive (the two releases share the "
     "noise multiplier), and it is 0.5 (the expected cohort / 20)"),
    # settings a run would not use
    (["--dp", "central", "--dp-noise", "1", "--dp-quantile", "0.3"],
     "--dp-quantile: settings of adaptive clipping; add --dp-adaptive"),
    (["--dp", "central", "--dp-noise", "1", "--dp-clip-lr", "0.5", "--dp-count-noise", "2"],
     "--dp-clip-lr, --dp-count-noise: settings of adaptive clipping; add --dp-adaptive"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_dp_value_is_refused_in_one_line_before_anything_is_written(tmp_path, args,
                                                                           message):
    assert _refused(tmp_path, *args).startswith(message)


def test_launch_refuses_an_impossible_calibration_before_its_folder_exists(tmp_path):
    """fednet launch opens its run folder before the session calibrates: the check is first."""
    why = _refused(tmp_path, "--dp", "central", "--dp-epsilon", "inf", command="launch")
    assert why.startswith("--dp-epsilon inf")


def test_the_calibration_itself_names_the_option_when_it_cannot_be_solved():
    """plan.calibrated's own refusal (behind checks.validate's): one ConfigError line."""
    cfg = small_config(dp={"mode": "central", "epsilon": 1e9})
    with pytest.raises(ConfigError, match=r"^--dp-epsilon 1e\+09: 2 rounds spend only epsilon "):
        plan.calibrated(cfg)
    assert plan.calibration_problem(cfg).startswith("--dp-epsilon 1e+09: 2 rounds spend only")
    assert Z_MIN == 1e-3 and 2.1e9 < Z_MAX < 2.2e9


@pytest.mark.parametrize("clients, want", [(3, 1e-5), (10, 1e-5), (10_000, 1e-5),
                                           (50_000, 2e-6), (1_000_000, 1e-7)])
def test_the_default_delta_is_well_below_one_over_the_population(clients, want):
    cfg = small_config(clients=clients, dp={"mode": "central", "noise": 1.0})
    assert plan.delta(cfg) == pytest.approx(want, rel=1e-12) and plan.delta(cfg) <= 0.1 / clients
    given = small_config(clients=clients, dp={"mode": "central", "noise": 1.0, "delta": 0.3})
    assert plan.delta(given) == 0.3


def test_a_given_delta_not_below_one_over_n_is_warned_of_and_recorded(tmp_path, caplog):
    cfg = small_config(clients=4, rounds=1, dp={"mode": "central", "noise": 0.5, "delta": 0.25})
    with caplog.at_level(logging.WARNING, logger="fednet.server"):
        s, _ = run_for_model(cfg, tmp_path, "d")
    want = ("--dp-delta 0.25 is not below 1/--clients = 0.25: such an (epsilon, delta) guarantee "
            "allows publishing each user's data outright with probability delta (about 1 of the 4 "
            "users); choose a delta well below 1/N (the default: min(1e-5, 1/(10 N)) = 1e-05)")
    assert want in caplog.messages and s["dp"]["remarks"][0] == want
    assert s["status"] == "completed" and s["dp"]["delta"] == 0.25  # used, as given


def test_no_warning_for_the_default_delta(tmp_path, caplog):
    cfg = small_config(clients=4, rounds=1, dp={"mode": "central", "noise": 0.1})  # ratio 3.1
    with caplog.at_level(logging.WARNING, logger="fednet.server"):
        s, _ = run_for_model(cfg, tmp_path, "d")
    assert s["dp"]["delta"] == 1e-5 and "remarks" not in s["dp"]
    assert not [m for m in caplog.messages if "delta" in m or "noise" in m]


@pytest.mark.parametrize("sampling, relation", [("poisson", "add or remove one user"),
                                                ("fixed", "replace one user")])
def test_each_epsilon_names_its_neighbouring_relation(tmp_path, sampling, relation):
    cfg = small_config(clients=4, rounds=1, algo={"fraction": 0.5},
                       dp={"mode": "central", "epsilon": 20.0, "sampling": sampling})
    z, said = plan.calibrated(cfg)
    assert said.endswith(f"; neighbours: {relation})")
    s, _ = run_for_model(cfg.replace(**{"dp.noise": z}), tmp_path, sampling)
    dp = s["dp"]
    assert dp["relation"] == relation and f"neighbouring datasets: {relation}" in dp["guarantee"]
    comparable = "not comparable with an add-or-remove-one epsilon" in dp["guarantee"]
    assert comparable == (sampling == "fixed")


def test_local_and_example_level_relations():
    local = small_config(dp={"mode": "local", "noise": 1.0})
    assert plan.relation_words(local) == "any change of one user's data"


def test_noise_that_swamps_the_updates_is_said_before_the_first_round():
    """central: the noise on the mean has norm z sqrt(d) / D times the clip norm; local: the
    mean of m privatized updates z sqrt(d / m); above 10 the remark says so, with the numbers."""
    central = small_config(clients=10, dp={"mode": "central", "noise": 8.0})
    assert plan.noise_ratio(central, 10_000) == pytest.approx(8.0 * 100 / 10)
    (line,) = plan.remarks(central, 10_000)
    assert line == ("the noise is likely to swamp the updates: --dp central's noise has std 0.8 "
                    "per parameter of the mean (multiplier 8, clip 1, 10 users a round); its norm "
                    "on a round's mean update (10,000 values) is about 80 times the clip norm, "
                    "the most the update itself can be; more users a round, a larger "
                    "--dp-epsilon or fewer --rounds lower it")
    local = small_config(clients=10, dp={"mode": "local", "noise": 0.02})
    assert plan.noise_ratio(local, 10_000) == pytest.approx(0.02 * math.sqrt(1000))
    assert plan.remarks(local, 10_000) == []  # 0.63: no remark


def test_an_epsilon_near_zero_or_not_finite_gets_a_remark():
    assert plan.epsilon_remark(0.0, 0.1).startswith(
        "epsilon 0 at delta 0.1: the noise is so large that the accountant bounds the privacy "
        "loss by delta alone")
    assert "no privacy to speak of" in plan.epsilon_remark(math.inf, 1e-5)
    assert plan.epsilon_remark(0.5, 1e-5) == ""


def _nan_reply(noise):
    """A result with NaN, as the server's replies module turns it into the client's failure."""
    msg = Message(MsgKind.RESULT, "c0000", "r" * 32, 1, 4, 1.0,
                  {"n": 5, "body": {}}, {"w": np.array([np.nan, 1.0], np.float32)})
    return accept_reply(msg, 0, 100, [Profile()], {"w": ((2,), np.dtype(np.float32))},
                        noise=noise)


def test_a_nan_result_under_dp_names_the_noise():
    cfg = small_config(clients=10, dp={"mode": "local", "noise": 3.0, "clip": 2.0})
    got = _nan_reply(lambda arrays: plan.noise_cause(cfg, 2))
    assert isinstance(got, Failure)
    assert got.reason == (f"result refused: array 'w' {NON_FINITE}; {plan.DP_CAUSE}: --dp local's "
                          "noise has std 6 per parameter of each result (multiplier 3, clip 2); "
                          "a larger --dp-epsilon or fewer --rounds lower it")
    quiet = small_config(clients=10, dp={"mode": "local", "noise": 0.01})  # ratio 0.014
    assert _nan_reply(lambda arrays: plan.noise_cause(quiet, 2)).reason.endswith(NON_FINITE)
    assert _nan_reply(None).reason == f"result refused: array 'w' {NON_FINITE}"


def test_a_divergence_the_noise_caused_names_the_noise_not_the_learning_rate():
    model = {"w": np.zeros(2, np.float32)}
    cause = f"{plan.DP_CAUSE}: --dp central's noise has std 800 per parameter of the mean"
    dp_failures = [Failure(i, 1, i, f"result refused: array 'w' {NON_FINITE}; {cause}")
                   for i in range(3)]
    status, error = Verdict.diverged(1, model, [], dp_failures, 2.3)
    assert status == RunStatus.DIVERGED and error.endswith(f"stops here ({cause})")
    assert "--lr" not in error
    plain = [Failure(i, 1, i, f"result refused: array 'w' {NON_FINITE}") for i in range(3)]
    _, error = Verdict.diverged(1, model, [], plain, 2.3)
    assert "(try a smaller --lr" in error


def test_a_dp_run_the_noise_wrecks_says_so_from_its_failures_to_its_end(tmp_path, caplog):
    """Local DP with a huge noise: every result is NaN from the second round; each failure, the
    diverged verdict and the summary's remarks name the noise; the rounds are counted from 1."""
    cfg = small_config(clients=4, rounds=3, dp={"mode": "local", "noise": 2000.0})
    with caplog.at_level(logging.WARNING, logger="fednet.server"):
        s, _ = run_for_model(cfg, tmp_path, "wreck")
    assert s["status"] == "diverged" and plan.DP_CAUSE in s["error"] and "--lr" not in s["error"]
    assert "--dp local's noise has std 2e+03 per parameter of each result" in s["error"]
    assert all(plan.DP_CAUSE in f["reason"] for f in s["failures"])
    dp = s["dp"]
    assert dp["non_finite_results"] == len(s["failures"]) >= 2
    assert dp["remarks"][0].startswith("the noise is likely to swamp the updates")
    assert any(m.startswith(f"{len(s['failures'])} client results held NaN/inf")
               for m in caplog.messages)
