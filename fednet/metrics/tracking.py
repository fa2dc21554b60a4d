"""Experiment tracking through the tools researchers use (`--track`, optional extras): TensorBoard
event files and MLflow runs, fed as the run goes. Every round: each number of its metrics.jsonl row
(accuracy, loss, train_loss, sim_s, wall_s, bytes_total, bytes_round/<direction>, ...) at step
round + 1; at the start the configuration (MLflow parameters, a TensorBoard text); at the end the
summary, and for MLflow the run's files as artifacts and its status. A tracker that fails is
logged and dropped: the run and its own files go on (they are the record)."""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError

log = logging.getLogger("fednet")
KINDS = ("tensorboard", "mlflow")  # each is also the package it needs
ARTIFACTS = ("summary.json", "config.toml", "metrics.jsonl", "clients.jsonl",
             "accuracy_vs_round.png", "accuracy_vs_sim_time.png", "accuracy_vs_bytes.png",
             "accuracy_vs_epsilon.png")
_STATUS = {"completed": "FINISHED", "budget_spent": "FINISHED",  # MLflow's; the others: FAILED
           "interrupted": "KILLED"}


def parse(spec: str) -> tuple[str, str]:
    """'tensorboard', 'tensorboard:DIR', 'mlflow', 'mlflow:URI' -> (kind, target or '')."""
    kind, _, target = spec.strip().partition(":")
    if kind not in KINDS:
        raise ConfigError(f"--track '{spec}': expected tensorboard[:DIR] or mlflow[:URI]")
    if importlib.util.find_spec(kind) is None:
        raise ConfigError(f"--track {kind}: the {kind} package is not installed; "
                          f"pip install 'fednet[{kind}]' (or pip install {kind})")
    return kind, target


def check(specs: tuple[str, ...] | list[str]) -> None:
    """Every --track value understood and its package installed (ConfigError otherwise)."""
    for s in specs:
        parse(s)


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl row, one level of nesting as 'outer/inner'."""
    out: dict[str, float] = {}
    for k, v in row.items():
        if k == "round":
            continue
        if isinstance(v, dict):
            out.update({f"{k}/{ik}": float(iv) for ik, iv in v.items() if _number(iv)})
        elif _number(v):
            out[k] = float(v)
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def flat(d: dict[str, Any]) -> dict[str, str]:
    """A configuration as dotted keys and text values (MLflow parameters; an empty table is
    '{}')."""
    from fednet.config import flatten

    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(d, empty=True).items()}


class TensorBoard:
    """Event files in DIR (torch.utils.tensorboard's writer); a resumed run purges the steps
    after its checkpoint, so TensorBoard shows one history."""

    def __init__(self, target: str, out: Path, cfg: dict[str, Any], first_round: int) -> None:
        self.where = Path(target) if target else out / "tensorboard"
        self.cfg, self.first = cfg, first_round

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(str(self.where), purge_step=self.first + 1 if self.first else None)
        if not self.first:
            self.w.add_text("config", "```\n" + json.dumps(self.cfg, indent=1) + "\n```", 0)

    def row(self, row: dict[str, Any]) -> None:
        for k, v in scalars(row).items():
            self.w.add_scalar(k, v, row["round"] + 1)
        self.w.flush()

    def end(self, summary: dict[str, Any] | None, out: Path) -> None:
        if summary is not None:
            self.w.add_text("summary", "```\n" + json.dumps(summary, indent=1, default=str)
                            + "\n```", int(summary.get("rounds") or 0))
        self.w.close()


class MLflow:
    """One MLflow run per fednet run (a resumed run continues it: its id is in OUT/mlflow.json)."""

    def __init__(self, target: str, out: Path, cfg: dict[str, Any], first_round: int) -> None:
        from mlflow.tracking import MlflowClient

        for k, v in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")):
            os.environ.setdefault(k, v)  # an unreachable server fails in seconds, not minutes
        self.c = MlflowClient(tracking_uri=target or None)
        self.where = self.c.tracking_uri if hasattr(self.c, "tracking_uri") else target
        self.id_file = out / "mlflow.json"
        resumed = self._resumed() if first_round else None
        self.run_id: str = resumed if resumed is not None else self._create(out, cfg)

    def start(self) -> None:
        from fednet.metrics.files import write_json

        write_json(self.id_file, {"run_id": self.run_id, "tracking_uri": str(self.where)})

    def _resumed(self) -> str | None:
        try:
            return str(json.loads(self.id_file.read_text())["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _create(self, out: Path, cfg: dict[str, Any]) -> str:
        from mlflow.entities import Param

        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "fednet"
        exp = self.c.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.c.create_experiment(name)
        run = self.c.create_run(exp_id, run_name=out.name, tags={
            "fednet.out": str(out.resolve()), "fednet.algorithm": str(cfg["algo"]["name"])})
        params = [Param(k, v[:6000]) for k, v in flat(cfg).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.c.log_batch(run.info.run_id, params=params[i:i + 100])
        return str(run.info.run_id)

    def row(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.c.log_batch(self.run_id, metrics=[Metric(k, v, now, row["round"] + 1)
                                               for k, v in scalars(row).items()])

    def end(self, summary: dict[str, Any] | None, out: Path) -> None:
        status = (summary or {}).get("status", "failed")
        if summary is not None:
            from mlflow.entities import Metric

            now, step = int(time.time() * 1000), int(summary.get("rounds") or 0)
            self.c.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step)
                                                   for k, v in summary.items() if _number(v)])
            for name in ARTIFACTS:
                if (out / name).is_file():
                    self.c.log_artifact(self.run_id, str(out / name))
        self.c.set_tag(self.run_id, "fednet.status", status)
        self.c.set_terminated(self.run_id, _STATUS.get(status, "FAILED"))


class Tracking:
    """The run's trackers (--track): made (and an MLflow run created) before the results folder
    is written, so that a server that cannot be reached is an error that leaves nothing behind;
    start() once the folder is there. Each later failure is logged and that tracker dropped."""

    def __init__(self, specs: tuple[str, ...], out: Path | None, cfg: dict[str, Any],
                 first_round: int = 0) -> None:
        self.trackers: list[Any] = []
        if out is None:
            return
        for spec in specs:
            kind, target = parse(spec)
            try:
                t = (TensorBoard if kind == "tensorboard" else MLflow)(target, out, cfg,
                                                                      first_round)
            except Exception as e:  # noqa: BLE001 - e.g. no server there: said, before round 0
                raise ConfigError(f"--track {spec}: {type(e).__name__}: {str(e)[:300]} (is the "
                                  "tracking server running, and is that its address?)") from None
            self.trackers.append(t)
            log.info("tracking to %s %s", kind, t.where)

    def start(self) -> None:
        """The results folder exists (History made it): write the trackers' own files."""
        self._each("start")

    def _each(self, what: str, *args: Any) -> None:
        for t in list(self.trackers):
            try:
                getattr(t, what)(*args)
            except Exception as e:  # noqa: BLE001 - the run's own files stay the record
                log.warning("tracking to %s stopped (%s: %s); the run goes on, its results are "
                            "in its folder", t.where, type(e).__name__, str(e)[:300])
                self.trackers.remove(t)

    def row(self, row: dict[str, Any]) -> None:
        self._each("row", row)

    def end(self, summary: dict[str, Any] | None, out: Path | None) -> None:
        """The run's end (summary None: it ended before its first round)."""
        self._each("end", summary, out)
        self.trackers = []
