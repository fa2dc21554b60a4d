"""Socket monitors that never block libzmq's I/O threads (connection events: closes, handshakes)."""
from __future__ import annotations

import itertools
import os

import zmq

_MONITORS = itertools.count()


def open_monitor(sock: zmq.Socket, events: int) -> zmq.Socket:
    """The reading end of `sock`'s socket monitor (what pyzmq's get_monitor_socket gives), with
    an unbounded pipe. With pyzmq's, 1,000 unread events fill the pipe, and libzmq's I/O thread
    then blocks in the next send holding the monitor's mutex: thousands of connections closing
    at the end of a run (nobody reads the monitor then) hung disable_monitor() for good, in C,
    where no SIGTERM is handled (gdb, 10,000 clients). An event is a few dozen bytes."""
    addr = f"inproc://fednet-monitor-{os.getpid()}-{next(_MONITORS)}"
    sock.monitor(addr, events)
    mon = sock.context.socket(zmq.PAIR)
    mon.setsockopt(zmq.RCVHWM, 0)  # the pipe's limit is the reader's: none
    mon.connect(addr)
    return mon


def stop_monitor(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    """Stop `sock`'s monitor (opened by open_monitor) and close its reading end."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:  # already closed
        pass
    monitor.close(linger=0)
