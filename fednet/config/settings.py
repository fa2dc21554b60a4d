"""The run settings, each declared once (config/declare.py: type, default, range, help, option),
and their readers: dicts, TOML files, dotted-key overrides."""
from __future__ import annotations

import functools
import sys
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fednet.config.adversary import AttackConfig, DefenseConfig
from fednet.config.latency import LATENCY_PRESETS as LATENCY_PRESETS, LatencyConfig
from fednet.config.liveness import Liveness
from fednet.config.privacy import DPConfig
from fednet.config.declare import Info, check_type, info_of, setting
from fednet.errors import ConfigError

if TYPE_CHECKING:
    from fednet.compress import Codecs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PARTITIONS = ("iid", "dirichlet", "shards", "domain", "natural")  # natural: data/natural.py
OPTIMIZERS = ("sgd", "adam", "adamw")
AUGMENTS = ("auto", "none", "fedseq", "simclr")
EVAL_MODES = ("auto", "global", "clients")
_COMPRESS = ("none, fp16, int8 (8-bit per tensor), qsgd[:S] (S levels, 16), topk[:R] (the "
             "fraction R kept, 0.01; error feedback), sign (scaled sign; error feedback)")


@dataclass(frozen=True)
class DataConfig:
    """Which dataset and how it is split among clients."""

    dataset: str = setting(
        "digits", "digits (embedded), cifar10, cifar100, svhn (--data-root), synthetic-cifar10/100 "
        "(not CIFAR); one user per client: synthetic-fedprox, femnist, shakespeare, sent140 "
        "(LEAF's JSON)", option="--dataset")
    partition: str = setting(
        "iid", "How data is split: iid, dirichlet(alpha), shards (one class per client), domain "
        "(20 clients, 5 domains); natural: the users of a naturally federated dataset",
        choices=PARTITIONS, option="--partition", shown="iid (natural)")
    alpha: float = setting(0.5, "Dirichlet concentration; 0 means shards", ge=0, option="--alpha")
    data_root: str = setting("", "Folder of dataset files", option="--data-root", path=True,
                             shown="~/.cache/fednet/data")
    download: bool = setting(False, "Download datasets if missing",
                             option="--download/--no-download")
    exemplars: int = setting(-1, "Exemplars per class taken out of the test set (FedSeq)", ge=-1,
                             option="--exemplars", shown="5 (digits), 10",
                             note="-1: the dataset's default")
    permute: bool = setting(False, "Every client relabels its data with a private permutation "
                            "(personalized FL)", option="--permute/--no-permute")
    synthetic_alpha: float = setting(
        1.0, "synthetic-fedprox: u_k ~ N(0, A), the mean of client k's weights (FedProx's "
        "Synthetic(A, B); a shift of every logit alike, so it changes no label: "
        "docs/algorithms.md 2.7)", option="--synthetic-alpha", metavar="A")
    synthetic_beta: float = setting(
        1.0, "synthetic-fedprox: how much the clients' inputs differ, B_k ~ N(0, B)",
        option="--synthetic-beta", metavar="B")


@dataclass(frozen=True)
class TrainConfig:
    """The local optimiser every client runs (training/optim.py: torch's functional kernels)."""

    model: str = setting("auto", "Model architecture (auto: the dataset's default)",
                         option="--model")
    epochs: int = setting(5, "Local epochs per round", ge=1, option="--epochs")
    batch_size: int = setting(8, "Local minibatch size", ge=1, option="--batch-size")
    lr: float = setting(0.15, "Local learning rate", gt=0, option="--lr")
    momentum: float = setting(0.0, "Local SGD momentum", ge=0, lt=1, option="--momentum")
    weight_decay: float = setting(4e-4, "Local weight decay", ge=0, option="--weight-decay")
    threads: int = setting(1, "Torch threads per client process", ge=1, option="--threads")
    batch_clients: int = setting(
        0, "Train up to N clients of a round together as one batch (torch.func; algorithms whose "
        "Spec says batched: FedAvg, FedProx, the FedOpt family, FedAsync, FedBuff), N at most "
        "a block and within a memory budget; each client's update equals its plain training to "
        "float32 rounding (docs/usage.md); 0: one client at a time", ge=0,
        option="--batch-clients", metavar="N")
    augment: str = setting("auto", "Train-time augmentation (auto: the dataset's default, none "
                           "for digits)", choices=AUGMENTS, option="--augment")
    optimizer: str = setting(
        "sgd", "The clients' local optimizer; adam and adamw want a much smaller --lr, e.g. 0.001",
        choices=OPTIMIZERS, option="--optimizer")
    nesterov: bool = setting(False, "Nesterov momentum (sgd with --momentum > 0)",
                             option="--nesterov/--no-nesterov")
    beta1: float = setting(0.9, "Adam's and AdamW's moment decays", ge=0, lt=1,
                           option="--betas", metavar="B1,B2", shown="0.9,0.999")
    beta2: float = setting(0.999, "Adam's and AdamW's moment decays", ge=0, lt=1,
                           option="--betas", metavar="B1,B2", shown="0.9,0.999")
    eps: float = setting(1e-8, "Adam's and AdamW's epsilon", gt=0, option="--optimizer-eps")


