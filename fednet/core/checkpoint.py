"""Atomic checkpoints of a run's state and resuming from them (--checkpoint-every, --resume).

A checkpoint is RUN/checkpoint/{state.npz, state.json}: the algorithm's server state (its typed
State dataclass, stored generically by algorithms/state.py: the model as model/<entry>, other
array fields as state/<field>/..., JSON fields under "algo"), the rounds done, the simulated time,
the ledger totals and the failures so far. The clients' state (their typed ClientUpdate state,
and personal models) is part of it too: it is the clients' store, RUN/checkpoint/clients/, one
file per client written after each of its tasks by whichever process ran it (`fednet local`, or
a client process of `fednet launch`/`fednet clients` on its host; core/state_files.py), which
the swap below carries over. Only a state that no store could hold (no results folder, a store
that could not be written) is put in state.npz, as client/<cid>/<field>/... and
client/<cid>/model/<entry>; `fednet local` resumes those too. Randomness needs no saving: every
draw comes from (seed, purpose, round, client). The server's files are written to a temporary
folder (each file fsynced) and renamed into place, so a crash leaves either the old or the new
checkpoint (a crash between the two renames leaves checkpoint.old, which --resume then reads).

A checkpoint is checked before a resumed run writes anything: read() checks the files and the
numbers against the run's configuration, load() also every array and JSON field against the
algorithm's state classes and the model (names, shapes, dtypes, client ids), every floating
array finite, and the values the algorithm checks itself (resume_problem: differential
privacy's events and counts against the rounds done, the run's mechanism and noise, the tasks
each client was given and the last row's epsilon; clip norms; FedOpt's second moments). Anything
wrong is a ConfigError naming the file.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard

import numpy as np

from fednet.algorithms.contract import ClientUpdate, Strategy
from fednet.algorithms.robust import center_problem
from fednet.algorithms.state import Shapes, check_model, decode, encode
from fednet.core import participants, state_files
from fednet.core.status import ENDED
from fednet.config import RunConfig
from fednet.errors import ConfigError
from fednet.metrics.accounting import Ledger
from fednet.metrics.files import OutputError, atomic_file, fsync_dir, write_text

if TYPE_CHECKING:
    from fednet.core.rounds import RoundDriver

Arrays = dict[str, np.ndarray]
# Totals every checkpoint has; the ledger may add others (checked against Ledger().totals())
LEDGER_KEYS = frozenset({"server_to_client", "client_to_server", "client_to_client",
                         "tensor_bytes", "header_bytes", "control"})
ClientStates = dict[int, tuple[Any, "Arrays | None"]]  # cid -> (typed state, personal model)


def _server_prefix(name: str) -> str:
    return "model" if name == "model" else f"state/{name}"


def save(out: Path, algo: Strategy, driver: RoundDriver, clients: ClientStates | None = None,
         ledger: dict[str, int] | None = None, lineage: str = "",
         manifest: state_files.Manifest | None = None) -> None:
    """Write RUN/checkpoint atomically; a disk error is an OutputError and the old one stays.
    `clients` (fednet local): the client states that no store holds, put in state.npz;
    `ledger`: the byte totals to record (default: the ledger's now); `lineage`: the run's id
    that its sessions share (core/state_files.lineage); `manifest`: the clients' store on this
    disk, brought up to date here (state_files.Manifest; None: no store, or not on this disk)."""
    arrays, meta = encode(algo.state, _server_prefix)
    arrays.update(driver.participants.arrays())
    client_meta = _client_arrays(clients, arrays)
    state = {"rounds_done": driver.rounds_done, "sim_time": driver.sim_time,
             "ledger": ledger or driver.ledger.totals(), "failures": driver.failures,
             "segments": driver.clock.all_segments(driver.rounds_done),
             "setup": driver.setup_stats, "rows": len(driver.history.rows), "algo": meta,
             "algorithm": algo.cfg.algo.name,
             "client_state": "checkpoint" if clients is not None else "files",
             "store": "manifest" if manifest is not None else "elsewhere",
             **({"lineage": lineage} if lineage else {}),
             **({"clients": client_meta} if clients is not None else {})}
    text = json.dumps(state, default=float)
    tmp, final, old = out / "checkpoint.tmp", out / "checkpoint", out / "checkpoint.old"
    target = final if final.is_dir() else old  # the folder --resume reads now
    gather_clients(out, target)
    if manifest is not None:  # the files a session resumed from here takes, by their tags
        manifest.refresh(out, driver.rounds_done)
        arrays.update(manifest.arrays())
    shutil.rmtree(tmp, ignore_errors=True)
    if target is final:
        shutil.rmtree(old, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise OutputError(tmp, e) from None
    try:
        with atomic_file(tmp / "state.npz") as fh:
            np.savez(fh, allow_pickle=False, **arrays)  # (numbers only)
        write_text(tmp / "state.json", text)
        fsync_dir(tmp)
        if (target / "clients").is_dir():  # the clients' own files move with the checkpoint
            os.replace(target / "clients", tmp / "clients")
        try:
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
        except OSError as e:
            if old.exists() and not final.exists():
                os.replace(old, final)  # put the previous checkpoint back
            raise OutputError(final, e) from None
        fsync_dir(out)
    finally:
        back = final if final.is_dir() else old
        if (tmp / "clients").is_dir() and back.is_dir() and not (back / "clients").exists():
            os.replace(tmp / "clients", back / "clients")  # a failed write keeps them
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def _client_prefix(cid: int) -> Callable[[str], str]:
    """The key of client cid's state array `n` in the checkpoint."""
    return lambda n: f"client/{cid}/{n}"


def _client_arrays(clients: ClientStates | None, arrays: Arrays) -> dict[str, Any]:
    """The client states no store holds (fednet local) into `arrays`; their JSON fields."""
    client_meta: dict[str, Any] = {}
    for cid, (st, model) in sorted((clients or {}).items()):
        a, m = encode(st, _client_prefix(cid))
        arrays.update(a)
        arrays.update({f"client/{cid}/model/{k}": v for k, v in (model or {}).items()})
        client_meta[str(cid)] = m
    return client_meta


def gather_clients(out: Path, target: Path) -> None:
    """Move client files left in another checkpoint folder by a crash into target/clients
    (the newer file wins where both have one)."""
    dst = target / "clients"
    for src in state_files.client_dirs(out):
        if src == dst or not src.is_dir():
            continue
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            there = dst / f.name
            if not there.exists() or f.stat().st_mtime > there.stat().st_mtime:
                os.replace(f, there)
        shutil.rmtree(src, ignore_errors=True)


class ResumeCheck:
    """Raises ConfigError('--resume RUN: FILE: problem')."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def fail(self, path: Path, problem: str) -> NoReturn:
        raise ConfigError(f"--resume {self.run_dir}: {path}: {problem}")

    def need(self, ok: bool, path: Path, problem: str) -> None:
        if not ok:
            self.fail(path, problem)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _folder(run_dir: Path) -> Path:
    """RUN/checkpoint, or checkpoint.old when the writer died between its two renames (a folder
    that holds only the clients' files is no checkpoint)."""
    for d in (run_dir / "checkpoint", run_dir / "checkpoint.old"):
        if (d / "state.json").exists() or (d / "state.npz").exists():
            return d
    raise ConfigError(f"--resume {run_dir}: no checkpoint there (runs write one with "
                      "--checkpoint-every N)")


def _read_json(chk: ResumeCheck, path: Path) -> dict[str, Any]:
    chk.need(path.is_file(), path, "missing")
    try:
        state = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        chk.fail(path, f"not valid JSON ({e})")
    chk.need(isinstance(state, dict), path, "not a JSON object")
    return state


def _read_npz(chk: ResumeCheck, path: Path) -> Arrays:
    chk.need(path.is_file(), path, "missing")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}  # reading every member checks its CRC
    except Exception as e:  # noqa: BLE001 - zipfile, format and pickle errors alike
        chk.fail(path, f"damaged or not an .npz file ({type(e).__name__}: {e})")
    for k, a in arrays.items():
        chk.need(a.dtype.kind in "biufc", path, f"array '{k}' has dtype {a.dtype}, not numbers")
    return arrays


def _check_state(chk: ResumeCheck, path: Path, s: dict[str, Any], cfg: RunConfig) -> None:
    name = s.get("algorithm")
    chk.need(name == cfg.algo.name, path,
             f"a checkpoint of algorithm {name!r}, this run is {cfg.algo.name!r}")
    rd = s.get("rounds_done")
    if not (_is_int(rd) and rd >= 0):
        chk.fail(path, f"rounds_done must be a whole number >= 0 (got {rd!r})")
    chk.need(rd <= cfg.rounds, path, f"rounds_done is {rd}, more than --rounds {cfg.rounds} "
                                     f"(resume with --rounds {rd} or more)")
    t = s.get("sim_time")
    chk.need(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
             and t >= 0, path, f"sim_time must be a finite number >= 0 (got {t!r})")
    ledger = s.get("ledger")
    if not isinstance(ledger, dict):
        chk.fail(path, "the byte ledger is missing")
    missing = sorted(LEDGER_KEYS - set(ledger))
    chk.need(not missing, path, f"the byte ledger lacks {', '.join(missing)}")
    unknown = sorted(set(ledger) - LEDGER_KEYS - set(Ledger().totals()))
    chk.need(not unknown, path, f"the byte ledger has an unknown key {unknown[0] if unknown else ''!r}")
    bad = sorted(k for k, v in ledger.items() if not (_is_int(v) and v >= 0))
    chk.need(not bad, path, f"ledger '{bad[0] if bad else ''}' must be a whole number >= 0")
    rows = s.get("rows")
    chk.need(_is_int(rows) and rows >= 0, path, f"rows must be a whole number >= 0 (got {rows!r})")
    f = s.get("failures", [])
    chk.need(isinstance(f, list) and all(isinstance(x, dict) for x in f), path,
             "failures must be a list of objects")
    chk.need(isinstance(s.get("setup", {}), dict), path, "setup must be an object")
    meta = s.get("algo")
    if not isinstance(meta, dict):
        chk.fail(path, "the algorithm's state ('algo') is missing")
    nt = meta.get("next_task", 0)
    chk.need(_is_int(nt) and nt >= 0, path, f"algo.next_task must be a whole number >= 0 (got {nt!r})")
    groups = meta.get("superclients", [])
    chk.need(isinstance(groups, list) and all(
        isinstance(g, list) and all(_is_int(c) and 0 <= c < cfg.clients for c in g) for g in groups),
        path, f"algo.superclients must be lists of client ids in 0..{cfg.clients - 1}")


def _check_metrics(chk: ResumeCheck, run_dir: Path, rows: int) -> dict[str, Any] | None:
    """The first `rows` rows of metrics.jsonl checked; the last of them (None: no rows)."""
    path = run_dir / "metrics.jsonl"
    chk.need(path.is_file(), path, f"missing (the checkpoint keeps its first {rows} rows)")
    kept: list[Any] = []
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
        kept = [json.loads(x) for x in lines[:rows]]
        ok = all(isinstance(x, dict) for x in kept)
    except (OSError, ValueError):
        ok = False
    chk.need(ok, path, f"its first {rows} rows are not all JSON objects")
    chk.need(len(lines) >= rows, path, f"{len(lines)} rows, the checkpoint needs its first {rows}")
    return kept[-1] if kept else None


def finished_rounds(run_dir: Path) -> tuple[int, str] | None:
    """(rounds, status) of RUN/summary.json when the run ended by itself there
    (RunStatus.ended_by_itself), else None."""
    try:
        s = json.loads((run_dir / "summary.json").read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(s, dict) or s.get("status") not in ENDED or not _is_int(s.get("rounds")):
        return None
    return int(s["rounds"]), str(s["status"])


def _check_history(chk: ResumeCheck, run_dir: Path, state: dict[str, Any], cfg: RunConfig) -> None:
    """A resume never replaces rounds a run finished: a run that ended after more rounds than
    its checkpoint holds (an older checkpoint), or a --rounds below what it did, is refused; so
    is a completed run resumed with no more rounds to run."""
    done = finished_rounds(run_dir)
    if done is None:
        return
    rounds, status = done
    at = state["rounds_done"]
    if rounds > at:
        chk.fail(run_dir / "summary.json",
                 f"this run ended ({status}) after {rounds} rounds and its checkpoint is at round {at}: "
                 f"resuming would replace rounds {at + 1}-{rounds}; start a new run with --out")
    if rounds > cfg.rounds:
        chk.fail(run_dir / "summary.json",
                 f"this run ended ({status}) after {rounds} rounds; --rounds {cfg.rounds} would cut it "
                 f"(give --rounds {rounds} or more)")
    if status == "completed" and rounds == cfg.rounds:
        chk.fail(run_dir / "summary.json",
                 f"this run completed its {rounds} rounds: nothing to resume (give --rounds "
                 f"{rounds + 1} or more to continue it)")


def read(run_dir: str | Path, cfg: RunConfig) -> tuple[Arrays, dict[str, Any]]:
    """The arrays and state of RUN/checkpoint, checked against the run (no algorithm needed);
    a ConfigError naming --resume and the file when absent or damaged, or when resuming from it
    would replace rounds the run finished (_check_history)."""
    run_dir = Path(run_dir)
    chk = ResumeCheck(run_dir)
    d = _folder(run_dir)
    state = _read_json(chk, d / "state.json")
    arrays = _read_npz(chk, d / "state.npz")
    _check_state(chk, d / "state.json", state, cfg)
    _check_history(chk, run_dir, state, cfg)
    state["_last_row"] = _check_metrics(chk, run_dir, state["rows"])
    return arrays, state


def load(run_dir: str | Path, algo: Strategy, cfg: RunConfig, shapes: Shapes,
         client: type[ClientUpdate], local: bool) -> tuple[dict[str, Any], ClientStates]:
    """read(), then every array and JSON field checked against the algorithm's state classes
    and the model; the server state is restored into algo. Returns the checkpoint's state and,
    for `fednet local`, each client's (typed state, personal model). `client` is the client
    half's class (its State and keeps_model)."""
    run_dir = Path(run_dir)
    arrays, state = read(run_dir, cfg)
    chk, d = ResumeCheck(run_dir), _folder(run_dir)
    npz, js = d / "state.npz", d / "state.json"
    fail = lambda m: chk.fail(npz, m)  # noqa: E731
    fail_json = lambda m: chk.fail(js, m)  # noqa: E731
    server, used = decode(type(algo.state), arrays, state["algo"], _server_prefix, shapes, fail,
                          fail_json, finite=True)
    for k in sorted(set(arrays) - used - set(STORE_KEYS) - set(participants.KEYS)):
        chk.need(k.startswith("client/"), npz, f"array '{k}' does not belong to this model")
    state["_manifest"] = _manifest(chk, npz, arrays, state, cfg)
    state["_participants"] = participants.Participants.of(
        arrays, cfg.clients, lambda ok, problem: chk.need(ok, npz, problem))
    _check_values(chk, npz, js, algo, server, state)
    clients = _clients(chk, npz, js, arrays, state, shapes, client.State)
    saved = state.get("client_state", "files")
    if client.stateful() and saved == "checkpoint" and not local:
        chk.fail(js, "the clients' state of this run is kept in this checkpoint by fednet local;"
                 " resume it with fednet local")
    algo.state = server
    return state, clients


def _check_values(chk: ResumeCheck, npz: Path, js: Path, algo: Strategy, server: Any,
                  state: dict[str, Any]) -> None:
    """The values of the decoded server state, beyond their shapes: the centered-clipping
    center one float64 per floating model value (robust.center_problem), then the algorithm's
    own checks (`resume_problem(server, rounds_done, participants, last_row)`: differential
    privacy's accounting, FedOpt's moments), each ConfigError naming the file it blames."""
    center = getattr(server, "center", None)
    if center is not None:
        why = center_problem(center, server.model)
        chk.need(not why, npz, why)
    check = getattr(algo, "resume_problem", None)
    if check is None:
        return
    blame = check(server, state["rounds_done"], state["_participants"], state["_last_row"])
    if blame:
        where, why = blame
        chk.fail(js if where == "json" else npz, why)


STORE_KEYS = ("store/cids", "store/rounds")


def _manifest(chk: ResumeCheck, npz: Path, arrays: Arrays, state: dict[str, Any], cfg: RunConfig
              ) -> state_files.Manifest | None:
    """The clients' store as the checkpoint names it (None: a checkpoint whose store is not on
    the server's disk, or of an older fednet), checked."""
    if state.get("store") != "manifest":
        return None
    chk.need(all(k in arrays for k in STORE_KEYS), npz, "the clients' store manifest is missing")
    cids, rounds = arrays["store/cids"], arrays["store/rounds"]
    ok = (cids.ndim == rounds.ndim == 1 and len(cids) == len(rounds) and cids.dtype.kind in "iu"
          and rounds.dtype.kind in "iu")
    chk.need(ok, npz, "the clients' store manifest must be two integer vectors of one length")
    chk.need(bool(np.all((cids >= 0) & (cids < cfg.clients))) and len(np.unique(cids)) == len(cids),
             npz, f"the store manifest must name distinct clients in 0..{cfg.clients - 1}")
    chk.need(bool(np.all((rounds >= -1) & (rounds < max(1, state["rounds_done"])))), npz,
             "the store manifest names a round the checkpoint has not reached")
    return state_files.Manifest.of(arrays)


def _clients(chk: ResumeCheck, npz: Path, js: Path, arrays: Arrays, state: dict[str, Any],
             shapes: Shapes, cls: type) -> ClientStates:
    """The clients' states of a `fednet local` checkpoint (client/<cid>/...), checked."""
    metas = state.get("clients", {})
    chk.need(isinstance(metas, dict), js, "clients must be an object")
    groups: dict[int, Arrays] = {}
    for k, a in arrays.items():
        if k.startswith("client/"):
            head = k.split("/", 2)[1]
            cid = int(head) if head.isdigit() and int(head) < shapes.clients else None
            chk.need(cid is not None and str(cid) == head, npz,
                     f"array '{k}' does not belong to a client of this run")
            groups.setdefault(int(head), {})[k] = a
    out: ClientStates = {}
    for cid in sorted(set(groups) | {int(c) for c in metas if str(c).isdigit()}):
        got, meta = groups.get(cid, {}), metas.get(str(cid), {})
        chk.need(isinstance(meta, dict), js, f"clients.{cid} must be an object")
        mp = f"client/{cid}/model"
        model = {k[len(mp) + 1:]: a for k, a in got.items() if k.startswith(mp + "/")}
        rest = {k: a for k, a in got.items() if not k.startswith(mp + "/")}
        st, used = decode(cls, rest, meta, _client_prefix(cid), shapes,
                          lambda m: chk.fail(npz, m), lambda m: chk.fail(js, m), finite=True)
        for k in sorted(set(rest) - used):
            chk.fail(npz, f"array '{k}' does not belong to this client's state")
        out[cid] = (st, check_model(mp, model, shapes, lambda m: chk.fail(npz, m), True)
                    if model else None)
    return out
