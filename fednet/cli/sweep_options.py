"""The options and help of `fednet sweep` (grid options before `--`, each a comma-separated list;
fixed options after it) and of `fednet report` (the commands themselves are in cli/commands.py)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


class SweepCommand(click.Command):
    """Arguments after `--` are the cells' fixed options, passed on as given (never split)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["argv"] = list(args)
        if "--" in args:
            i = args.index("--")
            ctx.meta["fixed"], args = list(args[i + 1:]), list(args[:i])
        return super().parse_args(ctx, args)


SWEEP_EPILOG = """Grid options (before --): any option of `fednet local`, each with a
comma-separated list of values; --param KEY=V1,V2 for an algorithm parameter. Every combination
is one cell; an option with one value is the same in every cell. Options after -- are passed to
every cell as given.

\b
  fednet sweep --out sweeps/lr --algo fedavg,fedprox --lr 0.05,0.1,0.2 --seed 0,1,2 \\
      -- --clients 20 --rounds 30 --partition shards
  fednet sweep --out sweeps/seq --metric rounds_to:0.9 --reference centralized \\
      --method 'fedavg=--algo fedavg --lr 0.1,0.2,0.3' \\
      --method 'greedy=--algo fedseq --lr 0.05,0.1,0.2' --seed 0,1,2 -- --partition shards

A method is the value of --by (default: algo), or a --method NAME=OPTIONS (its options may hold
lists too: that method's own grid). Each method's best setting is chosen by the mean of --metric
over the seeds. Cells go to OUT/cells/<method>__<setting>__seed=<s>/ (a run folder each, with
cell.json and log.txt); OUT/sweep.json and OUT/sweep.csv hold every cell, OUT/table.csv every
setting with its statistics. Running the same
command again skips the cells that finished (status completed or diverged); failed and
diverged cells are listed apart and never tabled as results; a completed seed that collapsed
or diverged is marked * (docs/usage.md). --latex FILE and --markdown FILE: the tables for a
paper (fednet report SWEEPDIR --latex FILE makes them from a finished sweep).
"""

TEXT_SUFFIXES = {"--csv": (".csv", ".txt"), "--curves": (".csv", ".txt"),
                 "--latex": (".tex", ".txt"), "--markdown": (".md", ".markdown", ".txt")}
"""What each text file of fednet report and sweep may be named (or no extension at all)."""


