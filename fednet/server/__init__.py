"""Server side: the round driver (runtime-agnostic), evaluation, and the ZeroMQ server."""
