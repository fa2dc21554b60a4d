"""Tests of Factorized-FL's layers and models (docs/algorithms.md §5.1, §5.2, §1.2, §1.3) and of parameter kinds."""
from __future__ import annotations

import copy
import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fednet.models import (
    FactorizedConv2d,
    FactorizedDigitsNet,
    FactorizedLinear,
    FactorizedResNet9,
    build_model,
    l1_penalty,
    load_arrays,
    mark_head,
    matching_layer,
    names_of_kind,
    nnz_mu,
    param_kinds,
    state_arrays,
    state_kinds,
)
from fednet.models.factorized import set_threshold
from fednet.models.param_kinds import tag


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomize(layer: torch.nn.Module, seed: int = 0) -> None:
    """Fill every parameter (mu included) with N(0, 1) values."""
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=_g(seed)))
            seed += 1


def _kind_counts(model: torch.nn.Module, head: bool = True) -> dict[str, int]:
    params = dict(model.named_parameters())
    out: Counter[str] = Counter()
    for name, kind in param_kinds(model, head).items():
        out[kind] += params[name].numel()
    return dict(out)


def test_linear_shapes_and_init_follow_the_code():
    torch.manual_seed(0)
    layer = FactorizedLinear(40, 30, rank=2)
    assert (layer.u.shape, layer.v.shape, layer.mu.shape, layer.bias.shape) == ((40, 2), (2, 30), (40, 30), (30,))
    assert torch.count_nonzero(layer.mu) == 0  # paper: zeros
    assert layer.u.abs().max() <= math.sqrt(6 / 42) and layer.v.abs().max() <= math.sqrt(6 / 32)
    assert 0 < layer.bias.abs().max() <= math.sqrt(6 / 31)
    xav = FactorizedLinear(40, 30, mu_init="xavier")
    assert torch.count_nonzero(xav.mu) == 1_200 and xav.mu.abs().max() <= math.sqrt(6 / 70)
    bare = FactorizedLinear(40, 30, mu=False, bias=False)
    assert bare.mu is None and bare.bias is None and [n for n, _ in bare.named_parameters()] == ["u", "v"]
    with pytest.raises(ValueError, match="mu_init"):
        FactorizedLinear(4, 3, mu_init="ones")


def test_linear_forward_is_x_times_uv_plus_mu_plus_bias():
    layer = FactorizedLinear(5, 4, rank=3)
    _randomize(layer)
    x = torch.randn(6, 5, generator=_g(9))
    w = torch.einsum("ir,ro->io", layer.u, layer.v) + layer.mu
    assert torch.allclose(layer(x), x @ w + layer.bias, atol=1e-5)
    assert torch.allclose(layer.composed_weight(), w, atol=1e-6)


