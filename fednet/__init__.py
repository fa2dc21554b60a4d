"""fednet: a federated-learning emulator over real processes and ZeroMQ sockets."""
from __future__ import annotations

__version__ = "0.1.0"
