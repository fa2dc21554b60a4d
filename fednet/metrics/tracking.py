"""Experiment tracking through the tools researchers use (`--track`, optional extras): TensorBoard
event files and MLflow runs, fed as the run goes. Every round: each number of its metrics.jsonl row
(accuracy, loss, train_loss, sim_s, wall_s, bytes_total, bytes_round/<direction>, ...) at step
round + 1; at the start the configuration (MLflow parameters, a TensorBoard text); at the end the
summary, and for MLflow the run's files as artifacts and its status. A tracker that fails is
logged and dropped: the run and its own files go on (they are the record). At the run's end a
dropped MLflow tracker whose server answers again is caught up (the rows it missed, then the end
as usual); one that stays away is named in summary.json ("tracking") with the command that sends
the finished run later (`fednet track upload`, metrics/track_upload.py)."""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
    """Every --track value understood, its package installed and an MLflow server's address
    answering (ConfigError otherwise: said before the run loads anything)."""
    for s in specs:
        kind, target = parse(s)
        if kind == "mlflow":
            try:
                probe(target or os.environ.get("MLFLOW_TRACKING_URI", ""))
            except OSError as e:
                raise ConfigError(failure(s, e)) from None


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


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def flat(d: dict[str, Any]) -> dict[str, str]:
    """A configuration as dotted keys and text values (MLflow parameters; an empty table is
    '{}')."""
    from fednet.config import flatten

    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(d, empty=True).items()}


def probe(uri: str, timeout: float = 3.0) -> None:
    """An http(s) tracking URI's host takes a TCP connection within timeout seconds (OSError
    naming host:port otherwise); other URIs (sqlite:, databricks, ...) are not probed."""
    u = urlsplit(uri)
    if u.scheme not in ("http", "https") or not u.hostname:
        return
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=timeout).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise OSError(f"nothing answers at {u.hostname}:{port} ({why})") from None


def client(target: str) -> Any:
    """An MlflowClient for target (or MLFLOW_TRACKING_URI, else MLflow's default), its server
    probed first: one that is not there fails in seconds, without urllib3's retries."""
    from mlflow.tracking import MlflowClient

    for k, v in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")):
        os.environ.setdefault(k, v)  # a server that goes away mid-run fails in seconds
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # its retries: our line
    probe(target or os.environ.get("MLFLOW_TRACKING_URI", ""))
    return MlflowClient(tracking_uri=target or None)


def failure(spec: str, e: BaseException) -> str:
    """One short line for a tracker that could not start (--track SPEC)."""
    text = str(e)
    if "filesystem tracking backend" in text:  # MLflow 3: mlruns/ and file: URIs are refused
        return (f"--track {spec}: MLflow 3 refuses file stores (./mlruns, file:...); use "
                "mlflow:sqlite:///mlflow.db or a tracking server (mlflow:http://HOST:PORT)")
    what = _short(e) if isinstance(e, OSError) else f"{type(e).__name__}: {_short(e)}"
    return f"--track {spec}: {what}; is the tracking server running, and is that its address?"


def _short(e: BaseException, most: int = 160) -> str:
    """An exception's first line, at most `most` characters."""
    first = (str(e).splitlines() or [""])[0]
    return first if len(first) <= most else first[:most - 3] + "..."


