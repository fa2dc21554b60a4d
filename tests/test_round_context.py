"""The Strategy's round context (issue 37): the runtime passes it to start_round, the Strategy
reads the step's time and availability from it and answers the results the step needs."""
from __future__ import annotations

from fednet.algorithms.contract import RoundContext
from fednet.algorithms import build
from fednet.types import ClientInfo
from tests.conftest import small_config


def _clients(n):
    return [ClientInfo(c, 10) for c in range(n)]


def test_start_round_keeps_the_context_and_picks_answer_in_it():
    cfg = small_config(clients=10, algo={"fraction": 0.5}, latency={"over_select": 1.5})
    algo = build(cfg)
    online = lambda cid, t: cid % 2 == 0  # noqa: E731
    ctx = RoundContext(3, now=12.5, online=online)
    tasks = algo.start_round(ctx, _clients(10))
    assert algo.ctx is ctx and algo.now == 12.5 and algo.online is online
    assert ctx.target == 5 and algo.target == 5  # 5 results needed,
    assert len(tasks) == 8 and all(t.round == 3 for t in tasks)  # ceil(1.5 x 5) selected
    nxt = RoundContext(4)
    algo.start_round(nxt, _clients(10))
    assert algo.now == 0.0 and ctx.target == 5 and nxt.target == 5  # each step its own


def test_a_wrapped_strategy_answers_in_the_drivers_context():
    """Secure aggregation wraps the inner algorithm: the inner's picks answer in the context the
    driver passed to the wrapper."""
    cfg = small_config(clients=6, algo={"fraction": 0.5}, net={"secagg": "full"})
    algo = build(cfg)
    ctx = RoundContext(0, now=2.0)
    algo.start_round(ctx, _clients(6))
    assert type(algo).__name__ == "SecAggServer" and ctx.target == 3 and algo.now == 2.0
