"""Every `fednet` command shown in README.md and docs/ is one fednet accepts as written (issue
57): the command lines of the fenced blocks (prompts, continuations and comments taken off) and
the inline `fednet ... --option` spans. Each is parsed by the real command line: a run command
(local, launch, server) up to its checked configuration (`validate`, everything but the data;
nothing runs), `fednet sweep` with --dry-run (its cells listed, each validated), `fednet keys`
and `fednet plugins` for real in a scratch folder; the others (clients, track, calibrate) by
their options. A doc that names an option fednet no longer has, a value it refuses or two
options that refuse each other fails here, naming the file and the command. Synopses (`[...]`,
`RUN...`) are not commands; placeholders (DIR, RUN, $K, ~) stand for scratch paths."""
from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fednet.cli.commands import main

ROOT = Path(__file__).resolve().parent.parent
# (docs/benchmarks/history.md records what past runs ran, with the options of their day)
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                    if p.name != "history.md")]
_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
_PROMPT = re.compile(r"^\s*(?:[\w.-]*\$\s+)?")  # "$ ", "server$  ", "hostA$ "
_SYNOPSIS = re.compile(r"\[|\.\.\.|\$\(|\s\|\s|SWEEPDIR|<")  # a template, not a command
_SUBS = {"$K": "{tmp}/run1.key", "/shared/run1.key": "{tmp}/run1.key", "~/": "{tmp}/home/",
         "DIR": "{tmp}/keys", "RUN_DIR": "{tmp}/run", "RUN": "{tmp}/run", "FILE": "{tmp}/run1.key",
         "NAME": "hostC", "URI": "http://127.0.0.1:5000", "HOST": "127.0.0.1",
         "SERVER": "127.0.0.1", "THIS_HOST_IP": "127.0.0.1", "SCALE": "2"}
RUNS = ("runs/A", "runs/B", "runs/nova-local", "runs/nova-launch", "run")
"""Run folders the docs' commands read: each a copy of one small real run."""


def _lines(block: str) -> list[str]:
    """The block's shell lines, backslash continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.split(r"\s#\s|\s{2,}#", line)[0].strip()
        line = re.sub(r";\s*wait$", "", line)
        out.append(_PROMPT.sub("", line))
    return out


def commands() -> list[tuple[str, str]]:
    """(where, command) for every fednet command line of the docs' fenced blocks."""
    found = []
    for md in DOCS:
        where = md.relative_to(ROOT).as_posix()
        for block in _FENCE.findall(md.read_text()):
            found += [(where, c) for c in _lines(block) if c.startswith("fednet ")]
    return _unique(found)


def mentions() -> list[tuple[str, str]]:
    """(where, text) for every inline `fednet ... --option` of the docs' prose: a command, or
    a part of one that names its options."""
    found = []
    for md in DOCS:
        prose = _FENCE.sub("", md.read_text())
        found += [(md.relative_to(ROOT).as_posix(), " ".join(c.split()))
                  for c in re.findall(r"`(fednet [^`]+)`", prose) if " --" in c]
    return _unique(found, synopses=True)


def _unique(found: list[tuple[str, str]], synopses: bool = False) -> list[tuple[str, str]]:
    seen, out = set(), []
    for where, c in found:
        if (not synopses and _SYNOPSIS.search(c)) or c.startswith("fednet: ") or (where, c) in seen:
            continue
        seen.add((where, c))
        out.append((where, c))
    return out


COMMANDS, MENTIONS = commands(), mentions()
PARSE_ONLY = {
    "--algo fednova": "the example plugin's algorithm: installed and run under every runtime by "
                      "tests/integration/test_plugins.py",
    "--track mlflow:": "its check connects to the tracking server: run against a real one by "
                       "tests/integration/test_tracking.py",
    "--plugin geomed.py": "docs/extending.md's defense plugin: its file written from the doc and "
                          "run under every runtime by tests/integration/test_plugin_pieces.py",
    "--plugin laplace.py": "docs/extending.md's DP mechanism plugin: its file written from the doc "
                           "and run under every runtime by tests/integration/test_plugin_pieces.py",
}
"""Commands whose options are checked here (they exist) and that run elsewhere, with why."""


