"""Run configuration: frozen dataclasses, TOML files, CLI overrides and validation."""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fednet.algorithms import params, registry
from fednet.compress import parse as compression
from fednet.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PARTITIONS = ("iid", "dirichlet", "shards", "domain", "natural")  # natural: data/natural.py
OPTIMIZERS = ("sgd", "adam", "adamw")
LATENCY_PRESETS = ("none", "lan", "wan", "hetero")


@dataclass(frozen=True)
class DataConfig:
    """Which dataset and how it is split among clients."""

    dataset: str = "digits"
    partition: str = "iid"
    alpha: float = 0.5
    data_root: str = ""
    download: bool = False
    exemplars: int = -1  # per class, removed from the test set (-1: 5 for digits, 10 otherwise)
    permute: bool = False  # each client relabels its data with a private permutation
    synthetic_alpha: float = 1.0  # synthetic-fedprox: u_k ~ N(0, alpha), the clients' weight means
    synthetic_beta: float = 1.0   # synthetic-fedprox: how much the clients' inputs differ


@dataclass(frozen=True)
class TrainConfig:
    """The local optimiser every client runs."""

    model: str = "auto"
    epochs: int = 5
    batch_size: int = 8
    lr: float = 0.15
    momentum: float = 0.0
    weight_decay: float = 4e-4
    threads: int = 1
    augment: str = "auto"  # none, fedseq, simclr; auto = the dataset's default (none for digits)
    optimizer: str = "sgd"  # sgd, adam, adamw (training/optim.py: torch's functional kernels)
    nesterov: bool = False  # sgd with momentum only
    beta1: float = 0.9      # adam, adamw
    beta2: float = 0.999
    eps: float = 1e-8


@dataclass(frozen=True)
class AlgoConfig:
    """Which algorithm, how many clients per round, and its own parameters."""

    name: str = "fedavg"
    fraction: float = 1.0
    eval: str = "auto"  # global (server model on the test set) | clients (each client's own model)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NetConfig:
    """Where the server listens and how long it waits."""

    host: str = "127.0.0.1"
    port: int = 0
    round_timeout: float = 300.0
    register_timeout: float = 60.0
    secure: str = ""  # key folder (fednet keys init DIR): CURVE + ZAP on every link
    ack_timeout: float = 30.0  # seconds a hand-off waits for HANDOFF_ACK before a retry
    ack_retries: int = 2       # attempts per peer before it counts as dead
    dead_peer: str = "skip"    # skip the dead peer and go on, or "server": return the model
    checkpoint_every: int = 0  # rounds between checkpoints (0: none); see --resume
    max_inflight: int = 0      # tasks out at once (0: all of a round's tasks)
    max_failed_rounds: int = 3  # rounds in a row without a usable result end the run as failed
    clients_per_process: int = 0  # logical clients per client process (launch); 0 = auto
    compress: str = "none"  # --compress: how results travel (fednet/compress: fp16, topk:0.01...)
    compress_down: str = "none"  # --compress-down: how tasks travel (fp16, int8, qsgd:S)
    compress_handoff: str = "none"  # --compress-handoff: how peer hand-offs travel (as down)


@dataclass(frozen=True)
class LatencyConfig:
    """Per-client simulated compute speed and links; real=True also sleeps the delays."""

    preset: str = "lan"
    file: str = ""
    real: bool = False
    time_scale: float = 1.0
    shaped: bool = False  # --shaped-links: the network enforces the bandwidths (e.g. tc tbf)
    availability: str = ""  # when clients are online: a preset or a trace (network/availability.py)
    server_bandwidth: float = 0.0  # the server's shared link, bytes/s each way (0: unlimited)
    deadline: float = 0.0     # simulated seconds per round; later results are stragglers (0: none)
    over_select: float = 1.0  # select ceil(F x target) clients, keep the first target arrivals


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; sent to every client in WELCOME."""

    clients: int = 10
    rounds: int = 25
    seed: int = 0
    gpus: tuple[int, ...] = ()
    out: str = ""
    plugins: tuple[str, ...] = ()  # --plugin modules (dotted names or .py paths) the run imports
    tuned: tuple[str, ...] = ()  # "key=value" the algorithm's tuned defaults set (registry.tuned)
    track: tuple[str, ...] = ()  # --track: tensorboard[:DIR], mlflow[:URI] (metrics/tracking.py)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    net: NetConfig = field(default_factory=NetConfig)
    latency: LatencyConfig = field(default_factory=LatencyConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (msgpack- and TOML-friendly)."""
        return {**asdict(self), **{k: list(getattr(self, k)) for k in _LISTS}}

    def replace(self, **overrides: Any) -> RunConfig:
        """A copy with dotted-key overrides, e.g. replace(**{"train.lr": 0.1})."""
        return from_dict(merge(self.to_dict(), overrides))


