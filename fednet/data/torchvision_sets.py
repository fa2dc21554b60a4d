"""CIFAR-10, CIFAR-100 and SVHN read by torchvision from their official files (torchvision imported lazily)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from fednet.errors import ConfigError

DEFAULT_ROOT = os.path.join("~", ".cache", "fednet", "data")
"""Folder used when --data-root is not given."""

NORMALIZATION: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    # docs/algorithms.md §2.1 (FedSeq's CIFAR pipeline; the widely used CIFAR-10 figures).
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    # docs/algorithms.md §2.4 (Factorized-FL's per-dataset figures). FedSeq reuses the CIFAR-10 figures for
    # CIFAR-100; the difference is a small per-channel affine shift of the inputs.
    "cifar100": ((0.507, 0.487, 0.441), (0.268, 0.257, 0.276)),
    "svhn": ((0.4380, 0.4440, 0.4730), (0.1751, 0.1771, 0.1744)),
}
NORMALIZATION["synthetic-cifar10"] = NORMALIZATION["cifar10"]  # generated pixels (data/synthetic.py)
NORMALIZATION["synthetic-cifar100"] = NORMALIZATION["cifar100"]
"""Per-channel (mean, std) of the [0, 1] pixels applied to train and test images."""

_FILES: dict[str, tuple[str, Sequence[str]]] = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]),
    "cifar100": ("cifar-100-python", ["train", "test", "meta"]),
    "svhn": ("", ["train_32x32.mat", "test_32x32.mat"]),
}
_SHOWN = {
    "cifar10": "data_batch_1..5, test_batch, batches.meta",
    "cifar100": "train, test, meta",
    "svhn": "train_32x32.mat, test_32x32.mat",
}
_NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "svhn": 10}


def expected_files(name: str, root: str) -> list[str]:
    """Paths torchvision reads for the named dataset under root."""
    folder, files = _FILES[name]
    return [os.path.join(root, folder, f) if folder else os.path.join(root, f) for f in files]


def _where(name: str, root: str) -> str:
    """Human-readable 'folder/files' description for error messages."""
    folder = _FILES[name][0]
    base = os.path.join(root, folder) if folder else root
    return f"{base}/{{{_SHOWN[name]}}}"


def _one_line(e: BaseException) -> str:
    """An exception as one line of text."""
    return " ".join(f"{type(e).__name__}: {e}".split())


def to_float(images: np.ndarray, name: str, channels_last: bool) -> np.ndarray:
    """uint8 images (N x H x W x C or N x C x H x W) -> normalized float32 N x C x H x W, one channel at a time."""
    mean, std = NORMALIZATION[name]
    n = images.shape[0]
    h, w = (images.shape[1], images.shape[2]) if channels_last else (images.shape[2], images.shape[3])
    out = np.empty((n, 3, h, w), dtype=np.float32)
    for c in range(3):
        plane = images[..., c] if channels_last else images[:, c]
        np.multiply(plane, np.float32(1.0 / (255.0 * std[c])), out=out[:, c], dtype=np.float32)
        out[:, c] -= np.float32(mean[c] / std[c])
    return out


def _open(name: str, root: str, train: bool, download: bool):  # noqa: ANN202 - a torchvision dataset
    """The torchvision dataset object of one split."""
    from torchvision import datasets as tvd  # lazy: 2-3 s of import, never paid for digits

    if name == "cifar10":
        return tvd.CIFAR10(root, train=train, download=download)
    if name == "cifar100":
        return tvd.CIFAR100(root, train=train, download=download)
    return tvd.SVHN(root, split="train" if train else "test", download=download)


def load_torchvision(name: str, data_root: str | None, download: bool):  # noqa: ANN201 - a Dataset
    """Official train/test splits of cifar10, cifar100 or svhn as a normalized Dataset."""
    from fednet.data.base import Dataset

    root = os.path.abspath(os.path.expanduser(data_root or DEFAULT_ROOT))
    missing = [p for p in expected_files(name, root) if not os.path.isfile(p)]
    if missing and not download:
        raise ConfigError(
            f"--dataset {name}: files not found, expected {_where(name, root)} (missing {os.path.basename(missing[0])}"
            f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}); pass --download to fetch them, "
            f"or --data-root pointing at the folder that holds them"
        )
    if download:
        os.makedirs(root, exist_ok=True)
    splits = []
    for train in (True, False):
        try:
            splits.append(_open(name, root, train, download))
        except RuntimeError as e:
            raise ConfigError(
                f"--dataset {name}: {_where(name, root)} is incomplete or fails torchvision's checksum "
                f"({_one_line(e)}); delete it and rerun with --download, or fix --data-root"
            ) from e
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"--dataset {name}: could not {'download' if download else 'read'} {_where(name, root)} "
                f"({_one_line(e)}); place the files there by hand or fix --data-root"
            ) from e
    out = []
    for tv in splits:
        if name == "svhn":
            x = to_float(np.asarray(tv.data), name, channels_last=False)
            y = np.asarray(tv.labels, dtype=np.int64)
        else:
            x = to_float(np.asarray(tv.data), name, channels_last=True)
            y = np.asarray(tv.targets, dtype=np.int64)
        out.append((x, y))
    classes = tuple(str(c) for c in getattr(splits[0], "classes", ())) or tuple(str(i) for i in range(10))
    (train_x, train_y), (test_x, test_y) = out
    return Dataset(
        name=name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=_NUM_CLASSES[name],
        input_shape=(3, int(train_x.shape[2]), int(train_x.shape[3])),
        class_names=classes,
    )
