"""Client side: the executor (pure, no sockets), the ZeroMQ poll loop and peer hand-offs."""
