"""Server optimizers (FedAvgM, FedAdam, FedYogi, FedAdagrad) on toy clients: numbers worked out by
hand from the update rules of Reddi et al. 2021, Algorithm 2 (docs/algorithms.md §3.11).

Every toy round has two clients, n = 1 and n = 3, chosen so that the sample-weighted mean minus the
model, Δ, and the square roots are exact binary fractions: the expected numbers are literals.
"""
from __future__ import annotations

import numpy as np
import pytest

from fednet.algorithms import build
from fednet.algorithms.state import Shapes, decode, encode
from fednet.types import Result
from tests.conftest import small_config

X0 = [0.0, 1.0, 2.0]


def _algo(name: str, **params):
    algo = build(small_config(algo={"name": name, "params": params}))
    algo.setup({"w": np.array(X0, np.float32), "n": np.array(7, np.int64)}, trainable={"w"})
    return algo


def _round(algo, rnd: int, mean: list[float], x: list[float]) -> dict:
    """Clients c1 (n = 3) returns x itself, c0 (n = 1) returns 4*mean - 3*x: their weighted mean is
    `mean`. The integer buffer n comes back as 9 and 5 (FedAvg's rule: the lowest client id's)."""
    x_ = np.array(x, np.float64)
    c0 = (4 * np.array(mean) - 3 * x_).astype(np.float32)
    rs = [Result(2 * rnd + 2, rnd, 1, {"w": x_.astype(np.float32), "n": np.array(5)}, {}, 3),
          Result(2 * rnd + 1, rnd, 0, {"w": c0, "n": np.array(9)}, {}, 1)]
    for r in rs:  # streamed, in arrival order, as the runtimes do
        algo.absorb(r)
    return algo.aggregate_round(rnd, rs, [])


def test_fedavgm_two_rounds():
    """η = 0.5, β = 0.5.  Round 0: Δ0 = [1, 1, 1] - X0 = [1, 0, -1]; m0 = Δ0; x1 = X0 + m0/2 =
    [0.5, 1, 1.5].  Round 1 (mean [1.5, 1, 0.5]): Δ1 = [1, 0, -1]; m1 = m0/2 + Δ1 = [1.5, 0, -1.5];
    x2 = x1 + m1/2 = [1.25, 1, 0.75]."""
    a = _algo("fedavgm", server_lr=0.5, server_momentum=0.5)
    _round(a, 0, [1.0, 1.0, 1.0], X0)
    assert a.state.model["w"].tolist() == [0.5, 1.0, 1.5]
    assert a.state.m["w"].tolist() == [1.0, 0.0, -1.0] and a.state.v == {}
    assert int(a.state.model["n"]) == 9  # buffers: FedAvg's average (integers: lowest client id)
    _round(a, 1, [1.5, 1.0, 0.5], [0.5, 1.0, 1.5])
    assert a.state.m["w"].tolist() == [1.5, 0.0, -1.5]
    assert a.state.model["w"].tolist() == [1.25, 1.0, 0.75]


def test_fedavgm_with_lr_1_and_no_momentum_is_fedavg():
    a = _algo("fedavgm", server_lr=1.0, server_momentum=0.0)
    _round(a, 0, [0.25, 1.5, -3.0], X0)
    assert a.state.model["w"].tolist() == [0.25, 1.5, -3.0]


