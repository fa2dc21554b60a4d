"""This host's training rate in FLOP/s and its seconds per dispatched tensor operation, for
`fednet calibrate` (a latency trace any run can use).

Three workloads, each timed in this process's CPU seconds (`time.process_time`: on a shared
machine, the time the work took, not the time others' work kept it waiting) after a warm-up, their work counted by the
clock's own counter (training/flops.batch_work):
- the operations: training/local.train's epochs of mclr on digits-shaped data (1x8x8, batch 8),
  whose FLOPs are negligible: its time is the fixed cost of the operations it dispatches (torch's
  dispatcher, autograd, the loop's Python), so s_per_op = (its seconds - its FLOPs / the rate) /
  its operations;
- the convolutions: the same of the digits CNN, whose 4 convolution calls a step cost most of
  its time beyond its operations' (oneDNN's per-call setup and reorders): s_per_conv = (its
  seconds - FLOPs / rate - operations x s_per_op) / its convolutions;
- the FLOPs: training steps (forward and backward) of a fednet model on batches of zeros shaped
  like its data (by default ResNet-18 on CIFAR-shaped 3x32x32 images, batch 32: convolutions and
  matrix products, what the counter counts); the rate is its FLOPs / (its seconds - its
  operations x s_per_op).
The three are solved together (each term is at most a few % of the other workloads' time). The
measurement is noisy (a shared machine, frequency scaling), the file it writes is not: a run that
reads it charges the same seconds every time.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fednet.models import build_model
from fednet.training import flops
from fednet.training.optim import Optimizer, OptimSpec


@dataclass(frozen=True)
class Timed:
    """One workload timed: its steps, one step's counted work and the CPU seconds they took."""

    steps: int
    work: flops.Work
    seconds: float


@dataclass(frozen=True)
class Calibration:
    """What one calibration measured: the FLOP workload (`model`...; its steps and seconds)
    and the operations' and convolutions' workloads (SMALL_WORKLOADS)."""

    model: str
    input_shape: tuple[int, ...]
    batch: int
    threads: int
    steps: int
    flops_per_step: int
    seconds: float
    small: tuple[Timed, ...] = ()  # SMALL_WORKLOADS' (empty: FLOPs alone)
    ops_per_step: int = 0
    convs_per_step: int = 0

    @property
    def flops_per_s(self) -> float:
        """The measured training rate (the FLOP workload's time less its fixed costs)."""
        return self.solve()[0]

    @property
    def s_per_op(self) -> float:
        """The measured seconds of one dispatched operation (0 without SMALL_WORKLOADS)."""
        return self.solve()[1]

    @property
    def s_per_conv(self) -> float:
        """The measured further seconds of one convolution call (0 without SMALL_WORKLOADS)."""
        return self.solve()[2]

    def solve(self) -> tuple[float, float, float]:
        """(FLOP/s, s_per_op, s_per_conv) that account for each workload's seconds: each
        unknown from the workload where it dominates (the FLOP workload, mclr, the digits
        CNN), the others' terms subtracted; a few rounds settle them (each term is a few %
        at most of the other workloads' time)."""
        rate, op, conv = self.steps * self.flops_per_step / self.seconds, 0.0, 0.0
        if len(self.small) != 2:
            return rate, op, conv
        ops_w, conv_w = self.small
        for _ in range(4):
            op = _rest(ops_w, rate, 0.0, conv) / max(ops_w.steps * ops_w.work.ops, 1)
            conv = _rest(conv_w, rate, op, 0.0) / max(conv_w.steps * conv_w.work.convs, 1)
            mine = Timed(self.steps, flops.Work(self.flops_per_step, self.ops_per_step,
                                                self.convs_per_step), self.seconds)
            busy = mine.seconds - _fixed(mine, op, conv)
            rate = self.steps * self.flops_per_step / (busy if busy > 0 else self.seconds)
        return rate, op, conv


