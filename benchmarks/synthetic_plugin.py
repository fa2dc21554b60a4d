"""A plugin that registers synthetic-cifar10 in an older fednet (one without data/synthetic.py), so
bench_memory.py can measure that code on the same data: the arrays come from this checkout's
fednet/data/synthetic.py (loaded by file path), generated in memory in every process that loads
them, as the older code's datasets were. Used as `--plugin synthetic_plugin` with benchmarks/ on
PYTHONPATH; never imported by fednet itself."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from fednet.data.datasets import DATASETS, Dataset, register_dataset

NAME = "synthetic-cifar10"


def _generate():
    path = Path(__file__).resolve().parent.parent / "fednet" / "data" / "synthetic.py"
    spec = importlib.util.spec_from_file_location("synthetic_arrays", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod.generate(NAME)


def load(data_root, download, split_seed) -> Dataset:
    a = _generate()
    return Dataset(name=NAME, num_classes=10, input_shape=(3, 32, 32),
                   class_names=tuple(str(i) for i in range(10)), **a)


if NAME not in DATASETS:  # a checkout that has it built in needs no plugin
    register_dataset(NAME, load, model="fedseq_cnn")
