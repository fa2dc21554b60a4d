"""What one client of a run holds on its device: its model's copies and its training data (for
the `--clients-per-process auto` rule with --gpus, platform/packing.py)."""
from __future__ import annotations

from fednet import algorithms
from fednet.config import RunConfig
from fednet.data import load_dataset
from fednet.platform.packing import client_device_bytes


def model_bytes(cfg: RunConfig) -> int:
    """Bytes of the run's model state (parameters and buffers), built on the meta device: no
    memory and no initialisation."""
    import torch

    from fednet.models import build_model
    from fednet.models.arrays import state_nbytes

    d = cfg.data
    ds = load_dataset(d.dataset, d.data_root or None, d.download)
    with torch.device("meta"):
        model = build_model(algorithms.model_name(cfg), ds.num_classes, ds.input_shape,
                            dataset=d.dataset)
    return state_nbytes(model)


def device_bytes_per_client(cfg: RunConfig) -> int:
    """A client's device memory: MODEL_COPIES model states and its mean share of the training
    set (the largest partitions are a few times the mean; the rule's margins cover that)."""
    d = cfg.data
    ds = load_dataset(d.dataset, d.data_root or None, d.download)
    data = (ds.train_x.nbytes + ds.train_y.nbytes) // max(1, cfg.clients)
    return client_device_bytes(model_bytes(cfg), data)


def hands_off(cfg: RunConfig) -> bool:
    """Whether the run's algorithm hands models between clients (each then holds a peer socket
    and its files: platform/packing.py)."""
    return algorithms.get(cfg.algo.name).handoffs
