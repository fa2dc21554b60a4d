"""CIFAR-10/100 and SVHN through the real torchvision loaders, on tiny files written in the official formats."""
from __future__ import annotations

import hashlib
import pickle  # only to WRITE fixture files: the official CIFAR "python version" batches are pickled dicts
import subprocess
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from fednet.data import DATASETS, NORMALIZATION, clear_cache, load_dataset, partition
from fednet.errors import ConfigError
from tests.harness import CIFAR100_FINE

torchvision_datasets = pytest.importorskip("torchvision.datasets")
scipy_io = pytest.importorskip("scipy.io")

"""CIFAR-100's 100 fine-label names in the order of its meta file (alphabetical)."""


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _dump(path: Path, obj: dict) -> None:
    """Write one batch the way the official archive stores it (a pickled dict; str keys as read by latin1)."""
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _images(n: int, seed: int) -> np.ndarray:
    """n random CIFAR rows (uint8, 3072 = R plane, G plane, B plane of 32 x 32), image 0 with known pixels."""
    data = np.random.default_rng(seed).integers(0, 256, size=(n, 3072), dtype=np.uint8)
    data[0, :1024], data[0, 1024:2048], data[0, 2048:] = 0, 128, 255
    data[0, 5] = 255  # R at row 0, column 5
    return data


