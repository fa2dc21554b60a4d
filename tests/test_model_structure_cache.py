"""flops.structure and updates.model_view (issue 56's per-task overheads): what they keep per
model object equals what is read afresh, and every change that moves the architecture (or the
trainable parameters, the modules) reads it again."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fednet.algorithms.updates import model_view
from fednet.training import flops


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _fresh_view(m: nn.Module) -> tuple:
    return ([(n, p) for n, p in m.named_parameters() if p.requires_grad], list(m.modules()))


def _same(m: nn.Module) -> None:
    st, view = flops.structure(m), model_view(m)
    assert st.arch == flops.architecture(m)
    params, modules = _fresh_view(m)
    assert [n for n, _ in view.params] == [n for n, _ in params]
    assert all(a is b for (_, a), (_, b) in zip(view.params, params))
    assert modules[0] is m and len(view.modules) == len(modules) - 1
    assert all(a is b for a, b in zip(view.modules, modules[1:]))


def test_kept_while_nothing_changes():
    m = _net()
    st, view = flops.structure(m), model_view(m)
    _same(m)
    m(torch.zeros(2, 1, 8, 8)).sum().backward()  # training, values written: the same structure
    with torch.no_grad():
        m[0].weight.add_(1.0)
    m.eval()
    m.train()
    assert flops.structure(m) is st and model_view(m) is view


@pytest.mark.parametrize("change", ["grad_off", "reshape", "recast", "replace_param", "add_buffer",
                                    "swap_module", "add_module", "drop_param"])
def test_a_change_reads_it_again(change):
    m = _net()
    st, view = flops.structure(m), model_view(m)
    if change == "grad_off":
        m[0].bias.requires_grad_(False)
    elif change == "reshape":
        m[3].weight.data = torch.zeros(3, 4 * 6 * 6 + 1)
    elif change == "recast":
        m[3].bias.data = m[3].bias.data.double()
    elif change == "replace_param":
        m[3].bias = nn.Parameter(torch.zeros(3))
    elif change == "add_buffer":
        m[1].register_buffer("seen", torch.zeros(1))
    elif change == "swap_module":
        m[3] = nn.Linear(4 * 6 * 6, 3)
    elif change == "add_module":
        m.append(nn.Linear(3, 3))
    else:
        m[3].bias = None
    assert flops.structure(m) is not st and model_view(m) is not view
    _same(m)
    if change in ("grad_off", "reshape", "recast", "add_buffer", "add_module", "drop_param"):
        assert flops.structure(m).arch != st.arch


def test_charge_sizes_charges_the_new_architecture():
    """A cached architecture never charges a changed model's batches with the old count."""
    m = _net()
    with flops.metered() as before:
        flops.charge_sizes(m, [2, 2], (1, 8, 8))
    m[3] = nn.Linear(4 * 6 * 6, 7)
    with flops.metered() as after:
        flops.charge_sizes(m, [2, 2], (1, 8, 8))
    with flops.metered() as direct:
        for _ in range(2):
            flops.charge(m, torch.zeros(2, 1, 8, 8))
    assert after.flops == direct.flops != before.flops and after.ops == direct.ops


def test_train_flags_kept_by_take_ahead_view():
    """model_view's plain_train: a module overriding train() makes take_ahead call it."""
    class Frozen(nn.Linear):
        def train(self, mode: bool = True) -> "Frozen":
            return super().train(False)
    assert model_view(_net()).plain_train
    assert not model_view(nn.Sequential(Frozen(2, 2))).plain_train


def test_take_ahead_trains_the_model_and_charges_as_before():
    """take_ahead through model_view: a model left in eval mode is put back in training mode,
    its parameters end where the block trained them, and its meter is charged what the
    architecture read afresh charges."""
    import copy

    from fednet.algorithms import updates
    from fednet.algorithms.contract import ClientContext
    from fednet.config import RunConfig
    from fednet.models import build_model
    from fednet.models.arrays import load_arrays, state_arrays
    from fednet.types import Task

    cfg = RunConfig(seed=3)
    model = build_model("mclr", 10, (60,), seed=0)
    g = torch.Generator().manual_seed(5)
    ctxs = [ClientContext(i, model, torch.randn(9 + i, 60, generator=g),
                          torch.randint(0, 10, (9 + i,), generator=g), cfg, torch.device("cpu"))
            for i in range(2)]
    arrays = state_arrays(copy.deepcopy(model))
    tasks = [Task(task_id=10 + i, round=1, route=[i], arrays=arrays) for i in range(2)]
    assert updates.train_ahead(ctxs, tasks, [updates.Plain(), updates.Plain()]) == ""
    ahead = updates._AHEAD[(0, 10)]
    try:
        load_arrays(model, tasks[0].arrays)
        model.eval()
        with flops.metered() as got:
            assert updates.take_ahead(ctxs[0], tasks[0], 0.0) is not None
        assert all(m.training for m in model.modules())
        assert all(torch.equal(p, ahead.end[n]) for n, p in model.named_parameters())
        with flops.metered() as want:
            for s in ahead.sizes:
                flops.charge(model, torch.zeros(s, *ahead.example))
        assert (got.flops, got.ops) == (want.flops, want.ops) and got.flops > 0
    finally:
        updates.forget_ahead()


def test_the_caches_do_not_keep_a_model_alive():
    import gc
    import weakref

    m = _net()
    model_view(m)
    flops.charge_sizes(m, [2], (1, 8, 8))
    gone = weakref.ref(m)
    del m
    gc.collect()
    assert gone() is None


def test_a_model_without_poolings_is_freed_after_its_fast_pool_lookup():
    import gc
    import weakref

    from fednet.training.batched import _with_fast_pools

    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    assert _with_fast_pools(model) is model
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


class _Overrides(nn.Linear):
    def named_parameters(self, *args, **kwargs):  # (a class may yield its own)
        return super().named_parameters(*args, **kwargs)


def _odd_net() -> nn.Module:
    """Shared submodules and a shared parameter, a None buffer and parameter, nesting."""
    shared = nn.Linear(2, 2)
    net = nn.Sequential(shared, nn.Sequential(shared, nn.ReLU(), nn.Sequential(nn.Linear(2, 2))),
                        nn.BatchNorm1d(2))
    net.register_buffer("gone", None)
    net.register_parameter("none", None)
    net.twice = shared.weight  # the same Parameter under a second name of another module
    net[2].register_parameter("again", net[2].weight)  # ... and twice in one module
    return net


@pytest.mark.parametrize("make", [_net, _odd_net])
def test_the_key_read_from_the_tables_is_the_methods_key(make):
    m = make()
    fast, slow = flops._plain_key(m), flops._methods_key(m)
    assert fast is not None and fast[0] == slow[0]
    assert len(fast[1]) == len(slow[1]) and all(a is b for a, b in zip(fast[1], slow[1]))
    assert len(fast[2]) == len(slow[2]) and all(a is b for a, b in zip(fast[2], slow[2]))
    assert flops.structure_key(m)[0] == slow[0]


def test_a_module_class_overriding_the_methods_is_read_through_them():
    m = nn.Sequential(nn.ReLU(), _Overrides(2, 2))
    assert flops._plain_key(m) is None
    assert flops.structure_key(m)[0] == flops._methods_key(m)[0]
