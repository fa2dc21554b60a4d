"""This host's training rate in FLOP/s, for `fednet calibrate` (a latency trace any run can use).

The workload is training steps (forward and backward) of a fednet model on batches of zeros
shaped like its data (by default ResNet-18 on CIFAR-shaped 3x32x32 images, batch 32: convolutions
and matrix products, what training/flops.py counts); its FLOPs are counted by the same counter
(training/flops.batch_flops), its seconds are measured with `time.perf_counter` after one warm-up
step, and the rate is FLOPs / seconds. The measurement is noisy (a shared machine, frequency
scaling), the file it writes is not: a run that reads it charges the same seconds every time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from fednet.models import build_model
from fednet.training import flops
from fednet.training.optim import Optimizer, OptimSpec


@dataclass(frozen=True)
class Calibration:
    """What one calibration measured."""

    model: str
    input_shape: tuple[int, ...]
    batch: int
    threads: int
    steps: int
    flops_per_step: int
    seconds: float

    @property
    def flops_per_s(self) -> float:
        """The measured training rate."""
        return self.steps * self.flops_per_step / self.seconds


def measure(model: str = "resnet18", input_shape: tuple[int, ...] = (3, 32, 32), batch: int = 32,
            seconds: float = 5.0, threads: int = 1, classes: int = 10) -> Calibration:
    """Time training steps of `model` until `seconds` have passed (at least 3 steps)."""
    if batch < 1 or seconds <= 0 or threads < 1:
        raise ValueError("batch and threads must be >= 1 and seconds > 0")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        net = build_model(model, classes, tuple(input_shape), seed=0)
        net.train()
        x = torch.zeros((batch, *input_shape))
        y = torch.zeros(batch, dtype=torch.long)
        per_step = flops.batch_flops(net, tuple(x.shape), x.dtype, "train")
        opt = Optimizer([p for p in net.parameters() if p.requires_grad],
                        OptimSpec("sgd", 0.0, 0.0, 0.0, nesterov=False))
        _step(net, opt, x, y)  # warm-up: allocations, kernels chosen
        steps, t0 = 0, time.perf_counter()
        while steps < 3 or time.perf_counter() - t0 < seconds:
            _step(net, opt, x, y)
            steps += 1
        elapsed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    return Calibration(model, tuple(input_shape), batch, threads, steps, per_step, elapsed)


def _step(net: torch.nn.Module, opt: Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step as training/local.train takes it (SGD at lr 0: the model stays)."""
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
