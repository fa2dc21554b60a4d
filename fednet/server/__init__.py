"""The ZeroMQ server: the ROUTER loop and what arrives (app.py), connections (conns.py),
and run_zmq for fednet launch and fednet server (main.py). The round driver it runs is fednet.core."""
