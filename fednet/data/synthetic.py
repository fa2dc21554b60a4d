"""synthetic-cifar10 and synthetic-cifar100: generated images with CIFAR's shapes (NOT CIFAR).

50,000 train and 10,000 test images of 3 x 32 x 32 in 10 or 100 balanced classes, made from a fixed
seed in a few seconds, for benchmarks and tests at paper scale without a download. They are
*learnable*: every class has its own smooth colour templates (MODES of them), and an image is one
of its class's templates, shifted by up to SHIFT pixels, scaled in contrast, laid over a random
smooth background of its own and covered by pixel noise. A CNN's accuracy rises over rounds, and
label-skewed partitions hurt as they do on real images. Pixels are quantized to uint8 like CIFAR's,
then normalized with the CIFAR figures (torchvision_sets.NORMALIZATION), so augmentations and
models treat them like CIFAR. Nothing here says anything about accuracy on CIFAR itself.
"""
from __future__ import annotations

import numpy as np

from fednet.rng import generator

SYNTHETIC = {"synthetic-cifar10": 10, "synthetic-cifar100": 100}
"""Name -> number of classes."""
LIKE = {"synthetic-cifar10": "cifar10", "synthetic-cifar100": "cifar100"}
"""Name -> the real dataset whose normalization, default model and augmentation it takes."""
VERSION = 1
"""Bumped whenever the generator's output changes (it is part of the cache key)."""
SEED = 0
"""The generation seed: the data is the same in every run, like a real dataset's files."""
TRAIN, TEST = 50_000, 10_000
MODES = 4       # templates per class
SHIFT = 3       # template translation, pixels each way (wrapping around)
GRID = 4        # templates and backgrounds are bilinear upsamplings of GRID x GRID noise
SIZE = 32
CHUNK = 5_000   # images generated at a time (bounds the temporary memory)
BANK = 512      # smooth background fields drawn per chunk
# Pixel-domain mixture (0..255): template contrast, background and noise strengths.
COLOUR, SHARED = 0.3, 0.5  # class colour and class pattern, relative to a mode's own pattern
BASE, TEMPLATE, BACKGROUND, NOISE = 120.0, 20.0, 24.0, 50.0


def _upsample_matrix(n: int = GRID, size: int = SIZE) -> np.ndarray:
    """size x n bilinear interpolation weights (align_corners), float32."""
    pos = np.linspace(0, n - 1, size)
    lo = np.clip(np.floor(pos).astype(int), 0, n - 2)
    frac = pos - lo
    m = np.zeros((size, n), dtype=np.float64)
    m[np.arange(size), lo] = 1 - frac
    m[np.arange(size), lo + 1] = frac
    return m.astype(np.float32)


def _smooth(coarse: np.ndarray, up: np.ndarray) -> np.ndarray:
    """(..., GRID, GRID) noise -> (..., SIZE, SIZE) smooth fields."""
    return np.einsum("ia,...ab,jb->...ij", up, coarse, up, optimize=True).astype(np.float32)


def templates(num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """num_classes x MODES x 3 x SIZE x SIZE unit-scale templates: a class colour and pattern
    shared by its modes, plus a pattern of each mode."""
    up = _upsample_matrix()
    colour = rng.normal(0.0, COLOUR, (num_classes, 1, 3, 1, 1))
    shared = _smooth(rng.normal(0.0, SHARED, (num_classes, 1, 3, GRID, GRID)), up)
    own = _smooth(rng.normal(0.0, 1.0, (num_classes, MODES, 3, GRID, GRID)), up)
    return (colour + shared + own).astype(np.float32)


def _pixels(labels: np.ndarray, temp: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """uint8 N x 3 x SIZE x SIZE images of the given labels."""
    n = labels.size
    up = _upsample_matrix()
    mode = rng.integers(0, MODES, n)
    shift = rng.integers(-SHIFT, SHIFT + 1, (n, 2))
    contrast = rng.uniform(0.6, 1.4, (n, 1, 1, 1)).astype(np.float32)
    x = temp[labels, mode] * contrast
    code = (shift[:, 0] + SHIFT) * (2 * SHIFT + 1) + (shift[:, 1] + SHIFT)
    for c in np.unique(code):  # one roll per distinct shift (49 of them), not per image
        sel = np.flatnonzero(code == c)
        dy, dx = divmod(int(c), 2 * SHIFT + 1)
        x[sel] = np.roll(x[sel], (dy - SHIFT, dx - SHIFT), axis=(2, 3))
    x *= TEMPLATE
    bank = _smooth(rng.normal(0.0, BACKGROUND, (BANK, 3, GRID, GRID)), up)
    pick = rng.integers(0, BANK, (2, n))
    x += bank[pick[0]]
    x -= bank[pick[1]]  # a background of its own: the difference of two of the chunk's fields
    noise = rng.random((n, 3, SIZE, SIZE), dtype=np.float32)
    noise += rng.random((n, 3, SIZE, SIZE), dtype=np.float32)  # triangular on [0, 2)
    noise -= 1.0
    x += NOISE * noise
    x += BASE
    np.clip(x, 0.0, 255.0, out=x)
    return np.rint(x).astype(np.uint8)


def _labels(n: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """n balanced labels in random order (n a multiple of num_classes)."""
    return rng.permutation(np.repeat(np.arange(num_classes, dtype=np.int64), n // num_classes))


def _split(n: int, num_classes: int, temp: np.ndarray, rng: np.random.Generator,
           to_float) -> tuple[np.ndarray, np.ndarray]:
    """(normalized float32 images, labels) of one split, generated CHUNK images at a time."""
    y = _labels(n, num_classes, rng)
    x = np.empty((n, 3, SIZE, SIZE), dtype=np.float32)
    for i in range(0, n, CHUNK):
        x[i:i + CHUNK] = to_float(_pixels(y[i:i + CHUNK], temp, rng))
    return x, y


def generate(name: str, seed: int = SEED) -> dict[str, np.ndarray]:
    """{'train_x', 'train_y', 'test_x', 'test_y'} of the named synthetic set (normalized float32
    images, int64 labels); the same name and seed give the same arrays."""
    from fednet.data.torchvision_sets import to_float

    k = SYNTHETIC[name]
    rng = generator(seed, f"data/{name}/v{VERSION}")
    temp = templates(k, rng)

    def norm(px: np.ndarray) -> np.ndarray:
        return to_float(px, LIKE[name], channels_last=False)

    train_x, train_y = _split(TRAIN, k, temp, rng, norm)
    test_x, test_y = _split(TEST, k, temp, rng, norm)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}