def _args(command: str, tmp: Path) -> list[str]:
    for k in sorted(_SUBS, key=len, reverse=True):
        command = re.sub(rf"(?<![\w/-]){re.escape(k)}(?![\w-])", _SUBS[k].format(tmp=tmp),
                         command) if k[0].isalpha() else command.replace(
                             k, _SUBS[k].format(tmp=tmp))
    return shlex.split(command)[1:]


def _parse_only(args: list[str]) -> None:
    """The subcommand's options parsed as click parses them (no callback runs)."""
    ctx = main.make_context("fednet", list(args), resilient_parsing=False)
    cmd: click.Command = main
    rest = list(args)
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(ctx, rest[0])
        assert sub is not None, f"no command {rest[0]!r}"
        cmd, rest = sub, rest[1:]
        ctx = cmd.make_context(cmd.name, list(rest), parent=ctx)


def _config_only(sub: str, args: list[str], tmp: Path) -> None:
    """A run command's configuration built and validated as the command does (no run)."""
    from fednet.algorithms.checks import validate
    from fednet.cli.commands import RUN_DEFAULTS
    from fednet.cli.options import build_config

    cmd = main.get_command(click.Context(main), sub)
    assert cmd is not None
    ctx = cmd.make_context(sub, list(args))
    opts = dict(ctx.params)
    opts.pop("bind", None)
    opts.pop("join_key", None)
    validate(build_config(opts, dict(RUN_DEFAULTS, clients=100)))


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    """One small finished run (digits, 3 clients, 1 round)."""
    from fednet.core.inproc import run_local
    from tests.conftest import small_config

    out = tmp_path_factory.mktemp("doc-run") / "run"
    run_local(small_config(clients=3, rounds=1, out=str(out)), quiet=True)
    return out


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}: {c[:60]}" for w, c in COMMANDS])
def test_each_documented_command_is_accepted_as_written(where, command, tmp_path, monkeypatch,
                                                        request):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    if any(r in command for r in ("runs/", " RUN")):
        import shutil

        run = request.getfixturevalue("a_run")
        for name in RUNS:
            shutil.copytree(run, tmp_path / name)
    args = _args(command, tmp_path)
    sub = args[0] if args else ""
    if "--help" in args or sub in ("plugins",):
        got = CliRunner().invoke(main, args)
        assert got.exit_code == 0, f"{where}: `{command}`: {got.output}"
    elif sub == "keys":
        if args[1] != "init":
            CliRunner().invoke(main, ["keys", "init", str(tmp_path / "keys")])
        got = CliRunner().invoke(main, args)
        assert got.exit_code == 0, f"{where}: `{command}`: {got.output}"
    elif sub == "sweep":
        if "--out" not in args:
            args += ["--out", str(tmp_path / "sweep")]
        got = CliRunner().invoke(main, [*args[:1], "--dry-run", *args[1:]])
        assert got.exit_code == 0, f"{where}: `{command}`: {got.output}"
    elif sub == "report":
        got = CliRunner().invoke(main, args)
        assert got.exit_code == 0, f"{where}: `{command}`: {got.output}"
    elif any(k in command for k in PARSE_ONLY):
        _options_exist(where, command)
    elif sub in ("local", "launch", "server") and "--resume" not in args:
        _config_only(sub, args[1:], tmp_path)
    else:
        _parse_only(args)


