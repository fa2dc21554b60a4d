"""`python -m fednet ...` is the `fednet` command (fednet sweep starts its cells this way)."""
from fednet.cli import main

main(prog_name="fednet")
