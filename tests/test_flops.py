"""Client compute counted in FLOPs (training/flops.py) and charged on the clock at a profile's
FLOP/s (network/latency.compute_time): the same work gives the same simulated seconds, and
models cost what their FLOPs say."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fednet.core.inproc import run_local
from fednet.models import build_model
from fednet.training import flops
from fednet.training.local import evaluate, train
from tests.conftest import small_config


def _per_example(name: str, shape: tuple[int, int, int], mode: str = "train") -> int:
    return flops.batch_flops(build_model(name, 10, shape, seed=0), (1, *shape), mode=mode)


def test_mclr_is_counted_as_its_matrix_products():
    """Logistic regression on 8x8 digits: 64 x 10 weights; forward 2*64*10 FLOPs an example,
    backward the weights' gradient as much again (the input needs none)."""
    assert _per_example("mclr", (1, 8, 8), "eval") == 2 * 64 * 10
    assert _per_example("mclr", (1, 8, 8)) == 2 * (2 * 64 * 10)


@pytest.mark.parametrize("name,shape", [("mclr", (1, 8, 8)), ("digits_cnn", (1, 8, 8)),
                                        ("resnet18", (3, 32, 32))])
def test_a_batch_costs_its_examples_and_is_counted_once(monkeypatch, name, shape):
    model = build_model(name, 10, shape, seed=0)
    one = flops.batch_flops(model, (1, *shape))
    assert flops.batch_flops(model, (32, *shape)) == 32 * one
    assert 0 < flops.batch_flops(model, (1, *shape), mode="eval") < one
    monkeypatch.setattr(flops, "_run", lambda *a: pytest.fail("counted twice"))
    assert flops.batch_flops(build_model(name, 10, shape, seed=1), (32, *shape)) == 32 * one


def test_models_differ_by_orders_of_magnitude():
    """The three models of issue 52: mclr, the digits CNN and ResNet-18 on CIFAR-shaped data
    cost ~2.6 kFLOP, ~0.54 MFLOP and ~3.3 GFLOP of training an example."""
    m, c = _per_example("mclr", (1, 8, 8)), _per_example("digits_cnn", (1, 8, 8))
    r = _per_example("resnet18", (3, 32, 32))
    assert m == 2560 and 5e5 < c < 6e5 and 3e9 < r < 4e9


def test_the_loops_charge_the_open_meter_only():
    torch.manual_seed(0)
    model = build_model("digits_cnn", 10, (1, 8, 8), seed=0)
    x, y = torch.randn(20, 1, 8, 8), torch.randint(0, 10, (20,))
    train(model, x, y, epochs=1, batch_size=8, lr=0.1, generator=torch.Generator().manual_seed(0))
    with flops.metered() as m:
        train(model, x, y, epochs=2, batch_size=8, lr=0.1,
              generator=torch.Generator().manual_seed(0))
        evaluate(model, x, y, batch_size=16)
    per = flops.batch_flops(model, (1, 1, 8, 8))
    ev = flops.batch_flops(model, (1, 1, 8, 8), mode="eval")
    assert m.flops == 2 * 20 * per + 20 * ev and m.batches == 2 * 3 + 2


