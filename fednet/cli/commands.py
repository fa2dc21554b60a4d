"""The `fednet` command: launch, local, server, clients, sweep, report (plugins, track and
calibrate: their own modules)."""
from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fednet.config.liveness import DEFAULT as DEFAULT_LIVENESS
from fednet.errors import FednetError
from fednet.metrics.files import WRITE_ERRNOS
from fednet.cli.options import HOST_PER_PROCESS, auto_for_host, build_config, common_options, prepare_out
from fednet.cli.options_extra import (JOIN_KEY, LIVENESS, drop_empty, listening,
                                      server_join_key)
from fednet.platform.malloc import one_arena
from fednet.platform.proc import seed_routing_ids as seed_ids
from fednet.cli.plugins_command import plugins_command
from fednet.cli.track_command import track_command
from fednet.cli.calibrate_command import calibrate_command
from fednet.cli.sweep_options import SWEEP_EPILOG, SweepCommand, report_options, sweep_options

# The defaults of a first run: 100 digits clients reach >= 85% within about a minute on 2 cores.
RUN_DEFAULTS: dict[str, Any] = {}

_RUN: dict[str, Any] = {}  # the results folder of the command now running (interrupt message)


def _errors(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*a: Any, **kw: Any) -> Any:
        from fednet.platform.proc import Terminated, sigterm_interrupts

        restore = sigterm_interrupts()
        _RUN.clear()
        t0 = time.time()
        try:
            return f(*a, **kw)
        except FednetError as e:
            click.echo(f"fednet: error: {e}", err=True)
            sys.exit(2)
        except OSError as e:  # a write outside the results helpers (e.g. the clients' log)
            if e.errno not in WRITE_ERRNOS or not e.filename:
                raise
            click.echo(f"fednet: error: cannot write {e.filename}: {e.strerror}", err=True)
            sys.exit(2)
        except KeyboardInterrupt as e:
            from fednet.metrics.run_end import interrupt_note
            term = isinstance(e, Terminated)
            if sys.stderr.isatty():  # the progress bar's line (and the terminal's ^C) ends here
                click.echo("", err=True)
            out = _RUN.get("out")
            extra = ""
            if f.__name__ == "server" and out:  # where its clients reconnect, the key they hold
                from fednet.server.served import resume_args
                extra = resume_args(out)
            what = interrupt_note(f.__name__, out, t0, click.echo, extra)
            click.echo(f"fednet: {'terminated' if term else 'interrupted'}{what}", err=True)
            sys.exit(143 if term else 130)
        finally:
            restore()
    return wrapper


def _config(opts: dict[str, Any], defaults: dict[str, Any]) -> Any:
    """The run's configuration, its results folder chosen and checked (before anything starts)."""
    cfg = prepare_out(opts, build_config(opts, defaults))
    _RUN["out"] = cfg.out
    return cfg


def _done(summary: dict[str, Any]) -> None:
    """Print the summary table; the exit code follows its status (no_clients: 3, failed: 4,
    diverged: 5; budget_spent is a result: 0, with one line on the epsilon reached)."""
    from fednet.metrics.report import summary_table
    from fednet.metrics.run_end import run_error, run_note

    click.echo(summary_table(summary))
    note = run_note(summary)
    if note:
        click.echo(f"fednet: {note}", err=True)
    bad = run_error(summary)
    if bad is not None:
        click.echo(f"fednet: error: {bad[1]}", err=True)
        sys.exit(bad[0])


def _setup_logs(quiet: bool) -> None:
    from fednet.log import setup_logging
    setup_logging("server", "ERROR" if quiet else "WARNING")


class _Main(click.Group):
    """The `fednet` group: a usage error is one line, `fednet: error: ...`, exit code 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        one_arena()  # before any thread allocates (platform/)
        seed_ids()  # zmq's routing ids
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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The installed `fednet` script's entry (console_scripts: `sys.exit(main())`): the
        command ends with exit_now, like `python -m fednet`; any other caller (a script or a
        test calling main() in its own process) gets click's SystemExit as before."""
        if not _console_script():
            return self.main(*args, **kwargs)
        exit_now(lambda: self.main(*args, **kwargs))


def _console_script() -> bool:
    """Whether this process is the installed `fednet` script (its __main__ is that file)."""
    top = sys.modules.get("__main__")
    return os.path.basename(getattr(top, "__file__", None) or "") in ("fednet", "fednet-script.py")


