"""Batch-wise train-time augmentation on normalized image tensors (torch only, no PIL), seeded by a torch.Generator.

Every function takes a normalized batch x (B x C x H x W float) and a torch.Generator and returns a new
batch; the same generator state gives the same output. Random numbers are drawn on the generator's device
and then moved to x's device, so a CPU generator also drives a CUDA batch.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from fednet.errors import ConfigError

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]

AUGMENTATIONS = ("none", "fedseq", "simclr")
"""Names accepted by augmentation ("auto" picks DEFAULT_AUGMENTATION of the dataset)."""

DEFAULT_AUGMENTATION = {"digits": "none", "cifar10": "fedseq", "cifar100": "fedseq", "svhn": "fedseq",
                        "synthetic-cifar10": "fedseq", "synthetic-cifar100": "fedseq"}
"""What "auto" means per dataset (FedSeq's crop + flip for the 32x32 sets; nothing for 8x8 digits)."""

_LUMA = (0.299, 0.587, 0.114)


def _uniform(n: int, lo: float, hi: float, g: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """n draws from U(lo, hi) made on the generator's device, returned on like's device and dtype."""
    u = torch.rand(n, generator=g, device=g.device)
    return (lo + (hi - lo) * u).to(device=like.device, dtype=like.dtype)


def _coin(n: int, p: float, g: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """n booleans, each True with probability p (on like's device)."""
    return (torch.rand(n, generator=g, device=g.device) < p).to(like.device)


def identity(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """No augmentation: x itself."""
    return x


def crop_flip(x: torch.Tensor, g: torch.Generator, pad: int = 4, fill: torch.Tensor | None = None) -> torch.Tensor:
    """RandomCrop(H, padding=pad) + RandomHorizontalFlip(0.5) per sample; fill (per channel) defaults to 0."""
    b, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    if fill is not None:
        border = torch.ones(1, 1, h, w, dtype=x.dtype, device=x.device)
        border = 1.0 - F.pad(border, (pad, pad, pad, pad))
        padded = padded + border * fill.to(x).view(1, c, 1, 1)
    off = torch.randint(0, 2 * pad + 1, (2, b), generator=g, device=g.device).to(x.device)
    rows = (off[0][:, None] + torch.arange(h, device=x.device))[:, :, None]  # B x H x 1
    cols = (off[1][:, None] + torch.arange(w, device=x.device))[:, None, :]  # B x 1 x W
    out = padded[torch.arange(b, device=x.device)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)
    flip = _coin(b, 0.5, g, x).view(b, 1, 1, 1)
    return torch.where(flip, out.flip(3), out).contiguous()


def resized_crop_flip(
    x: torch.Tensor, g: torch.Generator, scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """RandomResizedCrop(H) + RandomHorizontalFlip, bilinear, one affine grid per sample.

    Simplification: torchvision retries up to 10 draws until the box fits and then falls back to a centre
    crop; here the single drawn box is clipped to the image instead.
    """
    b, _, h, w = x.shape
    area = _uniform(b, *scale, g, x)
    logr = _uniform(b, math.log(ratio[0]), math.log(ratio[1]), g, x)
    r = torch.exp(logr)
    cw = torch.sqrt(area * r).clamp(max=1.0)  # crop width / image width
    ch = torch.sqrt(area / r).clamp(max=1.0)
    cx = (1.0 - cw) * _uniform(b, 0.0, 1.0, g, x)  # left edge, in units of the width
    cy = (1.0 - ch) * _uniform(b, 0.0, 1.0, g, x)
    sign = torch.where(_coin(b, 0.5, g, x), -1.0, 1.0).to(x)
    theta = torch.zeros(b, 2, 3, dtype=x.dtype, device=x.device)
    theta[:, 0, 0] = cw * sign
    theta[:, 0, 2] = 2 * cx + cw - 1
    theta[:, 1, 1] = ch
    theta[:, 1, 2] = 2 * cy + ch - 1
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """Luma (B x 1 x H x W) of RGB images, or the image itself for one channel."""
    if x.shape[1] != 3:
        return x.mean(1, keepdim=True)
    w = torch.tensor(_LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def _hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the chroma of RGB images by shift (fraction of a turn) in YIQ space."""
    yiq = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]],
                       dtype=x.dtype, device=x.device)
    back = torch.linalg.inv(yiq)
    a = 2 * math.pi * shift
    cos, sin = torch.cos(a), torch.sin(a)
    rot = torch.zeros(x.shape[0], 3, 3, dtype=x.dtype, device=x.device)
    rot[:, 0, 0] = 1.0
    rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = cos, -sin, sin, cos
    m = back @ rot @ yiq  # B x 3 x 3
    return torch.einsum("bij,bjhw->bihw", m, x)


def color_jitter(
    x: torch.Tensor, g: torch.Generator, strength: Sequence[float] = (0.4, 0.4, 0.2, 0.1), p: float = 0.8
) -> torch.Tensor:
    """ColorJitter(brightness, contrast, saturation, hue) with probability p on [0, 1] images.

    Simplifications: a fixed order (brightness, contrast, saturation, hue) instead of torchvision's random
    order, and hue as a chroma rotation in YIQ space instead of an HSV hue shift.
    """
    b = x.shape[0]
    bri, con, sat, hue = strength
    on = _coin(b, p, g, x).view(b, 1, 1, 1)
    f_b = _uniform(b, 1 - bri, 1 + bri, g, x).view(b, 1, 1, 1)
    f_c = _uniform(b, 1 - con, 1 + con, g, x).view(b, 1, 1, 1)
    f_s = _uniform(b, 1 - sat, 1 + sat, g, x).view(b, 1, 1, 1)
    f_h = _uniform(b, -hue, hue, g, x)
    y = (x * f_b).clamp(0, 1)
    m = _gray(y).mean(dim=(1, 2, 3), keepdim=True)
    y = ((y - m) * f_c + m).clamp(0, 1)
    if x.shape[1] == 3:
        gray = _gray(y)
        y = ((y - gray) * f_s + gray).clamp(0, 1)
        y = _hue(y, f_h).clamp(0, 1)
    return torch.where(on, y, x)


def random_grayscale(x: torch.Tensor, g: torch.Generator, p: float = 0.2) -> torch.Tensor:
    """RandomGrayscale(p): luma copied to every channel, per sample with probability p."""
    on = _coin(x.shape[0], p, g, x).view(-1, 1, 1, 1)
    return torch.where(on, _gray(x).expand_as(x), x)


def _stats(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std as 1 x C x 1 x 1 tensors like x (one value broadcasts to every channel)."""
    c = x.shape[1]
    m = torch.tensor(list(mean) * (c if len(mean) == 1 else 1), dtype=x.dtype, device=x.device)
    s = torch.tensor(list(std) * (c if len(std) == 1 else 1), dtype=x.dtype, device=x.device)
    return m.view(1, c, 1, 1), s.view(1, c, 1, 1)


def fedseq(x: torch.Tensor, g: torch.Generator, mean: Sequence[float] = (0.0,),
           std: Sequence[float] = (1.0,)) -> torch.Tensor:
    """FedSeq (2.1): RandomCrop(32, padding 4) with black (raw 0) padding + RandomHorizontalFlip."""
    m, s = _stats(x, mean, std)
    return crop_flip(x, g, 4, fill=(-m / s).flatten())


def simclr(x: torch.Tensor, g: torch.Generator, mean: Sequence[float] = (0.0,),
           std: Sequence[float] = (1.0,)) -> torch.Tensor:
    """Factorized-FL (2.4): RandomResizedCrop + flip + ColorJitter(0.4, 0.4, 0.2, 0.1) p 0.8 + RandomGrayscale 0.2.

    The colour operations run on the un-normalized [0, 1] pixels (x * std + mean), then x is re-normalized.
    """
    m, s = _stats(x, mean, std)
    raw = (x * s + m).clamp(0, 1)
    raw = resized_crop_flip(raw, g)
    raw = random_grayscale(color_jitter(raw, g), g)
    return (raw - m) / s


def augmentation(name: str, dataset: str | None = None) -> Augment:
    """The named augmentation ("auto": the dataset's default), using the dataset's normalization if known."""
    if name == "auto":
        from fednet.data.datasets import NATURAL, PLUGIN_DATASETS

        if dataset in PLUGIN_DATASETS or dataset in NATURAL:  # a plugin's dataset, or one of
            return identity  # features, characters or words: no augmentation unless asked for
        if dataset not in DEFAULT_AUGMENTATION:
            raise ConfigError(
                f"--augment auto has no default for dataset {dataset!r}; pass one of: {', '.join(AUGMENTATIONS)}"
            )
        name = DEFAULT_AUGMENTATION[dataset]
    if name not in AUGMENTATIONS:
        raise ConfigError(f"--augment {name!r} is not known; choose auto or one of: {', '.join(AUGMENTATIONS)}")
    if name == "none":
        return identity
    from fednet.data.torchvision_sets import NORMALIZATION  # numpy-only module; torchvision stays unimported

    mean, std = NORMALIZATION.get(dataset or "", ((0.0,), (1.0,)))
    fn = fedseq if name == "fedseq" else simclr
    return lambda x, g: fn(x, g, mean, std)
