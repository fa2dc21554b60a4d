"""Stateless clients' Executors kept between their tasks within a budget (core/executor.
KeptExecutors): fednet local's and each fednet launch client process's (client/trainer.py)."""
from __future__ import annotations

from types import SimpleNamespace

from fednet.client.trainer import Trainer
from fednet.core.executor import KeptExecutors


class _Ex(SimpleNamespace):
    def kept_bytes(self):
        return self.n

    def on_task(self, msg, nbytes):
        return "outcome"

    def sender_link(self, msg):
        return None


def test_the_least_recently_kept_leave_first_and_one_too_big_is_not_kept():
    k = KeptExecutors(keep_bytes=100)
    for cid in range(4):
        k.keep(_Ex(cid=cid, n=30))
    assert list(k.kept) == [1, 2, 3] and k.kept_bytes == 90
    assert k.take(2).cid == 2 and k.kept_bytes == 60 and k.take(2) is None
    k.keep(_Ex(cid=9, n=101))
    assert 9 not in k.kept
    k.clear()
    assert not k.kept and k.kept_bytes == 0


def test_a_process_clients_stateless_executor_is_kept_for_its_next_task_stateful_is_not():
    k = KeptExecutors()
    t = Trainer(5, "cpu", k)  # a client of a process of several
    assert t.drop_idle and t.kept is k
    stateless = _Ex(cid=5, n=10, holds_state=False, stateful=False, run_id="", links=None,
                    availability=None)
    t.train(stateless, None, 0)
    assert t.executor is None and k.take(5) is stateless
    k.keep(stateless)
    t.build = ("cfg", None)
    assert t.executor_now() is stateless and not k.kept  # reused, not rebuilt
    stateful = _Ex(cid=5, n=10, holds_state=False, stateful=True)
    t.train(stateful, None, 0)
    assert t.executor is None and not k.kept  # its state is in the run's store