def _torch_count(model: nn.Module, shape: tuple[int, ...]) -> int:
    """One training batch of zeros through `model` under torch's own counter, directly."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(shape)).sum().backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("other", [dict(stride=2), dict(padding=2), dict(dilation=2),
                                   dict(padding=1, padding_mode="circular")])
def test_models_of_the_same_shapes_but_other_settings_are_counted_apart(other):
    """A convolution's stride, padding and dilation change its work but no parameter's shape:
    the architecture (the cache's key: counts and meta templates, which training/batched's
    conv_flops reads too) tells them apart, and each count is torch's own counter's."""
    from fednet.training.batched import conv_flops

    def net(**kw: object) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(2, 4, 3, **kw), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                             nn.Linear(16, 3))

    plain, changed = net(), net(**other)
    assert [p.shape for p in plain.parameters()] == [p.shape for p in changed.parameters()]
    shape = (5, 2, 12, 12)
    assert flops.architecture(plain) != flops.architecture(changed)
    got = flops.batch_flops(plain, shape), flops.batch_flops(changed, shape)
    assert got == (_torch_count(plain, shape), _torch_count(changed, shape))
    assert got[0] != got[1]
    convs = conv_flops(plain, shape[1:]), conv_flops(changed, shape[1:])
    assert convs[0] != convs[1] and convs[1] == conv_flops(net(**other), shape[1:])


def test_a_poolings_settings_are_part_of_the_architecture():
    """Poolings hold no parameters: their kernel and stride are read from their settings."""
    a = nn.Sequential(nn.MaxPool2d(2), nn.Flatten())
    b = nn.Sequential(nn.MaxPool2d(2, stride=1), nn.Flatten())
    assert flops.architecture(a) != flops.architecture(b)
    assert flops.architecture(a) == flops.architecture(nn.Sequential(nn.MaxPool2d(2), nn.Flatten()))


def test_a_model_meta_cannot_run_is_counted_on_the_cpu():
    class ReadsAValue(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) if float(x.sum()) >= 0 else self.fc(-x)

    assert flops.batch_flops(ReadsAValue(), (5, 4), mode="eval") == 2 * 5 * 4 * 3


@pytest.mark.parametrize("name,shape,convs", [("mclr", (1, 8, 8), 0), ("digits_cnn", (1, 8, 8), 2),
                                              ("resnet18", (3, 32, 32), 20)])
def test_a_batch_counts_its_dispatched_operations_whatever_its_size(name, shape, convs):
    """The operations a batch dispatches depend on the model and the mode, not on the batch's
    size: training dispatches the forward's, the backward's and one update per trained tensor;
    evaluation the forward's only (no update). Each convolution layer is one call forward and
    one backward (ResNet-18: 20 layers, its downsampling ones included)."""
    model = build_model(name, 10, shape, seed=0)
    train_ops = flops.batch_work(model, (1, *shape)).ops
    assert flops.batch_work(model, (32, *shape)).ops == train_ops
    evaluated = flops.batch_work(model, (32, *shape), mode="eval")
    assert 0 < evaluated.ops < train_ops - len(list(model.parameters()))
    assert flops.batch_work(model, (1, *shape)) == flops.Work(
        flops.batch_flops(model, (1, *shape)), train_ops, 2 * convs)
    assert evaluated.convs == convs


def test_mclr_dispatches_its_forward_backward_and_updates():
    """mclr (flatten, one linear layer), counted on meta: the forward's view, t and addmm; the
    sum standing for the loss; its backward (ones_like, expand, t, mm, t, sum, view, the
    accumulated gradients' detaches); two updates (weight and bias): 16 calls."""
    assert flops.batch_work(build_model("mclr", 10, (1, 8, 8), seed=0), (8, 1, 8, 8)).ops == 16


def test_the_meter_counts_the_operations_of_every_batch():
    """The loop's batches add their operations to the meter's opcount.DISPATCH entry (a short
    last batch counts as many as a full one)."""
    from fednet.opcount import DISPATCH

    model = build_model("mclr", 10, (1, 8, 8), seed=0)
    x, y = torch.zeros((20, 1, 8, 8)), torch.zeros(20, dtype=torch.long)
    with flops.metered() as m:
        train(model, x, y, epochs=1, batch_size=8, lr=0.1, generator=torch.Generator())
    assert m.batches == 3
    assert m.ops[DISPATCH] == 3 * flops.batch_work(model, (8, 1, 8, 8)).ops


def test_dpsgd_counts_its_per_example_gradients():
    """DP-SGD's step (Opacus's per-example gradients, their clipping and sum) counts more than
    plain training's on the same batch, as counted on that path."""
    pytest.importorskip("opacus")
    for name in ("mclr", "digits_cnn"):
        model = build_model(name, 10, (1, 8, 8), seed=0)
        plain = flops.batch_flops(model, (32, 1, 8, 8))
        private = flops.batch_flops(model, (32, 1, 8, 8), mode="dpsgd")
        assert private > plain


def _host(tmp_path, rate: float, s_per_op: float = 0.0, s_per_conv: float = 0.0) -> str:
    f = tmp_path / "host.json"  # compute only: no latency, unlimited links
    f.write_text(json.dumps([{"train_flops_per_s": rate, "rtt_s": 0, "up_bps": 0,
                              "down_bps": 0, "s_per_op": s_per_op, "s_per_conv": s_per_conv}]))
    return str(f)


def test_simulated_seconds_per_example_follow_the_models_flops(tmp_path):
    """One client, one round, one epoch on a 1 GFLOP/s profile with free links: the clock
    charges the examples x the model's training FLOPs an example / 1e9, so mclr and the digits
    CNN differ by their FLOP ratio (with a per-example profile they cost the same)."""
    got = {}
    for name in ("mclr", "digits_cnn"):
        cfg = small_config(clients=1, rounds=1, train={"model": name},
                           latency={"preset": "", "file": _host(tmp_path, 1e9),
                                    "server_profile": "none"},  # (the clients' compute only)
                           out=str(tmp_path / name))
        s = run_local(cfg, quiet=True)
        n = s["compute"]["samples"]
        got[name] = s["sim_time_s"] / n
        assert s["sim_time_s"] == n * _per_example(name, (1, 8, 8)) / 1e9
    ratio = _per_example("digits_cnn", (1, 8, 8)) / _per_example("mclr", (1, 8, 8))
    assert got["digits_cnn"] / got["mclr"] == pytest.approx(ratio, rel=1e-12)
    assert ratio > 200


@pytest.mark.parametrize("name", ["mclr", "digits_cnn"])
def test_each_dispatched_operation_costs_the_profiles_seconds_per_op(tmp_path, name):
    """With s_per_op and s_per_conv, a task costs its FLOPs at the rate plus its batches'
    operations x s_per_op and convolutions x s_per_conv: one client's epoch over its 1,437
    examples in batches of 16 (89 of 16, one of 13: as many operations each)."""
    model = build_model(name, 10, (1, 8, 8), seed=0)
    cfg = small_config(clients=1, rounds=1, train={"model": name},
                       latency={"preset": "", "file": _host(tmp_path, 1e9, 1e-5, 1e-4),
                                "server_profile": "none"}, out=str(tmp_path / "run"))
    s = run_local(cfg, quiet=True)
    n = s["compute"]["samples"]
    assert n == 1437 and cfg.train.batch_size == 16
    work = flops.batch_work(model, (16, 1, 8, 8))
    assert s["sim_time_s"] == pytest.approx(n * _per_example(name, (1, 8, 8)) / 1e9
                                            + 90 * (work.ops * 1e-5 + work.convs * 1e-4),
                                            rel=1e-12)
    assert s["compute"]["client_compute_s"] == pytest.approx(s["sim_time_s"], rel=1e-12)
