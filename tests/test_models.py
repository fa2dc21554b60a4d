"""Tests of fednet.models: the digits CNN, the model factory and the torch <-> numpy parameter bridge."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from fednet.errors import ConfigError
from fednet.models import (
    MODELS,
    DigitsNet,
    build_model,
    clone_arrays,
    load_arrays,
    num_params,
    state_arrays,
)


def _frozen(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Read-only copies built the way the receiver builds them from wire frames."""
    return {k: np.frombuffer(v.tobytes(), dtype=v.dtype).reshape(v.shape) for k, v in arrays.items()}


def test_digits_net_has_15466_params_and_outputs_b_by_10():
    net = DigitsNet(10)
    assert num_params(net) == 15_466
    per_layer = [sum(p.numel() for p in getattr(net, n).parameters()) for n in ("conv1", "conv2", "fc1", "fc2", "fc3")]
    assert per_layer == [160, 4_640, 8_256, 2_080, 330]
    assert net(torch.zeros(7, 1, 8, 8)).shape == (7, 10)
    assert net.features(torch.zeros(2, 1, 8, 8)).shape == (2, 128)


def test_build_model_auto_picks_digits_cnn_and_seeds_the_init():
    assert MODELS == ("digits_cnn", "fedseq_cnn", "resnet9", "resnet18")
    a = build_model("auto", 10, (1, 8, 8), dataset="digits", seed=1)
    b = build_model("digits_cnn", 10, (1, 8, 8), seed=1)
    c = build_model("digits_cnn", 10, (1, 8, 8), seed=2)
    assert isinstance(a, DigitsNet)
    assert all(np.array_equal(x, y) for x, y in zip(state_arrays(a).values(), state_arrays(b).values()))
    assert not np.array_equal(state_arrays(a)["fc3.weight"], state_arrays(c)["fc3.weight"])
    assert isinstance(build_model("auto", 10, (1, 8, 8)), DigitsNet)


def test_build_model_seed_leaves_the_global_torch_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model("digits_cnn", 10, (1, 8, 8), seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_model_is_a_config_error_naming_the_option():
    with pytest.raises(ConfigError, match=r"--model 'resnet50'.*digits_cnn"):
        build_model("resnet50", 10, (1, 8, 8))
    with pytest.raises(ConfigError, match="--model auto"):
        build_model("auto", 10, (3, 32, 32), dataset="mnist")
    with pytest.raises(ConfigError, match="--model auto"):
        build_model("auto", 10, (3, 28, 28))


def test_state_arrays_share_memory_with_the_parameters():
    net = DigitsNet()
    arrays = state_arrays(net)
    assert list(arrays) == list(net.state_dict())
    assert list(arrays) == [f"{m}.{p}" for m in ("conv1", "conv2", "fc1", "fc2", "fc3") for p in ("weight", "bias")]
    for name, t in net.state_dict().items():
        assert np.shares_memory(arrays[name], t.numpy())
    with torch.no_grad():
        net.fc3.bias.fill_(4.5)
    assert np.all(arrays["fc3.bias"] == 4.5)


def test_state_arrays_include_buffers():
    net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    arrays = state_arrays(net)
    assert set(arrays) >= {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert arrays["1.num_batches_tracked"].dtype == np.int64
    assert num_params(net) == 8 + 4


def test_load_arrays_round_trip_from_read_only_arrays_gives_identical_outputs():
    src, dst = build_model("digits_cnn", 10, (1, 8, 8), seed=1), build_model("digits_cnn", 10, (1, 8, 8), seed=2)
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    frozen = _frozen(state_arrays(src))
    assert not any(a.flags.writeable for a in frozen.values())
    before = {k: v.data_ptr() for k, v in dst.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_arrays(dst, frozen)
    assert {k: v.data_ptr() for k, v in dst.state_dict().items()} == before  # written in place
    assert torch.equal(src(x), dst(x))


def test_load_arrays_rejects_wrong_shape_missing_and_unexpected_entries():
    net = DigitsNet()
    good = clone_arrays(state_arrays(net))
    bad = dict(good, **{"fc2.weight": np.zeros((32, 65), np.float32)})
    with pytest.raises(ValueError, match=r"'fc2.weight' has shape \(32, 65\), model expects \(32, 64\)"):
        load_arrays(net, bad)
    with pytest.raises(ValueError, match="missing entry 'fc3.bias'"):
        load_arrays(net, {k: v for k, v in good.items() if k != "fc3.bias"})
    with pytest.raises(ValueError, match="unexpected entry 'extra'"):
        load_arrays(net, dict(good, extra=np.zeros(1, np.float32)))
    load_arrays(net, {"fc3.bias": np.full(10, 2.0, np.float32)}, strict=False)
    assert torch.all(net.fc3.bias == 2.0)
    with pytest.raises(ValueError, match="dtype"):
        load_arrays(net, {"fc3.bias": np.ones(10, np.complex64)}, strict=False)


def test_clone_arrays_is_a_deep_writable_copy():
    net = DigitsNet()
    arrays = state_arrays(net)
    copy = clone_arrays(_frozen(arrays))
    assert list(copy) == list(arrays)
    assert all(v.flags.writeable and not np.shares_memory(v, arrays[k]) for k, v in copy.items())
    copy["fc3.bias"][:] = 7.0
    assert not np.any(arrays["fc3.bias"] == 7.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_state_and_load_arrays_work_for_a_cuda_model():
    net = build_model("digits_cnn", 10, (1, 8, 8), seed=1)
    frozen = _frozen(state_arrays(net))
    gpu = build_model("digits_cnn", 10, (1, 8, 8), seed=2).cuda()
    load_arrays(gpu, frozen)
    assert all(np.array_equal(a, frozen[k]) for k, a in state_arrays(gpu).items())


@pytest.mark.parametrize("name, shape", [("auto", (1, 8, 8)), ("factorized_digits", (1, 8, 8)),
                                         ("pfedpara_digits", (1, 8, 8))])
def test_a_kept_template_gives_independent_copies_with_the_same_weights_and_kinds(name, shape):
    from fednet.models import drop_templates, keep_template, param_kinds
    from fednet.models.arrays import state_arrays

    fresh = build_model(name, 10, shape, dataset="digits", seed=5)
    keep_template(name, 10, shape, dataset="digits", seed=5)
    try:
        a = build_model(name, 10, shape, dataset="digits", seed=5)
        b = build_model(name, 10, shape, dataset="digits", seed=5)
        other = build_model(name, 10, shape, dataset="digits", seed=6)  # not kept: initialised
    finally:
        drop_templates()
    sf, sa = state_arrays(fresh), state_arrays(a)
    assert list(sf) == list(sa) and all(np.array_equal(sf[k], sa[k]) for k in sf)
    assert param_kinds(a) == param_kinds(fresh)
    with torch.no_grad():
        next(a.parameters()).add_(1.0)  # a copy is its own model
    assert not np.array_equal(state_arrays(a)[next(iter(sa))], state_arrays(b)[next(iter(sa))])
    so = state_arrays(other)
    assert any(not np.array_equal(so[k], sf[k]) for k in sf)
