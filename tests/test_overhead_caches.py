"""What the per-task overheads of a round keep instead of recomputing (issue 56): each kept value
equals the value computed afresh, and a change that must invalidate it does.

- Executor.kept_bytes (KeptExecutors.keep reads it after every task): kept with the objects it
  read, counted again once one of them is replaced;
- Session._latest_unit (latest_return's one-example epoch of plain work, read once a run);
  latest_return equals its formula written out with the work computed afresh;
- train_ahead's starts: tasks carrying the same array objects share one start tensor, equal to
  the tensor made from each alone; another array object gets its own; take_ahead still refuses a
  model that is not where the task's training started;
- layout.vet's fast paths give the same reasons as before.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from fednet.algorithms import updates
from fednet.algorithms.contract import ClientContext
from fednet.algorithms.layout import layout_of, vet
from fednet.algorithms.updates import Plain, _start, take_ahead, train_ahead
from fednet.config import RunConfig
from fednet.core.executor import Executor
from fednet.core.session import Session
from fednet.core.work import LATEST_WORK
from fednet.data.partition import part_size
from fednet.models import build_model
from fednet.models.arrays import load_arrays, state_arrays
from fednet.network import latency
from fednet.types import Task
from tests.conftest import small_config


def test_kept_bytes_kept_until_an_object_it_read_changes():
    cfg = small_config(clients=3)
    s = Session(cfg, quiet=True, write=False)
    ex = Executor(1, cfg, s.profiles[1], "cpu", s.run_id, s.parts[1], files=False)
    first = ex.kept_bytes()
    assert ex._kept is not None and ex._kept[1] == first
    ex._kept = None
    assert ex.kept_bytes() == first  # the kept count is the count made afresh
    ex.ctx.y = torch.cat([ex.ctx.y, ex.ctx.y])  # a new label tensor, twice the bytes
    grown = ex.kept_bytes()
    assert grown == first + ex.ctx.y.nbytes // 2
    ex._kept = None
    assert ex.kept_bytes() == grown


def test_latest_return_with_its_unit_read_once():
    cfg = small_config(clients=4, latency={"preset": "hetero"})
    s = Session(cfg, quiet=True, write=False)
    w = s._work
    assert s._latest_unit == (w.epoch(1), tuple(w.epoch_ops(1).items()))
    arrays = s.algo.global_arrays
    task = Task(task_id=1, round=0, route=[2, 0], arrays=arrays, sim_time=3.5)

    def want(task: Task) -> float:  # latest_return as written before its unit was kept
        tensors = sum(a.nbytes for a in task.arrays.values())
        moved = 3 * (max(tensors, s.evaluator.model_bytes) + (1 << 20))
        t = task.sim_time + 1.0 + float(s.cfg.latency.deadline)
        for cid in task.route[task.hop:]:
            p = s.profiles[cid]
            samples = 4 * s._most_epochs * (s._pooled_examples or part_size(s.parts, cid)) + 4096
            work = LATEST_WORK * samples * w.epoch(1) if p.train_flops_per_s > 0 else 0
            calls = {k: LATEST_WORK * samples * n for k, n in w.epoch_ops(1).items()}
            t += 2 * p.rtt_s + moved / min(p.down_bps, p.up_bps) + latency.compute_time(
                p, samples, work, {**s._protocol_bound, **calls})
        return t

    assert s.latest_return(task) == want(task) > 3.5
    task.hop = 1
    assert s.latest_return(task) == want(task)


def _block(n: int):
    cfg = RunConfig(seed=3)
    model = build_model("mclr", 10, (60,), seed=0)
    g = torch.Generator().manual_seed(5)
    ctxs = [ClientContext(i, model, torch.randn(9 + i, 60, generator=g),
                          torch.randint(0, 10, (9 + i,), generator=g), cfg, torch.device("cpu"))
            for i in range(n)]
    arrays = state_arrays(copy.deepcopy(model))
    tasks = [Task(task_id=10 + i, round=1, route=[i], arrays=arrays) for i in range(n)]
    return model, ctxs, tasks


def test_block_starts_shared_and_equal():
    _, ctxs, tasks = _block(3)
    other = {k: np.array(a, copy=True) for k, a in tasks[0].arrays.items()}
    tasks[2] = Task(task_id=12, round=1, route=[2], arrays=other)  # equal values, other objects
    made: dict = {}
    starts = [_start(c, t, made) for c, t in zip(ctxs, tasks)]
    for ctx, task, got in zip(ctxs, tasks, starts):
        alone = _start(ctx, task, {})  # made fresh, from nothing shared
        assert got.keys() == alone.keys()
        assert all(torch.equal(got[k], alone[k]) for k in got)
    assert all(starts[0][k] is starts[1][k] for k in starts[0])  # the same arrays: shared
    assert all(starts[0][k] is not starts[2][k] for k in starts[0])  # others: made again


def test_take_ahead_refuses_a_model_moved_from_its_start():
    model, ctxs, tasks = _block(3)
    rules = [Plain() for _ in ctxs]
    assert train_ahead(ctxs, tasks, rules) == ""
    try:
        load_arrays(model, tasks[0].arrays)
        assert take_ahead(ctxs[0], tasks[0], 0.0) is not None  # where it started: taken
        load_arrays(model, tasks[1].arrays)
        with torch.no_grad():
            next(model.parameters()).add_(1.0)  # not where task 1 started
        assert take_ahead(ctxs[1], tasks[1], 0.0) is None
        load_arrays(model, tasks[2].arrays)
        assert take_ahead(ctxs[2], tasks[2], 0.1) is None  # another mu
    finally:
        updates.forget_ahead()


@pytest.mark.parametrize("arrays, why", [
    ({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}, None),
    ({"w": np.zeros((2, 3), np.float32)}, "array(s) 'b' missing"),
    ({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32),
      "c": np.zeros(1, np.float32)}, "unexpected array(s) 'c'"),
    ({"w": np.zeros((2, 3), np.float32), "c": np.zeros(3, np.float32)}, "array(s) 'b' missing"),
    ({"w": np.zeros((2, 3), np.float32), "b": np.array([0, np.inf, 0], np.float32)},
     "array 'b' holds NaN or inf"),
    ({"w": np.full((2, 3), np.nan, np.float32), "b": np.zeros(3, np.float32)},
     "array 'w' holds NaN or inf"),
])
def test_vet_reasons(arrays, why):
    expected = layout_of({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)})
    assert vet(expected, arrays, 5, 5) == why


def test_a_local_runs_objects_are_frozen_for_its_rounds(tmp_path, monkeypatch):
    """fednet local freezes what exists when its rounds start (gc.freeze: the cyclic collector's
    full passes then skip torch's, the data's and the session's objects, ~85 ms a pass), and
    gives them back to the collector when the run ends."""
    import gc

    from fednet.core import inproc

    seen: list[int] = []
    run_round = inproc.InprocDispatcher.run_round

    def counted(self, *a, **k):
        seen.append(gc.get_freeze_count())
        return run_round(self, *a, **k)

    monkeypatch.setattr(inproc.InprocDispatcher, "run_round", counted)
    before = gc.get_freeze_count()
    cfg = small_config(clients=3, rounds=2)
    assert inproc.run_local(cfg.replace(out=str(tmp_path / "r")), quiet=True)["status"] == \
        "completed"
    assert len(seen) == 2 and min(seen) > before + 10_000  # every round: torch's objects at least
    assert gc.get_freeze_count() == before


class _Extra(torch.nn.Linear):
    def get_extra_state(self):
        return {"x": 1}

    def set_extra_state(self, state):
        pass


def _state_net() -> torch.nn.Module:
    """Shared submodules, a None parameter and buffer, a non-persistent buffer, nesting."""
    shared = torch.nn.Linear(2, 2)
    net = torch.nn.Sequential(shared, torch.nn.Sequential(shared, torch.nn.BatchNorm1d(2)))
    net.register_buffer("gone", None)
    net.register_parameter("none", None)
    net.register_buffer("scratch", torch.ones(3), persistent=False)
    net.register_buffer("kept", torch.arange(3))
    return net


@pytest.mark.parametrize("make", [_state_net, lambda: build_model(
    "auto", 10, (1, 8, 8), dataset="digits", seed=0)])
def test_state_tensors_read_from_the_tables_are_state_dicts(make):
    from fednet.models.arrays import state_tensors

    m = make()
    got, want = state_tensors(m), m.state_dict()
    assert list(got) == list(want)
    assert all(got[k].data_ptr() == want[k].data_ptr() and not got[k].requires_grad
               and got[k].shape == want[k].shape for k in want)


def test_state_tensors_of_a_hooked_or_overriding_model_are_state_dicts():
    from fednet.models.arrays import state_tensors

    m = torch.nn.Sequential(torch.nn.Linear(2, 2), _Extra(2, 2))
    assert "1._extra_state" in state_tensors(m)
    h = torch.nn.Sequential(torch.nn.Linear(2, 2))
    h[0].register_state_dict_post_hook(lambda mod, sd, prefix, meta: [sd.pop(prefix + "bias"),
                                                                       None][1])
    assert list(state_tensors(h)) == ["0.weight"]


def test_a_blocks_clients_split_once_are_the_views_indexed_one_by_one():
    from fednet.training.batched import BatchedResult

    params = {"w": torch.randn(4, 3, 2), "b": torch.randn(4, 2)}
    res = BatchedResult(params, [])
    got = res.clients(3)
    assert len(got) == 3
    for g, d in enumerate(got):
        want = res.client(g)
        assert list(d) == list(want)
        assert all(d[k].data_ptr() == want[k].data_ptr() and d[k].shape == want[k].shape
                   and d[k].stride() == want[k].stride() for k in want)


def test_load_ahead_gives_load_arrays_then_take_ahead():
    """The same model, meter and answer as loading the received arrays and taking the training
    done ahead, whether the received arrays are where the block started (not loaded first), are
    not (a value moved: loaded, trained alone), or carry another mu."""
    from fednet.algorithms.updates import load_ahead
    from fednet.training import flops

    def run(take, moved: bool, mu: float):
        model, ctxs, tasks = _block(3)
        assert train_ahead(ctxs, tasks, [Plain() for _ in ctxs]) == ""
        arrays = {k: np.array(a, copy=True) for k, a in tasks[1].arrays.items()}  # received
        if moved:
            next(iter(arrays.values())).reshape(-1)[0] += 1.0
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(7.0)  # where another client's task left the working model
        try:
            with flops.metered() as meter:
                got = take(ctxs[1], replace(tasks[1], arrays=arrays), mu)
        finally:
            left = updates.has_ahead(1, tasks[1].task_id)
            updates.forget_ahead()
        return got, state_arrays(model), meter.flops, left

    def old(ctx, task, mu):
        load_arrays(ctx.model, task.arrays)
        return take_ahead(ctx, task, mu)

    for moved, mu in ((False, 0.0), (True, 0.0), (False, 0.1)):
        a, b = run(load_ahead, moved, mu), run(old, moved, mu)
        assert a[0] == b[0] and a[2] == b[2] and a[3] == b[3], (moved, mu)
        assert a[1].keys() == b[1].keys()
        assert all(np.array_equal(a[1][k], b[1][k]) for k in a[1]), (moved, mu)
        assert (a[0] is None) == (moved or mu != 0.0)
