"""Network architectures (docs/algorithms.md §1) and the name -> model factory behind --model."""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from fednet import plugins
from fednet.data.datasets import DEFAULT_MODELS
from fednet.errors import ConfigError
from fednet.models.convfc import ConvFC
from fednet.models.factorized import FactorizedDigitsNet, FactorizedResNet9
from fednet.models.fedpara import PFedParaDigitsNet
from fednet.models.natural_nets import BagOfWords, CharLSTM, FemnistCNN, LogisticRegression
from fednet.models.resnet import ResNet9, resnet18
from fednet.rng import int_seed

MODELS = ("digits_cnn", "fedseq_cnn", "resnet9", "resnet18")
"""Names accepted by build_model (and --model), besides "auto"."""
NATURAL_MODELS = ("mclr", "femnist_cnn", "char_lstm", "sent140_bow")
"""The models of the naturally federated datasets (natural_nets.py)."""

AUTO_MODELS = {"digits": "digits_cnn", "cifar10": "fedseq_cnn", "cifar100": "fedseq_cnn", "svhn": "fedseq_cnn",
               "synthetic-cifar10": "fedseq_cnn", "synthetic-cifar100": "fedseq_cnn",
               "synthetic-fedprox": "mclr", "femnist": "femnist_cnn", "shakespeare": "char_lstm",
               "sent140": "sent140_bow"}
"""The model "auto" picks for each dataset."""

AUTO_BY_SIZE: dict[tuple[int, ...], str] = {(8, 8): "digits_cnn", (32, 32): "fedseq_cnn"}
"""The model "auto" picks from the input's H x W when the dataset is not given."""


class DigitsNet(ConvFC):
    """docs/algorithms.md §1.3: two 3x3 conv blocks (16, 32 channels) and a 3-layer classifier; 15,466 params."""

    def __init__(self, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 8, 8)) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * (h // 4) * (w // 4), 64)
        self.fc2 = nn.Linear(64, 32)
        self.fc3 = nn.Linear(32, num_classes)


class FedSeqCNN(ConvFC):
    """1.1 (FedSeq's "LeNet"): 5x5 conv 64, 5x5 conv 64, fc 384, 192, N_C; 797,962 params for 10 classes."""

    def __init__(self, num_classes: int = 10, input_shape: tuple[int, ...] = (3, 32, 32)) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 64, kernel_size=5)
        self.conv2 = nn.Conv2d(64, 64, kernel_size=5)
        self.pool = nn.MaxPool2d(2)
        fh, fw = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        if fh < 1 or fw < 1:
            raise ConfigError(f"--model fedseq_cnn needs inputs of at least 16x16 (got {h}x{w}); use digits_cnn")
        self.fc1 = nn.Linear(64 * fh * fw, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)


_BUILDERS: dict[str, Callable[[int, tuple[int, ...]], nn.Module]] = {
    "digits_cnn": lambda k, shape: DigitsNet(k, shape),
    "fedseq_cnn": lambda k, shape: FedSeqCNN(k, shape),
    "resnet9": lambda k, shape: ResNet9(k, shape),
    "resnet18": lambda k, shape: resnet18(k, shape),
    # BN on: with mu = 0 at init (the paper) the rank-1 digits net does not learn without it
    "factorized_digits": lambda k, shape: FactorizedDigitsNet(k, bn=True, input_shape=shape),
    # the official code's init of every dense mu (Xavier-uniform; the paper: zeros): fc1 and fc2
    # are full rank from the start (docs/algorithms.md §5.8, §7.17)
    "factorized_digits_xavier": lambda k, shape: FactorizedDigitsNet(k, bn=True, input_shape=shape,
                                                                    mu_init="xavier"),
    "factorized_resnet9": lambda k, shape: FactorizedResNet9(k, shape),
    "pfedpara_digits": lambda k, shape: PFedParaDigitsNet(k, input_shape=shape),
    "mclr": lambda k, shape: LogisticRegression(k, shape),
    "femnist_cnn": lambda k, shape: FemnistCNN(k, shape),
    "char_lstm": lambda k, shape: CharLSTM(k, shape),
    "sent140_bow": lambda k, shape: BagOfWords(k, shape),
}


