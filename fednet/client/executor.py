"""Runs Tasks inside one client: builds the local data and model, stamps simulated time.

No sockets here: the in-process runtime and the ZeroMQ client both call `on_task`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from fednet import algorithms, latency
from fednet.algorithms.base import ClientContext, evaluate_own
from fednet.config import RunConfig
from fednet.data import load_dataset
from fednet.data.client_data import client_data
from fednet.data.augment import augmentation, identity
from fednet.latency import Profile
from fednet.models import build_model
from fednet.protocol import Message
from fednet.wire import failure_message, message_task, result_message

log = logging.getLogger("fednet.client")


def _augment(name: str, dataset: str):
    """The train-time augmentation, or None when it is the identity (no random draws at all)."""
    fn = augmentation(name, dataset)
    return None if fn is identity else fn


@dataclass
class Outcome:
    """A reply message plus the simulated delays it accumulated (for real-time mode)."""

    reply: Message
    sim_delay: float
    real_elapsed: float


class Executor:
    """One client's data, model and algorithm state."""

    def __init__(self, cid: int, cfg: RunConfig, profile: Profile, device: str = "cpu",
                 run_id: str = "", indices: np.ndarray | None = None) -> None:
        self.cid, self.cfg, self.profile, self.run_id = cid, cfg, profile, run_id
        self.device = torch.device(device)
        d = cfg.data
        ds = load_dataset(d.dataset, d.data_root or None, d.download)
        cd = client_data(ds, d, cfg.clients, cfg.seed, cid, indices)
        x = torch.from_numpy(np.ascontiguousarray(cd.x)).to(self.device)
        y = torch.from_numpy(np.ascontiguousarray(cd.y)).to(self.device)
        # the same seeded initial weights as the server's, so personal models need no download
        model = build_model(algorithms.model_name(cfg), ds.num_classes, ds.input_shape,
                            dataset=d.dataset, seed=cfg.seed).to(self.device)
        self.algo = algorithms.build(cfg)
        dev = self.device
        self.ctx = ClientContext(cid, model, x, y, cfg, dev,
                                 test_x=torch.from_numpy(np.ascontiguousarray(cd.test_x)).to(dev),
                                 test_y=torch.from_numpy(np.ascontiguousarray(cd.test_y)).to(dev),
                                 augment=_augment(cfg.train.augment, d.dataset),
                                 pooled=lambda: (torch.from_numpy(ds.train_x).to(dev),
                                                 torch.from_numpy(ds.train_y).to(dev)))

    @property
    def num_examples(self) -> int:
        """Local training examples."""
        return self.ctx.num_examples

    def on_task(self, msg: Message, nbytes: int) -> Outcome:
        """Run a TASK received with `nbytes` on the wire; return RESULT (or FAILURE)."""
        t0 = time.perf_counter()
        recv = msg.sim_time + latency.down_delay(self.profile, nbytes)
        try:
            task = message_task(msg)
            arrays, body = self.algo.client_update(self.ctx, task)
            if task.body.get("evaluate"):  # personalized evaluation: this client's model, its split
                body.update(evaluate_own(self.ctx))
        except Exception as e:  # a failing update is data for the server, not a dead client
            log.exception("client %d: task %d failed", self.cid, msg.task_id)
            reply = failure_message(self.cid, msg.task_id, msg.round, f"{type(e).__name__}: {e}",
                                    recv, self.run_id)
            return Outcome(reply, recv - msg.sim_time, time.perf_counter() - t0)
        samples = int(body.get("samples", self.num_examples))
        send = recv + latency.compute_time(self.profile, samples)
        reply = result_message(self.cid, task, arrays, body, self.num_examples, send, self.run_id)
        return Outcome(reply, send - msg.sim_time, time.perf_counter() - t0)
