"""One run's lifecycle, shared by `fednet local`, `fednet launch` and `fednet server`.

A `Run` owns what the run starts, in an `ExitStack`: each resource is entered in the order it
starts and stopped in the reverse order, also on Ctrl-C (SIGTERM) and on errors. The runtime
adds its resources (the in-process one: none; the ZeroMQ one: context, authenticator, client
log, socket, zygote, server) and marks the run started once its setup is done; from then on the
run is finished exactly once, here: the status says why it ended (`interrupted` on Ctrl-C,
`error` on any other exception, or what the driver or `Stopped` set), the runtime's reports
fill in the summary's extra fields (then this process's peak memory), and `Session.finish` writes
clients.jsonl, the final model
and summary.json. A run that never started writes no summary and removes the results folder it
created if that is still empty.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from fednet.core.status import RunStatus
from fednet.errors import FednetError
from fednet.metrics.files import OutputError
from fednet.platform.proc import peak_rss_bytes

if TYPE_CHECKING:  # the session imports torch; the ZeroMQ runtime imports it later, on purpose
    from fednet.core.session import Session
    from fednet.types import ClientInfo

T = TypeVar("T")


class Stopped(FednetError):
    """The run ends early with its own status (e.g. registration_timeout); a usage-level error."""

    def __init__(self, status: RunStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def discard_if_empty(out: Path) -> None:
    """Remove the results folder (and its logs/) if nothing was written into it."""
    for f in (out / "logs" / "clients.log", out / "metrics.jsonl"):
        if f.is_file() and f.stat().st_size == 0:
            f.unlink()
    for d in (out / "logs", out):
        try:
            d.rmdir()
        except OSError:  # not empty (or absent): keep what is there
            pass


class Run:
    """The lifecycle of one run: `with Run(...) as run:` add resources, `run.open(session)`,
    `run.started()`, drive the rounds; leaving the block stops everything and writes the summary.
    `run.summary` holds the summary afterwards."""

    def __init__(self, runtime: str, out: Path | None = None, on_interrupt: str | None = None,
                 t_start: float | None = None) -> None:
        self.t_start = time.monotonic() if t_start is None else t_start
        self.out = out
        self.extra: dict[str, Any] = {"runtime": runtime}
        self.on_interrupt = on_interrupt
        self.session: Session | None = None
        self.is_started = False
        self.summary: dict[str, Any] | None = None
        self.clients: Callable[[], Sequence[ClientInfo]] = lambda: []
        self.reports: list[Callable[[], None]] = []  # fill extra just before the summary
        self._stack = ExitStack()
        self._failing: BaseException | None = None  # what is stopping the run, if anything
        if out is not None and not out.exists():  # a run that never started leaves no folder
            self._stack.callback(self._discard, out)

    # ---- owning resources ----------------------------------------------------------------
    def enter(self, cm: AbstractContextManager[T]) -> T:
        """Own a context manager: exited when the run stops (in reverse order)."""
        return self._stack.enter_context(cm)

    def on_stop(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        """Call fn(*args, **kw) when the run stops (in reverse order of registration)."""
        self._stack.callback(fn, *args, **kw)

    def finish_here(self) -> None:
        """Write the summary at this point of the stop order: after everything registered later
        has stopped (e.g. the clients, whose exit codes it records), before everything earlier."""
        self._stack.callback(self._finish)

    def open(self, session: Session) -> Session:
        self.session = session
        return session

    def started(self) -> None:
        """The setup is done: from now on the run ends with a summary."""
        self.is_started = True

    # ---- the end -------------------------------------------------------------------------
    def __enter__(self) -> Run:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self._failing = e
        if e is not None and self.session is not None and self.is_started:
            driver = self.session.driver
            if isinstance(e, KeyboardInterrupt):
                driver.end(RunStatus.INTERRUPTED)
                if self.on_interrupt:
                    self.session.progress.message(self.on_interrupt)
                self._checkpoint()
            elif isinstance(e, Stopped):
                driver.end(e.status)
            else:
                why = (f"{type(e).__name__}: {e}".splitlines() or [""])[0][:2000]
                driver.end(RunStatus.ERROR, why)  # summary.json's error
        if not self.is_started and self.session is not None:
            self.session.history.close()
            self.session.tracking.end(None, self.session.out)
        self._stack.__exit__(et, e, tb)
        return False  # the exception, if any, goes on to the caller

    def _checkpoint(self) -> None:
        """The interrupted run's checkpoint (Session.checkpoint_interrupted); a failure to write
        it is logged, and the summary is still written."""
        try:
            self.session.checkpoint_interrupted()  # type: ignore[union-attr]  # __exit__ has a session
        except Exception:  # noqa: BLE001 - e.g. a full disk: the rows are kept all the same
            logging.getLogger("fednet").exception("could not write the interrupted run's checkpoint")

    def _finish(self) -> None:
        if not self.is_started or self.session is None:
            return
        try:
            for report in self.reports:
                report()
        finally:
            self.extra["server_peak_rss_bytes"] = peak_rss_bytes()
            try:
                self.summary = self.session.finish(self.clients(), self.extra)
            except OutputError as err:
                if self._failing is None:
                    raise
                # the error that stopped the run is the one reported (e.g. a full disk met
                # first by a checkpoint); what else could not be written is said here
                logging.getLogger("fednet").warning("%s", err)

    def _discard(self, out: Path) -> None:
        if not self.is_started:
            discard_if_empty(out)