def test_fedadagrad_two_rounds():
    """η = 0.5, β1 = 0.5, τ = 0.75 (v_{-1} = τ² = 0.5625).  Round 0: Δ0 = [1, 0, -1];
    m0 = Δ0/2 = [0.5, 0, -0.5]; v0 = 0.5625 + Δ0² = [1.5625, 0.5625, 1.5625], √v0 = [1.25, 0.75,
    1.25]; x1 = X0 + 0.5 m0/(√v0 + 0.75) = [0.125, 1, 1.875].
    Round 1 (mean [0.125, 2, 1.875]): Δ1 = [0, 1, 0]; m1 = m0/2 + Δ1/2 = [0.25, 0.5, -0.25];
    v1 = v0 + Δ1² = [1.5625, 1.5625, 1.5625], √v1 = 1.25; x2 = x1 + 0.5 m1/2 =
    [0.1875, 1.125, 1.8125]."""
    a = _algo("fedadagrad", server_lr=0.5, beta1=0.5, tau=0.75)
    assert a.state.v["w"].tolist() == [0.5625] * 3 and a.state.m["w"].tolist() == [0.0] * 3
    _round(a, 0, [1.0, 1.0, 1.0], X0)
    assert a.state.m["w"].tolist() == [0.5, 0.0, -0.5]
    assert a.state.v["w"].tolist() == [1.5625, 0.5625, 1.5625]
    assert a.state.model["w"].tolist() == [0.125, 1.0, 1.875]
    _round(a, 1, [0.125, 2.0, 1.875], [0.125, 1.0, 1.875])
    assert a.state.m["w"].tolist() == [0.25, 0.5, -0.25]
    assert a.state.v["w"].tolist() == [1.5625] * 3
    assert a.state.model["w"].tolist() == [0.1875, 1.125, 1.8125]


def test_fedadam_one_round():
    """η = 0.5, β1 = 0.5, β2 = 0.75, τ = 0.5 (v_{-1} = 0.25).  Δ0 = [0.5, 0.125, -0.5];
    m0 = Δ0/2 = [0.25, 0.0625, -0.25]; v0 = 0.75·0.25 + 0.25·Δ0² = [0.25, 0.19140625, 0.25],
    √v0 = [0.5, 0.4375, 0.5]; x1 = X0 + 0.5 m0/(√v0 + 0.5) = [0.125, 1 + 1/30, 1.875]."""
    a = _algo("fedadam", server_lr=0.5, beta1=0.5, beta2=0.75, tau=0.5)
    _round(a, 0, [0.5, 1.125, 1.5], X0)
    assert a.state.m["w"].tolist() == [0.25, 0.0625, -0.25]
    assert a.state.v["w"].tolist() == [0.25, 0.19140625, 0.25]
    assert a.state.model["w"].tolist() == np.array([0.125, 1 + 1 / 30, 1.875], np.float32).tolist()


def test_fedyogi_one_round():
    """η = 0.5, β1 = 0.5, β2 = 0.75, τ = 0.5.  Δ0 = [0.75, 0, -0.5]; m0 = [0.375, 0, -0.25];
    v0 = v - 0.25 Δ0² sign(v - Δ0²) with v = 0.25: [0.25 + 0.140625 (sign -1), 0.25 (Δ = 0),
    0.25 (sign 0)] = [0.390625, 0.25, 0.25], √v0 = [0.625, 0.5, 0.5];
    x1 = X0 + 0.5 m0/(√v0 + 0.5) = [1/6, 1, 1.875].  (FedAdam would give v0[0] = 0.328125.)"""
    a = _algo("fedyogi", server_lr=0.5, beta1=0.5, beta2=0.75, tau=0.5)
    _round(a, 0, [0.75, 1.0, 1.5], X0)
    assert a.state.m["w"].tolist() == [0.375, 0.0, -0.25]
    assert a.state.v["w"].tolist() == [0.390625, 0.25, 0.25]
    assert a.state.model["w"].tolist() == np.array([1 / 6, 1.0, 1.875], np.float32).tolist()


