"""Stopping a task between two batches: the run's end, a lost server or a gone launcher.

A local update can be long (a hand-off or task may ask for many epochs), and a client process
reads its sockets only between tasks. So the client process installs a check here
(client/app.Client.must_stop) and the training loops call `poll()` before each batch; at most
every EVERY_S seconds it runs the check, and when the client must stop, `Interrupted` (a
BaseException: no algorithm's error handling turns it into a FAILURE) unwinds the task. Without
a check installed (fednet local, tests) poll() costs one comparison.
"""
from __future__ import annotations

import time
from collections.abc import Callable

EVERY_S = 0.5


class Interrupted(BaseException):
    """The client must stop now: its task is abandoned (the run ended, or its server or
    launcher is gone); the client's loop sees why and exits."""


_check: Callable[[], bool] | None = None
_next = 0.0


def install(check: Callable[[], bool] | None) -> None:
    """Run `check` (True: stop) at most every EVERY_S seconds from poll(); None removes it."""
    global _check, _next
    _check, _next = check, 0.0


def poll() -> None:
    """Called between two batches: raise Interrupted when the installed check says stop."""
    global _next
    if _check is None:
        return
    now = time.monotonic()
    if now < _next:
        return
    _next = now + EVERY_S
    if _check():
        raise Interrupted()