def _options_exist(where: str, text: str) -> None:
    """The options `text` names are options of its subcommand (a sweep's grid: of a run's)."""
    words = shlex.split(text.replace("|", " "))[1:]
    cmd: click.Command | None = main
    while isinstance(cmd, click.Group) and words and not words[0].startswith("-"):
        cmd, words = cmd.get_command(click.Context(cmd), words[0]), words[1:]
    assert cmd is not None, f"{where}: `{text}`: no such command"
    runs = [cmd] if cmd.name != "sweep" else [cmd, main.get_command(click.Context(main), "local")]
    have = {o for c in runs if c is not None for p in c.params
            for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    named = {w.split("=")[0] for w in words if w.startswith("--") and w != "--"}
    assert named <= have, f"{where}: `{text}`: fednet has no {sorted(named - have)} there"


@pytest.mark.parametrize("where, text", MENTIONS, ids=[f"{w}: {c[:60]}" for w, c in MENTIONS])
def test_each_option_the_prose_names_exists(where, text):
    """An inline `fednet SUB ... --option` names options SUB has (the prose may leave out the
    required ones, or show a placeholder for a value)."""
    _options_exist(where, text)


def test_the_docs_show_commands_of_every_kind():
    """The collection itself: the README's and the docs' commands are found (a change of the
    fences or prompts that hid them would pass everything above)."""
    subs = {shlex.split(c)[1] for _, c in COMMANDS}
    assert {"local", "launch", "server", "clients", "sweep", "report", "keys"} <= subs, subs
    assert len(COMMANDS) >= 25 and len(MENTIONS) >= 10


RUNNABLE = list({c: (w, c) for w, c in reversed(COMMANDS)  # one run of a command two docs show
                 if shlex.split(c)[1] in ("local", "launch", "sweep")
                 and "--help" not in c and not any(k in c for k in PARSE_ONLY)}.values())[::-1]
SMALL = {"--clients": 6, "--rounds": 1, "--seed": 0}
"""What a documented command is run at here: at most 6 clients (or enough for 10 a round at its
--fraction: a cohort Poisson-sampled from 6 is often empty), one round, one seed."""


def _small(args: list[str]) -> list[str]:
    """The command with its sizes cut to SMALL, and a sweep's grid of values to the first of
    each option (its methods, --algo, all kept)."""
    out = list(args)
    frac = float(out[out.index("--fraction") + 1]) if "--fraction" in out[:-1] else 1.0
    for i, a in enumerate(out[:-1]):
        if a in SMALL:
            first = out[i + 1].split(",")[0]
            most = max(SMALL[a], math.ceil(10 / frac)) if a == "--clients" else SMALL[a]
            out[i + 1] = str(min(int(first), most)) if a != "--seed" else first
        elif a.startswith("--") and a != "--algo" and "," in out[i + 1]:
            out[i + 1] = out[i + 1].split(",")[0]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("where, command", RUNNABLE, ids=[f"{w}: {c[:60]}" for w, c in RUNNABLE])
def test_each_documented_run_runs(where, command, tmp_path):
    """Each `fednet local`, `launch` and `sweep` command of the docs run as a user runs it (the
    installed `fednet`, in a scratch folder), at SMALL sizes: exit 0, and the line that says
    how it ended (a run's `status  completed`, a sweep's cells done)."""
    import os
    import subprocess
    import sys

    from tests.leaf_fixtures import write_leaf

    home = tmp_path / "home"
    write_leaf(home / "leaf" / "data-root", "femnist", users=120)  # ~/leaf/data-root
    args = _small(_args(command, tmp_path))
    run = [*args, "--rounds", "1"] if args[0] != "sweep" else args
    if args[0] != "sweep":
        run += [] if "--out" in run else ["--out", str(tmp_path / "out")]
    elif "--" in run and "--rounds" not in run[run.index("--"):]:
        run += ["--rounds", "1"]
    got = subprocess.run([sys.executable, "-m", "fednet", *run], cwd=tmp_path, text=True,
                         capture_output=True, timeout=300,
                         env={**os.environ, "HOME": str(home), "FEDNET_NO_PROGRESS": "1"})
    said = got.stdout + got.stderr
    assert got.returncode == 0, f"{where}: `{command}` (run as {run}): {said[-3000:]}"
    if args[0] == "sweep":
        assert re.search(r"(?m)^\d+ cells? run in ", said), said[-2000:]
    else:
        assert re.search(r"(?m)^status\s+completed\b", said), said[-2000:]
