"""Tests of fednet.data.augment: batch-wise, seeded train-time augmentation."""
from __future__ import annotations

import pytest
import torch

from fednet.data import NORMALIZATION
from fednet.data.augment import (
    AUGMENTATIONS,
    DEFAULT_AUGMENTATION,
    augmentation,
    color_jitter,
    crop_flip,
    random_grayscale,
    resized_crop_flip,
)
from fednet.errors import ConfigError


def _batch(b: int = 16, c: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, c, 32, 32, generator=torch.Generator().manual_seed(seed))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_names_and_defaults():
    assert AUGMENTATIONS == ("none", "fedseq", "simclr")
    assert DEFAULT_AUGMENTATION == {"digits": "none", "cifar10": "fedseq", "cifar100": "fedseq", "svhn": "fedseq",
                                    "synthetic-cifar10": "fedseq", "synthetic-cifar100": "fedseq"}
    x = _batch()
    assert augmentation("auto", "digits")(x, _gen(0)) is x
    with pytest.raises(ConfigError, match=r"--augment 'mixup'.*none, fedseq, simclr"):
        augmentation("mixup")
    with pytest.raises(ConfigError, match="--augment auto"):
        augmentation("auto", "mnist")


@pytest.mark.parametrize("name", ["fedseq", "simclr"])
def test_augmentations_are_deterministic_in_the_generator_and_keep_shape(name):
    fn = augmentation(name, "cifar10")
    x = _batch()
    a, b, c = fn(x, _gen(1)), fn(x, _gen(1)), fn(x, _gen(2))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a, x) and torch.isfinite(a).all()


def test_crop_flip_is_a_shifted_window_of_the_padded_image_or_its_mirror():
    x = _batch(64)
    out = crop_flip(x, _gen(3), pad=4)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    windows = padded.unfold(2, 32, 1).unfold(3, 32, 1)  # B x C x 9 x 9 x 32 x 32
    flips = 0
    for i in range(64):
        w = windows[i].permute(1, 2, 0, 3, 4).reshape(81, 3, 32, 32)
        plain = (w == out[i]).flatten(1).all(1).any()
        mirrored = (w.flip(3) == out[i]).flatten(1).all(1).any()
        assert plain or mirrored
        flips += int(mirrored and not plain)
    assert 16 < flips < 48  # about half flipped


def test_fedseq_pads_with_raw_black_in_normalized_space():
    mean, std = NORMALIZATION["cifar10"]
    x = torch.full((200, 3, 32, 32), 5.0)
    out = augmentation("fedseq", "cifar10")(x, _gen(0))
    black = torch.tensor([-m / s for m, s in zip(mean, std)])
    border = out[out != 5.0].unique()
    assert torch.allclose(border.sort().values, black.sort().values)
    # 200 samples: some must have been shifted, so some padding is visible
    assert (out != 5.0).any()


def test_resized_crop_of_a_constant_image_is_constant_and_flip_mirrors():
    x = torch.full((8, 3, 32, 32), 0.25)
    assert torch.allclose(resized_crop_flip(x, _gen(0)), x)
    ramp = torch.arange(32.0).view(1, 1, 1, 32).expand(32, 1, 32, 32).contiguous()
    out = resized_crop_flip(ramp, _gen(4), scale=(1.0, 1.0), ratio=(1.0, 1.0))  # full image: only flips remain
    increasing = (out[:, 0, 0, -1] > out[:, 0, 0, 0])
    assert torch.allclose(out[increasing], ramp[increasing], atol=1e-4)
    assert torch.allclose(out[~increasing], ramp[~increasing].flip(3), atol=1e-4)
    assert 0 < int(increasing.sum()) < 32


def test_colour_ops_stay_in_range_and_grayscale_equalizes_channels():
    x = torch.rand(64, 3, 32, 32, generator=_gen(5))
    y = color_jitter(x, _gen(6))
    assert y.min() >= 0 and y.max() <= 1
    changed = (y != x).flatten(1).any(1).float().mean().item()
    assert 0.6 < changed < 0.95  # p = 0.8
    g = random_grayscale(x, _gen(7), p=1.0)
    assert torch.allclose(g[:, 0], g[:, 1]) and torch.allclose(g[:, 1], g[:, 2])
    assert torch.equal(random_grayscale(x, _gen(7), p=0.0), x)


def test_simclr_returns_normalized_images_of_valid_pixels():
    mean, std = NORMALIZATION["svhn"]
    out = augmentation("simclr", "svhn")(_batch(32), _gen(8))
    raw = out * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1)
    assert raw.min() >= -1e-5 and raw.max() <= 1 + 1e-5


def test_single_channel_batches_work():
    x = _batch(4, c=1)
    assert augmentation("fedseq")(x, _gen(0)).shape == x.shape
    assert augmentation("simclr")(x.sigmoid(), _gen(0)).shape == x.shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_generator_drives_a_cuda_batch_identically():
    x = _batch()
    for name in ("fedseq", "simclr"):
        fn = augmentation(name, "cifar10")
        cpu = fn(x, _gen(1))
        gpu = fn(x.cuda(), _gen(1)).cpu()
        assert torch.allclose(cpu, gpu, atol=1e-4)