def _explicit_conv_weight(layer: FactorizedConv2d, semantic: bool) -> torch.Tensor:
    """W built index by index from u, v, mu (the reference for both pi modes)."""
    o_n, i_n, f = layer.out_channels, layer.in_channels, layer.kernel_size
    m = (layer.u @ layer.v + layer.mu).detach()
    w = torch.zeros(o_n, i_n, f, f)
    for o in range(o_n):
        for i in range(i_n):
            for a in range(f):
                for b in range(f):
                    if semantic:
                        w[o, i, a, b] = m[a * f + b, o * i_n + i]
                    else:  # raw row-major reshape of the F^2 x (I*O) matrix
                        flat = ((o * i_n + i) * f + a) * f + b
                        w[o, i, a, b] = m[flat // (i_n * o_n), flat % (i_n * o_n)]
    return w


@pytest.mark.parametrize("pi", ["semantic", "raw_reshape"])
def test_conv_forward_equals_an_explicit_weight(pi):
    layer = FactorizedConv2d(2, 3, 3, stride=2, padding=1, rank=2, pi=pi)
    assert (layer.u.shape, layer.v.shape, layer.mu.shape, layer.bias) == ((9, 2), (2, 6), (9, 6), None)
    _randomize(layer, 3)
    w = _explicit_conv_weight(layer, pi == "semantic")
    assert torch.allclose(layer.composed_weight(), w, atol=1e-5)
    x = torch.randn(2, 2, 7, 7, generator=_g(1))
    assert torch.allclose(layer(x), F.conv2d(x, w, stride=2, padding=1), atol=1e-4)
    assert layer(x).shape == (2, 3, 4, 4)


def test_semantic_pi_makes_every_filter_a_scaled_copy_of_u_and_raw_reshape_does_not():
    torch.manual_seed(0)
    sem, raw = FactorizedConv2d(2, 3, 3), FactorizedConv2d(2, 3, 3, pi="raw_reshape")
    raw.load_state_dict(sem.state_dict())
    base = sem.u[:, 0].reshape(3, 3)
    w = sem.composed_weight()
    for o in range(3):
        for i in range(2):
            assert torch.allclose(w[o, i], sem.v[0, o * 2 + i] * base, atol=1e-7)
    w_raw = raw.composed_weight()
    assert not torch.allclose(w_raw, w)
    assert not all(torch.linalg.matrix_rank(torch.stack([w_raw[o, i].flatten(), base.flatten()])) == 1
                   for o in range(3) for i in range(2))
    with pytest.raises(ValueError, match="pi must be one of"):
        FactorizedConv2d(2, 3, 3, pi="transpose")


def test_pruning_applies_only_in_eval_mode_and_nnz_counts_what_survives():
    layer = FactorizedLinear(3, 2, bias=False)
    with torch.no_grad():
        layer.u.zero_()
        layer.mu.copy_(torch.tensor([[1e-4, -4.9e-4, 5e-4], [2.0, -1e-3, 0.0]]).t())
    x = torch.eye(3)
    assert torch.equal(layer.train()(x), layer.mu.detach())
    pruned = torch.tensor([[0.0, 0.0, 5e-4], [2.0, -1e-3, 0.0]]).t()
    assert torch.equal(layer.eval()(x), pruned)
    assert nnz_mu(layer) == 3 and nnz_mu(layer, threshold=1e-2) == 1 and nnz_mu(layer, threshold=0.0) == 6
    set_threshold(layer, 0.0)
    assert torch.equal(layer.eval()(x), layer.mu.detach())
    conv = FactorizedConv2d(1, 1, 1, bias=False)
    with torch.no_grad():
        conv.u.zero_()
        conv.mu.fill_(1e-4)
    img = torch.ones(1, 1, 2, 2)
    assert torch.allclose(conv.train()(img), torch.full_like(img, 1e-4)) and torch.equal(conv.eval()(img), 0 * img)


def test_l1_penalty_carries_a_gradient_to_mu_unless_detached():
    net = FactorizedDigitsNet(10, mu_init="xavier")
    expected = sum(float(m.mu.detach().abs().sum()) for m in (net.conv1, net.conv2, net.fc1, net.fc2, net.fc3))
    loss = l1_penalty(net)
    assert loss.item() == pytest.approx(expected, rel=1e-5) and loss.requires_grad
    loss.backward()
    assert torch.equal(net.fc1.mu.grad, torch.sign(net.fc1.mu.detach()))
    assert net.fc1.u.grad is None
    detached = l1_penalty(net, detach=True)
    assert not detached.requires_grad and detached.item() == pytest.approx(expected, rel=1e-5)
    assert l1_penalty(FactorizedLinear(3, 2, mu=False)).item() == 0.0


def test_factorized_resnet9_u_plus_v_is_270882_as_in_section_1_2():
    net = build_model("factorized_resnet9", 10, (3, 32, 32), seed=0)
    assert isinstance(net, FactorizedResNet9)
    convs = [m for m in net.modules() if isinstance(m, FactorizedConv2d)]
    assert len(convs) == 8 and all(m.bias is None and m.pi == "semantic" for m in convs)
    assert sum(m.u.numel() for m in convs) == 88 and sum(m.v.numel() for m in convs) == 270_528
    assert (net.head.u.numel(), net.head.v.numel(), net.head.mu.numel()) == (256, 10, 2_560)
    assert _kind_counts(net, head=False) == {"u": 344, "v": 270_538, "mu": 2_568_384, "norm": 2_944, "dense": 10}
    assert _kind_counts(net) == {"u": 88, "v": 270_528, "mu": 2_565_824, "norm": 2_944, "head": 2_836}
    assert 88 + 270_528 + 256 + 10 == 270_882
    assert matching_layer(net) == "encoder.6.0.v" and dict(net.named_parameters())["encoder.6.0.v"].numel() == 65_536
    with torch.no_grad():
        assert net.eval()(torch.randn(2, 3, 32, 32, generator=_g())).shape == (2, 10)


def test_factorized_digits_counts_kinds_and_matching_layer():
    registered = build_model("factorized_digits", 10, (1, 8, 8), seed=0)
    assert isinstance(registered, FactorizedDigitsNet)  # registered with BN: it learns with SGD
    assert _kind_counts(registered, head=False)["norm"] == 96
    net = FactorizedDigitsNet(10, bn=False)
    assert _kind_counts(net, head=False) == {"u": 242, "v": 634, "mu": 15_312, "dense": 154}
    assert _kind_counts(net) == {"u": 210, "v": 624, "mu": 14_992, "dense": 144, "head": 372}
    kinds = param_kinds(net)
    assert kinds["conv1.u"] == "u" and kinds["conv1.bias"] == "dense" and kinds["fc2.mu"] == "mu"
    assert {kinds[f"fc3.{p}"] for p in ("u", "v", "mu", "bias")} == {"head"}
    assert param_kinds(net, head=False)["fc3.u"] == "u"
    assert matching_layer(net) == "fc2.v" and net.fc2.v.numel() == 32
    assert matching_layer(FactorizedDigitsNet(10, matching="conv2")) == "conv2.v" and net.conv2.v.numel() == 512
    bn = FactorizedDigitsNet(10, bn=True)
    assert _kind_counts(bn, head=False) == {"u": 242, "v": 634, "mu": 15_312, "norm": 96, "dense": 106}
    assert net(torch.zeros(3, 1, 8, 8)).shape == (3, 10) and bn(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert names_of_kind(net, "u") == ["conv1.u", "conv2.u", "fc1.u", "fc2.u"]
    assert names_of_kind(bn, "buffer") == [f"bn{i}.{b}" for i in (1, 2)
                                           for b in ("running_mean", "running_var", "num_batches_tracked")]


def test_kinds_survive_deepcopy_and_cover_the_state_dict():
    net = FactorizedDigitsNet(10, bn=True)
    clone = copy.deepcopy(net)
    assert param_kinds(clone) == param_kinds(net) and net.fc1.u._fednet_kind == "u"
    kinds = state_kinds(net)
    assert list(kinds) == list(net.state_dict())
    assert kinds["bn1.weight"] == "norm" and kinds["bn1.running_var"] == "buffer"
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2), mark_head(torch.nn.Linear(2, 1)))
    assert param_kinds(plain) == {"0.weight": "dense", "0.bias": "dense", "1.weight": "norm", "1.bias": "norm",
                                  "2.weight": "head", "2.bias": "head"}
    with pytest.raises(ValueError, match="unknown parameter kind"):
        tag(plain[0], "weight", "weights")
    with pytest.raises(ValueError, match="unknown parameter kinds"):
        names_of_kind(plain, "bias")


