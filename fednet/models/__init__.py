"""Model architectures and the torch <-> numpy parameter bridge (no wire or process knowledge)."""
from __future__ import annotations

from fednet.models.nets import AUTO_MODELS, MODELS, DigitsNet, FedSeqCNN, build_model, resolve_model
from fednet.models.params import clone_arrays, load_arrays, num_params, state_arrays
from fednet.models.resnet import ResNet9, resnet18

__all__ = [
    "AUTO_MODELS",
    "MODELS",
    "DigitsNet",
    "FedSeqCNN",
    "ResNet9",
    "build_model",
    "clone_arrays",
    "load_arrays",
    "num_params",
    "resnet18",
    "resolve_model",
    "state_arrays",
]