def _fixed(t: Timed, op: float, conv: float) -> float:
    """A workload's fixed costs at s_per_op `op` and s_per_conv `conv`."""
    return t.steps * (t.work.ops * op + t.work.convs * conv)


def _rest(t: Timed, rate: float, op: float, conv: float) -> float:
    """A workload's seconds less its FLOPs' at `rate` and the fixed costs given (>= 0)."""
    return max(0.0, t.seconds - t.steps * t.work.flops / rate - _fixed(t, op, conv))


SMALL_WORKLOADS = (("mclr", (1, 8, 8), 8), ("digits_cnn", (1, 8, 8), 8))
"""The fixed costs' workloads, each trained as training/local.train runs it: a model, one
example's shape and a batch. mclr on digits (2,560 FLOPs an example, 16 operations a batch):
its time is its operations' (s_per_op); the digits CNN (79 operations, 4 of them convolutions,
~0.5 MFLOP an example): the rest of its time is its convolutions' (s_per_conv)."""


def measure(model: str = "resnet18", input_shape: tuple[int, ...] = (3, 32, 32), batch: int = 32,
            seconds: float = 5.0, threads: int = 1, classes: int = 10) -> Calibration:
    """Time training steps of `model` until `seconds` have passed (at least 3 steps), then
    SMALL_WORKLOADS for a quarter of that each."""
    if batch < 1 or seconds <= 0 or threads < 1:
        raise ValueError("batch and threads must be >= 1 and seconds > 0")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        net = build_model(model, classes, tuple(input_shape), seed=0)
        net.train()
        x = torch.zeros((batch, *input_shape))
        y = torch.zeros(batch, dtype=torch.long)
        work = flops.batch_work(net, tuple(x.shape), x.dtype, "train")
        opt = Optimizer([p for p in net.parameters() if p.requires_grad],
                        OptimSpec("sgd", 0.0, 0.0, 0.0, nesterov=False))
        def one() -> int:
            _step(net, opt, x, y)
            return 1

        one()  # warm-up: allocations, kernels chosen
        steps, elapsed = _for_cpu(seconds, 3, one)
        small = tuple(_small(*w, max(seconds / 4, 0.05)) for w in SMALL_WORKLOADS)
    finally:
        torch.set_num_threads(before)
    return Calibration(model, tuple(input_shape), batch, threads, steps, work.flops, elapsed,
                       small, work.ops, work.convs)


def _small(name: str, shape: tuple[int, ...], batch: int, seconds: float) -> Timed:
    """One of SMALL_WORKLOADS trained as training/local.train runs it (epochs of 50 batches of
    random data, lr 0) until `seconds` of CPU time have passed."""
    from fednet.training.local import train

    net = build_model(name, 10, shape, seed=0)
    g = torch.Generator().manual_seed(0)
    n = 50 * batch
    x, y = torch.randn((n, *shape), generator=g), torch.randint(0, 10, (n,), generator=g)

    def epoch() -> int:
        return train(net, x, y, epochs=1, batch_size=batch, lr=0.0,
                     generator=torch.Generator().manual_seed(1)).steps

    epoch()  # warm-up
    steps, elapsed = _for_cpu(seconds, 1, epoch)
    return Timed(steps, flops.batch_work(net, (batch, *shape)), elapsed)


def _for_cpu(seconds: float, least: int, run: Callable[[], int]) -> tuple[int, float]:
    """Call `run` (it returns the steps it took) until `seconds` of this process's CPU time
    have passed and at least `least` steps were taken: (steps, CPU seconds). Nothing else is
    timed (a first count of a batch's work on the meta device was, before)."""
    steps, t0 = 0, time.process_time()
    while steps < least or time.process_time() - t0 < seconds:
        steps += run()
    return steps, time.process_time() - t0


def _step(net: torch.nn.Module, opt: Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step as training/local.train takes it (SGD at lr 0: the model stays)."""
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
