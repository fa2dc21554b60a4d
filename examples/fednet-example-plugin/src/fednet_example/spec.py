"""The registry entry of FedNova: its name, its two halves and its typed parameters.

This module is what the `fednet.algorithms` entry point names. It imports no torch: the CLI
reads it to offer `--algo fednova` and `--param gmf=...`; the halves load on first use.
"""
from dataclasses import dataclass

from fednet.api import Spec, param


@dataclass(frozen=True)
class FedNovaParams:
    """FedNova's parameters (Wang et al., NeurIPS 2020)."""

    gmf: float = param(0.0, "global (server) momentum factor", ge=0, lt=1)


FEDNOVA = Spec("fednova", "FedNova: normalized averaging of heterogeneous local updates",
               "fednet_example.fednova:FedNova", "fednet_example.fednova:FedNovaClient",
               FedNovaParams, result_body={"a": "number"})
