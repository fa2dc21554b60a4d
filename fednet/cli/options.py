"""Command-line options shared by launch, local and server, and how they become a RunConfig."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fednet import plugins
from fednet.algorithms.registry import REGISTRY, check_params, get, with_plugins
from fednet.config import LATENCY_PRESETS, PARTITIONS, RunConfig, from_dict, load_toml, merge
from fednet.errors import ConfigError
from fednet.cli.options_extra import OPTIONS as EXTRA_OPTIONS, AlgoChoice, load_plugins, overrides
from fednet.cli.options_extra import HOST_PER_PROCESS, PER_PROCESS_HELP, PerProcess, check_resume_options  # noqa: F401,E501
from fednet.platform.packing import auto_for_host  # noqa: F401  (fednet clients)

# option name -> dotted config key
_KEYS = {
    "clients": "clients", "rounds": "rounds", "seed": "seed", "out": "out",
    "algo": "algo.name", "fraction": "algo.fraction",
    "dataset": "data.dataset", "partition": "data.partition", "alpha": "data.alpha",
    "data_root": "data.data_root", "download": "data.download",
    "model": "train.model", "epochs": "train.epochs", "batch_size": "train.batch_size", "lr": "train.lr",
    "momentum": "train.momentum", "weight_decay": "train.weight_decay", "threads": "train.threads",
    "round_timeout": "net.round_timeout", "register_timeout": "net.register_timeout",
    "max_inflight": "net.max_inflight", "clients_per_process": "net.clients_per_process",
    "max_failed_rounds": "net.max_failed_rounds", "real_time": "latency.real",
    "time_scale": "latency.time_scale", "availability": "latency.availability",
    "permute": "data.permute", "exemplars": "data.exemplars", "eval_mode": "algo.eval",
    "augment": "train.augment", "secure": "net.secure", "checkpoint_every": "net.checkpoint_every",
}

def _algo_options() -> list[tuple[str, str, Any, str]]:
    """(option, params key, click type, help) of every parameter the registry gives an option
    of its own (param(..., option="--mu")); help and defaults come from the declarations."""
    from fednet.algorithms import params as P

    seen: dict[str, list[tuple[str, P.Info]]] = {}
    for spec in with_plugins().values():
        for info in P.declared(spec.params):
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
    click.option("--clients", type=int, help="Number of clients (default 100 for launch, 10 for local)."),
    click.option("--rounds", type=int, help="Communication rounds. [default: 25]"),
    click.option("--algo", type=AlgoChoice(),
                 help="Algorithm (README: the table; docs/algorithms.md: the rules). "
                      "[default: fedavg]"),
    click.option("--dataset", help="digits (embedded), cifar10, cifar100, svhn (--data-root), synthetic-"
                                   "cifar10/100 (not CIFAR); one user per client: synthetic-fedprox, "
                                   "femnist, shakespeare, sent140 (LEAF's JSON). [default: digits]"),
    click.option("--partition", type=click.Choice(PARTITIONS),
                 help="How data is split: iid, dirichlet(alpha), shards (one class per client), domain "
                      "(20 clients, 5 domains); natural: the users of a naturally federated dataset."),
    click.option("--alpha", type=float, help="Dirichlet concentration; 0 means shards. [default: 0.5]"),
    click.option("--seed", type=int, help="Seed of every random draw. [default: 0]"),
    click.option("--gpus", help="Comma-separated CUDA devices, e.g. 0,1; client i uses gpus[i % n]. "
                                "Without it everything runs on the CPU."),
    click.option("--latency", help=f"Client profiles: {', '.join(LATENCY_PRESETS)} or a CSV/JSON "
                                   "file (compute_s_per_sample, rtt_s, up_bps, down_bps; rates in "
                                   "bytes/s, or with a unit: 100Mbit, 12.5MB). [default: lan]"),
    click.option("--availability", help="When clients are online: always, offline:F[:S], "
                                        "diurnal[:DAY[:ON]] or a CSV/JSON trace (client,start,end "
                                        "in simulated seconds). [default: always]"),
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
    click.option("--max-failed-rounds", type=int, help="Rounds in a row without a usable result "
                 "before the run stops as failed (exit code 4); 0: never. [default: 3]"),
    click.option("--clients-per-process", type=PerProcess(), help=PER_PROCESS_HELP),
    click.option("--max-inflight", type=int,
                 help="At most N tasks out at once; the next is sent when a result returns. Bounds "
                      "the server's memory when results arrive faster than it aggregates them "
                      "(simulated times are unchanged; with --real-time it delays sleeping "
                      "clients). [default: 0 = all at once]"),
    click.option("--checkpoint-every", type=int,
                 help="Write RUN/checkpoint every N rounds (atomically) for --resume. [default: off]"),
    click.option("--resume", type=click.Path(file_okay=False, exists=True), is_eager=True,
                 callback=load_plugins, help="Continue the run in this folder from its checkpoint (its config.toml; "
                      "options given here override it, e.g. more --rounds)."),
    click.option("--overwrite", is_flag=True, help="Let --out name a folder that already holds "
                 "files: the previous run's results there are replaced. [default: refused]"),
    click.option("--secure", type=click.Path(file_okay=False),
                 help="Key folder from `fednet keys init`: CURVE encryption and client "
                      "authentication on every server and peer link."),
    click.option("--permute/--no-permute", default=None,
                 help="Every client relabels its data with a private permutation (personalized FL)."),
    click.option("--eval", "eval_mode", type=click.Choice(["auto", "global", "clients"]),
                 help="global: the server model on the test set; clients: each client's own model "
                      "on its own split. [default: auto]"),
    click.option("--exemplars", type=int,
                 help="Exemplars per class taken out of the test set (FedSeq). [default: 5 digits, 10 else]"),
    click.option("--augment", type=click.Choice(["auto", "none", "fedseq", "simclr"]),
                 help="Train-time augmentation. [default: auto]"),
    *EXTRA_OPTIONS,
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
    from fednet.platform.gpus import parse_gpus

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
    over: dict[str, Any] = {_KEYS[k]: v for k, v in opts.items() if k in _KEYS and v is not None}
    over.update(overrides(opts, base))  # --optimizer and its settings, --plugin
    over.update({"gpus": list(parse_gpus(opts["gpus"]))} if opts.get("gpus") is not None else {})
    lat = opts.get("latency")
    if lat is not None and lat not in LATENCY_PRESETS and not Path(lat).is_file():
        raise ConfigError(f"--latency '{lat}' is neither a preset ({', '.join(LATENCY_PRESETS)}) "
                          "nor an existing CSV/JSON file")
    if lat is not None:
        over["latency.preset" if lat in LATENCY_PRESETS else "latency.file"] = lat
        if lat in LATENCY_PRESETS:
            over["latency.file"] = ""
    given = [(dest, opt, key) for dest, (opt, key) in _ALGO_DEST.items()
             if opts.get(dest) is not None]
    for dest, _, key in given:
        over[f"algo.params.{key}"] = opts[dest]
    for p in opts.get("params") or ():
        if "=" not in p:
            raise click.BadParameter(f"'{p}' is not KEY=VALUE", param_hint="--param")
        k, v = p.split("=", 1)
        over[f"algo.params.{k.strip()}"] = v.strip()  # typed below, by the algorithm's declaration
    check_resume_options(over, _flatten(base)) if resume else None  # a resume keeps settings
    merged = merge(base, over)
    plugins.load_modules(list(merged.get("plugins") or ()))  # before the algorithm is looked up
    algo = merged["algo"]
    spec = get(str(algo.get("name")))
    for dest, opt, _ in given:  # an option names its value in the error
        _check_option(spec, opt, opts[dest])
    in_table = fixed.get("algo.params") or {}  # a file's [algo.params] table
    tuned = {k: v for k, v in spec.tuned_for(str(merged["data"]["partition"])).items()
             if k not in fixed and k not in over
             and not (k.startswith("algo.params.") and k[len("algo.params."):] in in_table)}
    merged = merge(merged, tuned)
    algo = merged["algo"]
    algo["params"] = check_params(spec.name, dict(algo.get("params") or {}))
    if tuned or "tuned" not in fixed:  # a resumed run keeps what its first start recorded
        merged["tuned"] = [f"{k}={v}" for k, v in sorted(tuned.items())]
    return from_dict(merged)


def _check_option(spec: Any, opt: str, value: Any) -> None:
    """A per-algorithm option's value, for the chosen algorithm (ConfigError naming the option)."""
    from fednet.algorithms.params import check_value, declared

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
    from fednet.config import validate
    from fednet.metrics.history import check_out, resolve_out

    validate(cfg)
    out = resolve_out(cfg)
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
    return {k: checked[k] if k in checked and k != "algo.params" else v for k, v in flat.items()}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "algo.params":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


