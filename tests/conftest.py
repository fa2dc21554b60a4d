"""Shared fixtures: small configurations that run in seconds."""
from __future__ import annotations

import pytest
import torch

from fednet.config import RunConfig, from_dict


def small_config(**over) -> RunConfig:
    """A tiny digits FedAvg run (a few clients, one short epoch)."""
    d = {"clients": 3, "rounds": 2, "seed": 7, "latency": {"preset": "lan"},
         "train": {"epochs": 1, "batch_size": 16, "lr": 0.1}}
    for k, v in over.items():
        if isinstance(v, dict):
            d.setdefault(k, {}).update(v)
        else:
            d[k] = v
    return from_dict(d)


def run_for_model(cfg: RunConfig, tmp_path, name: str):
    """Run cfg in-process into tmp_path/name; (summary, final model arrays: harness.final_model)."""
    from fednet.core.inproc import run_local
    from tests.harness import final_model

    s = run_local(cfg.replace(out=str(tmp_path / name)), quiet=True)
    return s, final_model(tmp_path / name)


from tests.harness import same_arrays  # noqa: E402,F401 (tests import it from here too)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests run torch single-threaded, like every client process."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