@pytest.mark.parametrize("name", ["fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_state_round_trips_through_a_checkpoint(name):
    a = _algo(name)
    _round(a, 0, [0.5, 1.25, 1.0], X0)
    arrays, meta = encode(a.state, lambda f: f"state/{f}")
    shapes = Shapes({"w": np.zeros(3, np.float32), "n": np.array(0)}, [(3,)], clients=3)

    def fail(m: str) -> None:
        raise AssertionError(m)
    back, used = decode(type(a.state), arrays, meta, lambda f: f"state/{f}", shapes, fail, fail)
    assert used == set(arrays)
    for f in ("m", "v"):
        assert getattr(back, f).keys() == getattr(a.state, f).keys()
        for k in getattr(a.state, f):
            assert getattr(back, f)[k].tobytes() == getattr(a.state, f)[k].tobytes()


def test_the_rule_comes_from_the_class_not_the_algorithm_name(monkeypatch):
    """A plugin that registers FedAdam under its own name gets Adam, not a silent other rule."""
    from fednet.algorithms import fedopt
    from fednet.algorithms.registry import REGISTRY, get
    from fednet.algorithms.spec import Spec

    adam = get("fedadam")
    monkeypatch.setitem(REGISTRY, "my_adam", Spec("my_adam", "Adam again", adam.server, adam.client,
                                                  adam.params))
    mine, ref = _algo("my_adam", server_lr=0.5, beta1=0.5, beta2=0.75, tau=0.5), \
        _algo("fedadam", server_lr=0.5, beta1=0.5, beta2=0.75, tau=0.5)
    for a in (mine, ref):
        _round(a, 0, [0.5, 1.125, 1.5], X0)
    assert type(mine) is fedopt.FedAdam and mine.state.model["w"].tolist() == \
        ref.state.model["w"].tolist()
    assert mine.state.v["w"].tolist() == [0.25, 0.19140625, 0.25]  # Adam's v, not FedAvgM's
    with pytest.raises(TypeError, match="no server rule of its own"):
        fedopt.FedOpt(small_config(), adam.parse({})).init_state({"w": np.zeros(3, np.float32)})


def test_only_fedseq_builds_a_second_initial_model():
    from fednet.core.session import Session

    cfg = small_config()
    assert Session(cfg, quiet=True, write=False).algo.info.pretrain_init is None
    seq = Session(small_config(algo={"name": "fedseq"}), quiet=True, write=False)
    pre = seq.algo.info.pretrain_init
    assert pre is not None and set(pre) == set(seq.evaluator.initial)
    assert any((pre[k] != seq.evaluator.initial[k]).any() for k in pre)  # another random init


def test_a_staged_hook_on_a_plain_strategy_is_refused_not_ignored():
    from fednet.algorithms.contract import NOT_STAGED, StagedStrategy, Strategy

    with pytest.raises(TypeError, match="Mine defines follow_up, setup_tasks: those are hooks of "
                                        "StagedStrategy"):
        type("Mine", (Strategy,), {"setup_tasks": lambda s, c: [], "follow_up": lambda s, d: []})
    staged = type("Mine", (StagedStrategy,), {"follow_up": lambda s, d: []})
    assert issubclass(staged, Strategy)
    assert (NOT_STAGED.setup_tasks([]), NOT_STAGED.rounds_per_step(), NOT_STAGED.follow_up(None),
            NOT_STAGED.interim_points(), NOT_STAGED.step_end(), NOT_STAGED.virtual_order) == \
        ([], 1, [], [], None, False)


@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_absorb_drops_exactly_the_non_finite_results(bad, dtype):
    """FedAvg's absorb folds a result whose floating arrays are all finite (float32 values near
    the largest included: their float64 sum cannot overflow) and drops one with NaN or inf, as
    common.finite decides; the round's mean is the finite results' only."""
    from fednet.algorithms.common import finite

    algo = build(small_config())
    big = np.finfo(dtype).max / 4
    algo.setup({"w": np.zeros(3, dtype), "n": np.array(7, np.int64)}, trainable={"w"})
    w = np.array([big, big, 1.0], dtype) if dtype == np.float32 else np.array([1.0, 2.0, 3.0],
                                                                                dtype)
    if bad is not None:
        w[1] = bad
    ok = Result(1, 0, 0, {"w": np.array([1.0, 2.0, 3.0], dtype), "n": np.array(9)}, {}, 1)
    other = Result(2, 0, 1, {"w": w, "n": np.array(5)}, {}, 1)
    want = finite(other.arrays)
    for r in (ok, other):
        algo.absorb(r)
    assert algo._finite == {1: True, 2: want}
    assert want == (bad is None)
