"""Every fingerprinted dashboard row reproduces at HEAD (issue 55 item 1): each recipe kept in
benchmarks/results/*.json (a 2-round re-run of a row's seed-0 cell, benchmarks/benchlib/
fingerprint.py) is run again and must give the figures its file recorded, bit for bit. A failure
names the rows the code moved: re-measure them in the same change (then `python3
benchmarks/dashboard.py --fingerprints` records HEAD's paths), or say in their file why they
are "stale". The slow lane: about a minute here."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))


def _recipes() -> dict[str, dict]:
    """Each distinct recipe (by its command) of the files that are not stale: the fingerprint
    as recorded, and the rows that rest on it."""
    out: dict[str, dict] = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("stale") or not data.get("fingerprints"):
            continue
        for name, fp in data["fingerprints"].items():
            rows = [r["metric"] for r in data.get("headline", [])
                    if name in (r.get("fingerprint") or [])]
            entry = out.setdefault(fp["command"], {"fp": fp, "rows": []})
            assert fp.get("fields") == entry["fp"].get("fields"), \
                f"{fp['command']}: fingerprinted with other fields in {path.name}"
            entry["rows"] += [f"{path.name}: {m}" for m in rows]
    return out


RECIPES = _recipes()


def test_the_dashboard_has_fingerprints_to_check():
    assert len(RECIPES) >= 20, sorted(RECIPES)
    for command, entry in RECIPES.items():
        assert entry["rows"], f"{command}: no dashboard row names this fingerprint"


def test_a_clockless_path_leaves_only_the_simulated_time_out():
    from benchlib.fingerprint import CLOCKLESS, fields_of, path_of

    r = {"round": 0, "accuracy": 0.5, "loss": 1.0, "bytes_total": 10, "sim_s": 0.1,
         "client_epochs": 2}
    later = {**r, "sim_s": 0.2}
    assert path_of([r], CLOCKLESS) == path_of([later], CLOCKLESS)
    assert path_of([r]) != path_of([later])  # rows that report simulated time see the clock
    for k, v in (("accuracy", 0.51), ("loss", 1.01), ("bytes_total", 11), ("client_epochs", 3)):
        assert path_of([{**r, k: v}], CLOCKLESS) != path_of([r], CLOCKLESS), k
    assert fields_of({"fields": list(CLOCKLESS)}) == CLOCKLESS and "sim_s" in fields_of({})


def test_each_recorded_command_is_its_recipe():
    """The command a row prints is the run its fingerprint re-runs: typed at `fednet local`, it
    gives the configuration the recipe's fednet.api.run keywords give (no run; a keyword whose
    option is spelled otherwise, eval_mode as --eval, params as --param k=v, is the case)."""
    import shlex

    from fednet.api import _argument, options
    from fednet.cli import local

    known = options()
    for command, entry in RECIPES.items():
        words = shlex.split(command)
        assert words[:2] == ["fednet", "local"], command
        typed = dict(local.make_context("local", words[2:]).params)
        given = dict(local.make_context("local", []).params)
        given.update({k: _argument(k, v, known[k]) for k, v in entry["fp"]["recipe"].items()})
        assert typed == given, command


def _other_machine(command: str, recorded: str) -> str:
    from benchlib.fingerprint import ALTERNATES, translation

    if command in translation():
        return ""
    return (f"\nNo translation of this recipe for this machine's environment in benchmarks/"
            f"{ALTERNATES}: if only the last bits of losses differ, the rows were measured on "
            "another kind of CPU; record this one with `python3 benchmarks/dashboard.py "
            "--fingerprint-alternates` at a commit where the recorded paths hold (CI passed).")


def test_a_translation_applies_only_to_the_path_it_was_recorded_for():
    from benchlib.fingerprint import expected_here

    table = {"fednet local --x": {"recorded": "aaaa", "here": "bbbb"}}
    assert expected_here("fednet local --x", "aaaa", table) == "bbbb"
    assert expected_here("fednet local --x", "cccc", table) == "cccc"  # re-measured since
    assert expected_here("fednet local --y", "aaaa", table) == "aaaa"


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(RECIPES))
def test_a_fingerprint_reproduces_at_head(command, monkeypatch):
    from benchlib.fingerprint import expected_here, fields_of, take, translation

    monkeypatch.chdir(ROOT)  # a recipe's --plugin benchmarks/... is relative to the repository
    entry = RECIPES[command]
    now = take(entry["fp"]["recipe"], fields_of(entry["fp"]))
    want = expected_here(command, entry["fp"]["path"], translation())
    if now["path"] != want:
        diff = next(((i, a, b) for i, (a, b) in enumerate(zip(entry["fp"]["rounds"],
                                                              now["rounds"])) if a != b), None)
        pytest.fail("the code moved these dashboard rows (re-measure them in this change):\n  "
                    + "\n  ".join(entry["rows"]) + f"\nrecipe: {command}\nrecorded path "
                    f"{entry['fp']['path']} (here: {want}), now {now['path']}; first differing "
                    f"round: {diff}" + _other_machine(command, entry["fp"]["path"]))