def write_cifar10(root: Path, per_batch: int = 4, n_test: int = 6) -> Path:
    """cifar-10-batches-py/data_batch_1..5, test_batch, batches.meta with tiny batches."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        _dump(folder / f"data_batch_{i}", {"batch_label": f"training batch {i} of 5", "data": _images(per_batch, i),
                                            "labels": [(i + j) % 10 for j in range(per_batch)],
                                            "filenames": [f"img{i}_{j}.png" for j in range(per_batch)]})
    _dump(folder / "test_batch", {"batch_label": "testing batch 1 of 1", "data": _images(n_test, 9),
                                   "labels": [j % 10 for j in range(n_test)],
                                   "filenames": [f"t{j}.png" for j in range(n_test)]})
    _dump(folder / "batches.meta", {"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                                    "horse", "ship", "truck"],
                                    "num_cases_per_batch": per_batch, "num_vis": 3072})
    return folder


def write_cifar100(root: Path, per_class: int = 2) -> Path:
    """cifar-100-python/train, test, meta with per_class train and one test image of every fine class."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for name, k, seed in (("train", per_class, 1), ("test", 1, 2)):
        fine = [c for c in range(100) for _ in range(k)]
        _dump(folder / name, {"batch_label": name, "data": _images(len(fine), seed), "fine_labels": fine,
                              "coarse_labels": [c // 5 for c in fine], "filenames": [f"{i}.png" for i in fine]})
    _dump(folder / "meta", {"fine_label_names": list(CIFAR100_FINE),
                            "coarse_label_names": [f"coarse{i}" for i in range(20)]})
    return folder


def write_svhn(root: Path, n_train: int = 12, n_test: int = 5) -> None:
    """train_32x32.mat and test_32x32.mat: X is 32 x 32 x 3 x N uint8, y is N x 1 with 10 for the digit 0."""
    root.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", n_train, 3), ("test", n_test, 4)):
        x = np.random.default_rng(seed).integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
        x[:, :, 2, 0], x[3, 7, 2, 0] = 0, 255  # image 0: blue plane black but for row 3, column 7
        y = (np.arange(n) % 10 + 1).reshape(n, 1).astype(np.uint8)  # labels 1..10 (10 = digit 0)
        scipy_io.savemat(root / f"{name}_32x32.mat", {"X": x, "y": y})


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def trust(monkeypatch):
    """Give torchvision the md5 sums of the fixture files, so its own integrity checks run and pass."""

    def patch(name: str, root: Path) -> None:
        if name == "svhn":
            table = {s: [u, f, _md5(root / f)] for s, (u, f, _) in torchvision_datasets.SVHN.split_list.items()
                     if (root / f).exists()}
            monkeypatch.setattr(torchvision_datasets.SVHN, "split_list", table)
            return
        cls = torchvision_datasets.CIFAR10 if name == "cifar10" else torchvision_datasets.CIFAR100
        folder = root / cls.base_folder
        monkeypatch.setattr(cls, "train_list", [[f, _md5(folder / f)] for f, _ in cls.train_list])
        monkeypatch.setattr(cls, "test_list", [[f, _md5(folder / f)] for f, _ in cls.test_list])
        monkeypatch.setattr(cls, "meta", dict(cls.meta, md5=_md5(folder / cls.meta["filename"])))

    return patch


def test_dataset_names():
    assert DATASETS == ("digits", "cifar10", "cifar100", "svhn", "synthetic-cifar10", "synthetic-cifar100")


def test_cifar10_loads_official_splits_normalized_channel_first(tmp_path, trust):
    write_cifar10(tmp_path)
    trust("cifar10", tmp_path)
    ds = load_dataset("cifar10", str(tmp_path))
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.test_x.shape == (6, 3, 32, 32)
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int64
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert ds.class_names[:2] == ("airplane", "automobile")
    assert ds.train_y.tolist()[:5] == [1, 2, 3, 4, 2]  # batch 1 labels, then batch 2
    assert ds.test_y.tolist() == [0, 1, 2, 3, 4, 5]
    mean, std = NORMALIZATION["cifar10"]
    assert mean == (0.4914, 0.4822, 0.4465) and std == (0.2023, 0.1994, 0.2010)
    img = ds.train_x[0]
    assert img[0, 0, 5] == pytest.approx((1.0 - mean[0]) / std[0], abs=1e-5)
    assert img[0, 0, 4] == pytest.approx((0.0 - mean[0]) / std[0], abs=1e-5)
    assert np.allclose(img[1], (128 / 255 - mean[1]) / std[1], atol=1e-5)
    assert np.allclose(img[2], (1.0 - mean[2]) / std[2], atol=1e-5)
    assert load_dataset("cifar10", str(tmp_path)) is ds  # cached per (name, root)


def test_cifar100_reads_fine_labels_and_names(tmp_path, trust):
    write_cifar100(tmp_path)
    trust("cifar100", tmp_path)
    ds = load_dataset("cifar100", str(tmp_path), split_seed=3)
    assert ds.train_x.shape == (200, 3, 32, 32) and ds.test_x.shape == (100, 3, 32, 32)
    assert ds.num_classes == 100 and ds.class_names == tuple(CIFAR100_FINE)
    assert np.bincount(ds.train_y).tolist() == [2] * 100
    mean, std = NORMALIZATION["cifar100"]
    assert ds.train_x[0, 2, 10, 10] == pytest.approx((1.0 - mean[2]) / std[2], abs=1e-5)
    parts = partition(ds.train_y, 20, "domain", seed=0, dataset="cifar100", class_names=ds.class_names)
    assert [len(p) for p in parts] == [5] * 20  # 10 classes x 2 images per domain, 4 clients
    animals = {ds.class_names[c] for p in parts[16:] for c in ds.train_y[p]}
    assert animals == {"bear", "leopard", "lion", "tiger", "wolf", "camel", "cattle", "chimpanzee", "elephant",
                       "kangaroo"}


def test_svhn_reads_mat_files_and_maps_label_10_to_0(tmp_path, trust):
    write_svhn(tmp_path)
    trust("svhn", tmp_path)
    ds = load_dataset("svhn", str(tmp_path))
    assert ds.train_x.shape == (12, 3, 32, 32) and ds.test_x.shape == (5, 3, 32, 32)
    assert ds.train_y.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert ds.class_names == tuple(str(i) for i in range(10))
    mean, std = NORMALIZATION["svhn"]
    blue = ds.train_x[0, 2]
    assert blue[3, 7] == pytest.approx((1.0 - mean[2]) / std[2], abs=1e-5)  # X[h, w, c, n] -> x[n, c, h, w]
    assert np.count_nonzero(blue == blue[3, 7]) == 1


@pytest.mark.parametrize("name,shown", [
    ("cifar10", "cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}"),
    ("cifar100", "cifar-100-python/{train, test, meta}"),
    ("svhn", "{train_32x32.mat, test_32x32.mat}"),
])
def test_missing_files_are_one_config_error_naming_files_download_and_root(tmp_path, name, shown):
    with pytest.raises(ConfigError) as e:
        load_dataset(name, str(tmp_path / "nowhere"))
    msg = str(e.value)
    assert "\n" not in msg and shown in msg and str(tmp_path / "nowhere") in msg
    assert "--download" in msg and "--data-root" in msg


def test_partly_missing_cifar10_names_the_first_missing_file(tmp_path):
    (write_cifar10(tmp_path) / "data_batch_3").unlink()
    with pytest.raises(ConfigError, match=r"missing data_batch_3\)"):
        load_dataset("cifar10", str(tmp_path))


def test_files_failing_torchvisions_checksum_are_a_config_error(tmp_path):
    write_cifar10(tmp_path)  # genuine layout, but not the official md5 sums: torchvision refuses them
    with pytest.raises(ConfigError, match=r"fails torchvision's checksum.*--download") as e:
        load_dataset("cifar10", str(tmp_path))
    assert "\n" not in str(e.value)


def test_failed_download_is_a_config_error(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr("torchvision.datasets.cifar.download_and_extract_archive", offline)
    with pytest.raises(ConfigError, match=r"could not download .*URLError.*--data-root"):
        load_dataset("cifar10", str(tmp_path), download=True)


def test_download_flag_with_files_present_loads_without_network(tmp_path, trust):
    write_svhn(tmp_path)
    trust("svhn", tmp_path)
    assert load_dataset("svhn", str(tmp_path), download=True).train_x.shape[0] == 12


def test_digits_does_not_import_torchvision():
    code = ("import sys; from fednet.data import load_dataset, partition; from fednet.models import build_model; "
            "import fednet.data.augment; ds = load_dataset('digits'); build_model('auto', 10, ds.input_shape); "
            "assert 'torchvision' not in sys.modules, 'torchvision imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
