"""Bad values for secure aggregation, the attacks and the defenses (issue 54): each refused in
one line naming its option, exit code 2, before anything is written (the checks that need the
dataset run in the Session before the run folder is made); and the values that were once taken
silently (clamped, ignored, or meaningless) refused the same way."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from fednet.algorithms.checks import validate
from fednet.cli import RUN_DEFAULTS, local
from fednet.cli.commands import main
from fednet.cli.options import build_config
from fednet.errors import ConfigError


def _refused(tmp_path, *args: str) -> str:
    """The one line of a `fednet local` refused with exit code 2, having written nothing."""
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["local", "--rounds", "1", "-q", "--out", str(out), *args])
    assert res.exit_code == 2, (res.exit_code, res.output, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fednet: error: "), res.stderr
    assert "Traceback" not in res.output + res.stderr
    assert not out.exists()
    return lines[0][len("fednet: error: "):]


CASES = [
    # secure aggregation: its settings, its neighbours, its cohort, its field, its dropouts
    (["--secagg", "plus", "--secagg-neighbours", "3"], "--secagg-neighbours 3: SecAgg+'s graph"),
    (["--secagg", "plus", "--secagg-neighbours", "5", "--clients", "20"], "use 4 or 6"),
    (["--secagg-neighbours", "4"], "--secagg-neighbours: settings of --secagg full|plus"),
    (["--secagg-bits", "12", "--secagg-clip", "2"],
     "--secagg-clip, --secagg-bits: settings of --secagg"),
    (["--secagg-drop", "input:0.1"], "--secagg-drop: settings of --secagg"),
    (["--secagg", "full", "--secagg-neighbours", "4"], "full SecAgg shares with every other"),
    (["--secagg", "plus", "--secagg-neighbours", "100", "--clients", "10"],
     "a round of 10 clients gives each at most 9 neighbours"),
    (["--secagg", "plus", "--secagg-neighbours", "10", "--clients", "20", "--fraction", "0.5"],
     "a round of 10 clients gives each at most 9 neighbours"),
    (["--secagg", "full", "--clients", "1"], "needs at least 2 clients a round"),
    (["--secagg", "full", "--clients", "10", "--fraction", "0.1"],
     "--clients 10 --fraction 0.1 selects 1"),
    (["--secagg", "plus", "--clients", "100", "--secagg-field", "32", "--secagg-bits", "24"],
     "--secagg-bits 24 --secagg-field 32: a field of 2^32 cannot hold the sum"),
    (["--secagg", "full", "--secagg-drop", "input"], "'input' is not STAGE:RATE"),
    (["--secagg", "full", "--secagg-drop", "train:0.1"], "'train:0.1' is not STAGE:RATE"),
    (["--secagg", "full", "--secagg-drop", "input:1"], "a rate in [0, 1)"),
    (["--secagg", "full", "--secagg-drop", "input:-0.1"], "a rate in [0, 1)"),
    (["--secagg", "full", "--secagg-drop", "input:nan"], "a rate in [0, 1)"),
    (["--secagg", "full", "--secagg-drop", "input:0.1,input:0.2"], "stage input is given twice"),
    (["--secagg", "full", "--secagg-threshold", "1"], "--secagg-threshold"),
    (["--secagg", "full", "--secagg-dropout", "0.2"],
     "--secagg-dropout 0.2 sizes SecAgg+'s default neighbours, and full SecAgg has none"),
    (["--secagg", "plus", "--secagg-neighbours", "4", "--secagg-dropout", "0.3"],
     "--secagg-neighbours 4 sets them"),
    (["--secagg", "full", "--secagg-field", "48"], "--secagg-field 48: the modulus is 2^32"),
    (["--secagg", "full", "--secagg-bits", "0"], "--secagg-bits"),
    (["--secagg", "full", "--secagg-clip", "-1"], "--secagg-clip"),
    # attacks: the target against the dataset, the attackers against the clients
    (["--attack", "backdoor", "--param", "target=42"],
     "--param target=42: --attack backdoor's target is a label, and digits has 10 (0..9)"),
    (["--attack", "backdoor", "--param", "target=10"], "digits has 10 (0..9)"),
    (["--attack", "backdoor", "--param", "trigger_size=9"],
     "--param trigger_size=9: the trigger is a square in the image's corner, and digits's "
     "images are 8x8"),
    (["--attack", "alie", "--param", "known=5", "--clients", "10"],
     "--param known=5: --attack alie's colluders are the 2 malicious clients"),
    (["--attack", "signflip", "--malicious", "1.0", "--clients", "10"],
     "every one of the 10 clients would be malicious"),
    (["--attack", "signflip", "--malicious", "ids:0-9", "--clients", "10"],
     "every one of the 10 clients would be malicious"),
    (["--attack", "noise", "--malicious", "0"], "no client is malicious, so no attack would run"),
    (["--attack", "signflip", "--malicious", "1.5"], "--malicious 1.5: give a fraction"),
    (["--attack", "signflip", "--malicious", "ids:3-99", "--clients", "10"],
     "ids must lie in 0..9"),
    # defenses: their parameters against the round
    (["--defense", "multikrum", "--param", "keep=1000", "--clients", "10"],
     "--param keep=1000: Multi-Krum averages the m best-scored of a round's n results, at most "
     "n - f = 8 here"),
    (["--defense", "krum", "--clients", "4"], "--defense krum assumes f = 1"),
    (["--defense", "norm_bound", "--attack", "signflip", "--malicious", "0.5"],
     "norm_bound has no f to check, and no rule holds against a majority"),
    (["--defense", "centered_clip", "--attack", "noise", "--malicious", "0.6"],
     "centered_clip has no f to check"),
    (["--defense", "trimmed_mean", "--param", "trim=0.5"], "trim"),
    (["--defense", "centered_clip", "--param", "radius=-1"], "radius"),
    (["--attack", "signflip", "--secagg", "full"], "--attack signflip does not go with --secagg"),
]


@pytest.mark.parametrize("args, says", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_value_is_one_line_naming_its_option(tmp_path, args, says):
    line = _refused(tmp_path, *args)
    assert says in line, line


def _cfg(*args: str):
    ctx = local.make_context("local", list(args))
    return build_config(ctx.params, dict(RUN_DEFAULTS, clients=10))


def test_the_secagg_rules_hold_before_any_data_loads():
    """validate alone (no dataset) refuses what needs no data; a good SecAgg+ run passes."""
    validate(_cfg("--secagg", "plus", "--secagg-neighbours", "4", "--secagg-drop",
                  "keys:0.05,input:0.1"))
    for bad in (["--secagg", "plus", "--secagg-neighbours", "7"],
                ["--secagg", "full", "--clients", "1"], ["--secagg-dropout", "0.2"]):
        with pytest.raises(ConfigError):
            validate(_cfg(*bad))


def test_the_field_check_is_the_largest_sum_a_round_can_make(tmp_path):
    """A field that holds the largest round's sum is taken: digits' 100 clients hold about 14
    examples each, 1,437 in all, so 2^32 holds 20 bits a value (31 bits needed) but not 22."""
    from fednet.core.session import Session
    from tests.conftest import small_config

    ok = small_config(clients=100, rounds=1, net={"secagg": "full", "secagg_field": 32,
                                                  "secagg_bits": 20})
    Session(ok, quiet=True, write=False)
    with pytest.raises(ConfigError, match="cannot hold the sum"):
        Session(ok.replace(**{"net.secagg_bits": 22}), quiet=True, write=False)


def test_a_plugin_that_registers_nothing_stops_a_launch_before_any_process(tmp_path):
    """Given in a RunConfig (the API, not the CLI that loads it itself), such a plugin is one
    ConfigError before any process starts; it was an error in every READY's WELCOME while the
    registration waited out --register-timeout."""
    from fednet.server.main import run_zmq
    from tests.conftest import small_config

    (tmp_path / "empty_plugin.py").write_text("X = 1\n")
    cfg = small_config(clients=2, rounds=1, out=str(tmp_path / "run"),
                       plugins=(str(tmp_path / "empty_plugin.py"),))
    with pytest.raises(ConfigError, match="it registered nothing"):
        run_zmq(cfg, quiet=True)
    assert not (tmp_path / "run").exists()
