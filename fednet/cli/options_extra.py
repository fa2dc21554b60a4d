"""Command-line options of the local optimizer and of plugins (shared by launch, local, server).

--plugin, --config and --resume are eager: the plugins they name are imported before click checks
the other options, so that `--plugin my_algo --algo myalgo` finds the algorithm.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fednet.config import OPTIMIZERS
from fednet.errors import ConfigError

# option name -> dotted config key
KEYS = {"optimizer": "train.optimizer", "nesterov": "train.nesterov",
        "optimizer_eps": "train.eps", "deadline": "latency.deadline",
        "over_select": "latency.over_select", "shaped_links": "latency.shaped",
        "synthetic_alpha": "data.synthetic_alpha", "synthetic_beta": "data.synthetic_beta",
        "compress": "net.compress", "compress_down": "net.compress_down",
        "compress_handoff": "net.compress_handoff"}


class AlgoChoice(click.Choice):
    """--algo's choices: the registry's names when the option is checked (so the algorithms of
    --plugin modules, imported by the eager --plugin, are choices too), and those it had when
    the CLI was built (one missing since is then named by the registry's own error)."""

    def __init__(self) -> None:
        from fednet.algorithms.registry import names

        self.built = names()
        super().__init__(())

    @property  # type: ignore[override]
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


TRACK_HELP = ("Also log the run to TensorBoard or MLflow (repeatable): tensorboard[:DIR] (event "
              "files; default OUT/tensorboard) or mlflow[:URI] (default MLFLOW_TRACKING_URI, "
              "else MLflow's own; experiment MLFLOW_EXPERIMENT_NAME, else fednet). Needs pip "
              "install 'fednet[tensorboard]' or 'fednet[mlflow]'.")
OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--compress", metavar="SPEC",
                 help="How the clients' results travel: none, fp16, int8 (8-bit per tensor), "
                      "qsgd[:S] (S levels, 16), topk[:R] (the fraction R kept, 0.01; error "
                      "feedback), sign (scaled sign; error feedback). The update against the "
                      "received model is encoded; the server decodes it. [default: none]"),
    click.option("--compress-down", metavar="SPEC",
                 help="How the server's tasks travel: none, fp16, int8 or qsgd[:S], the values "
                      "themselves (a client holds no reference to take a difference against); "
                      "every client trains from what it received. [default: none]"),
    click.option("--compress-handoff", metavar="SPEC",
                 help="How the models handed from client to client travel (FedSeq's rings): as "
                      "--compress-down. [default: none]"),
    click.option("--optimizer", type=click.Choice(OPTIMIZERS),
                 help="The clients' local optimizer (torch's functional kernels); adam and adamw "
                      "want a much smaller --lr, e.g. 0.001. [default: sgd]"),
    click.option("--nesterov/--no-nesterov", default=None,
                 help="Nesterov momentum (sgd with --momentum > 0). [default: off]"),
    click.option("--betas", metavar="B1,B2",
                 help="Adam's and AdamW's moment decays. [default: 0.9,0.999]"),
    click.option("--optimizer-eps", type=float,
                 help="Adam's and AdamW's epsilon. [default: 1e-8]"),
    click.option("--server-bandwidth", metavar="RATE",
                 help="The server's link, each way, shared fairly by concurrent server<->client "
                      "transfers (peer hand-offs do not use it): 100Mbit, 1Gbit, 12.5MB (a plain "
                      "number is bytes/s). [default: unlimited]"),
    click.option("--shaped-links/--simulated-links", "shaped_links", default=None,
                 help="With --real-time: the network itself runs every transfer at the profiles' "
                      "rates (e.g. tc tbf per host), so only the latencies and the compute are "
                      "slept, not the transfers. [default: simulated links]"),
    click.option("--deadline", type=float, metavar="S",
                 help="Simulated seconds per round; results that arrive later are stragglers "
                      "(counted, not aggregated). [default: none]"),
    click.option("--over-select", type=float, metavar="F",
                 help="Select ceil(F x the round's target) clients and keep the first target "
                      "results to arrive. [default: 1]"),
    click.option("--synthetic-alpha", type=float, metavar="A",
                 help="synthetic-fedprox: u_k ~ N(0, A), the mean of client k's weights "
                      "(FedProx's Synthetic(A, B); a shift of every logit alike, so it changes no "
                      "label: docs/algorithms.md 2.7). [default: 1]"),
    click.option("--synthetic-beta", type=float, metavar="B",
                 help="synthetic-fedprox: how much the clients' inputs differ, B_k ~ N(0, B). "
                      "[default: 1]"),
    click.option("--plugin", multiple=True, metavar="MODULE", is_eager=True,
                 callback=load_plugins,
                 help="Import this module (a dotted name or a .py file) first: it registers "
                      "algorithms, models or datasets (repeatable; recorded in config.toml). "
                      "Installed plugins (entry points) load by themselves; see `fednet plugins`."),
    click.option("--track", multiple=True, metavar="TOOL[:WHERE]", help=TRACK_HELP),
]


def overrides(opts: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The dotted config keys these options set (base: the configuration so far, for the
    plugins the file named)."""
    over: dict[str, Any] = {KEYS[k]: v for k, v in opts.items() if k in KEYS and v is not None}
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
    if opts.get("track"):
        from fednet.metrics.tracking import check

        check(opts["track"])
        over["track"] = list(opts["track"])
    given = list(opts.get("plugin") or ())
    if given:
        from fednet import plugins

        over["plugins"] = plugins.merged(list(base.get("plugins") or ()), given)
    return over


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


PER_PROCESS_HELP = (
    "Logical clients in each client process: one fork, one interpreter and one CUDA context "
    "serve them all, their tasks one at a time. auto: one process per client up to 8 per "
    "core (and half the available memory at 32 MiB plus 3 model copies each); beyond 8 per "
    "core, 8 processes per core sharing the clients evenly; beyond the memory limit alone, the "
    "fewest clients per process within it; with --gpus, also each device's "
    "memory (512 MiB CUDA context + 256 MiB workspace per process, 4 model copies and the "
    "data per client, within 90%; a device listed twice is two slots sharing it); never more "
    "clients in a process than its open-files limit allows (8 files each); "
    "--real-time keeps one per client. A number wins. [default: auto]")


HOST_PER_PROCESS = click.option("--clients-per-process", "per_process", type=PerProcess(),
                                default="auto", help=PER_PROCESS_HELP)


RESUME_MAY_CHANGE = ("rounds", "net.", "gpus", "train.threads", "plugins", "data.data_root",
                     "data.download", "out", "track")
"""What a --resume may set anew: more rounds, and where and how the run's processes run."""


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


def server_join_key(join_key: str, secure: str, out: Path) -> str:
    """The join key file of a plaintext `fednet server` ('' under --secure)."""
    return "" if secure else (join_key or str(out / "join.key"))


def listening(join: str) -> Any:
    """`fednet server`'s announcement once it listens (printed even with --quiet)."""
    def say(ep: str) -> None:
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
