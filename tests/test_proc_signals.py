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


def test_every_distinct_signal_held_is_delivered_at_the_end_in_the_order_they_came():
    """SIGTERM, then Ctrl-C, then SIGTERM again during the held block: at its end each distinct
    one is raised again under its handler from before, in the order they first came (the old
    code raised only the first: the Ctrl-C was lost)."""
    got: list[int] = []
    before = {s: signal.signal(s, lambda n, f: got.append(n))
              for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with interrupts_deferred():
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
                os.kill(os.getpid(), s)
                for _ in range(100):  # (bytecodes enough for the hold's handler to run)
                    pass
            assert got == []  # (held)
        assert got == [signal.SIGTERM, signal.SIGINT]
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_a_ctrl_c_and_a_sigterm_held_end_as_terminated_with_the_interrupt_as_context():
    """Both handlers raise (fednet's: KeyboardInterrupt, then SIGTERM's Terminated, which also
    makes a next SIGTERM end the process at once): the second is not lost behind the first's
    exception; the last one raised propagates with the first as its context (exit 143)."""
    restore = sigterm_interrupts()
    try:
        with pytest.raises(Terminated) as info:
            with interrupts_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):
                    pass
        assert isinstance(info.value.__context__, KeyboardInterrupt)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # (its handler ran)
    finally:
        restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
