"""`fednet plugins`: the installed plugins (entry points), the given --plugin modules, and what
each one provides."""
from __future__ import annotations

import click


@click.command("plugins")
@click.option("--plugin", "modules", multiple=True, metavar="MODULE",
              help="Also import this module (a dotted name or a .py file) and list what it "
                   "registers (repeatable).")
def plugins_command(modules: tuple[str, ...]) -> None:
    """List the plugins: what each provides (algorithms, models, datasets, objectives)."""
    import sys

    import fednet
    from fednet import plugins
    from fednet.core import plugin_check
    from fednet.errors import ConfigError

    try:
        plugins.load_modules(list(modules))
    except ConfigError as e:
        click.echo(f"fednet: error: {e}", err=True)
        sys.exit(2)
    rows = plugin_check.installed()
    from fednet.algorithms.registry import REGISTRY
    from fednet.data.datasets import DATASETS, NATURAL
    from fednet.models.nets import _BUILDERS, PLUGIN_MODELS

    click.echo(f"fednet {fednet.__version__}; built in: {len(REGISTRY) - _count(rows, 'algorithm')}"
               f" algorithms, {len(_BUILDERS) - len(PLUGIN_MODELS)} models, {len(DATASETS + NATURAL)} datasets")
    if not rows:
        click.echo("no plugins (entry points fednet.algorithms, fednet.models, fednet.datasets; "
                   "or --plugin MODULE): see docs/extending.md")
        return
    width = max(len(r[0]) for r in rows)
    for name, version, what in rows:
        click.echo(f"{name:<{width}}  {version:<12}  {what}")


def _count(rows: list[tuple[str, str, str]], kind: str) -> int:
    return sum(part.startswith(kind + " ") for _, _, what in rows for part in what.split(", "))
