"""ZeroMQ sockets: the only package (with server/client apps) that knows about zmq."""
