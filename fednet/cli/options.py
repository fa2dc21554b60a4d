"""Command-line options shared by launch, local and server, and how they become a RunConfig."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fednet import plugins
from fednet.algorithms.registry import REGISTRY, check_params, get, with_plugins
from fednet.cli import setting_options
from fednet.algorithms import params as P
from fednet.algorithms import robust_spec
from fednet.config import TABLES, RunConfig, flatten, from_dict, load_toml, merge
from fednet.errors import ConfigError
from fednet.cli.options_extra import load_plugins, overrides
from fednet.cli.options_extra import HOST_PER_PROCESS, check_resume_options  # noqa: F401
from fednet.platform.packing import auto_for_host  # noqa: F401  (fednet clients)

def _algo_options() -> list[tuple[str, str, Any, str]]:
    """(option, params key, click type, help) of every parameter the registry gives an option
    of its own (param(..., option="--mu")); help and defaults come from the declarations."""
    from fednet.config.declare import Info, declared

    seen: dict[str, list[tuple[str, Info]]] = {}
    for spec in with_plugins().values():
        for info in declared(spec.params):
            if info.option:
                seen.setdefault(info.option, []).append((spec.name, info))
    out = []
    for opt, uses in seen.items():
        first = uses[0][1]
        if any(i.name != first.name or i.type is not first.type for _, i in uses):
            raise TypeError(f"{opt} stands for different parameters: {uses}")
        choices = {i.choices for _, i in uses}
        typ: Any = (click.Choice(first.choices) if len(choices) == 1 and first.choices
                    else {int: int, float: float, bool: click.BOOL}.get(first.type, str))
        defaults: dict[str, list[str]] = {}
        for name, i in uses:
            shown = str(i.default).lower() if i.type is bool else f"{i.default:g}" \
                if i.type is float else str(i.default)
            defaults.setdefault(shown + (f"; {i.note}" if i.note else ""), []).append(name)
        default = (next(iter(defaults)) if len(defaults) == 1 else
                   "; ".join(f"{', '.join(n)}: {d}" for d, n in defaults.items()))
        algos = ", ".join(n for n, _ in uses)
        out.append((opt, first.name, typ, f"[{algos}] {first.help}. [default: {default}]"))
    return out


ALGO_OPTIONS = _algo_options()
_ALGO_DEST = {opt.lstrip("-").replace("-", "_"): (opt, key) for opt, key, _, _ in ALGO_OPTIONS}


def _opt_dest(opt: str) -> str:
    return opt.lstrip("-").replace("-", "_")


_COMMON: list[Callable[[Any], Any]] = [
    click.option("--config", "config_file", type=click.Path(dir_okay=False), is_eager=True,
                 callback=load_plugins, help="TOML file with the same fields; command-line options override it."),
    *setting_options.options(),  # every run setting's own option (config/settings.py declares them)
    click.option("--resume", type=click.Path(file_okay=False, exists=True), is_eager=True,
                 callback=load_plugins,
                 help="Continue the run in this folder from its checkpoint, with the settings of "
                      "its config.toml: only more --rounds and where and how the processes run "
                      "(network, --gpus, threads, plugins, data root, tracking), and --target, "
                      "may be given anew; any other option is refused, naming it."),
    click.option("--overwrite", is_flag=True, help="Let --out name a folder that already holds "
                 "files: the previous run's results there are replaced. [default: refused]"),
    *[click.option(opt, _opt_dest(opt), type=typ, help=hlp) for opt, _, typ, hlp in ALGO_OPTIONS],
    click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                 help="Algorithm parameter (repeatable), e.g. --param mu=0.01; typed and checked "
                      "against the algorithm's declared parameters (a wrong name lists them)."),
    click.option("-q", "--quiet", is_flag=True, help="No progress output."),
]


def common_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Attach the options shared by launch, local and server."""
    for opt in reversed(_COMMON):
        f = opt(f)
    return f


