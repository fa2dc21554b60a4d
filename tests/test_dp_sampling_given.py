"""--dp-sampling given on the command line where no value of it applies (issue 58's follow-up):
its default, poisson, was accepted silently under --dp distributed (and local, and none) while
fixed was refused, since the check read only the value. The command line's own options are
now seen (cli/setting_options.given): any value given is refused there, naming the option and
what to do; under --dp central both are taken as before."""
from __future__ import annotations

import pytest

from tests.harness import cli, one_line

DISTRIBUTED = ["--secagg", "plus", "--dp", "distributed", "--dp-noise", "0.4"]


@pytest.mark.parametrize("value", ["poisson", "fixed"])
def test_dp_sampling_given_under_distributed_dp_is_refused_whatever_its_value(tmp_path, value):
    res = cli("local", "--clients", "6", "--rounds", "1", "-q", "--out", str(tmp_path / "r"),
              *DISTRIBUTED, "--dp-sampling", value)
    assert one_line(res) == (
        "--dp-sampling: settings of --dp central (under --dp distributed each cohort is "
        "floor(fraction N) clients drawn without replacement, as its accounting takes them "
        "(amplified against the released models, not the server)); drop it")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("mode", [["--dp", "local", "--dp-noise", "0.1"], []],
                         ids=["local", "none"])
def test_dp_sampling_poisson_given_where_no_cohort_is_sampled_is_refused(tmp_path, mode):
    res = cli("local", "--clients", "6", "--rounds", "1", "-q", "--out", str(tmp_path / "r"),
              *mode, "--dp-sampling", "poisson")
    said = one_line(res)
    assert said.startswith("--dp-sampling: settings of --dp central")
    assert said.endswith("add --dp") if not mode else "a client alone has no sampling" in said


def test_the_sweeps_cells_see_the_given_option_as_the_command_does():
    from fednet.cli import main
    from fednet.cli.sweep_options import ClickCells
    from fednet.errors import ConfigError

    cells = ClickCells(main.commands["local"], {})
    with pytest.raises(ConfigError, match="^--dp-sampling: settings of --dp central"):
        cells.config([*DISTRIBUTED, "--clients", "6", "--dp-sampling", "poisson"])
    assert cells.config([*DISTRIBUTED, "--clients", "6"]).dp.sampling == "poisson"  # (unset)


def test_central_dp_takes_either_value_given():
    from fednet.cli import main
    from fednet.cli.sweep_options import ClickCells

    cells = ClickCells(main.commands["local"], {})
    for value in ("poisson", "fixed"):
        cfg = cells.config(["--dp", "central", "--dp-noise", "0.5", "--dp-sampling", value])
        assert cfg.dp.sampling == value
