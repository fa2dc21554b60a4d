"""core/evaluate.Evaluator (issue 56's round cost): the server's evaluation under
inference_mode, with channels-last max-pooling and its batches' forwards in chunks, gives
training/local.evaluate's accuracy and loss bit for bit."""
from __future__ import annotations

import copy

import torch

import fednet.core.evaluate as evaluate_mod
from fednet.config import RunConfig
from fednet.core.evaluate import Evaluator, channels_last_pools
from fednet.models.arrays import load_arrays, state_arrays
from fednet.training.local import evaluate


def test_server_evaluation_gives_the_plain_evaluations_bits(monkeypatch):
    """fedseq_cnn on 300 synthetic CIFAR images in batches of 128 (as local.evaluate sums
    them), each batch's forward in chunks (CHUNK_BYTES lowered so that a chunk is 22 images:
    the probe keeps them on this CPU), its two poolings channels-last: the same accuracy and
    loss as local.evaluate on the same model, to the last bit, on trained-looking weights."""
    monkeypatch.setattr(evaluate_mod, "EVAL_BATCH", 128)
    monkeypatch.setattr(evaluate_mod, "CHUNK_BYTES", 22 * 64 * 28 * 28 * 4)
    cfg = RunConfig(clients=10, seed=0).replace(**{"data.dataset": "synthetic-cifar10"})
    ev = Evaluator(cfg)
    x, y = ev.x[:300], ev.y[:300]
    g = torch.Generator().manual_seed(3)
    arrays = {k: v + 0.05 * torch.randn(v.shape, generator=g).numpy()
              for k, v in state_arrays(ev.model).items()}
    got = ev.score(arrays, x, y)
    assert ev.chunk == 22  # chunked (the probe found the same bits)
    plain = copy.deepcopy(ev.model)  # its own copy, loaded here: score must load `arrays`
    load_arrays(plain, arrays)
    want = evaluate(plain, x, y, batch_size=128, objective=ev.objective)
    assert got == want
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in ev.model.modules())


def test_channels_last_pools_hook_only_plain_poolings():
    """Only non-overlapping max-poolings are hooked, and only inside the block; a pooled
    tensor comes back contiguous with the contiguous kernel's values."""
    model = torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.MaxPool2d(3, stride=1))
    x = torch.randn(4, 5, 12, 12).relu()  # ties at zero
    with channels_last_pools(model):
        assert len(model[0]._forward_pre_hooks) == 1 and not model[1]._forward_pre_hooks
        out = model[0](x)
    assert out.is_contiguous() and torch.equal(out, torch.nn.functional.max_pool2d(x, 2))
    assert not model[0]._forward_pre_hooks and not model[0]._forward_hooks
