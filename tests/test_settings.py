"""The run settings' declarations (config/settings.py) drive the command line, the readers and the
checks: every plain option sets its key, every declared range is enforced with the option named,
and a TOML file's wrong type names the key."""
from __future__ import annotations

import pytest

from fednet.cli import local
from fednet.cli.setting_options import PARSED
from fednet.cli.options import build_config
from fednet.config import RunConfig, declarations, from_dict
from fednet.algorithms.checks import validate
from fednet.config.declare import Info, setting
from fednet.errors import ConfigError

# A value other than the default for the settings whose valid values depend on other settings.
_OTHER = {"data.dataset": "synthetic-cifar10", "train.model": "mlp", "algo.name": "fedprox",
          "net.compress": "fp16", "net.compress_down": "fp16", "net.compress_handoff": "fp16",
          "latency.availability": "diurnal", "net.secure": "", "out": "", "data.data_root": "",
          "data.partition": "dirichlet", "train.optimizer": "sgd", "train.nesterov": False,
          "latency.real": False, "latency.shaped": False, "data.synthetic_alpha": 1.0,
          "data.synthetic_beta": 1.0, "net.clients_per_process": 3}


def _other(i: Info) -> object:
    if i.key in _OTHER:
        return _OTHER[i.key]
    if i.type is bool:
        return not i.default
    if i.choices:
        return next(c for c in i.choices if c != i.default)
    if i.type is int:
        return int(max(i.default, i.ge if i.ge is not None else 0)) + 1
    if i.type is float:
        lo = i.ge if i.ge is not None else i.gt if i.gt is not None else 0.0
        hi = i.le if i.le is not None else i.lt if i.lt is not None else lo + 2.0
        return float(lo + (hi - lo) / 2)
    return "x"


_CENTRAL = ["--dp", "central", "--dp-noise", "1"]
# adaptive clipping: a noise below twice the count's (10 clients: the default count noise 0.5)
_ADAPTIVE = ["--dp", "central", "--dp-noise", "0.5", "--dp-adaptive"]
_WITH = {"train.eps": ["--optimizer", "adam"],  # what a setting needs beside it
         "dp.mode": ["--dp-noise", "1"], "dp.noise": ["--dp", "central"],
         "dp.epsilon": ["--dp", "central"], "dp.sgd_clip": ["--dp-sgd-noise", "1"],
         "dp.sgd_delta": ["--dp-sgd-noise", "1"],
         **{f"dp.{k}": _CENTRAL for k in ("delta", "sampling", "accountant")},
         "dp.adaptive": _ADAPTIVE[:-1],
         **{f"dp.{k}": _ADAPTIVE for k in ("quantile", "clip_lr", "count_noise")}}
_WITH.update({f"dp.{k}": ["--dp", "distributed", "--dp-noise", "1", "--secagg", "plus"]
              for k in ("against", "survivors")})  # distributed DP's settings
_WITH["net.compress_handoff"] = ["--algo", "fedseq"]  # (an algorithm that hands models over)
_WITH.update({f"net.secagg_{k}": ["--secagg", "plus"]  # SecAgg's settings need --secagg
              for k in ("neighbours", "dropout", "threshold", "clip", "bits", "field", "drop")})
_VALUE = {"attack.malicious": "0.5", "target": "0.9",  # string settings whose text must parse
          "attack.name": "signflip", "defense.name": "median", "dp.mode": "central",  # (names the registry checks)
          "net.secagg_neighbours": 4, "net.secagg_field": 64, "net.secagg_drop": "input:0.1"}
PLAIN = [i for i in declarations() if i.option and i.option not in PARSED]


@pytest.mark.parametrize("info", PLAIN, ids=lambda i: i.option)
def test_every_plain_option_sets_its_key(info, tmp_path):
    v = _VALUE.get(info.key, _other(info))
    if info.type is bool:
        args = [info.names()[0] if v else info.names()[-1]]
    else:
        args = [info.option, str(v)]
    ctx = local.make_context("local", args + _WITH.get(info.key, []))
    cfg = validate(build_config(dict(ctx.params), {"clients": 10}))
    got: object = cfg
    for part in info.key.split("."):
        got = getattr(got, part)
    assert got == v


RANGED = [i for i in declarations() if i.type in (int, float) and
          (i.ge is not None or i.gt is not None or i.le is not None or i.lt is not None)]


@pytest.mark.parametrize("info", RANGED, ids=lambda i: i.key)
def test_every_declared_range_is_checked_naming_the_option(info):
    i = info
    low = i.ge - 1 if i.ge is not None else i.gt if i.gt is not None else None
    bad = low if low is not None else (i.le + 1 if i.le is not None else i.lt)
    bad = (bad,) if info.many else int(bad) if info.type is int else float(bad)
    cfg = RunConfig().replace(**{info.key: list(bad) if info.many else bad})
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    name = info.names()[0] if info.option and not info.hidden else info.key  # hidden: the key
    assert str(e.value).startswith(f"{name} must be ") and "\n" not in str(e.value)


@pytest.mark.parametrize("info", [i for i in declarations() if i.type in (int, float, bool)],
                         ids=lambda i: i.key)
def test_a_wrong_type_in_a_file_names_the_key(info):
    d = RunConfig().to_dict()
    node = d
    *path, last = info.key.split(".")
    for p in path:
        node = node[p]
    node[last] = "text" if info.type is not bool else 1
    if info.many:
        node[last] = ["text"]
    if info.key == "latency.server_bandwidth":
        pytest.skip("a rate may be text with a unit (parsed where it is used)")
    with pytest.raises(ConfigError, match=f"'{info.key}' must be "):
        from_dict(d)


def test_range_words():
    def words(**kw: object) -> str:
        import dataclasses

        @dataclasses.dataclass(frozen=True)
        class C:
            x: float = setting(1.0, "x", **kw)  # type: ignore[arg-type]
        from fednet.config.declare import declared
        return declared(C)[0].range_text()

    assert words(gt=0) == "positive"
    assert words(gt=0, le=1) == "in (0, 1]"
    assert words(ge=1, le=100) == "in [1, 100]"
    assert words(ge=-1) == ">= -1"
    assert words(choices=("a", "b")) == "one of: a, b"