def build_config(opts: dict[str, Any], defaults: dict[str, Any]) -> RunConfig:
    """Defaults < TOML file < command-line options."""
    base = RunConfig().to_dict()
    base = merge(base, defaults)
    fixed: dict[str, Any] = {}  # the dotted keys a file sets (algo.params: a table)
    if opts.get("config_file"):
        fo = _file_overrides(opts["config_file"])
        base, fixed = merge(base, fo), {**fixed, **fo}
    resume = opts.get("resume")
    if resume:
        _check_resume(resume, opts)
        fo = _file_overrides(str(Path(resume) / "config.toml"))
        base, fixed = merge(base, fo), {**fixed, **fo}
        base["out"] = str(resume)
    over = setting_options.given(opts)  # the plain options, then those parsed into settings
    over.update(overrides(opts, base))
    given = [(dest, opt, key) for dest, (opt, key) in _ALGO_DEST.items()
             if opts.get(dest) is not None]
    for dest, _, key in given:
        over[f"algo.params.{key}"] = opts[dest]
    raw: dict[str, str] = {}
    for p in opts.get("params") or ():
        if "=" not in p:
            raise click.BadParameter(f"'{p}' is not KEY=VALUE", param_hint="--param")
        k, v = p.split("=", 1)
        raw[k.strip()] = v.strip()  # typed below, by the declaration of who takes it
    merged = merge(base, over)
    plugins.load_modules(list(merged.get("plugins") or ()))  # before the algorithm is looked up
    spec = get(str(merged["algo"].get("name")))
    over.update(_routed(raw, spec, merged))  # the algorithm's, the attack's or the defense's
    check_resume_options(over, _flatten(base)) if resume else None  # a resume keeps settings
    merged = merge(base, over)
    algo = merged["algo"]
    for dest, opt, _ in given:  # an option names its value in the error
        _check_option(spec, opt, opts[dest])
    in_table = fixed.get("algo.params") or {}  # a file's [algo.params] table
    tuned = {k: v for k, v in spec.tuned_for(str(merged["data"]["partition"])).items()
             if k not in fixed and k not in over
             and not (k.startswith("algo.params.") and k[len("algo.params."):] in in_table)}
    merged = merge(merged, tuned)
    algo = merged["algo"]
    algo["params"] = check_params(spec.name, dict(algo.get("params") or {}))
    for table, declare in (("attack", robust_spec.ATTACKS), ("defense", robust_spec.DEFENSES)):
        sec = merged[table]
        piece = declare.get(str(sec.get("name")))
        if piece is not None:  # (an unknown name is refused by the option's choices)
            sec["params"] = P.typed(piece.params, dict(sec.get("params") or {}), str(sec["name"]))
    if tuned or "tuned" not in fixed:  # a resumed run keeps what its first start recorded
        merged["tuned"] = [f"{k}={v}" for k, v in sorted(tuned.items())]
    from fednet.metrics.target import parse_target

    cfg = from_dict(merged)
    parse_target(cfg.target)  # a bad --target (or its run folder) before anything starts
    return cfg


def _routed(raw: dict[str, str], spec: Any, merged: dict[str, Any]) -> dict[str, str]:
    """--param pairs as dotted keys of the table whose owner declares them (robust_spec)."""
    from fednet.config.declare import declared

    split = robust_spec.route_params(raw, {i.name for i in declared(spec.params)},
                                     str(merged["attack"].get("name")),
                                     str(merged["defense"].get("name")))
    return {f"{table}.params.{k}": v for table, vals in split.items() for k, v in vals.items()}


def _check_option(spec: Any, opt: str, value: Any) -> None:
    """A per-algorithm option's value, for the chosen algorithm (ConfigError naming the option)."""
    from fednet.config.declare import check_value, declared

    info = next((i for i in declared(spec.params) if i.option == opt), None)
    if info is None:
        users = [n for n, s in REGISTRY.items() if any(i.option == opt for i in declared(s.params))]
        raise ConfigError(f"{opt} does not apply to {spec.name} (it is for {', '.join(users)}); "
                          "drop it or choose one of those")
    try:
        check_value(info, value, spec.name)
    except ConfigError:
        raise ConfigError(f"{opt} {value}: {spec.name} expects {info.name} to be "
                          f"{info.expected()}") from None


def prepare_out(opts: dict[str, Any], cfg: RunConfig) -> RunConfig:
    """Choose the results folder before anything starts: --out (refused when it holds files,
    unless --resume or --overwrite), --resume's folder (its checkpoint checked), or a fresh
    runs/<stamp>-<algo>/. Nothing is written here; the folder must be writable."""
    from fednet.algorithms.checks import validate
    from fednet.metrics.history import check_out, resolve_out

    validate(cfg, setting_options.given(opts))  # (a DP option given at its default: refused
    out = resolve_out(cfg)                       # where any value of it is, checks.validate)
    resume = bool(opts.get("resume"))
    check_out(out, resume=resume, overwrite=bool(opts.get("overwrite")))
    cfg = cfg.replace(out=str(out))
    if resume:
        from fednet.core import checkpoint

        checkpoint.read(out, cfg)
    return cfg


def _check_resume(resume: str, opts: dict[str, Any]) -> None:
    """--resume DIR continues the run in DIR: no other --out, no --overwrite, a config.toml."""
    if opts.get("overwrite"):
        raise ConfigError("--resume and --overwrite do not go together: --resume continues the "
                          "run in its folder, --overwrite starts a new one there")
    out = opts.get("out")
    if out is not None and Path(out).resolve() != Path(resume).resolve():
        raise ConfigError(f"--resume {resume} continues the run in its own folder; drop "
                          f"--out {out}")
    if not (Path(resume) / "config.toml").is_file():
        raise ConfigError(f"--resume {resume}: no config.toml there; give the folder of a run "
                          "that was started with --checkpoint-every N")


def _file_overrides(path: str) -> dict[str, Any]:
    """The dotted keys of a TOML run file, checked against the known keys and their types
    (config.from_dict: the same checks as the Python path)."""
    flat = _flatten(load_toml(path))
    flat.pop("out", None)  # older config.toml files recorded it: only --out chooses the folder
    try:
        checked = _flatten(from_dict(merge(RunConfig().to_dict(), flat)).to_dict())
    except ConfigError as e:
        raise ConfigError(f"--config {path}: {e}") from None
    return {k: checked[k] if k in checked and k not in TABLES else v for k, v in flat.items()}


def _flatten(d: dict[str, Any]) -> dict[str, Any]:
    return flatten(d, tables=TABLES)  # --param values stay one table each
