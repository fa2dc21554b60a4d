"""The `fednet` command: launch, local, server, clients, report."""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fednet.config import ALGORITHMS, LATENCY_PRESETS, PARTITIONS, RunConfig, from_dict, load_toml, merge
from fednet.errors import ConfigError, FednetError

# option name -> dotted config key
_KEYS = {
    "clients": "clients", "rounds": "rounds", "seed": "seed", "out": "out",
    "algo": "algo.name", "fraction": "algo.fraction",
    "dataset": "data.dataset", "partition": "data.partition", "alpha": "data.alpha",
    "data_root": "data.data_root", "download": "data.download",
    "model": "train.model", "epochs": "train.epochs", "batch_size": "train.batch_size", "lr": "train.lr",
    "momentum": "train.momentum", "weight_decay": "train.weight_decay", "threads": "train.threads",
    "round_timeout": "net.round_timeout", "register_timeout": "net.register_timeout",
    "real_time": "latency.real", "time_scale": "latency.time_scale",
}

_COMMON: list[Callable[[Any], Any]] = [
    click.option("--config", "config_file", type=click.Path(dir_okay=False),
                 help="TOML file with the same fields; command-line options override it."),
    click.option("--clients", type=int, help="Number of clients (default 100 for launch, 10 for local)."),
    click.option("--rounds", type=int, help="Communication rounds. [default: 25]"),
    click.option("--algo", type=click.Choice(ALGORITHMS), help="Algorithm. [default: fedavg]"),
    click.option("--dataset", help="digits (embedded). [default: digits]"),
    click.option("--partition", type=click.Choice(PARTITIONS),
                 help="How data is split: iid, dirichlet(alpha) or shards (one class per client)."),
    click.option("--alpha", type=float, help="Dirichlet concentration; 0 means shards. [default: 0.5]"),
    click.option("--seed", type=int, help="Seed of every random draw. [default: 0]"),
    click.option("--gpus", help="Comma-separated CUDA devices, e.g. 0,1; client i uses gpus[i % n]. "
                                "Without it everything runs on the CPU."),
    click.option("--latency", help=f"Client profiles: {', '.join(LATENCY_PRESETS)} or a CSV/JSON "
                                   "file (compute_s_per_sample, rtt_s, up_bps, down_bps). [default: lan]"),
    click.option("--real-time/--virtual-time", "real_time", default=None,
                 help="Also sleep the simulated delays (demonstrations); figures use the virtual clock."),
    click.option("--time-scale", type=float, help="Multiplier on slept delays in --real-time mode."),
    click.option("--out", type=click.Path(file_okay=False),
                 help="Results folder. [default: runs/<timestamp>-<algo>]"),
    click.option("--fraction", type=float, help="Fraction of clients per round. [default: 1.0]"),
    click.option("--model", help="Model architecture. [default: auto]"),
    click.option("--epochs", type=int, help="Local epochs per round. [default: 5]"),
    click.option("--batch-size", type=int, help="Local minibatch size. [default: 8]"),
    click.option("--lr", type=float, help="Local SGD learning rate. [default: 0.15]"),
    click.option("--momentum", type=float, help="Local SGD momentum. [default: 0]"),
    click.option("--weight-decay", type=float, help="Local SGD weight decay. [default: 4e-4]"),
    click.option("--threads", type=int, help="Torch threads per client process. [default: 1]"),
    click.option("--data-root", type=click.Path(file_okay=False), help="Folder of dataset files."),
    click.option("--download/--no-download", default=None, help="Download datasets if missing."),
    click.option("--round-timeout", type=float, help="Seconds a round may take. [default: 300]"),
    click.option("--register-timeout", type=float, help="Seconds to wait for clients. [default: 60]"),
    click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                 help="Algorithm parameter (repeatable), e.g. --param mu=0.01."),
    click.option("-q", "--quiet", is_flag=True, help="No progress output."),
]


