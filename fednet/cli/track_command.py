"""`fednet track upload RUN`: a run folder sent to MLflow or TensorBoard after it has ended
(metrics/track_upload.py)."""
from __future__ import annotations

import sys

import click


@click.group("track")
def track_command() -> None:
    """Experiment trackers after the fact (what --track does as a run goes).

    \b
      fednet track upload runs/A --mlflow http://127.0.0.1:5000
      fednet track upload runs/A --track tensorboard     # event files in runs/A/tensorboard
      fednet track upload runs/A                         # to the run's own --track values
    """


@track_command.command("upload")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--track", "specs", multiple=True, metavar="TOOL[:WHERE]",
              help="Where to send it, as the run's --track: tensorboard[:DIR] (default "
                   "RUN/tensorboard) or mlflow[:URI] (repeatable; default: the run's own).")
@click.option("--mlflow", "mlflow_uri", metavar="URI",
              help="The same as --track mlflow:URI.")
@click.option("--again", is_flag=True,
              help="MLflow: a new MLflow run even when RUN/mlflow.json names one that already "
                   "holds this run (without it, that upload is skipped and said).")
def upload_command(run: str, specs: tuple[str, ...], mlflow_uri: str | None, again: bool) -> None:
    """Send a run that has ended (completed, interrupted, failed) to MLflow or TensorBoard: its
    configuration, every row of metrics.jsonl, its summary and its files."""
    from pathlib import Path

    from fednet.errors import FednetError
    from fednet.metrics.track_upload import upload

    wanted = list(specs) + ([f"mlflow:{mlflow_uri}"] if mlflow_uri is not None else [])
    try:
        said = upload(Path(run), wanted, again)
    except FednetError as e:
        click.echo(f"fednet: error: {e}", err=True)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - e.g. the server failing mid-upload: one line
        click.echo(f"fednet: error: the upload failed ({type(e).__name__}: "
                   f"{(str(e).splitlines() or [''])[0][:200]}); the same command tries again",
                   err=True)
        sys.exit(1)
    for line in said:
        click.echo(line)
