"""`python -m fednet.cli ...`: the `fednet` command (ends without the interpreter's teardown:
commands.exit_now)."""
from fednet.cli.commands import exit_now, main

exit_now(main.main)
