"""`python -m fednet.cli ...`: the `fednet` command."""
from fednet.cli.commands import main

main()
