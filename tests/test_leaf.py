"""LEAF's JSON datasets (data/leaf.py): one user per client, read from fixtures written in LEAF's
own format; and the models LEAF uses for them (models/natural_nets.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fednet.config import DataConfig
from fednet.data import clear_cache, leaf, load_dataset, natural, run_partition
from fednet.data.client_data import client_data
from fednet.errors import ConfigError
from fednet.models import build_model
from tests.leaf_fixtures import user_order, write_leaf


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDNET_CACHE", str(tmp_path / "cache"))
    clear_cache()
    yield
    clear_cache()


def _cfg(name: str, root, **kw) -> DataConfig:
    return DataConfig(dataset=name, partition="natural", data_root=str(root), **kw)


def test_femnist_clients_are_leaf_users_in_file_order(tmp_path):
    written = write_leaf(tmp_path, "femnist", users=7, files=3)
    d = _cfg("femnist", tmp_path)
    ds = load_dataset("femnist", str(tmp_path))
    assert (ds.num_classes, ds.input_shape, ds.natural.users) == (62, (1, 28, 28), 7)
    users = user_order(written)
    parts = run_partition(ds, d, 7, 0)
    for cid, u in enumerate(users):
        x, y = written["train"][u]
        cd = client_data(ds, d, 7, 0, cid, parts[cid])
        assert np.array_equal(cd.x, np.asarray(x, np.float32).reshape(-1, 1, 28, 28))
        assert cd.y.tolist() == y and len(parts[cid]) == len(y)
        tx, ty = written["test"][u]
        assert np.array_equal(cd.test_x.reshape(len(ty), -1), np.asarray(tx, np.float32))
        assert cd.test_y.tolist() == ty
    # the server's test set: the test samples of the run's users, in client order
    test = natural.test_dataset(ds, d, 4, 0)
    assert test.test_y.tolist() == sum((written["test"][u][1] for u in users[:4]), [])
    stats, hists, label_hist = natural.summary(ds, d, 7, 0)
    assert stats["described_clients"] == 7 and label_hist.shape == (7, 62)
    assert hists[2] == np.bincount(written["train"][users[2]][1], minlength=62).tolist()
    with pytest.raises(ConfigError, match="exceeds the 7 users of femnist.*--clients 7"):
        run_partition(ds, d, 8, 0)


def test_leaf_arrays_are_cached_and_rebuilt_when_the_files_change(tmp_path):
    write_leaf(tmp_path, "femnist", users=3)
    a = load_dataset("femnist", str(tmp_path))
    dirs = [f for f in (tmp_path / "cache").iterdir() if f.is_dir()]
    assert len(dirs) == 1 and dirs[0].name.startswith("femnist-leaf-")
    meta = json.loads((dirs[0] / "meta.json").read_text())
    assert set(meta["arrays"]) >= {"train_offsets", "test_offsets"}
    clear_cache()
    b = load_dataset("femnist", str(tmp_path))  # mapped from the cache
    assert isinstance(b.train_x.base, np.memmap)
    assert np.array_equal(a.train_x, b.train_x)
    write_leaf(tmp_path, "femnist", users=4, seed=1)  # the files change: converted again
    clear_cache()
    assert load_dataset("femnist", str(tmp_path)).natural.users == 4


def test_shakespeare_encodes_characters_as_leaf_does(tmp_path):
    written = write_leaf(tmp_path, "shakespeare", users=3)
    ds = load_dataset("shakespeare", str(tmp_path))
    assert (ds.num_classes, ds.input_shape, ds.train_x.dtype) == (80, (80,), np.uint8)
    u = user_order(written)[0]
    x, y = written["train"][u]
    cd = client_data(ds, _cfg("shakespeare", tmp_path), 3, 0, 0)
    assert cd.x[0].tolist() == [leaf.LETTERS.index(c) for c in x[0]]
    assert cd.y.tolist() == [leaf.LETTERS.index(c) for c in y]
    odd = leaf._chars(["é" + "a" * 79, "b"])  # outside the alphabet: a space; short: padded
    assert odd[0, 0] == leaf.LETTERS.index(" ") and odd[1, -1] == leaf.LETTERS.index("b")
    assert odd[1, 0] == leaf.LETTERS.index(" ") and len(leaf.LETTERS) == 80


def test_sent140_hashes_the_words_of_the_text_field(tmp_path):
    written = write_leaf(tmp_path, "sent140", users=3)
    ds = load_dataset("sent140", str(tmp_path))
    assert (ds.num_classes, ds.input_shape, ds.train_x.dtype) == (2, (25,), np.int16)
    x, y = written["train"][user_order(written)[1]]
    cd = client_data(ds, _cfg("sent140", tmp_path), 3, 0, 1)
    ids = leaf._words(x[0][4])
    assert cd.x[0, :len(ids)].tolist() == ids and not cd.x[0, len(ids):].any()
    assert cd.y.tolist() == y
    assert leaf._words("Good, GOOD day!") == leaf._words("good , good day !")
    assert all(1 <= i < leaf.VOCAB for i in leaf._words("a b c d e f g"))


def test_a_user_split_tests_on_every_test_user(tmp_path):
    write_leaf(tmp_path, "femnist", users=4, test_users=2)
    ds = load_dataset("femnist", str(tmp_path))
    assert ds.natural.without_tests(4) == 2
    with pytest.raises(ConfigError, match="--eval clients.*2 of the 4 users"):
        natural.check_own_tests(ds, 4)
    test = natural.test_dataset(ds, _cfg("femnist", tmp_path), 4, 0)
    assert len(test.test_y) == len(ds.test_y)  # users 0-3 hold them all


def test_bad_or_missing_leaf_files_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="no LEAF JSON files in .*femnist/data/train"):
        load_dataset("femnist", str(tmp_path))
    write_leaf(tmp_path, "femnist", users=2)
    bad = tmp_path / "femnist" / "data" / "train" / "zz_broken.json"
    bad.write_text(json.dumps({"users": ["u"], "user_data": {"u": {"x": [[0.5] * 10], "y": [1]}}}))
    with pytest.raises(ConfigError, match="zz_broken.json is not a LEAF JSON file of femnist"):
        load_dataset("femnist", str(tmp_path))


def test_leaf_models():
    cases = [("mclr", 10, (60,), torch.randn(3, 60), 610),
             ("femnist_cnn", 62, (1, 28, 28), torch.rand(3, 1, 28, 28), 6_603_710),
             ("char_lstm", 80, (80,), torch.randint(0, 80, (3, 80), dtype=torch.uint8), 819_920),
             ("sent140_bow", 2, (25,), torch.randint(0, leaf.VOCAB, (3, 25)).to(torch.int16),
              leaf.VOCAB * 2 + 2)]
    for name, k, shape, x, params in cases:
        m = build_model(name, k, shape, seed=0)
        assert m(x).shape == (3, k) and sum(p.numel() for p in m.parameters()) == params, name
    for dataset, model in (("synthetic-fedprox", "mclr"), ("femnist", "femnist_cnn"),
                           ("shakespeare", "char_lstm"), ("sent140", "sent140_bow")):
        from fednet.models import resolve_model

        assert resolve_model("auto", dataset) == model


@pytest.mark.parametrize("name", ["femnist", "shakespeare", "sent140"])
def test_fednet_local_runs_on_leaf(tmp_path, name):
    from fednet.core.inproc import run_local
    from tests.conftest import small_config

    write_leaf(tmp_path, name, users=4)
    cfg = small_config(clients=4, rounds=1, data={"dataset": name, "partition": "natural",
                                                  "data_root": str(tmp_path)},
                       out=str(tmp_path / "run"))
    s = run_local(cfg, quiet=True)
    assert s["status"] == "completed" and s["partition"]["clients"] == 4
    rows = [json.loads(r) for r in (tmp_path / "run" / "clients.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in rows] == list(np.diff(load_dataset(
        name, str(tmp_path)).natural.train_offsets))
