"""server/fates.Fates: deaths, BYEs and clean exits as columns over the run's ids."""
from __future__ import annotations

import numpy as np

from fednet.server.fates import Fates


def test_deaths_are_recorded_once_with_their_round_and_reason():
    f = Fates(10)
    new = f.die(np.array([1, 2, 3]), "process exited with code -9", 4, False)
    assert new.tolist() == [1, 2, 3] and f.dead_count == 3
    assert f.die(np.array([3, 4]), "connection lost", 5, False).tolist() == [4]
    assert f.reason(3) == "process exited with code -9" and f.reason(4) == "connection lost"
    assert f.died[3] == 4 and f.reason(0) == "" and not f.is_dead(0)
    assert f.dead() == {1: f.reason(1), 2: f.reason(1), 3: f.reason(1), 4: "connection lost"}
    assert len(f.reasons) == 2  # each distinct reason once, however many clients
    f.revive([2, 7])
    assert f.dead_ids().tolist() == [1, 3, 4] and f.dead_count == 3


def test_a_clean_exit_is_one_after_bye_or_a_code_0_exit_after_shutdown():
    f = Fates(6)
    f.bye(np.array([0, 1]), {"control": 5})
    f.die(np.array([0, 1, 2]), "process exited with code 1", 2, False)  # 0, 1 said BYE
    f.die(np.array([3]), "process exited with code 0", 2, True)  # after SHUTDOWN
    f.die(np.array([4]), "process exited with code 0", 2, False)  # before: not normal
    assert f.clean.tolist() == [True, True, False, True, False, False]
    rows = f.unclean({4})
    assert [r["client"] for r in rows] == [2]
    assert rows[0] == {"round": 2, "client": 2, "task": None,
                       "reason": "client died: process exited with code 1"}


def test_byes_keep_totals_with_the_first_id_and_say_who_waits_to_exit():
    f = Fates(5)
    f.bye(np.array([1, 2, 3]), {"control": 7})
    assert f.byes() == {1: {"control": 7}, 2: {}, 3: {}} and f.bye_count() == 3
    f.die(np.array([2]), "process exited with code 0", 0, True)
    assert f.waiting_exit().tolist() == [1, 3]
