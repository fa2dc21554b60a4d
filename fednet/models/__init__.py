"""Model architectures and the torch <-> numpy parameter bridge (no wire or process knowledge)."""
from __future__ import annotations

from fednet.models.nets import AUTO_MODELS, MODELS, DigitsNet, build_model, resolve_model
from fednet.models.params import clone_arrays, load_arrays, num_params, state_arrays

__all__ = [
    "AUTO_MODELS",
    "MODELS",
    "DigitsNet",
    "build_model",
    "clone_arrays",
    "load_arrays",
    "num_params",
    "resolve_model",
    "state_arrays",
]