PLUGIN_MODELS: list[str] = []
"""Models that plugins registered (register_model; fednet/plugins/__init__.py), in order."""


def register_model(name: str, builder: Callable[[int, tuple[int, ...]], nn.Module], *,
                   auto_for: tuple[str, ...] = ()) -> None:
    """Make `--model NAME` build builder(num_classes, input_shape) (a plugin's model; build it
    with torch's global RNG: fednet seeds it per run). auto_for: datasets whose --model auto is
    this model."""
    if name == "auto" or (name in _BUILDERS and name not in PLUGIN_MODELS):
        raise ValueError(f"model {name!r} is registered twice")
    _BUILDERS[name] = builder
    if name not in PLUGIN_MODELS:
        PLUGIN_MODELS.append(name)
    for d in auto_for or getattr(builder, "auto_for", ()):
        AUTO_MODELS[d] = name
    plugins.provide("model", name)


def model_names() -> tuple[str, ...]:
    """Every name --model accepts besides auto (built-in, then plugins)."""
    return MODELS + NATURAL_MODELS + tuple(PLUGIN_MODELS)


def resolve_model(name: str, dataset: str | None = None, input_shape: tuple[int, ...] | None = None) -> str:
    """The concrete model name for name ("auto" looks at the dataset, else at the input shape)."""
    if name == "auto":
        if dataset in AUTO_MODELS:
            return AUTO_MODELS[dataset]
        if dataset in DEFAULT_MODELS:  # a plugin dataset's own default
            return DEFAULT_MODELS[dataset]
        if dataset is None and input_shape is not None and tuple(input_shape)[1:] in AUTO_BY_SIZE:
            return AUTO_BY_SIZE[tuple(input_shape)[1:]]
        raise ConfigError(
            f"--model auto has no default for dataset {dataset!r}; pass --model with one of: "
            f"{', '.join(model_names())}"
        )
    if name not in _BUILDERS:
        raise ConfigError(f"--model {name!r} is not known; choose auto or one of: "
                          f"{', '.join(model_names())}")
    return name


def build_model(
    name: str,
    num_classes: int,
    input_shape: tuple[int, ...],
    *,
    dataset: str | None = None,
    seed: int | None = None,
) -> nn.Module:
    """A freshly initialized model; with seed, the init comes from rng stream "model/init" (global RNG untouched)."""
    resolved = resolve_model(name, dataset, input_shape)
    builder = _BUILDERS[resolved]
    if seed is None:
        return builder(int(num_classes), tuple(input_shape))
    template = _TEMPLATES.get((resolved, int(num_classes), tuple(input_shape), int(seed)))
    if template is not None:  # the same weights, copied (a fraction of the cost of an init)
        return copy.deepcopy(template)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int_seed(seed, "model/init"))
        return builder(int(num_classes), tuple(input_shape))


_TEMPLATES: dict[tuple[str, int, tuple[int, ...], int], nn.Module] = {}


def keep_template(name: str, num_classes: int, input_shape: tuple[int, ...], *,
                  dataset: str | None = None, seed: int) -> None:
    """Build the seeded model once and keep it: later build_model calls with the same arguments
    return copies. The zygote keeps the run's model before forking (clients then copy it instead
    of initialising it: ResNet-18 29 ms instead of 95 ms per client), and so does the in-process
    runtime while it builds its executors."""
    key = (resolve_model(name, dataset, input_shape), int(num_classes), tuple(input_shape), int(seed))
    if key not in _TEMPLATES:
        model = build_model(name, num_classes, input_shape, dataset=dataset, seed=seed)
        _TEMPLATES[key] = model


def drop_templates() -> None:
    """Forget the kept models (their memory is freed once no copy refers to it: none does)."""
    _TEMPLATES.clear()


plugins.attach("model", register_model)  # installed model plugins (entry points), loaded lazily