@dataclass(frozen=True)
class AlgoConfig:
    """Which algorithm, how many clients per round, and its own parameters."""

    name: str = setting("fedavg", "Algorithm (README: the table; docs/algorithms.md: the rules)",
                        option="--algo")
    fraction: float = setting(1.0, "Fraction of clients per round", gt=0, le=1,
                              option="--fraction")
    eval: str = setting("auto", "global: the server model on the test set; clients: each "
                        "client's own model on its own split", choices=EVAL_MODES,
                        option="--eval", dest="eval_mode")
    params: dict[str, Any] = field(default_factory=dict)  # typed by the algorithm's declarations


@dataclass(frozen=True)
class NetConfig:
    """Where the server listens, how long it waits, and how messages travel."""

    host: str = setting("127.0.0.1", "The address the server listens on (fednet server: --bind)")
    port: int = setting(0, "The server's port (0: any free one)", ge=0, le=65535)
    round_timeout: float = setting(300.0, "Seconds a round may take", gt=0,
                                   option="--round-timeout")
    register_timeout: float = setting(60.0, "Seconds to wait for clients", gt=0,
                                      option="--register-timeout")
    secure: str = setting(
        "", "Key folder from `fednet keys init`: CURVE encryption and client authentication on "
        "every server and peer link", option="--secure", path=True, shown="off")
    ack_timeout: float = setting(30.0, "Seconds a hand-off waits for HANDOFF_ACK before a retry",
                                 gt=0, option="--ack-timeout", metavar="S")
    ack_retries: int = setting(2, "Attempts per peer before it counts as dead", ge=1,
                               option="--ack-retries", metavar="N")
    dead_peer: str = setting("skip", "A dead peer in a ring: skip it and go on, or return the "
                             "model to the server", choices=("skip", "server"),
                             option="--dead-peer")
    checkpoint_every: int = setting(0, "Write RUN/checkpoint every N rounds (atomically) for "
                                    "--resume", ge=0, option="--checkpoint-every", note="0: off")
    max_inflight: int = setting(
        0, "At most N tasks out at once; the next is sent when a result returns. Bounds the "
        "server's memory when results arrive faster than it aggregates them (simulated times are "
        "unchanged; with --real-time it delays sleeping clients)", ge=0, option="--max-inflight",
        note="0: all at once")
    max_failed_rounds: int = setting(
        3, "Rounds in a row without a usable result before the run stops as failed (exit code 4)",
        ge=0, option="--max-failed-rounds", note="0: never stop")
    clients_per_process: int = setting(
        0, "Logical clients in each client process: one fork, one interpreter and one CUDA "
        "context serve them all, their tasks one at a time. auto: one process per client up to 8 "
        "per core (and half the available memory at 32 MiB plus 3 model copies each); beyond 8 per "
        "core, at most 8 processes per core sharing the clients evenly (20 clients on 2 cores: 10 "
        "processes of 2); beyond the memory limit alone, the "
        "fewest clients per process within it; with --gpus, also each device's memory (512 MiB "
        "CUDA context + 256 MiB workspace per process, 4 model copies and the data per client, "
        "within 90%; a device listed twice is two slots sharing it); never more clients in a "
        "process than its open-files limit allows (8 files each); --real-time keeps one per "
        "client; with --batch-clients (an algorithm that batches), one process per core but the "
        "server's, the clients shared evenly (each trains the tasks it holds as blocks). A "
        "number wins", ge=0, option="--clients-per-process", shown="auto",
        note="0 in a TOML file: auto")
    compress: str = setting(
        "none", f"How the clients' results travel: {_COMPRESS}. The update against the received "
        "model is encoded; the server decodes it", option="--compress", metavar="SPEC")
    compress_down: str = setting(
        "none", "How the server's tasks travel: none, fp16, int8 or qsgd[:S], the values "
        "themselves (a client holds no reference to take a difference against); every client "
        "trains from what it received", option="--compress-down", metavar="SPEC")
    compress_handoff: str = setting(
        "none", "How the models handed from client to client travel (FedSeq's rings): as "
        "--compress-down", option="--compress-handoff", metavar="SPEC")
    secagg: str = setting(
        "off", "Secure aggregation of the clients' updates: full (SecAgg, every client shares "
        "with every other) or plus (SecAgg+, a random graph of O(log n) neighbours); the server "
        "learns only their weighted sum", choices=("off", "full", "plus"), option="--secagg")
    secagg_neighbours: int = setting(
        0, "SecAgg+'s neighbours per client (even)", ge=0, option="--secagg-neighbours",
        note="0: the fewest (at least 2 * ceil(1.5 * log2 n)) that survive --secagg-dropout "
        "but for a 2^-20 chance a round")
    secagg_dropout: float = setting(
        0.1, "The dropout rate SecAgg+'s default neighbours are chosen for: clients that "
        "drop out independently at this rate leave every secret enough shares", ge=0, lt=1,
        option="--secagg-dropout")
    secagg_threshold: float = setting(
        0.5, "Secure aggregation's share threshold: a secret shared among k neighbours needs "
        "floor(fraction * k) + 1 shares, and floor(fraction * cohort) + 1 clients must survive "
        "each stage", gt=0, lt=1, option="--secagg-threshold")
    secagg_clip: float = setting(
        8.0, "Secure aggregation clips each update value to [-c, c] before it is quantized",
        gt=0, option="--secagg-clip")
    secagg_bits: int = setting(
        16, "Secure aggregation's quantization bits per update value", ge=1, le=24,
        option="--secagg-bits")
    secagg_drop: str = setting(
        "", "Simulated dropouts: each client of a round's cohort drops out of secure aggregation "
        "at STAGE (keys, shares, input or unmask) with probability RATE, drawn from the run's "
        "seed; several as keys:0.05,input:0.1", option="--secagg-drop", metavar="STAGE:RATE",
        shown="none")
    secagg_field: int = setting(
        0, "Secure aggregation's modulus bits (the masks' group): 32 or 64", choices=(),
        option="--secagg-field", note="0: the smallest that holds the cohort's sum")

    def codecs(self) -> Codecs:
        """--compress, --compress-down and --compress-handoff parsed (once per run's values)."""
        from fednet.compress import codecs
        return codecs(self.compress, self.compress_down, self.compress_handoff, self.secagg)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; sent to every client in WELCOME."""

    clients: int = setting(10, "Number of clients", ge=1, option="--clients",
                           shown="100 (local: 10)")
    rounds: int = setting(25, "Communication rounds", ge=1, option="--rounds")
    seed: int = setting(0, "Seed of every random draw", ge=0, option="--seed")
    gpus: tuple[int, ...] = setting(
        (), "Comma-separated CUDA devices, e.g. 0,1; client i uses gpus[i % n]. Without it "
        "everything runs on the CPU", ge=0, option="--gpus", metavar="LIST", shown="CPU")
    out: str = setting("", "Results folder", option="--out", path=True,
                       shown="runs/<timestamp>-<algo>/")
    plugins: tuple[str, ...] = setting(
        (), "Import this module (a dotted name or a .py file) first: it registers algorithms, "
        "models or datasets (repeatable; recorded in config.toml). Installed plugins (entry "
        "points) load by themselves; see `fednet plugins`", option="--plugin", metavar="MODULE")
    tuned: tuple[str, ...] = setting(
        (), "The key=value settings the algorithm's tuned defaults chose (recorded by the run)")
    track: tuple[str, ...] = setting(
        (), "Also log the run to TensorBoard or MLflow (repeatable): tensorboard[:DIR] (event "
        "files; default OUT/tensorboard) or mlflow[:URI] (default MLFLOW_TRACKING_URI, else "
        "MLflow's own; experiment MLFLOW_EXPERIMENT_NAME, else fednet). Needs pip install "
        "'fednet[tensorboard]' or 'fednet[mlflow]'", option="--track", metavar="TOOL[:WHERE]")
    population_file: bool = setting(
        False, "Also write OUT/population.npz: every client's size, label counts, latency profile "
        "and tasks, as columns (clients.jsonl holds only the clients that took part)",
        option="--population-file/--no-population-file")
    target: str = setting(
        "", "Report the cost of reaching this accuracy in summary.json's to_target (rounds, "
        "client-epochs, samples, simulated and wall-clock seconds, bytes each way, setup "
        "included): ACC in (0, 1], or Fx:RUN, F times the best accuracy of the finished run "
        "in folder RUN", option="--target", metavar="ACC|Fx:RUN", shown="none")
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    defense: DefenseConfig = field(default_factory=DefenseConfig)
    net: NetConfig = field(default_factory=NetConfig)
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    dp: DPConfig = field(default_factory=DPConfig)
    liveness: Liveness = field(default_factory=Liveness)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (msgpack- and TOML-friendly; tuples as lists)."""
        return _lists(asdict(self))

    def replace(self, **overrides: Any) -> RunConfig:
        """A copy with dotted-key overrides, e.g. replace(**{"train.lr": 0.1})."""
        return from_dict(merge(self.to_dict(), overrides))


