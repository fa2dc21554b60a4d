"""Federated algorithms: each is a server Strategy plus a client ClientUpdate (contract.py),
declared once in the registry (registry.py; the built-ins in catalog.py). Importing this package
imports no torch; the halves load when a run builds them. Algorithms never import sockets or
the wire format."""
from __future__ import annotations

from fednet.algorithms.registry import (REGISTRY, Spec, available, build, build_client,
                                        client_class, get, model_name, names, personalized,
                                        preload, register)

__all__ = ["REGISTRY", "Spec", "available", "build", "build_client", "client_class", "get",
           "model_name", "names", "personalized", "preload", "register"]
