"""The runtime-agnostic core: the session, the round driver, evaluation and checkpoints.

Both runtimes drive it: the in-process one (fednet/core/inproc.py) and the ZeroMQ server (fednet/server).
It imports no zmq and nothing from server, client, transport or launch.
"""
