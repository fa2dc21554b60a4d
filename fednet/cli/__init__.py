"""The command line: `fednet launch | local | server | clients | sweep | report | plugins | keys
| track` (commands.py), the options they share (options.py, options_extra.py), those of `fednet
sweep` and `fednet report` (sweep_options.py), `fednet plugins` (plugins_command.py) and `fednet
track upload` (track_command.py)."""
from fednet.cli.commands import (RUN_DEFAULTS, clients, keys, launch, local, main, report,  # noqa: F401
                                 server, sweep)