def common_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Attach the options shared by launch, local and server."""
    for opt in reversed(_COMMON):
        f = opt(f)
    return f


def _param_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def build_config(opts: dict[str, Any], defaults: dict[str, Any]) -> RunConfig:
    """Defaults < TOML file < command-line options."""
    from fednet.launch.gpus import parse_gpus

    base = RunConfig().to_dict()
    base = merge(base, defaults)
    if opts.get("config_file"):
        base = merge(base, _file_overrides(opts["config_file"]))
    over: dict[str, Any] = {_KEYS[k]: v for k, v in opts.items() if k in _KEYS and v is not None}
    if opts.get("gpus") is not None:
        over["gpus"] = list(parse_gpus(opts["gpus"]))
    lat = opts.get("latency")
    if lat is not None and lat not in LATENCY_PRESETS and not Path(lat).is_file():
        raise ConfigError(f"--latency '{lat}' is neither a preset ({', '.join(LATENCY_PRESETS)}) "
                          "nor an existing CSV/JSON file")
    if lat is not None:
        over["latency.preset" if lat in LATENCY_PRESETS else "latency.file"] = lat
        if lat in LATENCY_PRESETS:
            over["latency.file"] = ""
    for p in opts.get("params") or ():
        if "=" not in p:
            raise click.BadParameter(f"'{p}' is not KEY=VALUE", param_hint="--param")
        k, v = p.split("=", 1)
        over[f"algo.params.{k.strip()}"] = _param_value(v.strip())
    return from_dict(merge(base, over))


# the default value's type -> how a TOML value must look, and the types accepted
_TOML_KINDS = [(bool, "true or false", (bool,)), (int, "an integer", (int,)),
               (float, "a number", (int, float)), (str, "a string", (str,)),
               (list, "a list of integers", (list,)), (dict, "a table", (dict,))]


def _file_overrides(path: str) -> dict[str, Any]:
    """The dotted keys of a TOML run file, checked against the known keys and their types."""
    flat = _flatten(load_toml(path))
    known = _flatten(RunConfig().to_dict())
    for key, v in flat.items():
        if key not in known:
            continue  # unknown keys and misplaced tables are named by from_dict below
        kind, ok = next((k, ok) for t, k, ok in _TOML_KINDS if isinstance(known[key], t))
        good = isinstance(v, ok) and (kind == "true or false" or not isinstance(v, bool))
        if good and isinstance(v, list):
            good = all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        if not good:
            raise ConfigError(f"--config {path}: '{key}' must be {kind} (got {v!r})")
        flat[key] = float(v) if kind == "a number" else v
    try:
        from_dict(merge(RunConfig().to_dict(), flat))
    except ConfigError as e:
        raise ConfigError(f"--config {path}: {e}") from None
    return flat


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "algo.params":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# The defaults of a first run: 100 digits clients reach >= 85% within about a minute on 2 cores.
RUN_DEFAULTS: dict[str, Any] = {}


def _errors(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*a: Any, **kw: Any) -> Any:
        from fednet.launch.proc import Terminated, sigterm_interrupts

        restore = sigterm_interrupts()
        try:
            return f(*a, **kw)
        except FednetError as e:
            click.echo(f"fednet: error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt as e:
            term = isinstance(e, Terminated)
            click.echo(f"fednet: {'terminated' if term else 'interrupted'}; partial results were "
                       "kept", err=True)
            sys.exit(143 if term else 130)
        finally:
            restore()
    return wrapper


def _setup_logs(quiet: bool) -> None:
    from fednet.log import setup_logging

    setup_logging("server", "ERROR" if quiet else "WARNING")


class _Main(click.Group):
    """The `fednet` group: a usage error is one line, `fednet: error: ...`, exit code 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # bare `fednet`: the help text
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            click.echo(f"fednet: error: {e.format_message()}{hint}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("fednet: interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


_SHARED_HELP = """\b
Options shared by launch, local and server (details: fednet launch --help):
  --clients N        --rounds N          --algo NAME          --dataset NAME
  --partition iid|dirichlet|shards       --alpha A            --seed S
  --gpus 0,1         --latency PRESET|FILE                    --out DIR
  --config RUN.toml  (command-line options override the file)
"""


@click.group(cls=_Main, epilog=_SHARED_HELP,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="fednet")
def main() -> None:
    """fednet: federated learning over real processes and ZeroMQ sockets.

    \b
    Quick start:
      fednet launch --clients 100            # server + 100 client processes on this machine
      fednet local --clients 100             # the same run in one process (no sockets)
      fednet report runs/A runs/B            # compare finished runs
    """


@main.command()
@common_options
@_errors
def launch(**opts: Any) -> None:
    """Run a whole experiment on this machine: one server and N client processes."""
    from fednet.metrics.report import summary_table
    from fednet.server.main import run_zmq

    _setup_logs(opts["quiet"])
    cfg = build_config(opts, dict(RUN_DEFAULTS, clients=100))
    summary = run_zmq(cfg, quiet=opts["quiet"], local_clients=True)
    click.echo(summary_table(summary))


@main.command()
@common_options
@_errors
def local(**opts: Any) -> None:
    """Run the same experiment in one process, without sockets (reference and tests)."""
    cfg = build_config(opts, dict(RUN_DEFAULTS, clients=10))  # errors before importing torch
    from fednet.inproc import run_local
    from fednet.metrics.report import summary_table

    _setup_logs(opts["quiet"])
    summary = run_local(cfg, quiet=opts["quiet"])
    click.echo(summary_table(summary))


@main.command()
@common_options
@click.option("--bind", default="tcp://0.0.0.0:5555", show_default=True,
              help="Where to listen, tcp://HOST:PORT (PORT 0 = any free port).")
@_errors
def server(bind: str, **opts: Any) -> None:
    """Serve a run to clients on other hosts (`fednet clients --connect ...`)."""
    from fednet.metrics.report import summary_table
    from fednet.server.main import run_zmq, split_bind

    host, port = split_bind(bind)
    _setup_logs(opts["quiet"])
    cfg = build_config(opts, dict(RUN_DEFAULTS, clients=100, **{"net.host": host, "net.port": port}))
    summary = run_zmq(cfg, quiet=opts["quiet"], local_clients=False,
                      on_listen=lambda ep: click.echo(f"server listening on {ep}", err=True))
    click.echo(summary_table(summary))


@main.command()
@click.option("--connect", required=True, help="The server's endpoint, tcp://HOST:PORT.")
@click.option("--ids", required=True, help="Client ids to run here, e.g. 0-49 or 0,2,4.")
@click.option("--gpus", help="CUDA devices for these clients (round-robin by client id).")
@click.option("--advertise", default="127.0.0.1", show_default=True,
              help="Address of this host that peers use for hand-offs.")
@click.option("--threads", type=int, default=1, show_default=True, help="Torch threads per client.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the server to listen and to welcome each client.")
@_errors
def clients(connect: str, ids: str, gpus: str | None, advertise: str, threads: int,
            timeout: float) -> None:
    """Start clients on this host; they get the run's configuration from the server."""
    from fednet.launch.local_clients import parse_ids, run_clients

    sys.exit(run_clients(connect, parse_ids(ids), gpus, advertise, threads, timeout))


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@_errors
def report(runs: tuple[str, ...]) -> None:
    """Print finished runs side by side (each RUN is a results folder)."""
    from fednet.metrics.report import compare

    click.echo(compare(list(runs)))


if __name__ == "__main__":  # pragma: no cover
    main()