def _suffix(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a file name whose extension names another format than the one written (before
    anything is written: a usage error, exit 2)."""
    from pathlib import PurePath

    if not value:
        return value
    opt, ext = (param.opts or [""])[0], PurePath(value).suffix.lower()
    if opt == "--plot":
        from fednet.metrics.plots import plot_formats

        known = sorted(plot_formats())
        if ext.lstrip(".") not in known:
            raise click.BadParameter(
                f"'{value}': {'no extension' if not ext else repr(ext) + ' is no format matplotlib writes'}"
                f"; end the name in one of {', '.join('.' + k for k in known)}")
    elif ext and ext not in TEXT_SUFFIXES.get(opt, (ext,)):
        raise click.BadParameter(f"'{value}': this file is written as "
                                 f"{ {'--latex': 'LaTeX', '--markdown': 'Markdown'}.get(opt, 'CSV')}"
                                 f"; end its name in {' or '.join(TEXT_SUFFIXES[opt])}")
    return value


def _paper_options(when: str) -> list[Callable[[Any], Any]]:
    """--latex FILE and --markdown FILE: the printed tables for a paper (`when`: how often the
    file is written, said in the help)."""
    return [click.option("--latex", "latex_file", type=click.Path(dir_okay=False),
                         callback=_suffix,
                         help="Also write the tables as LaTeX (booktabs: \\toprule, \\midrule, "
                              f"\\bottomrule) into this file (.tex), the same cells as "
                              f"printed{when}."),
            click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False),
                         callback=_suffix,
                         help="Also write the tables as Markdown (pipe tables) into this file "
                              f"(.md), the same cells as printed{when}.")]


_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--out", required=True, type=click.Path(file_okay=False),
                 help="The sweep's folder (created; reused to go on with an unfinished sweep)."),
    click.option("--jobs", type=int, default=1, show_default=True, help="Cells run at once."),
    click.option("--runtime", type=click.Choice(["local", "launch"]), default="local",
                 show_default=True, help="How each cell runs: fednet local or fednet launch."),
    click.option("--metric", default="final_accuracy", show_default=True,
                 help="What chooses the best setting: final_accuracy, best_accuracy, "
                      "rounds_to:X, sim_to:X, bytes_to:X, wall_to:X, epochs_to:X or samples_to:X "
                      "(rounds, simulated seconds, bytes, wall-clock seconds, client-epochs or "
                      "training samples until the accuracy first reaches X, setup stages "
                      "included)."),
    click.option("--reference", default="",
                 help="Makes X of rounds_to:X a fraction of this accuracy: a number, a run "
                      "folder (its best accuracy), or centralized[:OPTIONS] (a --algo "
                      "centralized cell with the fixed options, then OPTIONS)."),
    click.option("--method", "methods", multiple=True, metavar="NAME=OPTIONS",
                 help="A named method and its options (repeatable), e.g. 'random=--algo fedseq "
                      "--grouping random'."),
    click.option("--by", default="algo", show_default=True,
                 help="Grid options whose values tell methods apart (comma-separated); the "
                      "other options but --seed are the settings tuned per method."),
    click.option("--baseline", default="", metavar="METHOD",
                 help="Add columns comparing each method with this one, paired by seed (ratio "
                      "for rounds_to-like metrics, difference for accuracies; a 95% interval, a "
                      "paired t-test's p and the pairs)."),
    click.option("--show", multiple=True, metavar="METRIC|KEY",
                 help="Another column for the best settings: a metric (rounds_to:0.8) or a "
                      "summary.json key (setup.balance_ratio_mean); repeatable."),
    *_paper_options("; rewritten as cells finish"),
    click.option("--dry-run", is_flag=True, help="List the cells and their commands; run nothing."),
    click.argument("grid", nargs=-1, type=click.UNPROCESSED),
]


def _attach(options: list[Callable[[Any], Any]], f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(options):
        f = opt(f)
    return f


def sweep_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Attach the options of `fednet sweep`."""
    return _attach(_OPTIONS, f)


def run_command(ctx: click.Context, o: dict[str, Any], command: click.Command,
                defaults: dict[str, Any]) -> str:
    """Run the sweep the command line describes (progress on stderr); its table."""
    from fednet.sweep.runner import Options, run_sweep

    opts = Options(o["out"], list(o["grid"]), ctx.meta.get("fixed", []), list(o["methods"]),
                   [b.strip() for b in o["by"].split(",") if b.strip()], o["runtime"], o["jobs"],
                   o["metric"], o["reference"], o["baseline"], list(o["show"]), o["dry_run"],
                   argv=["fednet", "sweep", *ctx.meta.get("argv", [])],
                   latex=o["latex_file"] or "", markdown=o["markdown_file"] or "")
    return run_sweep(opts, ClickCells(command, defaults), lambda line: click.echo(line, err=True))


class ClickCells:
    """The command a sweep's cells run (sweep/grid.CellCommand), as the command line parses it."""

    def __init__(self, command: click.Command, defaults: dict[str, Any]) -> None:
        self.command, self.defaults = command, defaults
        self.flags = {o for p in command.params if isinstance(p, click.Option)
                      and (p.is_flag or p.count) for o in (*p.opts, *p.secondary_opts)}

    def config(self, args: list[str]) -> Any:
        """A cell's options parsed and validated as the command will (ConfigError)."""
        from fednet.cli import setting_options
        from fednet.cli.options import build_config
        from fednet.algorithms.checks import validate
        from fednet.errors import ConfigError

        try:
            ctx = self.command.make_context(str(self.command.name), list(args))
            return validate(build_config(ctx.params, self.defaults),
                            setting_options.given(ctx.params))  # (as prepare_out's)
        except click.ClickException as e:
            raise ConfigError(e.format_message()) from None


_REPORT_OPTIONS: list[Callable[[Any], Any]] = [
    click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True)),
    click.option("--plot", "plot_file", type=click.Path(dir_okay=False), callback=_suffix,
                 help="Also draw accuracy vs round, vs simulated time and vs traffic of these "
                      "runs into one figure, overlaid (the format by the extension: .png, .pdf, "
                      ".svg, .eps, .jpg, ...; a "
                      "sweep folder: each method's best setting, the mean over its seeds; run "
                      "folders that differ only in --seed: one curve, their mean)."),
    click.option("--log-x", is_flag=True,
                 help="--plot: simulated time and traffic on a log scale (methods far apart)."),
    click.option("--csv", "csv_file", type=click.Path(dir_okay=False), callback=_suffix,
                 help="Also write the table as CSV (.csv): a line per run (with its cost to "
                      "--target, attack, defense and secure aggregation), and per sweep setting "
                      "with its statistics over seeds and the comparison with the baseline."),
    click.option("--curves", "curves_file", type=click.Path(dir_okay=False), callback=_suffix,
                 help="Also write every run's curves as CSV (a line per run and round: "
                      "accuracy, loss, simulated and wall-clock time, cumulative bytes)."),
    *_paper_options(""),
]


def report_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Attach the arguments and options of `fednet report`."""
    return _attach(_REPORT_OPTIONS, f)


def write_report_files(runs: list[str], plot_file: str | None, log_x: bool,
                       csv_file: str | None, curves_file: str | None,
                       latex_file: str | None = None, markdown_file: str | None = None) -> None:
    """The files `fednet report` was asked for (each named on stderr once written)."""
    from pathlib import Path

    from fednet.metrics import export, paper
    from fednet.metrics.files import write_text
    from fednet.metrics.report import report_parts

    for f, make in ((csv_file, export.table_csv), (curves_file, export.curves_csv)):
        if f:
            write_text(Path(f), make(runs))
            click.echo(f"wrote {f}", err=True)
    if latex_file or markdown_file:
        for f in paper.write(report_parts(runs), latex_file, markdown_file):
            click.echo(f"wrote {f}", err=True)
    if plot_file:
        from fednet.metrics.plots import plot_overlay

        click.echo(f"wrote {plot_overlay(runs, Path(plot_file), log_x)}", err=True)
