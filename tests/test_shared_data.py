"""Paper-scale data without per-client copies: synthetic-cifar10/100, the host's .npy cache, and
clients that hold index views of the run's shared arrays (in one process and across processes)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from fednet.data import cache, synthetic
from fednet.data.datasets import clear_cache, load_dataset, run_test_rows, run_test_split
from fednet.data.views import Rows

TEST_SPLIT = 9_900 * 3 * 32 * 32 * 4  # bytes of one copy of the run's test images (10 exemplars/class out)


@pytest.fixture(scope="module")
def cached_root(tmp_path_factory):
    """One FEDNET_CACHE for the module: synthetic-cifar10 is generated once, then mapped."""
    root = tmp_path_factory.mktemp("fednet-cache")
    old = os.environ.get(cache.ENV)
    os.environ[cache.ENV] = str(root)
    clear_cache()
    yield root
    clear_cache()
    if old is None:
        os.environ.pop(cache.ENV, None)
    else:
        os.environ[cache.ENV] = old


def test_synthetic_cifar10_has_cifar_shapes_balanced_classes_and_is_mapped(cached_root):
    ds = load_dataset("synthetic-cifar10")
    assert ds.train_x.shape == (50_000, 3, 32, 32) and ds.test_x.shape == (10_000, 3, 32, 32)
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int64
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert np.bincount(ds.train_y).tolist() == [5_000] * 10
    assert np.bincount(ds.test_y).tolist() == [1_000] * 10
    # normalized with the CIFAR-10 figures: roughly centred, unit scale
    assert abs(float(ds.train_x[:2000].mean())) < 0.5 and 0.5 < float(ds.train_x[:2000].std()) < 1.5
    folder = cached_root / f"synthetic-cifar10-s{synthetic.SEED}-v{synthetic.VERSION}"
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "test_x.npy", "test_y.npy",
                                                      "train_x.npy", "train_y.npy"]
    assert isinstance(ds.train_x.base, np.memmap)  # a mapping of the file, not a private copy
    clear_cache()
    again = load_dataset("synthetic-cifar10")  # a second process would do the same: map it
    assert again.train_x is not ds.train_x and np.array_equal(again.train_x[::997], ds.train_x[::997])


def test_synthetic_generation_is_seeded_and_learnable(monkeypatch):
    monkeypatch.setattr(synthetic, "TRAIN", 4_000)
    monkeypatch.setattr(synthetic, "TEST", 2_000)
    a, b = synthetic.generate("synthetic-cifar10"), synthetic.generate("synthetic-cifar10")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    other = synthetic.generate("synthetic-cifar10", seed=1)
    assert not np.array_equal(a["train_x"], other["train_x"])
    # class structure: a nearest-class-mean classifier is far above chance (10%), not perfect
    x, y = a["train_x"].reshape(len(a["train_y"]), -1), a["train_y"]
    mu = np.stack([x[y == c].mean(0) for c in range(10)])
    xt = a["test_x"].reshape(len(a["test_y"]), -1)
    acc = float((np.argmin(-2 * xt @ mu.T + (mu ** 2).sum(1), 1) == a["test_y"]).mean())
    assert 0.3 < acc < 0.95
    hundred = synthetic.generate("synthetic-cifar100")
    assert np.bincount(hundred["train_y"]).tolist() == [40] * 100


def test_rows_gather_the_same_values_as_a_copy_and_behave_like_a_tensor():
    base = torch.arange(60, dtype=torch.float32).reshape(20, 3)
    idx = np.array([4, 0, 17, 9, 9, 3])
    rows, copy = Rows(base, idx), base[torch.from_numpy(idx)]
    assert len(rows) == 6 and rows.shape == (6, 3) and rows.dtype == torch.float32
    perm = torch.tensor([5, 1, 0])
    assert torch.equal(rows[perm], copy[perm]) and torch.equal(rows[1:4], copy[1:4])
    assert torch.equal(rows[np.array([2])], copy[[2]]) and torch.equal(rows[3], copy[3])
    assert torch.equal(torch.relu(rows), torch.relu(copy))  # any torch op gets the gathered rows
    assert torch.equal(rows.subset(np.array([0, 2])).materialize(), copy[[0, 2]])


def test_clients_of_a_process_share_the_images_and_the_test_split(cached_root):
    """Several clients in one process (fednet local, --clients-per-process k): one copy of the
    train and test images, index views and shared test rows in every client."""
    from fednet.core.executor import Executor
    from fednet.config import from_dict
    from fednet.network.latency import Profile

    cfg = from_dict({"clients": 50, "seed": 3, "data": {"dataset": "synthetic-cifar10",
                                                          "partition": "shards"}})
    ds = load_dataset("synthetic-cifar10")
    ex = [Executor(cid, cfg, Profile(), files=False) for cid in (0, 1, 2)]
    for e in ex:
        x, tx = e.ctx.x, e.ctx.test_x
        assert isinstance(x, Rows) and isinstance(tx, Rows)
        assert np.shares_memory(x.base.numpy(), ds.train_x)
        assert np.shares_memory(tx.base.numpy(), ds.test_x)
        assert len(x) == 1_000 and len(tx) == 9_900
    rows, labels = run_test_rows(ds, -1, 3)
    assert all(np.shares_memory(e.ctx.test_y.numpy(), labels) for e in ex)  # not copied per client
    # the view holds the same images as the run's test split that the server evaluates on
    rest, (ex_x, _) = run_test_split(ds, -1, 3)
    assert ex_x.shape == (100, 3, 32, 32) and np.array_equal(ds.test_x[rows[::500]], rest.test_x[::500])
    assert run_test_split(ds, -1, 3)[0] is rest  # computed once per process


def _own_memory(pid: int) -> tuple[int, bool]:
    """(bytes of anonymous memory only this process has written: its own copies; whether it maps
    the cache's train_x.npy). File pages are left out: pages of a freshly written cache file
    count as dirty until the kernel writes them back, though they are the page cache's."""
    own, mapped, anon = 0, False, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and not head[0].endswith(":"):  # a mapping's first line: range perms ... [path]
                path = head[5] if len(head) > 5 else ""
                anon = not path or path.startswith("[")
                mapped = mapped or path.endswith("train_x.npy")
            elif anon and head[0] == "Private_Dirty:":
                own += int(head[1]) * 1024
    return own, mapped


@pytest.mark.net
@pytest.mark.slow
@pytest.mark.parametrize("per_process", [1, 3])
def test_client_processes_share_the_arrays(cached_root, tmp_path, monkeypatch, per_process):
    """fednet launch on a CIFAR-shaped set, 6 clients in processes: read when the server reads
    the clients' PSS (after training), no client process has written as much memory as one copy
    of the test images (116 MiB: each client copied them, and its 8,333 training images, 98 MiB,
    before they were shared; models, training buffers and the interpreter stay well under it),
    and every process maps the host's cache file."""
    import fednet.server.main as server_main
    from fednet.server.main import run_zmq
    from tests.conftest import small_config

    seen: dict[int, tuple[int, int]] = {}
    real = server_main.pss_bytes

    def reading(pids):
        seen.update({pid: _own_memory(pid) for pid in pids})
        return real(pids)

    monkeypatch.setattr(server_main, "pss_bytes", reading)
    cfg = small_config(clients=6, rounds=1, algo={"fraction": 1 / 6},
                       train={"batch_size": 64}, data={"dataset": "synthetic-cifar10"},
                       net={"clients_per_process": per_process}, out=str(tmp_path / "run"))
    s = run_zmq(cfg, quiet=True)
    assert s["status"] == "completed" and len(seen) == 6 // per_process
    assert all(mapped for _, mapped in seen.values())  # the file is mapped, not read into memory
    assert max(d for d, _ in seen.values()) < TEST_SPLIT, seen
    assert 0 < s["client_pss_bytes"]