_LISTS = ("gpus", "plugins", "tuned", "track")  # the top-level lists (tuples in RunConfig)
_SECTIONS = {"data": DataConfig, "train": TrainConfig, "algo": AlgoConfig, "net": NetConfig,
             "latency": LatencyConfig}


def _build(cls: type, d: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ConfigError(f"unknown key '{where}{unknown[0]}' in the configuration; known keys: "
                          f"{', '.join(sorted(names))}")
    kw = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if f.name in _SECTIONS and cls is RunConfig:
            _need(isinstance(v, dict), f"'[{f.name}]' must be a table in the configuration")
            v = _build(_SECTIONS[f.name], v, f"{f.name}.")
        elif f.name in _LISTS:
            t = int if f.name == "gpus" else str
            _need(isinstance(v, (list, tuple)) and all(params.fits(x, t) for x in v),
                  f"'{f.name}' must be a list of {'integers' if t is int else 'strings'} (got {v!r})")
        elif f.name == "params":
            _need(isinstance(v, dict), f"'{where}params' must be a table (got {v!r})")
        elif f.name != "server_bandwidth":  # (a rate: also a string with a unit)
            v = params.setting(where + f.name, v, f.default)
        kw[f.name] = dict(v) if f.name == "params" else tuple(v) if isinstance(v, list) else v
    return cls(**kw)


def from_dict(d: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from a nested dict (as written by to_dict or read from TOML)."""
    return _build(RunConfig, d, "")


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply dotted-key overrides ("train.lr": 0.1, "algo.params.mu": 0.01) to a nested dict."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, val in overrides.items():
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            nxt = dict(nxt) if isinstance(nxt, dict) else {}
            node[p] = nxt
            node = nxt
        node[parts[-1]] = val
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML run file into a nested dict; a missing or invalid file is a ConfigError."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config: file '{p}' does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config: '{p}' is not valid TOML ({e})") from None


def to_toml(cfg: RunConfig) -> str:
    """The resolved configuration as TOML text, readable back with --config; without `out`: a run's
    config.toml reused with --config must not write into that run's folder (--out chooses)."""
    import tomli_w

    d = cfg.to_dict()
    d.pop("out", None)
    try:
        return tomli_w.dumps(d)
    except TypeError as e:  # e.g. a value TOML has no type for
        raise ConfigError(f"the configuration cannot be written as TOML ({e})") from None


def __getattr__(name: str) -> Any:
    """ALGORITHMS and PERSONAL: views of the algorithm registry, for code importing them here."""
    if name in ("ALGORITHMS", "PERSONAL"):
        return tuple(n for n in registry.names() if name == "ALGORITHMS" or registry.personalized(n))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def eval_mode(cfg: RunConfig) -> str:
    """'clients' (personalized: every client tests its own model on its own split) or 'global'."""
    if cfg.algo.eval != "auto":
        return cfg.algo.eval
    personal = (cfg.data.permute or cfg.data.partition == "domain"
                or registry.personalized(cfg.algo.name))
    return "clients" if personal else "global"


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def optimizer_problem(t: TrainConfig) -> str:
    """Why the [train] optimizer settings do not fit together (one line naming the option)."""
    if t.optimizer not in OPTIMIZERS:
        return f"--optimizer '{t.optimizer}' is unknown; choose one of: {', '.join(OPTIMIZERS)}"
    if t.nesterov and (t.optimizer != "sgd" or t.momentum <= 0):
        return "--nesterov needs --optimizer sgd and a --momentum above 0"
    if t.optimizer == "sgd" and (t.beta1, t.beta2, t.eps) != (0.9, 0.999, 1e-8):
        return "--betas and --optimizer-eps are Adam's; add --optimizer adam (or adamw)"
    if t.optimizer != "sgd" and t.momentum:
        return f"--momentum is SGD's; {t.optimizer} has --betas B1,B2 instead: drop --momentum"
    if not (0 <= t.beta1 < 1 and 0 <= t.beta2 < 1):
        return f"--betas must each be in [0, 1) (got {t.beta1:g},{t.beta2:g})"
    return "" if t.eps > 0 else f"--optimizer-eps must be positive (got {t.eps:g})"


def validate(cfg: RunConfig) -> RunConfig:
    """Check values that do not need the dataset; raise ConfigError naming the option."""
    _need(cfg.clients >= 1, f"--clients must be at least 1 (got {cfg.clients})")
    _need(cfg.rounds >= 1, f"--rounds must be at least 1 (got {cfg.rounds})")
    _need(cfg.seed >= 0, f"--seed must be a non-negative integer (got {cfg.seed})")
    _need(all(g >= 0 for g in cfg.gpus), f"--gpus takes non-negative device indices (got {cfg.gpus})")
    registry.check_params(cfg.algo.name, dict(cfg.algo.params))  # the name, then each --param
    _need(cfg.algo.eval in ("auto", "global", "clients"),
          f"--eval '{cfg.algo.eval}' is unknown; choose auto, global or clients")
    _need(0.0 < cfg.algo.fraction <= 1.0, f"--fraction must be in (0, 1] (got {cfg.algo.fraction})")
    _need(cfg.data.partition in PARTITIONS,
          f"--partition '{cfg.data.partition}' is unknown; choose one of: {', '.join(PARTITIONS)}")
    _need(cfg.data.alpha >= 0, f"--alpha must be >= 0 (got {cfg.data.alpha})")
    d = cfg.data
    _need(d.dataset == "synthetic-fedprox" or (d.synthetic_alpha, d.synthetic_beta) == (1, 1),
          "--synthetic-alpha and --synthetic-beta are settings of --dataset synthetic-fedprox")
    _need(d.dataset != "synthetic-fedprox" or cfg.algo.name != "centralized", "--algo centralized "
          "needs a pooled training set, and synthetic-fedprox's clients generate theirs apart")
    t = cfg.train
    _need(t.epochs >= 1, f"--epochs must be at least 1 (got {t.epochs})")
    _need(t.batch_size >= 1, f"--batch-size must be at least 1 (got {t.batch_size})")
    _need(t.lr > 0, f"--lr must be positive (got {t.lr})")
    _need(0 <= t.momentum < 1, f"--momentum must be in [0, 1) (got {t.momentum})")
    _need(t.weight_decay >= 0, f"--weight-decay must be >= 0 (got {t.weight_decay})")
    _need(t.threads >= 1, f"--threads must be at least 1 (got {t.threads})")
    _need(not (why := optimizer_problem(t)), why)
    _need(0 <= cfg.net.port <= 65535, f"--port must be in 0..65535 (got {cfg.net.port})")
    compression(cfg.net.compress), compression(cfg.net.compress_down, "--compress-down")
    compression(cfg.net.compress_handoff, "--compress-handoff")  # each error names its option
    _need(cfg.net.dead_peer in ("skip", "server"),
          f"net.dead_peer must be skip or server (got '{cfg.net.dead_peer}')")
    _need(cfg.net.ack_timeout > 0 and cfg.net.ack_retries >= 1,
          "net.ack_timeout must be positive and net.ack_retries at least 1")
    _need(cfg.net.clients_per_process >= 0, "--clients-per-process must be auto (0 in a TOML "
          f"file) or at least 1 (got {cfg.net.clients_per_process})")
    _need(cfg.net.clients_per_process <= 1 or not cfg.latency.real,
          "--clients-per-process above 1 does not go with --real-time: the clients of one process "
          "would wait out each other's simulated delays; use one process per client")
    _need(cfg.net.max_inflight >= 0,
          f"--max-inflight must be 0 (no limit) or a positive number (got {cfg.net.max_inflight})")
    _need(cfg.net.max_failed_rounds >= 0, "--max-failed-rounds must be 0 (never stop) or a "
          f"positive number (got {cfg.net.max_failed_rounds})")
    _need(cfg.net.round_timeout > 0, f"--round-timeout must be positive (got {cfg.net.round_timeout})")
    lat = cfg.latency
    _need(bool(lat.file) or lat.preset in LATENCY_PRESETS,
          f"--latency '{lat.preset}' is neither a preset ({', '.join(LATENCY_PRESETS)}) nor a file")
    _need(lat.time_scale > 0, f"--time-scale must be positive (got {lat.time_scale})")
    _need(not lat.shaped or (lat.real and lat.time_scale == 1),
          "--shaped-links says the network itself runs the transfers at the profiles' rates, which "
          "only --real-time can use (at --time-scale 1); add --real-time, or drop --shaped-links")
    _need(isinstance(lat.deadline, (int, float)) and 0 <= lat.deadline < float("inf"),
          f"--deadline must be a number of simulated seconds > 0, or 0 for none (got {lat.deadline})")
    _need(isinstance(lat.over_select, (int, float)) and 1 <= lat.over_select <= 100,
          f"--over-select must be a factor in [1, 100], e.g. 1.3 (got {lat.over_select})")
    _need(lat.over_select == 1 or cfg.algo.name != "fedseq_inter",
          "--over-select does not apply to fedseq_inter (its slots run on without waiting for "
          "the others); use --deadline, or --algo fedseq")
    return cfg
