"""The garbage collector in a long run: what lives on kept out of its full passes."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def settled_heap() -> Iterator[Callable[[], None]]:
    """Within: settle() moves every object alive into the collector's permanent generation
    (gc.freeze), which its passes skip; leaving, they are given back (gc.unfreeze), unless this
    process held frozen objects before (a zygote's child: its parent's stay frozen).

    A run's process holds ~320,000 objects that live as long as it does (the imports' (torch
    and torch._dynamo most of them) and the run's own); a full pass over them took ~0.1-0.2 s on
    a 2-core machine every other round of a million-client `fednet local` run (issue 56), and
    found no garbage among them. Anything that still becomes garbage among them is collected
    once they are given back; nothing a run computes depends on when objects are freed."""
    mine = gc.get_freeze_count() == 0
    try:
        yield gc.freeze
    finally:
        if mine:
            gc.unfreeze()
