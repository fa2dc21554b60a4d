"""Tests of the papers' models: FedSeq's CNN, Factorized-FL's ResNet-9 and a 32x32 ResNet-18 (tiny CPU batches)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fednet.errors import ConfigError
from fednet.models import FedSeqCNN, ResNet9, build_model, load_arrays, num_params, resolve_model, state_arrays
from fednet.models.arrays import clone_arrays


def _x(b: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _float_state_values(net: torch.nn.Module) -> int:
    return sum(t.numel() for t in net.state_dict().values() if t.is_floating_point())


@pytest.mark.parametrize("k,total,fc3", [(10, 797_962, 1_930), (100, 815_332, 19_300)])
def test_fedseq_cnn_matches_the_paper_layer_by_layer(k, total, fc3):
    net = build_model("fedseq_cnn", k, (3, 32, 32), seed=0)
    assert isinstance(net, FedSeqCNN) and num_params(net) == total
    per_layer = [sum(p.numel() for p in getattr(net, n).parameters()) for n in ("conv1", "conv2", "fc1", "fc2", "fc3")]
    assert per_layer == [4_864, 102_464, 614_784, 73_920, fc3]
    classifier_all = sum(getattr(net, n).weight.numel() for n in ("fc1", "fc2", "fc3"))  # psi_clf, biases excluded
    assert classifier_all == 614_400 + 73_728 + 192 * k  # 690,048 for 10 classes
    assert net.features(_x()).shape == (2, 1_600) and net(_x()).shape == (2, k)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())


def test_fedseq_cnn_rejects_tiny_inputs():
    with pytest.raises(ConfigError, match="--model fedseq_cnn needs inputs of at least 16x16"):
        build_model("fedseq_cnn", 10, (1, 8, 8))


def test_resnet9_counts_2571338_trainable_and_2574282_with_bn_running_stats():
    net = build_model("resnet9", 10, (3, 32, 32), seed=0)
    assert isinstance(net, ResNet9)
    assert num_params(net) == 2_571_338
    assert _float_state_values(net) == 2_574_282  # the paper's "2.574M"
    tracked = [k for k in net.state_dict() if k.endswith("num_batches_tracked")]
    assert len(tracked) == 8
    assert sum(p.numel() for p in net.head.parameters()) == 2_570
    assert not any(m.bias is not None for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    assert len(net.encoder) == 9


def test_resnet9_shapes_block_by_block():
    net = build_model("resnet9", 10, (3, 32, 32), seed=0).eval()
    shapes = []
    h = _x()
    with torch.no_grad():
        for block in net.encoder:
            h = block(h)
            shapes.append(tuple(h.shape[1:]))
        assert net(_x()).shape == (2, 10)
    assert shapes == [(64, 32, 32), (128, 16, 16), (128, 16, 16), (256, 16, 16), (256, 8, 8), (256, 8, 8),
                      (256, 6, 6), (256, 1, 1), (256,)]
    conv = net.encoder[1][0]
    assert (conv.kernel_size, conv.stride, conv.padding) == ((5, 5), (2, 2), (2, 2))
    assert net.encoder[6][0].padding == (0, 0)


def test_resnet9_state_round_trip_includes_int64_bn_buffers():
    src = build_model("resnet9", 10, (3, 32, 32), seed=1)
    src.train()
    with torch.no_grad():
        src(_x(4))  # one training-mode pass: running stats and num_batches_tracked change
    arrays = state_arrays(src)
    assert arrays["encoder.0.1.num_batches_tracked"].dtype == np.int64
    assert int(arrays["encoder.0.1.num_batches_tracked"]) == 1
    frozen = {k: np.frombuffer(v.tobytes(), dtype=v.dtype).reshape(v.shape) for k, v in arrays.items()}
    dst = build_model("resnet9", 10, (3, 32, 32), seed=2)
    load_arrays(dst, frozen)
    assert all(np.array_equal(a, frozen[k]) for k, a in state_arrays(dst).items())
    src.eval(), dst.eval()
    with torch.no_grad():
        assert torch.equal(src(_x(3, 5)), dst(_x(3, 5)))
    with pytest.raises(ValueError, match="dtype"):
        load_arrays(dst, dict(clone_arrays(arrays), **{"encoder.0.1.num_batches_tracked": np.array(1.5)}))


def test_resnet18_has_a_32x32_stem_and_11173962_params():
    net = build_model("resnet18", 10, (3, 32, 32), seed=0)
    assert num_params(net) == 11_173_962
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, torch.nn.Identity)
    assert num_params(build_model("resnet18", 100, (3, 32, 32))) == 11_220_132
    with torch.no_grad():
        assert net.eval()(_x(1)).shape == (1, 10)


@pytest.mark.parametrize("name", ["fedseq_cnn", "resnet9"])
def test_seeded_builds_are_identical_and_differ_across_seeds(name):
    a, b, c = (build_model(name, 10, (3, 32, 32), seed=s) for s in (3, 3, 4))
    sa, sb, sc = state_arrays(a), state_arrays(b), state_arrays(c)
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not all(np.array_equal(sa[k], sc[k]) for k in sa)


def test_auto_resolves_by_dataset_or_input_size():
    assert resolve_model("auto", "cifar10") == "fedseq_cnn"
    assert resolve_model("auto", "cifar100") == "fedseq_cnn"
    assert resolve_model("auto", "svhn") == "fedseq_cnn"
    assert resolve_model("auto", None, (3, 32, 32)) == "fedseq_cnn"
    assert resolve_model("auto", None, (1, 8, 8)) == "digits_cnn"
    assert isinstance(build_model("auto", 100, (3, 32, 32)), FedSeqCNN)
    with pytest.raises(ConfigError, match=r"--model 'resnet50'.*resnet9, resnet18"):
        build_model("resnet50", 10, (3, 32, 32))


def test_resnet9_trains_one_step_on_cpu():
    net = build_model("resnet9", 10, (3, 32, 32), seed=0)
    x, y = _x(4), torch.tensor([0, 1, 2, 3])
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())
