"""Command-line options of the local optimizer and of plugins (shared by launch, local, server).

--plugin, --config and --resume are eager: the plugins they name are imported before click checks
the other options, so that `--plugin my_algo --algo myalgo` finds the algorithm.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fednet.config import LATENCY_PRESETS, declaration
from fednet.errors import ConfigError

class AlgoChoice(click.Choice):
    """--algo's choices: the registry's names when the option is checked (so the algorithms of
    --plugin modules, imported by the eager --plugin, are choices too), and those it had when
    the CLI was built (one missing since is then named by the registry's own error)."""

    def __init__(self) -> None:
        from fednet.algorithms.registry import names

        self.built = names()
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from fednet.algorithms.registry import names

        return tuple(dict.fromkeys(self.built + names()))

    @choices.setter
    def choices(self, _: object) -> None:
        pass

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        """The name, or one line: the closest names, and how to use an algorithm of one's own."""
        if value in self.choices:
            return value
        import difflib

        close = difflib.get_close_matches(str(value), self.choices, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        self.fail(f"{value!r} is not an algorithm; {hint}choose one of {', '.join(self.choices)}"
                  " (`fednet local --help` describes them), or bring your own with --plugin "
                  "FILE.py", param, ctx)


class PieceChoice(click.Choice):
    """--attack's or --defense's choices: the registered names when the option is checked (the
    built-in ones and those of --plugin modules: algorithms/seam.py)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from fednet.algorithms import robust_spec

        return tuple(robust_spec.ATTACKS if self.kind == "attack" else robust_spec.DEFENSES)

    @choices.setter
    def choices(self, _: object) -> None:
        pass


def load_plugins(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Import the plugin modules named by --plugin (or by the plugins field of the --config or
    --resume file) before the other options are checked."""
    from fednet import plugins

    if not value:
        return value
    try:
        if param.name == "plugin":
            plugins.load_modules(list(value))
        else:
            path = Path(value) / "config.toml" if param.name == "resume" else Path(value)
            plugins.load_modules(plugins.named_in(path))
    except ConfigError as e:
        raise click.UsageError(str(e), ctx=ctx) from None
    return value


def overrides(opts: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The dotted config keys of the options whose text is parsed into settings (cli/setting_options.py,
    PARSED), and the partition a naturally federated dataset implies (base: the configuration so
    far, for the plugins the file named)."""
    over: dict[str, Any] = _latency(opts.get("latency"))
    if opts.get("gpus") is not None:
        from fednet.platform.gpus import parse_gpus

        over["gpus"] = list(parse_gpus(opts["gpus"]))
    betas = opts.get("betas")
    if betas is not None:
        try:
            b1, b2 = (float(x) for x in str(betas).split(","))
        except ValueError:
            raise ConfigError(f"--betas expects two numbers B1,B2, e.g. 0.9,0.999 (got "
                              f"'{betas}')") from None
        over["train.beta1"], over["train.beta2"] = b1, b2
    if opts.get("server_bandwidth") is not None:
        from fednet.network.latency import parse_rate

        rate = parse_rate(opts["server_bandwidth"], "--server-bandwidth")
        over["latency.server_bandwidth"] = 0.0 if rate == float("inf") else rate
    over.update(_natural_partition(opts, base))
    if opts.get("liveness") is not None:
        from fednet.config import liveness

        over.update(liveness.overrides(opts["liveness"]))
    if opts.get("track"):
        from fednet.metrics.tracking import check

        check(opts["track"])
        over["track"] = list(opts["track"])
    given = list(opts.get("plugin") or ())
    if given:
        from fednet import plugins

        over["plugins"] = plugins.merged(list(base.get("plugins") or ()), given)
    return over


def _latency(lat: str | None) -> dict[str, Any]:
    """--latency: a preset, or a profiles file (which must exist)."""
    if lat is None:
        return {}
    if lat in LATENCY_PRESETS:
        return {"latency.preset": lat, "latency.file": ""}
    if not Path(lat).is_file():
        raise ConfigError(f"--latency '{lat}' is neither a preset ({', '.join(LATENCY_PRESETS)}) "
                          "nor an existing CSV/JSON file")
    return {"latency.file": lat}


def _natural_partition(opts: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A naturally federated dataset's partition is `natural` unless another is given (which
    is refused here); a file's default iid is replaced."""
    from fednet.data.datasets import NATURAL

    data = base.get("data") or {}
    dataset = opts.get("dataset") or data.get("dataset")
    given = opts.get("partition")
    if dataset not in NATURAL:
        return {}
    if given not in (None, "natural"):
        raise ConfigError(f"--partition {given} does not apply to --dataset {dataset}: its "
                          "clients' data is naturally federated (one user per client); drop "
                          "--partition")
    if opts.get("alpha") is not None:
        raise ConfigError(f"--alpha (Dirichlet's) does not apply to --dataset {dataset}, whose "
                          "clients are its users" + ("; its own settings are --synthetic-alpha "
                          "and --synthetic-beta" if dataset == "synthetic-fedprox" else ""))
    return {"data.partition": "natural"} if data.get("partition", "iid") in ("iid", "natural") \
        else {}


class PerProcess(click.ParamType):
    """--clients-per-process: 'auto' (0) or a positive number."""

    name = "auto|N"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return 0
        if text.isdigit() and int(text) >= 1:
            return int(text)
        self.fail(f"'{value}': write auto or a number of clients, at least 1 (e.g. 10)", param,
                  ctx)


HOST_PER_PROCESS = click.option(  # fednet clients: its processes' own packing
    "--clients-per-process", "per_process", type=PerProcess(), default="auto",
    help=f"{declaration('net.clients_per_process').help}. [default: auto]")


RESUME_MAY_CHANGE = ("rounds", "gpus", "train.threads", "plugins", "data.data_root",
                     "data.download", "out", "track", "population_file", "target",
                     *(f"net.{k}" for k in ("host", "port", "round_timeout", "register_timeout",
                                            "secure", "ack_timeout", "ack_retries", "dead_peer",
                                            "checkpoint_every", "max_inflight",
                                            "max_failed_rounds", "clients_per_process")),
                     "liveness")
"""What a --resume may set anew: more rounds, where and how the run's processes run, and the
--target it reports the cost of (not what travels: --compress*, --secagg* change the bytes and
the model, so they are refused)."""


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    try:  # --param values are text until the algorithm types them
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def check_resume_options(over: dict[str, Any], run: dict[str, Any]) -> None:
    """--resume continues a run with the settings it was started with (its config.toml, in
    `run`, flattened to dotted keys): an option that would change one is refused, naming it, before anything is written
    (was: the run's config.toml rewritten with it, though nothing it had done changed). More
    --rounds, and where and how the processes run (RESUME_MAY_CHANGE), are allowed."""
    diff = [f"{key} {v!r} (the run has {had!r})" for key, v in over.items()
            if not key.startswith(RESUME_MAY_CHANGE)
            and (had := run.get(key)) is not None and not _same(v, had)]
    if diff:
        raise ConfigError(f"--resume continues a run with its own settings, and these options "
                          f"would change them (config.toml keys): {'; '.join(diff)}; drop "
                          "them, or start a new run with --out")


JOIN_KEY_HELP = ("The run's join key file: only holders of the key connect to a plaintext "
                 "server. The server draws it there when the file does not exist [default: RUN/join.key]; "
                 "clients read it (copy it to their host, or give its path on a shared folder). "
                 "Not needed with --secure.")
JOIN_KEY = click.option("--join-key", "join_key", type=click.Path(dir_okay=False), default="",
                        envvar="FEDNET_JOIN_KEY", help=JOIN_KEY_HELP)


LIVENESS = click.option(  # fednet clients: its processes' timers (the server's: the setting)
    "--liveness", "liveness", metavar="SCALE", hidden=True,
    help="Every liveness timer (heartbeats, timeouts, registration retries) times SCALE, as "
         "the server's --liveness. [default: 1]")


def server_join_key(join_key: str, secure: str, out: Path) -> str:
    """The join key file of a plaintext `fednet server` ('' under --secure)."""
    return "" if secure else (join_key or str(out / "join.key"))


def listening(join: str, out: str = "", secure: str = "") -> Any:
    """`fednet server`'s announcement once it listens (printed even with --quiet), after it
    recorded how its clients reach it (server/served.py)."""
    def say(ep: str) -> None:
        if out:
            from fednet.server import served
            served.record(out, ep, join, secure)
        click.echo(f"server listening on {ep}", err=True)
        if join:
            ep = ep.replace("0.0.0.0", "THIS_HOST")
            click.echo(f"clients join with: fednet clients --connect {ep} --join-key {join} --ids "
                       "... (copy that file to the client hosts; plaintext: --secure encrypts)",
                       err=True)
    return say


def drop_empty(log: Path) -> None:
    """Remove the clients' log (and its folder) that a refused start created, if still empty."""
    try:
        if log.is_file() and log.stat().st_size == 0:
            log.unlink()
        log.parent.rmdir()
    except OSError:
        pass
