"""Issue 52 item 2: DP-SGD's own work on the clock, counted (never timed): its batches' FLOPs
through the per-example path and one Gaussian draw per trained value a step."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("opacus")

from fednet.models import build_model  # noqa: E402
from fednet.network.latency import compute_time  # noqa: E402
from fednet.network.profiles import Profile  # noqa: E402
from fednet.opcount import DISPATCH  # noqa: E402
from fednet.training import flops  # noqa: E402
from fednet.training.dpsgd import train_private  # noqa: E402
from fednet.training.local import train  # noqa: E402
from fednet.training.optim import OptimSpec  # noqa: E402


def _run(how: str, noise: float = 1.0) -> tuple[flops.Meter, int]:
    torch.manual_seed(0)
    model = build_model("mclr", 10, (1, 8, 8), seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn((40, 1, 8, 8), generator=g), torch.randint(0, 10, (40,), generator=g)
    with flops.metered() as m:
        if how == "dpsgd":
            st = train_private(model, x, y, epochs=1, batch_size=8,
                               spec=OptimSpec("sgd", 0.05, 0.0, 0.0, nesterov=False),
                               generator=torch.Generator().manual_seed(1),
                               noise_generator=torch.Generator().manual_seed(2), noise=noise,
                               clip=1.0)
        else:
            st = train(model, x, y, epochs=1, batch_size=8, lr=0.05,
                       generator=torch.Generator().manual_seed(1))
    return m, st.steps


def test_dpsgd_charges_its_noise_draws_and_its_per_example_path():
    dp, steps = _run("dpsgd")
    values = sum(p.numel() for p in build_model("mclr", 10, (1, 8, 8), seed=0).parameters())
    calls = dp.ops.pop(DISPATCH)  # the batches' dispatched operations
    assert steps == 5 and dp.ops == {"noise": steps * values}
    assert set(_run("dpsgd", noise=0.0)[0].ops) == {DISPATCH}  # no noise, no draws
    plain, _ = _run("plain")
    assert set(plain.ops) == {DISPATCH} and dp.flops > plain.flops  # per-example gradients
    assert calls > 2 * plain.ops[DISPATCH]  # Opacus's hooks dispatch far more operations
    p = Profile(train_flops_per_s=1e9, noise_per_s=1e7, s_per_op=1e-5)
    sim = compute_time(p, 40, dp.flops, {**dp.ops, DISPATCH: calls})
    assert sim == pytest.approx(dp.flops / 1e9 + calls * 1e-5 + steps * values / 1e7)
    again, _ = _run("dpsgd")  # the same task, the same seconds: nothing is timed
    assert compute_time(p, 40, again.flops, again.ops) == sim


def test_local_dp_charges_one_noise_draw_a_noised_value():
    """--dp local (algorithms/dp_client.py): the client's noise is on its task's meter, one
    opcount "noise" draw per floating value it sends, beside its training's batches."""
    import numpy as np

    from fednet.core.executor import Executor
    from fednet.models.arrays import state_arrays
    from fednet.network import latency
    from fednet.types import Task
    from tests.conftest import small_config

    cfg = small_config(clients=3, dp={"mode": "local", "noise": 1.0, "clip": 1.0})
    ex = Executor(0, cfg, latency.profiles(cfg.latency, cfg.clients, cfg.seed)[0], files=False)
    arrays = {k: np.array(a, copy=True) for k, a in state_arrays(ex._initial()).items()}
    floating = sum(a.size for a in arrays.values() if np.issubdtype(a.dtype, np.floating))
    with flops.metered() as m:
        ex.update.run(ex.ctx, Task(1, 0, [0], arrays, {"epochs": 1, "lr": 0.1}))
    assert m.ops.get("noise") == floating and m.batches > 0
