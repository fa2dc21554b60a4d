"""The clients' store checked before a resumed run starts (--resume on the server's disk).

The checkpoint's manifest (state_files.Manifest) names the round of the state file each client
takes when the run goes on; every file of the store is read here as the client would read it
(no link followed, a plain archive within its bound, its tags, the algorithm's client state,
every floating array finite),
and the file each client will take must be of exactly that round. The first problem is one
ConfigError naming the file; nothing is changed.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from fednet.algorithms.state import Shapes
from fednet.core import state_files
from fednet.core.checkpoint import ResumeCheck
from fednet.types import Arrays


def check_store(run_dir: Path, state: dict[str, Any], cls: type, shapes: Shapes,
                bound: Callable[[int], int], codec: Callable[[Arrays], None]) -> None:
    """Every file of the clients' store (on this disk) before a resumed run starts: each one
    readable (no link followed, a plain archive within its `bound(cid)` bytes), of its client,
    this algorithm and this run (its lineage), its arrays those of the algorithm's client state
    (`cls`, `shapes`; `codec`: the --compress residual's check); and the file each client will
    take (state_files.chosen) of exactly the round the checkpoint's manifest names. A
    ConfigError names the first file that is not."""
    chk = ResumeCheck(run_dir)
    manifest: state_files.Manifest | None = state.get("_manifest")
    algorithm, ckpt = state["algorithm"], state["rounds_done"]
    lineage = state.get("lineage")
    want = manifest.rounds if manifest is not None else {}
    held = {int(c) for c in state.get("clients", {})}  # fednet local kept these in state.npz
    for cid, mark in sorted(state_files.unsaved_marks(run_dir).items()):
        chk.need(cid in held, mark, f"client {cid}'s state could not be written during the run "
                 "(a full disk?), so this checkpoint cannot restore it; start a new run with --out")
    for cid in sorted(state_files.stored_cids(run_dir) | set(want)):
        rounds = [_check_file(chk, path, cid, algorithm, lineage, cls, shapes, bound(cid), codec)
                  for path in state_files.files_of(run_dir, cid)]
        got = max((r for r in rounds if r < ckpt), default=None)
        if manifest is None or got == want.get(cid):
            continue
        name = state_files.client_name(cid)
        if want.get(cid) is None:
            chk.fail(run_dir / "checkpoint" / "clients" / f"{name}.npz",
                     f"client {cid} has a state of round {got} that the checkpoint does not know "
                     "(it had none then)")
        chk.fail(run_dir / "checkpoint" / "clients" / f"{name}.npz",
                 f"the checkpoint needs client {cid}'s state of round {want[cid]}, and its files"
                 f" hold {'no such state' if got is None else f'round {got} instead'}")


def _check_file(chk: ResumeCheck, path: Path, cid: int, algorithm: str, lineage: str | None,
                cls: type, shapes: Shapes, bound: int, codec: Callable[[Arrays], None]) -> int:
    """One store file checked as StateStore.take and Executor.take_back read it; its round."""
    try:
        arrays, meta = state_files.read(path, bound)
        state_files.check_tags(path, meta, cid, algorithm, lineage)
        codec(arrays)

        def fail(problem: str) -> NoReturn:
            raise ValueError(f"{path}: {problem}")
        state_files.decode_client(cls, arrays, meta, shapes, fail, finite=True)
    except ValueError as e:
        chk.fail(path, str(e).removeprefix(f"{path}: "))
    return int(meta["round"])