def exit_now(command: Callable[[], Any]) -> Any:
    """Run the `fednet` command `command` (a standalone click main: it ends in SystemExit) as
    this process's whole life, then end the process without the interpreter's teardown (module
    clean-up and the deallocation of a run's large objects: ~0.5 s after a million-client run).

    Only for the process's top-level command (`python -m fednet`, `python -m fednet.cli`, the
    `fednet` script), never in a caller's own process. Everything an ordinary exit does that
    can leave a trace is done first: non-daemon threads are joined, atexit handlers run
    (logging.shutdown among them: every handler flushed and closed), stdout and stderr are
    flushed; the results themselves are written and closed by the run before it returns. The
    exit code is SystemExit's, as Python would give it (None: 0, a message: printed, 1; 120
    when stdout cannot be flushed, e.g. a reader that closed the pipe). An exception other
    than SystemExit propagates: the ordinary exit prints its traceback."""
    try:
        command()
        code: Any = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # as an ordinary exit: its exit
    # callbacks first (concurrent.futures wakes its idle workers), then non-daemon threads joined
    atexit._run_exitfuncs()
    for stream, failed in ((sys.stdout, 120), (sys.stderr, None)):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # e.g. `fednet report ... | head`: the pipe is closed
            code = code or failed or 0
    os._exit(code & 0xFF)


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
    from fednet.server.main import run_zmq

    _setup_logs(opts["quiet"])
    cfg = _config(opts, dict(RUN_DEFAULTS, clients=100))
    log = Path(cfg.out) / "logs" / "clients.log"
    had_log = log.exists()
    try:
        summary = run_zmq(cfg, quiet=opts["quiet"], local_clients=True, resume=bool(opts["resume"]))
    except FednetError:  # e.g. a checkpoint refused by the session: the folder stays as it was
        if opts["resume"] and not had_log:
            drop_empty(log)
        raise
    _done(summary)


@main.command()
@common_options
@_errors
def local(**opts: Any) -> None:
    """Run the same experiment in one process, without sockets (reference and tests)."""
    cfg = _config(opts, dict(RUN_DEFAULTS, clients=10))  # errors before importing torch
    from fednet.core.inproc import run_local

    _setup_logs(opts["quiet"])
    if (cfg.net.clients_per_process > 1 or cfg.net.max_inflight or cfg.net.secure
            or cfg.liveness != DEFAULT_LIVENESS):
        click.echo("note: --clients-per-process, --max-inflight, --secure and --liveness shape "
                   "client processes and their links; fednet local runs every client in this "
                   "process, without sockets, and ignores them", err=True)
    _done(run_local(cfg, quiet=opts["quiet"], resume=bool(opts["resume"])))


@main.command()
@common_options
@click.option("--bind", default="tcp://0.0.0.0:5555", show_default=True,
              help="Where to listen, tcp://HOST:PORT (PORT 0 = any free port).")
@JOIN_KEY
@_errors
def server(bind: str, join_key: str, **opts: Any) -> None:
    """Serve a run to clients on other hosts (`fednet clients --connect ... --join-key ...`)."""
    from fednet.server import served
    from fednet.server.main import run_zmq, split_bind

    resumed = served.recorded(opts["resume"]) if opts["resume"] else None
    given = click.get_current_context().get_parameter_source("bind")
    if resumed is not None and given == click.core.ParameterSource.DEFAULT:
        bind = resumed["bind"]  # where the run's live clients reconnect
    host, port = split_bind(bind)
    _setup_logs(opts["quiet"])
    cfg = _config(opts, dict(RUN_DEFAULTS, clients=100, **{"net.host": host, "net.port": port}))
    join = (served.resume_join_key(cfg.out, join_key, cfg.net.secure) if opts["resume"]
            else server_join_key(join_key, cfg.net.secure, Path(cfg.out)))
    _done(run_zmq(cfg, quiet=opts["quiet"], local_clients=False, resume=bool(opts["resume"]),
                  on_listen=listening(join, cfg.out, cfg.net.secure), join_key=join))


@main.command()
@click.option("--connect", required=True, help="The server's endpoint, tcp://HOST:PORT.")
@click.option("--ids", required=True,
              help="Client ids to run here, e.g. 0-49 or 0,2,4; slurm:N = this srun task's share "
                   "of N clients (task 0 runs the server).")
@click.option("--gpus", help="CUDA devices for these clients (round-robin by client id).")
@click.option("--advertise", default="127.0.0.1", show_default=True,
              help="Address of this host that peers use for hand-offs.")
