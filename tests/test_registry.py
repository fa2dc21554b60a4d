"""One registry, one source of truth: names, typed parameters, CLI options and their checks."""
from __future__ import annotations

import subprocess
import sys
import tracemalloc

import pytest
from click.testing import CliRunner

from fednet.algorithms import REGISTRY, build, build_client, client_class, names
from fednet.algorithms.contract import ClientUpdate, Strategy
from fednet.config.declare import declared
from fednet.cli import main
from fednet.algorithms.checks import algorithms as _algorithms, eval_mode
from fednet.errors import ConfigError
from fednet.cli.options import ALGO_OPTIONS, build_config
from tests.conftest import small_config

ALGORITHMS = _algorithms()
PERSONAL = _algorithms(personal=True)


def _error(*args: str) -> str:
    res = CliRunner().invoke(main, ["local", *args, "--clients", "3", "--rounds", "1", "-q"])
    assert res.exit_code == 2, (res.output, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output + res.stderr, res.stderr
    return lines[0].removeprefix("fednet: error: ")


def test_every_algorithm_has_two_halves_and_declared_parameters():
    assert ALGORITHMS == names() and len(names()) == 20
    assert set(PERSONAL) == {n for n, s in REGISTRY.items() if s.personalized}
    for name in names():
        cfg = small_config(algo={"name": name})
        assert isinstance(build(cfg), Strategy) and isinstance(build_client(cfg), ClientUpdate)
        for info in declared(REGISTRY[name].params):
            assert info.help and isinstance(info.default, info.type), (name, info.name)
    assert eval_mode(small_config(algo={"name": "fedfomo"})) == "clients"
    assert eval_mode(small_config(algo={"name": "fedprox"})) == "global"


@pytest.mark.parametrize("args,line", [
    (["--algo", "fedprox", "--param", "mu=abc"],
     "--param mu=abc: fedprox expects mu to be a number >= 0"),
    (["--algo", "fedprox", "--param", "mu=-1"],
     "--param mu=-1: fedprox expects mu to be a number >= 0"),
    (["--algo", "fedprox", "--mu", "-1"], "--mu -1.0: fedprox expects mu to be a number >= 0"),
    (["--algo", "feddyn", "--param", "official=maybe"],
     "--param official=maybe: feddyn expects official to be true or false"),
    (["--algo", "scaffold", "--scaffold-option", "3"],
     "--scaffold-option 3: scaffold expects option to be an integer >= 1 and <= 2"),
    (["--algo", "fedfomo", "--param", "val_fraction=1"],
     "--param val_fraction=1: fedfomo expects val_fraction to be a number > 0 and < 1"),
    (["--algo", "fedfomo", "--param", "norm=l3"],
     "--param norm=l3: fedfomo expects norm to be one of: l1, l2"),
    (["--algo", "fedavg", "--param", "mu=1"],
     "--param mu is not a fedavg parameter (it takes: none); drop it or choose the algorithm "
     "it belongs to"),
    (["--algo", "perfedavg", "--dyn-alpha", "0.5"],
     "--dyn-alpha does not apply to perfedavg (it is for feddyn, fedseq, fedseq_inter); drop it "
     "or choose one of those"),
])
def test_a_wrong_parameter_is_one_line_naming_it_and_what_it_takes(args, line):
    assert _error(*args) == line


def test_values_are_typed_by_the_declaration():
    def params(*ps: str, algo: str = "feddyn") -> dict:
        return build_config({"algo": algo, "params": ps}, {}).algo.params

    assert params("official=no", "alpha=1") == {"official": False, "alpha": 1.0}
    assert params("official=TRUE")["official"] is True
    assert params("warmup=3", "eps1=10", algo="cfl") == {"warmup": 3, "eps1": 10.0}
    assert params("hf=1", algo="perfedavg") == {"hf": True, "beta": 0.3}  # beta: tuned default
    assert params("hf=1", "beta=0.01", algo="perfedavg") == {"hf": True, "beta": 0.01}
    assert build_config({"algo": "fedprox", "mu": 0.5}, {}).algo.params == {"mu": 0.5}
    with pytest.raises(ConfigError, match="kl needs probability vectors"):
        params("approximator=clf_last", algo="fedseq")


def test_the_per_algorithm_options_and_their_defaults_come_from_the_declarations():
    by_opt = {opt: (key, hlp) for opt, key, _, hlp in ALGO_OPTIONS}
    assert by_opt["--mu"] == ("mu", "[fedprox, fedseq, fedseq_inter] proximal weight of FedProx. "
                                    "[default: 0.01]")
    assert by_opt["--dyn-alpha"][0] == "alpha"
    assert "feddyn, standalone, fedseq, fedseq_inter: 0; factorized, factorized_beta, pfedpara: 5" \
        in by_opt["--clip"][1]
    assert "[default: 0; domain: 0.95]" in by_opt["--tau"][1]


def test_the_cli_imports_no_torch_to_check_a_configuration():
    code = ("import sys; from fednet.cli.options import build_config; "
            "build_config({'algo': 'fedfomo', 'params': ('m=3',)}, {}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_client_builds_only_the_client_half():
    """FedFOMO's K x K affinities (and every other server state) stay on the server."""
    cfg = small_config(clients=2000, algo={"name": "fedfomo"})
    tracemalloc.start()
    update = build_client(cfg)
    state = update.new_state()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert size < 1_000_000  # the server half allocates 2000 x 2000 float64: 32 MB
    assert not hasattr(update, "state") and client_class("fedfomo").keeps_model
    assert state.fomo_split is None and state.fomo_first is None
