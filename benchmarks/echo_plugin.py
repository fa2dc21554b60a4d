"""A plugin for bench_transfer_only.py (never imported by fednet itself): `--plugin
benchmarks/echo_plugin.py`.

Two algorithms that move a round's models without training, so that a round's time is its
transfers (and their decoding) alone:

- `echo`: each client returns the model it received, unchanged (no local step); the server drops
  every result's arrays on arrival (no aggregation) and keeps the global model as it was.
- `echo-fedavg`: the same clients, FedAvg's server (each result folded in exactly on arrival).
"""
from __future__ import annotations

from typing import Any

from fednet.algorithms.common import round_metrics, usable
from fednet.algorithms.contract import ClientUpdate, Strategy
from fednet.algorithms.registry import REGISTRY, Spec, register


class EchoClient(ClientUpdate):
    """Returns the received arrays as they are: no model load, no local step."""

    def run(self, ctx: Any, task: Any) -> Any:
        return dict(task.arrays), {"loss": 0.0, "samples": ctx.num_examples, "steps": 0}


class Echo(Strategy):
    """Drops each result's arrays as it arrives; the global model stays as it was."""

    def absorb(self, done: Any) -> None:
        if hasattr(done, "arrays"):
            done.arrays = {}

    def aggregate_round(self, rnd: int, results: Any, failures: Any) -> dict[str, float]:
        ok, dropped = usable(results)
        return round_metrics(ok, failures, dropped)


for _name, _server, _what in (("echo", "Echo", "results dropped on arrival"),
                              ("echo-fedavg", "fednet.algorithms.fedavg:FedAvg",
                               "FedAvg's server")):
    if _name not in REGISTRY:
        register(Spec(_name, f"clients return the received model untrained; {_what}",
                      _server if ":" in _server else f"{__name__}:{_server}",
                      f"{__name__}:EchoClient"))
