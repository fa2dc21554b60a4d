"""Golden numbers: every algorithm's small digits run gives exactly the pinned results.

The runs, the hashing and the pinned file come from benchmarks/golden.py (loaded by path);
tests/golden/README.md says what is pinned and how to regenerate it.
"""
from __future__ import annotations


import pytest
import torch

from fednet.algorithms.checks import algorithms as _algorithms

from tests.harness import golden

ALGORITHMS = _algorithms()
PINNED = golden.load()
EXPECTED, WHICH = golden.pinned_for(PINNED, golden.environment())

REGENERATE = ("If, and only if, this change of the numbers is intended, regenerate them with "
              "`python benchmarks/golden.py --write` and explain in the commit message why they "
              "changed; otherwise the change is a regression. `python benchmarks/golden.py` "
              "prints the same diff for every algorithm.")


def _environment_note() -> str:
    notes = golden.diff(PINNED["environment"], golden.environment(), "environment.")
    if not notes or WHICH != "the main pin":
        return ""
    return ("\nNote: the numbers were pinned on another environment, which can change the last "
            "bits of float results by itself:\n  " + "\n  ".join(notes) + "\nIf only "
            "float results differ, pin this environment beside it with `python "
            "benchmarks/golden.py --write-env` (it checks that everything else is equal).")


def test_every_algorithm_of_the_cli_is_pinned():
    from fednet.cli import local

    choices = next(p for p in local.params if p.name == "algo").type.choices
    assert sorted(choices) == sorted(ALGORITHMS)
    assert sorted(PINNED["algorithms"]) == sorted(golden.keys()), (
        "tests/golden/golden.json does not cover the algorithms `fednet local --algo` offers "
        "(and the VARIANTS); add the new one to EXTRA in benchmarks/golden.py and regenerate "
        "(--write)")


@pytest.mark.parametrize("algo", golden.keys())
def test_pinned_run_is_not_trivial(algo):
    """The pinned scenario exercises the algorithm (superclients, slots, splits, mixing)."""
    assert golden.scenario_problems(algo, PINNED["algorithms"][algo]) == []


@pytest.mark.parametrize("algo", golden.keys())
def test_golden(algo, tmp_path):
    want = dict(EXPECTED[algo])
    pinned_command = want.pop("command")
    assert pinned_command == golden.command(algo), (
        f"{algo}: the settings in benchmarks/golden.py changed since the numbers were pinned "
        f"({pinned_command!r} -> {golden.command(algo)!r}); regenerate with "
        "`python benchmarks/golden.py --write`")
    threads = golden.config(algo, str(tmp_path / "x")).train.threads
    got = golden.run(algo, tmp_path / algo)
    # run_local sets the run's torch threads (1, like every client process and conftest's fixture)
    assert torch.get_num_threads() == threads == 1
    unpinned = [k for k in golden.FLOAT_KEYS if want.get(k, "") is None and got.get(k) is not None]
    for k in unpinned:  # a run pinned on another environment only: its floats not known here
        got.pop(k)
        want.pop(k)
    lines = golden.diff(want, got)
    assert not lines, (f"{algo}: the golden run ({pinned_command}) no longer gives the pinned "
                       "numbers (pinned -> now):\n  " + "\n  ".join(lines) + "\n" + REGENERATE
                       + _environment_note())
