"""Interrupts held while a round is aggregated and logged, in a process with threads."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from fednet.platform.proc import Terminated, interrupts_deferred, sigterm_interrupts


class _Sender:
    """A thread started before the held block (so its signal mask is the process's, not the
    block's) that sends a process-directed signal (kill PID) when asked: the kernel hands it
    to a thread that does not block it, as in a server whose threads were running already."""

    def __init__(self, sig: int) -> None:
        self.go, self.sent = threading.Event(), threading.Event()
        self.t = threading.Thread(target=self._run, args=(sig,), daemon=True)
        self.t.start()

    def _run(self, sig: int) -> None:
        self.go.wait(10)
        os.kill(os.getpid(), sig)
        self.sent.set()

    def send(self) -> None:
        self.go.set()
        assert self.sent.wait(10)


@pytest.mark.parametrize("sig,exc", [(signal.SIGINT, KeyboardInterrupt),
                                     (signal.SIGTERM, Terminated)], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_during_the_held_block_comes_at_its_end_whichever_thread_it_reached(sig, exc):
    restore = sigterm_interrupts()
    sender, steps = _Sender(sig), list[int]()
    try:
        with pytest.raises(exc):
            with interrupts_deferred():
                sender.send()
                for i in range(1000):  # bytecodes enough for a pending handler to run
                    steps.append(i)
        assert steps == list(range(1000))  # the block ran to its end before the interrupt
    finally:
        restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_an_interrupt_nothing_is_raised_and_the_handlers_are_put_back():
    before = signal.getsignal(signal.SIGTERM)
    with interrupts_deferred():
        pass
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
