"""platform/heap.settled_heap: a run's long-lived objects out of the collector's passes, given back
after; and the round driver settles them (a run's objects stay frozen while it runs)."""
from __future__ import annotations

import gc
import weakref

from fednet.platform.heap import settled_heap


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settled_objects_are_skipped_then_given_back() -> None:
    assert gc.get_freeze_count() == 0
    with settled_heap() as settle:
        assert gc.get_freeze_count() == 0  # nothing frozen until settle()
        old = _Cycle()
        settled = weakref.ref(old)
        settle()
        assert gc.get_freeze_count() > 1000  # every object alive (the imports' among them)
        del old  # garbage now, but frozen: no pass sees it
        gc.collect()
        assert settled() is not None
        young = _Cycle()
        made_after = weakref.ref(young)
        del young
        gc.collect()
        assert made_after() is None  # garbage made after settle() is collected as usual
    assert gc.get_freeze_count() == 0  # given back on leaving...
    gc.collect()
    assert settled() is None  # ...and the cycle frozen with them is collected now


def test_objects_frozen_before_stay_frozen() -> None:
    """A zygote's child holds its parent's frozen objects: leaving does not give them back."""
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with settled_heap() as settle:
            settle()
        assert gc.get_freeze_count() >= before
    finally:
        gc.unfreeze()


def test_a_run_settles_its_objects(tmp_path) -> None:
    """fednet local: frozen during the rounds (after the setup and the first step), none left
    after the run."""
    from fednet.config import RunConfig
    from fednet.core import rounds
    from fednet.core.inproc import run_local

    seen: list[int] = []
    real = rounds.RoundDriver._step

    def step(self, rnd, step_, dispatcher):  # noqa: ANN001
        seen.append(gc.get_freeze_count())
        return real(self, rnd, step_, dispatcher)

    cfg = RunConfig(clients=4, rounds=3, seed=0)
    rounds.RoundDriver._step = step  # type: ignore[method-assign]
    try:
        run_local(cfg, quiet=True, write=False)
    finally:
        rounds.RoundDriver._step = real  # type: ignore[method-assign]
    assert len(seen) == 3 and all(n > 1000 for n in seen)
    assert seen[1] > seen[0]  # the first step's objects settled too
    assert gc.get_freeze_count() == 0