def _lists(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _lists(v) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else v
            for k, v in d.items()}


_SECTIONS: dict[str, Any] = {f.name: f.default_factory for f in fields(RunConfig)
                             if is_dataclass(f.default_factory)}  # data, train, ..., dp, liveness
# free-form tables: the algorithm, the attack and the defense type them (algorithms/params.py,
# algorithms/robust_spec.py)
TABLES = _TABLES = ("algo.params", "attack.params", "defense.params")


def _infos(cls: type, prefix: str) -> list[Info]:
    hints = typing.get_type_hints(cls)
    out: list[Info] = []
    for f in fields(cls):
        key = prefix + f.name
        if f.name in _SECTIONS and cls is RunConfig:
            out += _infos(_SECTIONS[f.name], key + ".")
        elif key not in _TABLES:
            out.append(info_of(f, hints[f.name], key))
    return out


@functools.cache
def declarations() -> tuple[Info, ...]:
    """Every run setting's declaration, with its dotted key, in declaration order."""
    return tuple(_infos(RunConfig, ""))


def declaration(key: str) -> Info:
    """The declaration of one run setting by its dotted key ("train.lr")."""
    return next(i for i in declarations() if i.key == key)


def _build(cls: type, d: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ConfigError(f"unknown key '{where}{unknown[0]}' in the configuration; known keys: "
                          f"{', '.join(sorted(names))}")
    infos = {i.key: i for i in declarations()}
    kw: dict[str, Any] = {}
    for name, v in d.items():
        key = where + name
        if cls is RunConfig and name in _SECTIONS:
            if not isinstance(v, dict):
                raise ConfigError(f"'[{name}]' must be a table in the configuration")
            kw[name] = _build(_SECTIONS[name], v, key + ".")
        elif key in _TABLES:
            if not isinstance(v, dict):
                raise ConfigError(f"'{key}' must be a table (got {v!r})")
            kw[name] = dict(v)
        elif key == "latency.server_bandwidth" and isinstance(v, str):
            kw[name] = v  # a rate with a unit, parsed where it is used (network/step.py)
        else:
            kw[name] = check_type(infos[key], v, where)
    return cls(**kw)


def from_dict(d: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from a nested dict (as written by to_dict or read from TOML); each value
    must have its declared type (a ConfigError names the key)."""
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


def flatten(d: dict[str, Any], tables: tuple[str, ...] = (), empty: bool = False,
            prefix: str = "") -> dict[str, Any]:
    """A nested configuration as dotted keys ({"train": {"lr": 0.1}} -> {"train.lr": 0.1}): the
    dotted keys in `tables` stay whole (e.g. "algo.params"), and an empty table is a key of its
    own when `empty` (else it yields none)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = prefix + k
        if isinstance(v, dict) and key not in tables and (v or not empty):
            out.update(flatten(v, tables, empty, key + "."))
        else:
            out[key] = v
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
