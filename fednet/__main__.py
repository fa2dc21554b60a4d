"""`python -m fednet ...` is the `fednet` command (fednet sweep starts its cells this way); the
process ends without the interpreter's teardown once the command is done (commands.exit_now)."""
from fednet.cli import main
from fednet.cli.commands import exit_now

exit_now(lambda: main.main(prog_name="fednet"))
