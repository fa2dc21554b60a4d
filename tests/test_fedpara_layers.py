"""Tests of the pFedPara layers and digits model (docs/algorithms.md §3.7)."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fednet.models import (
    FedParaConv2d,
    FedParaLinear,
    PFedParaDigitsNet,
    build_model,
    fedpara_rank,
    load_arrays,
    names_of_kind,
    num_params,
    param_kinds,
    state_arrays,
)


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_rank_formula_on_the_digits_layers_and_a_resnet_layer():
    assert [fedpara_rank(16, 1, 3), fedpara_rank(32, 16, 3), fedpara_rank(64, 128), fedpara_rank(32, 64),
            fedpara_rank(10, 32)] == [4, 6, 12, 8, 6]
    assert fedpara_rank(256, 256, 3) == 36  # the gamma term wins (r^2 >= max(O, I) asks only 16)
    assert fedpara_rank(256, 256, 3, gamma=0.01) == 16  # r^2 >= max(O, I) wins
    for o, i, k, gamma in [(256, 256, 3, 0.1), (256, 256, 3, 0.5), (128, 64, 5, 0.5), (512, 256, 1, 0.3)]:
        r = fedpara_rank(o, i, k, gamma)  # the smallest r whose two factor sets reach gamma of the weights
        used = [2 * (q * q * k * k + q * (o + i)) for q in (r - 1, r)]
        assert used[1] >= gamma * o * i * k * k > used[0]


def test_linear_forward_equals_the_hadamard_construction():
    layer = FedParaLinear(7, 5, rank=3)
    assert (layer.x1.shape, layer.y1.shape, layer.x2.shape, layer.y2.shape) == ((5, 3), (7, 3), (5, 3), (7, 3))
    x = torch.randn(4, 7, generator=_g())
    w1 = torch.einsum("or,ir->oi", layer.x1, layer.y1)
    w2 = torch.einsum("or,ir->oi", layer.x2, layer.y2)
    w = w1 * (w2 + 1)
    assert torch.allclose(layer.composed_weight(), w, atol=1e-6)
    assert torch.allclose(layer(x), x @ w.t() + layer.bias, atol=1e-5)
    with torch.no_grad():
        layer.x2.zero_()  # local factor off: W is the global low-rank product alone
    assert torch.allclose(layer.composed_weight(), w1, atol=1e-6)


def test_conv_forward_equals_an_explicit_tucker_construction():
    layer = FedParaConv2d(2, 3, 3, stride=1, padding=1, rank=2)
    assert (layer.t1.shape, layer.x1.shape, layer.y1.shape) == ((2, 2, 3, 3), (2, 3), (2, 2))
    w = torch.zeros(3, 2, 3, 3)
    pq = [(p, q) for p in range(2) for q in range(2)]
    with torch.no_grad():
        for o, i, a, b in np.ndindex(3, 2, 3, 3):
            g = sum(layer.t1[p, q, a, b] * layer.x1[p, o] * layer.y1[q, i] for p, q in pq)
            loc = sum(layer.t2[p, q, a, b] * layer.x2[p, o] * layer.y2[q, i] for p, q in pq)
            w[o, i, a, b] = g * (loc + 1)
    assert torch.allclose(layer.composed_weight(), w, atol=1e-5)
    x = torch.randn(2, 2, 5, 5, generator=_g(1))
    assert torch.allclose(layer(x), F.conv2d(x, w, layer.bias, padding=1), atol=1e-4)


def test_kinds_are_global_local_dense_and_head():
    net = build_model("pfedpara_digits", 10, (1, 8, 8), seed=0)
    assert isinstance(net, PFedParaDigitsNet)
    params = dict(net.named_parameters())
    raw: Counter[str] = Counter()
    for name, kind in param_kinds(net, head=False).items():
        raw[kind] += params[name].numel()
    assert dict(raw) == {"global": 4_148, "local": 4_148, "dense": 154}
    assert num_params(net) == 8_450  # vs DigitsNet's 15,466
    per_layer = [sum(p.numel() for p in getattr(net, n).parameters()) for n in ("conv1", "conv2", "fc1", "fc2", "fc3")]
    assert per_layer == [440, 1_256, 4_672, 1_568, 514]  # DigitsNet: 160, 4,640, 8,256, 2,080, 330
    assert names_of_kind(net, "global") == [f"{layer}.{f}1" for layer in ("conv1", "conv2") for f in "txy"] + [
        f"{layer}.{f}1" for layer in ("fc1", "fc2") for f in "xy"]
    assert names_of_kind(net, "head") == ["fc3.x1", "fc3.y1", "fc3.x2", "fc3.y2", "fc3.bias"]
    assert param_kinds(net)["conv1.t2"] == "local" and param_kinds(net)["fc1.bias"] == "dense"


def test_init_gives_weights_near_the_kaiming_scale():
    torch.manual_seed(0)
    net = PFedParaDigitsNet(10)
    for layer in (net.conv1, net.conv2, net.fc1, net.fc2, net.fc3):
        w = layer.composed_weight().detach()
        ratio = float(w.std()) / math.sqrt(2.0 / w[0].numel())
        assert 0.4 < ratio < 2.0, (layer, ratio)


def test_state_round_trip_and_gradients_reach_every_factor():
    src, dst = PFedParaDigitsNet(10, gamma=0.5), PFedParaDigitsNet(10, gamma=0.5)
    frozen = {k: np.frombuffer(v.tobytes(), dtype=v.dtype).reshape(v.shape) for k, v in state_arrays(src).items()}
    load_arrays(dst, frozen)
    x = torch.randn(3, 1, 8, 8, generator=_g(2))
    assert torch.equal(src(x), dst(x))
    F.cross_entropy(dst(x), torch.tensor([1, 2, 3])).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in dst.parameters())
    with pytest.raises(ValueError, match="shape"):
        load_arrays(PFedParaDigitsNet(10, gamma=0.1), frozen)  # conv2 rank 9 vs 6
