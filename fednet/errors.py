"""The exception hierarchy: every error fednet raises on purpose is a FednetError."""
from __future__ import annotations


class FednetError(Exception):
    """Base class of fednet's own errors; the CLI prints these as one line, exit code 2."""


class ConfigError(FednetError):
    """A configuration value is invalid; the message names the option and the fix."""


class ProtocolError(FednetError):
    """A message could not be decoded or violates the wire limits."""


class PeerUnreachable(FednetError):
    """A peer did not acknowledge a hand-off in time."""


class RoundTimeout(FednetError):
    """A round passed its deadline."""


class ClientFailure(FednetError):
    """A client reported an error while running a task."""


class Dropout(FednetError):
    """A client left its task on purpose (a simulated dropout such as --secagg-drop): the
    task's failure, with no traceback to look for."""
