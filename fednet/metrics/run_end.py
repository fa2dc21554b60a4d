"""How a run ended, for the command that ran it: the exit code and line of a run that produced
no usable result, the note of one that ended early as a result, and what a Ctrl-C left behind."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics.report import load_summary, summary_table


def interrupt_note(command: str, out: str | None, t0: float,
                   echo: Callable[[str], Any] = print, extra: str = "") -> str:
    """What a Ctrl-C (or SIGTERM) left behind, for `fednet: interrupted<note>`; echoes the partial
    summary table of a run that wrote one after t0 (time.time() when the command started)."""
    if command == "clients":
        return "; the clients on this host were stopped"
    if command == "sweep":
        return (f"; the finished cells are kept in {out}: the same command goes on from there"
                if out and Path(out).is_dir() else "")
    if command not in ("launch", "local", "server"):
        return ""
    if not out or not Path(out).is_dir():
        return " before the run started; nothing was written"

    def fresh(name: str) -> bool:
        p = Path(out) / name
        return p.is_file() and p.stat().st_mtime >= t0 - 1

    if fresh("summary.json"):
        try:
            echo(summary_table(load_summary(out)))
        except (ConfigError, OSError):
            pass
        return f"; partial results were kept in {out}{_resume_hint(command, out, extra)}"
    if fresh("metrics.jsonl"):
        return f"; partial results (metrics.jsonl) were kept in {out}{_resume_hint(command, out, extra)}"
    return f" before the first round ended; {out} holds only the configuration"


def _resume_hint(command: str, out: str, extra: str = "") -> str:
    """How the interrupted run goes on: the exact --resume command when it kept a checkpoint
    (`extra`: the options it needs beside, e.g. a server's --bind and --join-key), else why it
    cannot (checkpoints are off unless --checkpoint-every N)."""
    if (Path(out) / "checkpoint" / "state.json").is_file():  # (clients/ alone is no checkpoint)
        return f"; continue it with `fednet {command} --resume {out}{extra}`"
    return ("; it kept no checkpoint, so it cannot be resumed (--checkpoint-every N writes one "
            "every N rounds; FedAsync and FedBuff checkpoint only where they drain: --param "
            "drain=R)")


def run_error(summary: dict[str, Any]) -> tuple[int, str] | None:
    """(exit code, one line) for a run that produced no usable result, else None: failed (4,
    with the first failure's reason and where its traceback is), diverged (5, which round and
    what was not finite) or no clients left (3). A run that stopped as budget_spent (its
    differential-privacy budget: run_note) is a result, exit code 0."""
    status = summary.get("status")
    if status == "failed":
        return 4, f"the run failed: {summary.get('error')}"
    if status == "diverged":
        return 5, f"the run diverged: {summary.get('error')}"
    if status == "no_clients":
        return 3, (f"no live clients left after round {summary.get('rounds')}; see "
                   f"{summary.get('out')}/summary.json")
    return None


def run_note(summary: dict[str, Any]) -> str | None:
    """One line on how a run that is a result ended early (budget_spent: the epsilon reached and
    the round it stopped before), and on trackers (--track) that dropped out, with the command
    that uploads the run to them; else None."""
    notes = []
    if summary.get("status") == "budget_spent":
        notes.append(str((summary.get("dp") or {}).get("stopped") or "the privacy budget is spent"))
    track = summary.get("tracking")
    if isinstance(track, dict) and track.get("dropped"):
        notes.append(f"tracking to {', '.join(map(str, track['dropped']))} dropped during the run; "
                     f"send the finished run with `{track.get('upload')}`")
    return "; ".join(notes) or None
