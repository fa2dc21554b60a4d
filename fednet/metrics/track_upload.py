"""`fednet track upload RUN`: a run folder that has ended (its summary.json: completed,
interrupted, failed, ...) sent after the fact to MLflow or TensorBoard, as `--track` sends a run as
it goes (metrics/tracking.py, whose trackers do the sending): the configuration, every row of
metrics.jsonl at step round + 1, the summary's numbers, the files (MLflow artifacts) and the
status.

A second upload: MLflow: the folder's mlflow.json names the MLflow run it was last sent to; when
that run is at the same tracking URI, still there, and ended by fednet with the folder's status
(tag fednet.status; not RUNNING), the upload says so and sends nothing (`--again` makes a new
MLflow run). Otherwise it makes a new MLflow run and mlflow.json names it; the run a dropped
tracker left behind is tagged fednet.replaced_by (and ended as FAILED if it was still RUNNING).
TensorBoard: the event files in DIR are rewritten as one history (a purge from step 0), so a
second upload replaces the first."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics import tracking


def read_folder(run: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """A run folder's configuration, rows and summary; ConfigError naming what is missing."""
    from fednet.config import load_toml
    from fednet.metrics.history import read_rows
    from fednet.metrics.report import load_summary

    if not run.is_dir():
        raise ConfigError(f"'{run}' is not a run folder (give a results folder such as runs/<name>)")
    if not (run / "summary.json").is_file():
        raise ConfigError(f"'{run}' has no summary.json: the run is still going, or was killed "
                          "before its end (--resume it, or upload once it has ended)")
    if not (run / "config.toml").is_file():
        raise ConfigError(f"'{run}' has no config.toml: not a fednet run folder")
    cfg = load_toml(run / "config.toml")
    cfg.pop("out", None)
    return cfg, read_rows(run), load_summary(run)


def destinations(given: list[str], cfg: dict[str, Any]) -> list[str]:
    """The --track values to send to: those given, else those the run itself had."""
    specs = given or [str(s) for s in cfg.get("track") or []]
    if not specs:
        raise ConfigError("--track: say where to send the run: --track mlflow[:URI], --mlflow "
                          "URI or --track tensorboard[:DIR] (the run itself tracked nothing)")
    tracking.check(specs)
    return specs


def upload(run: Path, specs: list[str], again: bool = False) -> list[str]:
    """Send the run folder to each destination; one line each on what was done."""
    cfg, rows, summary = read_folder(run)
    said = []
    for spec in destinations(specs, cfg):
        kind, target = tracking.parse(spec)
        if kind == "tensorboard":
            said.append(_tensorboard(spec, target, run, cfg, rows, summary))
        else:
            said.append(_mlflow(spec, target, run, (cfg, rows, summary), again))
    return said


def _tensorboard(spec: str, target: str, run: Path, cfg: dict[str, Any],
                 rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    t = tracking.TensorBoard(target, run, cfg, 0, replace=True)
    t.start()
    t.rows(rows)
    t.end(summary, run)
    return (f"{spec}: {len(rows)} rows and the summary written to {t.where} (a second upload "
            "replaces this history)")


def _recorded(run: Path, c: Any) -> Any:
    """The MLflow run the folder's mlflow.json names at this tracking URI, or None."""
    try:
        rec = json.loads((run / "mlflow.json").read_text())
        if str(rec["tracking_uri"]) != str(c.tracking_uri):
            return None
        return c.get_run(str(rec["run_id"]))
    except Exception:  # noqa: BLE001 - no file, another server, a deleted run: none there
        return None


def _mlflow(spec: str, target: str, run: Path,
            folder: tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]], again: bool) -> str:
    cfg, rows, summary = folder
    try:
        c = tracking.client(target)
        old = _recorded(run, c)
        t = None if _ended(old, summary) and not again else tracking.MLflow(target, run, cfg, 0)
    except Exception as e:  # noqa: BLE001 - the server is not there, a file store, ...
        raise ConfigError(tracking.failure(spec, e)) from None
    if t is None:
        return (f"{spec}: already there, as MLflow run {old.info.run_id} "
                f"({old.info.status}) at {c.tracking_uri}; nothing sent (--again sends it "
                "as a new MLflow run)")
    try:
        t.c.set_tag(t.run_id, "fednet.uploaded", "true")
        t.rows(rows)
        t.end(summary, run)
    except BaseException:
        t.c.set_terminated(t.run_id, "FAILED")
        raise
    t.start()  # mlflow.json names it: a --resume continues it, a second upload finds it
    if old is not None and old.info.run_id != t.run_id:
        c.set_tag(old.info.run_id, "fednet.replaced_by", t.run_id)
        if old.info.status == "RUNNING":
            c.set_terminated(old.info.run_id, "FAILED")
    files = sum((run / name).is_file() for name in tracking.ARTIFACTS)
    return (f"{spec}: {len(rows)} rows, the summary and {files} files sent to MLflow run "
            f"{t.run_id} at {c.tracking_uri}")


def _ended(old: Any, summary: dict[str, Any]) -> bool:
    """The recorded MLflow run holds this folder's whole record (ended by fednet, its status)."""
    if old is None or old.info.status == "RUNNING":
        return False
    tags = old.data.tags
    return tags.get("fednet.status") == summary.get("status") and "fednet.tracking" not in tags