@pytest.mark.parametrize("name,shape", [("factorized_digits", (1, 8, 8)), ("factorized_resnet9", (3, 32, 32))])
def test_state_arrays_round_trip_and_seeded_builds(name, shape):
    src, same, dst = (build_model(name, 10, shape, seed=s) for s in (1, 1, 2))
    s_src, s_same, s_dst = state_arrays(src), state_arrays(same), state_arrays(dst)
    assert all(np.array_equal(a, s_same[k]) for k, a in s_src.items())
    assert not np.array_equal(s_dst[matching_layer(dst)], s_same[matching_layer(same)])
    with torch.no_grad():
        for p in src.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=_g()))  # mu non-zero too
    arrays = state_arrays(src)
    frozen = {k: np.frombuffer(v.tobytes(), dtype=v.dtype).reshape(v.shape) for k, v in arrays.items()}
    load_arrays(dst, frozen)
    x = torch.randn(2, *shape, generator=_g(4))
    src.eval(), dst.eval()
    with torch.no_grad():
        assert torch.equal(src(x), dst(x))
    assert param_kinds(dst) == param_kinds(src)


def test_training_step_reaches_every_factor():
    net = FactorizedResNet9(10, rank=2)
    x, y = torch.randn(2, 3, 32, 32, generator=_g()), torch.tensor([0, 1])
    loss = F.cross_entropy(net(x), y) + 5e-4 * l1_penalty(net)
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())
    assert net.encoder[0][0].u.shape == (9, 2)
