"""Federated algorithms: each is a server Strategy plus a client ClientUpdate (contract.py),
declared once in the registry (registry.py; the built-ins in catalog.py). Importing this package
imports no torch; the halves load when a run builds them. Algorithms never import sockets or
the wire format."""
from __future__ import annotations

from typing import TYPE_CHECKING

from fednet.algorithms.halves import build_bare, build_client_bare, client_class, preload
from fednet.algorithms.registry import (REGISTRY, Spec, available, get, model_name, names,
                                        personalized, register)
from fednet.errors import ConfigError

if TYPE_CHECKING:
    from fednet.algorithms.contract import ClientUpdate, Strategy
    from fednet.config import RunConfig

__all__ = ["REGISTRY", "Spec", "available", "build", "build_client", "client_class", "get",
           "model_name", "names", "personalized", "preload", "register"]


def build(cfg: RunConfig) -> Strategy:
    """The configured algorithm's server half, inside secure aggregation with --secagg."""
    server = build_bare(cfg)
    if cfg.net.secagg == "off":
        return server
    from fednet.algorithms.secagg import SecAggServer, refusal
    why = refusal(cfg, server, client_class(cfg.algo.name))
    if why:
        raise ConfigError(f"--secagg {cfg.net.secagg}: {why}")
    return SecAggServer(server)


def build_client(cfg: RunConfig) -> ClientUpdate:
    """The configured algorithm's client half (what every client process builds, and no
    more), inside secure aggregation's client stages with --secagg."""
    client = build_client_bare(cfg)
    if cfg.net.secagg == "off":
        return client
    from fednet.algorithms.secagg_client import SecAggClient
    return SecAggClient(client)  # type: ignore[return-value]  # a ClientUpdate by delegation