@click.option("--threads", type=int, default=1, show_default=True, help="Torch threads per client.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the server to listen and to welcome each client.")
@click.option("--secure", type=click.Path(file_okay=False), default="",
              help="Key folder (as the server's): CURVE and authentication on every link.")
@click.option("--key", "key_name", default="",
              help="With --secure: this host's key NAME in the folder (made by `fednet keys add`); "
                   "needed only when the folder holds several client keys.")
@HOST_PER_PROCESS
@JOIN_KEY
@LIVENESS
@_errors
def clients(connect: str, ids: str, gpus: str | None, advertise: str, threads: int,
            timeout: float, secure: str, key_name: str, per_process: int, join_key: str,
            liveness: str | None) -> None:
    """Start clients on this host; they get the run's configuration from the server."""
    from fednet.config.liveness import DEFAULT, scale_of
    from fednet.launch.local_clients import parse_ids, run_clients

    live = DEFAULT if liveness is None else DEFAULT.scaled(scale_of(liveness))
    cids = parse_ids(ids)  # auto (0): from this host's cores, memory and devices
    sys.exit(run_clients(connect, cids, gpus, advertise, threads, timeout, secure,
                         per_process or auto_for_host(len(cids), gpus), key_name, join_key,
                         live))


@main.group()
def keys() -> None:
    """Key pairs for --secure (CURVE encryption; each key may claim only its client ids).

    \b
      fednet keys init DIR                     # the server's key pair
      fednet keys add DIR hostA --ids 0-49     # one key per client host (or per client)
      fednet keys list DIR                     # which key may claim which ids
    Copy DIR/server.key and DIR/hostA.key* to host A; keep DIR/server.key_secret on the server.
    """


@keys.command("init")
@click.argument("folder", type=click.Path(file_okay=False))
@_errors
def keys_init(folder: str) -> None:
    """Write the server's key pair (and an empty allowed/ folder) into FOLDER."""
    from fednet.transport.security import init_keys

    for p in init_keys(folder):
        click.echo(p)


@keys.command("add")
@click.argument("folder", type=click.Path(file_okay=False))
@click.argument("name")
@click.option("--ids", required=True, help="The client ids this key may claim, e.g. 0-49 or 0,2,4.")
@_errors
def keys_add(folder: str, name: str, ids: str) -> None:
    """Issue key pair NAME in FOLDER for one client host, allowed to claim --ids."""
    from fednet.transport.security import add_key

    for p in add_key(folder, name, ids):
        click.echo(p)


@keys.command("list")
@click.argument("folder", type=click.Path(file_okay=False, exists=True))
@_errors
def keys_list(folder: str) -> None:
    """The client keys the server in FOLDER admits, and the ids each may claim."""
    from fednet.client.table import ids_text
    from fednet.transport.security import list_keys

    for name, (pub, ids) in list_keys(folder).items():
        click.echo(f"{name}\t{ids_text(sorted(ids)) if ids else '(no ids)'}\t{pub}")


@main.command(cls=SweepCommand, epilog=SWEEP_EPILOG,
              context_settings={"ignore_unknown_options": True})
@sweep_options
@click.pass_context
@_errors
def sweep(ctx: click.Context, **opts: Any) -> None:
    """Run a grid of experiments (one fednet local per cell) and tabulate the best settings."""
    from fednet.cli.sweep_options import run_command

    _RUN["out"] = opts["out"]
    command, clients = (local, 10) if opts["runtime"] == "local" else (launch, 100)
    click.echo(run_command(ctx, opts, command, dict(RUN_DEFAULTS, clients=clients)))


@main.command()
@report_options
@_errors
def report(runs: tuple[str, ...], **files: Any) -> None:
    """Print runs side by side (each RUN is a results folder, finished or running, or a sweep
    folder)."""
    from fednet.metrics.report import report as text
    from fednet.cli.sweep_options import write_report_files

    table = text(list(runs))
    write_report_files(list(runs), **files)  # first: a reader that closes stdout (| head)
    click.echo(table)                       # leaves the files written


main.add_command(plugins_command)  # fednet plugins: what is installed (fednet/cli/plugins_command.py)
main.add_command(track_command)  # fednet track upload: a run sent to MLflow or TensorBoard afterwards
main.add_command(calibrate_command)  # fednet calibrate: this host's FLOP/s as a --latency trace

if __name__ == "__main__":  # pragma: no cover
    main()