class TensorBoard:
    """Event files in DIR (torch.utils.tensorboard's writer); a resumed run purges the steps
    after its checkpoint, so TensorBoard shows one history."""

    def __init__(self, target: str, out: Path, cfg: dict[str, Any], first_round: int,
                 replace: bool = False) -> None:
        self.where = Path(target) if target else out / "tensorboard"
        self.cfg, self.first = cfg, first_round
        self.purge = first_round + 1 if first_round else (0 if replace else None)  # replace: all

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(str(self.where), purge_step=self.purge)
        if not self.first:
            self.w.add_text("config", "```\n" + json.dumps(self.cfg, indent=1) + "\n```", 0)

    def row(self, row: dict[str, Any]) -> None:
        self.rows([row])

    def rows(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
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
        self.c = client(target)
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
        self.rows([row])

    def rows(self, rows: list[dict[str, Any]]) -> None:
        """Rows' numbers, at most 1000 a request (MLflow's batch limit)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, row["round"] + 1) for row in rows
                   for k, v in scalars(row).items()]
        for i in range(0, len(metrics), 1000):
            self.c.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def reachable(self) -> bool:
        try:
            probe(str(self.where), 2.0)
        except OSError:
            return False
        return True

    def abandon(self) -> None:
        """The run this tracker dropped, ended as FAILED (tag fednet.tracking: dropped), so that
        it does not stay RUNNING; only when its server answers."""
        if self.reachable():
            self.c.set_tag(self.run_id, "fednet.tracking", "dropped")
            self.c.set_terminated(self.run_id, "FAILED")

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
    start() once the folder is there. Each later failure is logged and that tracker dropped; at
    the end, recover() catches up those whose server answers again and notes() names the rest."""

    def __init__(self, specs: tuple[str, ...], out: Path | None, cfg: dict[str, Any],
                 first_round: int = 0) -> None:
        self.trackers: list[Any] = []
        self.spec: dict[int, str] = {}  # id(tracker) -> its --track value
        self.sent: dict[int, int] = {}  # id(tracker) -> rows it took (a resumed run: those kept)
        self.dropped: list[Any] = []
        self.out = out
        if out is None:
            return
        for spec in specs:
            kind, target = parse(spec)
            try:
                t = (TensorBoard if kind == "tensorboard" else MLflow)(target, out, cfg,
                                                                      first_round)
            except Exception as e:  # noqa: BLE001 - e.g. no server there: said, before round 0
                raise ConfigError(failure(spec, e)) from None
            self.trackers.append(t)
            self.spec[id(t)], self.sent[id(t)] = spec, first_round
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
                            "in its folder; after the run, `%s` sends it", t.where,
                            type(e).__name__, _short(e), self.upload_command([t]))
                self.trackers.remove(t)
                self.dropped.append(t)
            else:
                self.sent[id(t)] = self.sent.get(id(t), 0) + (what == "row")

    def upload_command(self, trackers: list[Any]) -> str:
        """The command that sends the run's folder to these trackers once the run has ended."""
        import shlex

        return f"fednet track upload {shlex.quote(str(self.out))}" + "".join(
            f" --track {shlex.quote(self.spec.get(id(t), ''))}" for t in trackers)

    def row(self, row: dict[str, Any]) -> None:
        self._each("row", row)

    def recover(self, rows: list[dict[str, Any]]) -> None:
        """Before the summary: each dropped tracker whose server answers again gets the rows it
        missed and is back for the end."""
        for t in list(self.dropped):
            if not getattr(t, "reachable", lambda: False)():
                continue
            try:
                t.rows(rows[self.sent.get(id(t), 0):])
            except Exception:  # noqa: BLE001 - still failing: it stays dropped
                continue
            log.warning("tracking to %s is back: it got the %d rows it missed", t.where,
                        len(rows) - self.sent.get(id(t), 0))
            self.dropped.remove(t)
            self.trackers.append(t)

    def notes(self) -> dict[str, Any]:
        """summary.json's "tracking" entry when trackers stayed dropped ({} otherwise)."""
        if not self.dropped:
            return {}
        return {"tracking": {"dropped": [self.spec.get(id(t), "") for t in self.dropped],
                             "upload": self.upload_command(self.dropped)}}

    def end(self, summary: dict[str, Any] | None, out: Path | None) -> None:
        """The run's end (summary None: it ended before its first round); a dropped MLflow run
        is ended as FAILED where its server answers (abandon)."""
        self._each("end", summary, out)
        for t in self.dropped:
            try:
                getattr(t, "abandon", lambda: None)()
            except Exception:  # noqa: BLE001 - best effort: upload replaces it
                pass
        self.trackers = []
