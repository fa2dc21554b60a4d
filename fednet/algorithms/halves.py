"""An algorithm's two halves, loaded and built from its Spec's "module:Class" references
(registry.py holds the Specs): the client half's class, every half imported once (the zygote,
before it forks), and the configured server and client halves with differential privacy (the
server's: a piece it holds, private.Privacy; the client's: dp_client's wrapper;
algorithms/__init__.build and build_client add secure aggregation's wrappers)."""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from fednet.algorithms.registry import get, with_plugins

if TYPE_CHECKING:
    from fednet.algorithms.contract import ClientUpdate, Strategy
    from fednet.config import RunConfig


@functools.cache
def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def client_class(name: str) -> type[ClientUpdate]:
    """The client half's class (its State and keeps_model), without building it."""
    return _load(get(name).client)


def preload() -> None:
    """Import every registered algorithm's two halves (the zygote does, before it forks)."""
    for spec in with_plugins().values():
        _load(spec.server), _load(spec.client)


def build_bare(cfg: RunConfig) -> Strategy:
    """The configured algorithm's own server half, holding differential privacy's piece
    (algorithms/private.Privacy, built from the run's DPSpec); algorithms.build wraps it for
    --secagg."""
    spec = get(cfg.algo.name)
    server: Strategy = _load(spec.server)(cfg, spec.parse(dict(cfg.algo.params)))
    if cfg.dp.mode != "none" or cfg.dp.sgd_noise > 0:  # (by name, as the halves: no cycle)
        server.add_piece(_load("fednet.algorithms.private:Privacy").of(cfg))
    return server


def build_client_bare(cfg: RunConfig) -> ClientUpdate:
    """The configured algorithm's own client half (what every client process builds, and no
    more; with --dp local: algorithms/dp_client.py); algorithms.build_client wraps it for
    --secagg."""
    spec = get(cfg.algo.name)
    client = _load(spec.client)(cfg, spec.parse(dict(cfg.algo.params)))
    if cfg.dp.mode == "local":
        return _load("fednet.algorithms.dp_client:LocalDPClient")(client)  # (by its members)
    return client
