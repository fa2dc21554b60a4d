"""Model architectures and the torch <-> numpy parameter bridge (no wire or process knowledge)."""
from __future__ import annotations

from fednet.models.factorized import (
    FactorizedConv2d,
    FactorizedDigitsNet,
    FactorizedLinear,
    FactorizedResNet9,
    l1_penalty,
    matching_layer,
    nnz_mu,
)
from fednet.models.fedpara import FedParaConv2d, FedParaLinear, PFedParaDigitsNet, fedpara_rank
from fednet.models.param_kinds import KINDS, mark_head, names_of_kind, param_kinds, state_kinds
from fednet.models.nets import (AUTO_MODELS, MODELS, DigitsNet, FedSeqCNN, build_model, drop_templates,
                                keep_template, resolve_model)
from fednet.models.arrays import clone_arrays, load_arrays, num_params, state_arrays
from fednet.models.resnet import ResNet9, resnet18

__all__ = [
    "AUTO_MODELS",
    "MODELS",
    "DigitsNet",
    "FactorizedConv2d",
    "FactorizedDigitsNet",
    "FactorizedLinear",
    "FactorizedResNet9",
    "FedParaConv2d",
    "FedParaLinear",
    "FedSeqCNN",
    "KINDS",
    "PFedParaDigitsNet",
    "ResNet9",
    "build_model",
    "drop_templates",
    "keep_template",
    "clone_arrays",
    "fedpara_rank",
    "l1_penalty",
    "load_arrays",
    "mark_head",
    "matching_layer",
    "names_of_kind",
    "nnz_mu",
    "num_params",
    "param_kinds",
    "resnet18",
    "resolve_model",
    "state_arrays",
    "state_kinds",
]
