"""The network model beyond one client's profile (docs/architecture.md): the server's shared
link, client availability, round deadlines and over-selection. Pure simulated-time arithmetic:
no sockets, no torch; both runtimes reach it through core/rounds.py."""
