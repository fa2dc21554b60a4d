"""A client's side of --compress: the reference its update is taken against, its residual,
and (--compress-down) the decoding of the tasks it receives."""
from __future__ import annotations

import numpy as np

from fednet.compress import Spec, encode_result
from fednet.compress.downlink import decode
from fednet.rng import int_seed

Arrays = dict[str, np.ndarray]
RESIDUAL = "compress/residual"
"""The residual's name among the client's state arrays (the clients' store)."""


class UpdateCodec:
    """Encodes one client's results; its error-feedback residual is client state."""

    __slots__ = ("spec", "seed", "cid", "residual", "down", "peer")

    def __init__(self, spec: Spec, seed: int, cid: int, down: Spec | None = None,
                 peer: Spec | None = None) -> None:
        self.spec, self.seed, self.cid = spec, seed, cid
        self.down = down or Spec()  # --compress-down: how tasks arrive from the server
        self.peer = peer or Spec()  # --compress-handoff: how hand-offs arrive from peers
        self.residual: np.ndarray | None = None

    def received(self, arrays: Arrays, handoff: bool = False, model: dict | None = None
                 ) -> Arrays:
        """A task's (or hand-off's) arrays as their sender meant them (--compress-down or
        --compress-handoff decoded; a peer's hand-off against this client's model layout
        `model`, the server's tasks as the server laid them out; CompressionError when they
        do not decode or a hand-off does not fit the model)."""
        spec = self.peer if handoff else self.down
        return decode(spec, arrays, model if handoff else None) if spec.on else arrays

    def reference(self, received: Arrays) -> Arrays:
        """A copy of the task's arrays before training changes them (a FedAvg client trains in
        the received buffers); nothing when compression is off."""
        return {k: np.array(a, copy=True) for k, a in received.items()} if self.spec.on else {}

    def encode(self, arrays: Arrays, reference: Arrays, rnd: int) -> Arrays:
        """The arrays of a result as they travel (unchanged when compression is off)."""
        if not self.spec.on:
            return arrays
        rng = (np.random.default_rng(int_seed(self.seed, "compress", rnd, self.cid))
               if self.spec.random else None)
        out, residual = encode_result(self.spec, arrays, reference, self.residual, rng)
        if self.spec.feedback:
            self.residual = residual
        return out

    def state(self) -> Arrays:
        """The residual as state arrays (none before the first compression)."""
        return {RESIDUAL: self.residual} if self.residual is not None else {}

    @staticmethod
    def check_residual(arrays: Arrays) -> np.ndarray | None:
        """Take the residual out of a client's saved state arrays (ValueError if damaged)."""
        r = arrays.pop(RESIDUAL, None)
        if r is not None and (r.dtype != np.float32 or r.ndim != 1 or not np.isfinite(r).all()):
            raise ValueError(f"saved state: {RESIDUAL} must be a finite float32 vector")
        return r

    def restore(self, arrays: Arrays) -> None:
        """Take the residual out of a client's saved state arrays (ValueError if damaged)."""
        r = self.check_residual(arrays)
        self.residual = None if r is None else np.array(r)
