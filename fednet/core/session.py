"""What every runtime shares: validated config, results folder, algorithm, ledger and driver."""
from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fednet import algorithms
from fednet.network import latency
from fednet.algorithms.contract import ServerInfo
from fednet.algorithms.attack_client import attack_metrics
from fednet.algorithms.robust_spec import malicious_ids
from fednet.algorithms.state import Shapes
from fednet.compress import Spec
from fednet.compress.downlink import Downlink, for_peer
from fednet.algorithms.checks import check_data, eval_mode, validate
from fednet.config import RunConfig
from fednet.data import load_dataset, natural, run_partition
from fednet.data.base import Dataset
from fednet.data.partition import part_size, part_sizes
from fednet.data.stats import label_histogram, partition_summary
from fednet.metrics.accounting import Ledger
from fednet.metrics.files import OutputError, atomic_file
from fednet.metrics.history import History, resolve_out
from fednet.metrics.progress import Progress
from fednet.metrics.target import cost_summary, parse_target
from fednet.metrics.tracking import Tracking
from fednet.errors import ConfigError
from fednet.core import checkpoint, store_check
from fednet.core.arrivals import Arrivals
from fednet.core.evaluate import Evaluator
from fednet.core.rounds import RoundDriver, no_extra_eval
from fednet.core.status import RunStatus
from fednet.core.summary import robust_summary
from fednet.network import availability
from fednet.network.churn import NO_CHURN, Churn
from fednet.network.step import Network
from fednet.platform.proc import peak_rss_bytes
from fednet.core.state_files import NO_MANIFEST, Manifest, lineage, state_bound
from fednet.core.wire import task_size
from fednet.core.work import LATEST_WORK, ClientCompute, PlainWork

if TYPE_CHECKING:
    from torch import nn
from fednet.types import Arrays, ClientInfo, Failure, Result, Task, lookup

log = logging.getLogger("fednet")


class Session:
    """Builds the server-side pieces of a run from a config (no sockets)."""

    def __init__(self, cfg: RunConfig, quiet: bool = False, write: bool = True,
                 out: Path | None = None, resume: bool = False, local: bool = False,
                 store_here: bool = True) -> None:
        cfg, said = private_plan(validate(cfg))  # --dp-epsilon: the noise calibrated first
        self.cfg = cfg
        self.target = parse_target(cfg.target)  # (Fx:RUN: that run's summary read once, now)
        self.local = local  # fednet local: the clients' state goes into the checkpoint
        # the run's id: its first half names the run (kept across --resume: the clients' store
        # files carry it, state_files.lineage), its second half this session
        self.run_id = uuid.uuid4().hex
        d = cfg.data
        ds, label_hist = self._partition(cfg)
        check_data(cfg, ds.num_classes, lambda: part_sizes(self.parts, np.arange(cfg.clients)),
                   tuple(ds.input_shape))
        self.profiles = latency.profiles(cfg.latency, cfg.clients, cfg.seed)
        self.availability = availability.build(cfg.latency.availability, cfg.clients, cfg.seed)
        self.algo = algorithms.build(cfg)  # the server half
        self.algo.calibrated = bool(said)  # (differential privacy: summary.json says so)
        self.spec = algorithms.get(cfg.algo.name)  # its declarations (result body keys)
        self.handoffs = self.spec.handoffs  # rings: WELCOME's tables
        codecs = cfg.net.codecs()
        self.compress = codecs.up  # --compress: results decoded on arrival
        client = algorithms.client_class(cfg.algo.name)  # the client half's class
        self.update_results = client.sends_updates  # results are updates: no reference
        down = codecs.down
        self.handoff_codec = codecs.handoff
        self.evaluator = Evaluator(cfg)
        self.algo.setup(self.evaluator.initial, self.evaluator.trainable)
        ev = self.evaluator
        pre = ev.pretrain_init() if self.algo.wants_pretrain_init else None
        self.algo.bind(ServerInfo(ds.num_classes, label_hist, ev.exemplars, pre, ev.kinds,
                                  ev.matching, ev.linears, lambda cid: part_size(self.parts, cid)))
        if cfg.dp.sgd_noise > 0:
            _check_private_model(ev.model)
        self.out = (out or resolve_out(cfg)) if write else None
        self.ledger = Ledger()
        self.resumed_clients: checkpoint.ClientStates = {}  # fednet local --resume: per client
        self.client_view: Callable[[], checkpoint.ClientStates | None] | None = None  # by local
        # the clients' store on this disk (fednet local, launch), named in every checkpoint
        self.manifest = (Manifest() if store_here and self.out is not None
                         and (client.stateful() or self.compress.feedback) else None)
        state = self._resume_state() if resume else None
        self.tracking = Tracking(cfg.track, self.out, {k: v for k, v in cfg.to_dict().items()
                                                       if k != "out"}, state["rows"] if state else 0)
        self.history = History(self.out, cfg, keep_rows=state["rows"] if state else -1,
                               resolved={"model": self._model_summary()["model"],
                                         "eval": eval_mode(cfg)})
        self.tracking.start()
        self.history.listeners.append(self.tracking.row)
        self.progress = Progress(cfg.rounds, quiet=quiet)
        if said and state is None:
            self.progress.message(said)
        if cfg.tuned and state is None:
            self.progress.message(f"{cfg.algo.name} on {d.partition}: tuned defaults "
                                  f"{' '.join(map(_as_option, cfg.tuned))} (options you give win)")
        self.driver = self._driver(cfg, client.stateful(), down, state)
        if not local:  # a served run's first reply reads it (latest_return): the first count of
            # the model's work (training/flops: ~0.7 s, torch's counter starting) now, not inside
            # round 0's wall-clock; in-process clients start the counter as they train
            self._work.batch(self._work.batch_size)

    def _partition(self, cfg: RunConfig) -> tuple[Dataset, np.ndarray | None]:
        """Load the dataset and split it (self.parts; natural: built when asked for); the
        partition's statistics and label histograms (of a bounded sample for natural data)."""
        d = cfg.data
        ds = load_dataset(d.dataset, d.data_root or None, d.download)
        self.parts = run_partition(ds, d, cfg.clients, cfg.seed)
        self.histograms: Sequence[list[int] | None]  # natural: None beyond the described clients
        if ds.natural is not None:
            self.stats, self.histograms, label_hist = natural.summary(ds, d, cfg.clients, cfg.seed)
            if eval_mode(cfg) == "clients":
                natural.check_own_tests(ds, cfg.clients)
        else:
            self.stats = partition_summary(self.parts, ds.train_y, ds.num_classes)
            self.histograms = [label_histogram(ds.train_y[p], ds.num_classes) for p in self.parts]
            label_hist = np.array(self.histograms)
        return ds, label_hist

    def _driver(self, cfg: RunConfig, stateful: bool, down: Spec, state: dict | None
                ) -> RoundDriver:
        """The round driver with the run's network model, codecs, resume state and checkpoints."""
        size = lambda t: task_size(t, self.run_id)  # noqa: E731 - a TASK's bytes as sent
        driver = RoundDriver(
            cfg, self.algo, self.evaluator, self.ledger, self.history, self.progress,
            network=Network.of(cfg, self.profiles, size),
            churn=Churn(self.availability) if self.availability is not None else NO_CHURN,
            downlink=Downlink(down, cfg.seed),
            arrivals=lambda: Arrivals(  # replies in simulated-time order
                self.earliest_return, size, float(cfg.latency.deadline)),
            checkpoint=self._checkpoint, manifest=self.manifest or NO_MANIFEST,
            client_state=stateful or self.compress.feedback,  # (a residual is state too)
            extra_eval=attack_metrics(cfg, self.evaluator) or no_extra_eval,
            compute=ClientCompute(cfg, lambda cid: self._pooled_examples
                                  or part_size(self.parts, cid), self.compute_seconds))
        driver.split.profiles, driver.split.task_work = self.profiles, getattr(self.algo, "task_work", None)
        if state is not None:
            driver.resume(state)
        return driver

    def _checkpoint(self) -> bool:
        """A checkpoint of the driver's last finished round, when there is a results folder;
        whether one was written."""
        if self.out is None:
            return False
        checkpoint.save(self.out, self.algo, self.driver,
                        self.client_view() if self.client_view else None,
                        lineage=lineage(self.run_id), manifest=self.manifest)
        return True

    def _resume_state(self) -> dict:
        if self.out is None:
            raise ConfigError("--resume needs a results folder")
        ev = self.evaluator
        shapes = Shapes(ev.initial, [tuple(p.shape) for p in ev.model.parameters()
                                     if p.requires_grad], self.cfg.clients, self.algo.state)
        cls = algorithms.client_class(self.cfg.algo.name)
        state, self.resumed_clients = checkpoint.load(  # checked, then restored
            self.out, self.algo, self.cfg, shapes, cls, self.local)
        if self.manifest is not None:  # the clients' store on this disk: every file checked
            store_check.check_store(self.out, state, cls.State, Shapes(ev.initial, shapes.params,
                                                                self.cfg.clients),
                                   self._state_bound(), _residual_check)
            self.manifest = state["_manifest"] or Manifest()
        if state.get("lineage"):  # the same run: its clients' files say so
            self.run_id = state["lineage"] + self.run_id[len(state["lineage"]):]
        return state

    def _state_bound(self) -> Callable[[int], int]:
        """Client cid's state file's bound on its arrays' bytes (state_files.state_bound)."""
        nbytes = self.evaluator.model_bytes  # (the state's arrays: parameters and buffers)
        return lambda cid: state_bound(nbytes, part_size(self.parts, cid))

    def arrived(self, done: Result | Failure, sent: float, skipped: int) -> Result | Failure:
        """A reply as the server takes it: a Failure where its client went offline before it
        arrived (--availability), the peers its ring skipped counted (network/churn.py)."""
        return self.driver.churn.upload(done, sent, skipped)

    def skipped_peers(self, rnd: int, skipped: int) -> None:
        """`skipped` offline peers of a ring passed over in round rnd (--availability)."""
        self.driver.churn.note(rnd, skipped)

    def for_peer(self, arrays: Arrays, task_id: int, hop: int) -> Arrays | None:
        """A hand-off's model as it travels to hop (--compress-handoff; None: as it is)."""
        return for_peer(self.handoff_codec, self.cfg.seed, arrays, task_id, hop)

    def checkpoint_interrupted(self) -> bool:
        """Ctrl-C (or SIGTERM) while a round's tasks were out: write a checkpoint of the last
        finished round, so that `--resume` continues from it without --checkpoint-every given
        in advance. Not for FedAsync and FedBuff, whose server state changes as replies come,
        nor beside --checkpoint-every (the clients' store then keeps the states from before the
        last periodic checkpoint, which --resume takes). Stateful clients kept the state from
        before this step (tasks carry `ckpt`: RoundDriver.stamp). True when written."""
        d = self.driver
        if (not d.marks.caught or self.out is None or self.driver.staged.virtual_order
                or self.cfg.net.checkpoint_every):
            return False
        if self.client_view is not None and self.client_view():  # states only objects hold
            return False  # (a store that could not be written): some are the round's already
        ledger, self.algo.state.next_task, d.sim_time = d.marks.mark  # as the round began
        checkpoint.save(self.out, self.algo, d, None, ledger, lineage(self.run_id), self.manifest)
        return True

    def earliest_return(self, task: Task) -> float:
        """The earliest simulated time a reply to `task` can arrive, from the server's own
        tables (core/arrivals.py): its start, the client's round trip, the download of its
        tensors and the compute of its epochs over the client's partition."""
        p = self.profiles[task.cid]
        tensors = sum(a.nbytes for a in (task.arrays if task.wire is None else task.wire).values())
        epochs, n = int(task.body.get("epochs", self.cfg.train.epochs)), part_size(self.parts, task.cid)
        work = epochs * self._work.epoch(n) if p.train_flops_per_s > 0 else 0
        return task.sim_time + p.rtt_s + tensors / p.down_bps + latency.compute_time(p, epochs * n, work)

    def latest_return(self, task: Task) -> float:
        """The latest simulated time a reply to `task` can carry, from the server's own tables:
        its start and, for every client of its route from the task's hop on, a round trip and
        three transfers (the task, a hand-off, the result: each at most the larger of the
        task's arrays and the model, plus 1 MiB of headers) at its slowest link, and four times
        the compute of its epochs over its partition (the most epochs any task of the run may
        ask for), plus the run's deadline. Generous on purpose: only a false stamp goes past."""
        tensors = sum(a.nbytes for a in (task.arrays if task.wire is None else task.wire).values())
        moved = 3 * (max(tensors, self.evaluator.model_bytes) + (1 << 20))
        most = self._most_epochs
        pooled = self._pooled_examples
        flops_1, ops_1 = self._latest_unit
        bound = self._protocol_bound
        t = task.sim_time + 1.0 + float(self.cfg.latency.deadline)
        for cid in task.route[task.hop:]:
            p = self.profiles[cid]
            samples = 4 * most * (pooled or part_size(self.parts, cid)) + 4096
            work = LATEST_WORK * samples * flops_1 if p.train_flops_per_s > 0 else 0
            calls = {k: LATEST_WORK * samples * n for k, n in ops_1}
            t += 2 * p.rtt_s + moved / min(p.down_bps, p.up_bps) + latency.compute_time(
                p, samples, work, {**bound, **calls})
        return t

    @functools.cached_property
    def _latest_unit(self) -> tuple[int, tuple[tuple[str, float], ...]]:
        """latest_return's unit of work, read once a run instead of once a reply: plain
        training's FLOPs and dispatched operations of one epoch over one example (_work's, which
        the run's model and --batch-size fix)."""
        return self._work.epoch(1), tuple(self._work.epoch_ops(1).items())

    def compute_seconds(self, cid: int, epochs: int, examples: int) -> float:
        """Simulated seconds of `epochs` of plain training over `examples` at client cid's rate
        (the rows' client_compute_s)."""
        p = self.profiles[cid]
        if p.train_flops_per_s <= 0:
            return latency.compute_time(p, epochs * examples)
        calls = {k: epochs * n for k, n in self._work.epoch_ops(examples).items()}
        return latency.compute_time(p, epochs * examples, epochs * self._work.epoch(examples),
                                    calls)

    @functools.cached_property
    def _protocol_bound(self) -> dict[str, float]:
        """The most protocol work a task may charge (latest_return; secure aggregation's)."""
        return dict(b()) if callable(b := getattr(self.algo, "work_bound", None)) else {}

    @functools.cached_property
    def _work(self) -> PlainWork:
        """Plain training's FLOPs on the server's model (earliest_return, latest_return)."""
        return self.evaluator.plain_work(self.cfg.train.batch_size)

    @functools.cached_property
    def _pooled_examples(self) -> int:
        """The training set's size when the algorithm's client trains on all of it (the
        centralized reference), else 0."""
        cls = algorithms.client_class(self.cfg.algo.name)
        return int(self.stats.get("samples", 0)) if cls.trains_on_pooled else 0

    @functools.cached_property
    def _most_epochs(self) -> int:
        from fednet.core.work import max_epochs
        return max_epochs(self.cfg)

    def model_template(self) -> dict[str, Any]:
        """The clients' initial model (name, classes, input shape, dataset, seed), for
        models.keep_template: built once, then copied by every client."""
        d = self.cfg.data
        ds = load_dataset(d.dataset, d.data_root or None, d.download)  # cached
        return {"name": algorithms.model_name(self.cfg), "num_classes": ds.num_classes,
                "input_shape": list(ds.input_shape), "dataset": d.dataset, "seed": self.cfg.seed}

    def describe(self) -> str:
        """One line on the partition, for the console at start."""
        s, d = self.stats, self.cfg.data
        if "described_clients" in s:  # a naturally federated dataset
            return natural.describe(load_dataset(d.dataset, d.data_root or None, d.download), d, s)
        alpha = f"(alpha={d.alpha})" if d.partition == "dirichlet" else ""  # only it reads alpha
        return (f"{self.cfg.clients} clients, {d.dataset} {d.partition}{alpha}"
                f": {s['min_size']}-{s['max_size']} samples each,"
                f" {s['mean_classes']:.1f} classes per client on average")

    def finish(self, clients: Sequence[ClientInfo], extra: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        """Write clients.jsonl, final_model.npz, the plots and summary.json (last: it says the
        run is done, with the peak memory of all of it); return the summary. Each file is
        replaced atomically: a disk error is an OutputError naming the file, the files written
        before it are intact and those after it (summary.json among them: it never describes a
        final model that is not there) keep their last good content."""
        if self.driver.status == RunStatus.RUNNING:  # an error escaped the rounds (re-raised)
            self.driver.end(RunStatus.ERROR)
        summary = self.driver.summary(clients, {"partition": self.stats, "run_id": self.run_id,
                                                "out": str(self.out) if self.out else None,
                                                **self._model_summary(),
                                                **robust_summary(self.cfg, self.history.rows),
                                                **cost_summary(self.history.rows, self.target,
                                                               self.driver.setup_stats.get("bytes")),
                                                **(extra or {})})
        self.history.close()
        if self.out is None:
            return summary
        self.tracking.recover(self.history.rows)  # a tracker dropped mid-run, if it is back
        summary.update(self.tracking.notes())  # one still away: how to upload the run later
        self.history.clients(self._client_rows(clients))
        if self.cfg.population_file:
            self.history.population(self._population())
        self._write_model(self.out)
        self._plots(self.out)
        if "server_peak_rss_bytes" in summary:  # the whole run's, its outputs included
            summary["server_peak_rss_bytes"] = peak_rss_bytes()
        self.history.summary(summary)  # last: it says the run is done
        self.tracking.end(summary, self.out)
        return summary

    def _model_summary(self) -> dict[str, Any]:
        """summary.json's `model` (the architecture built: auto resolved, a plugin's too) and
        `num_classes` (chance is 1 / num_classes: metrics/seed_health.py)."""
        from fednet.models import resolve_model

        return {"model": resolve_model(algorithms.model_name(self.cfg), self.cfg.data.dataset),
                "num_classes": self.evaluator.num_classes}

    def _client_rows(self, clients: Sequence[ClientInfo]) -> list[dict[str, Any]]:
        """clients.jsonl: each client that took part (was given a task, setup stages included),
        with its size, labels, device, host, profile and task count; the population is
        summary.json's `partition` (and population.npz with --population-file)."""
        info = lookup(clients)
        took = self.driver.participants.tasks
        bad = set(malicious_ids(self.cfg)) if self.cfg.attack.name != "none" else None
        rows = []
        for cid in sorted(took):
            c = info(cid)
            rows.append({"client": cid, "samples": part_size(self.parts, cid),  # (no rows built)
                         "labels": self.histograms[cid], "tasks": took[cid],
                         "device": c.device if c else None,
                         "host": c.host if c else None, "endpoint": c.endpoint if c else None,
                         "profile": self.profiles[cid].to_dict(),
                         **({"malicious": cid in bad} if bad is not None else {})})
        return rows

    def _population(self) -> dict[str, np.ndarray]:
        """population.npz's columns, row i for client i: samples, tasks, the latency profile's
        five fields (0 bandwidth: unlimited), malicious (with --attack) and labels (clients x
        classes; of the described clients only, for a natural dataset that describes a sample)."""
        n = self.cfg.clients
        took = self.driver.participants.tasks
        links = latency.to_array(self.profiles)
        cols = {"samples": part_sizes(self.parts, np.arange(n, dtype=np.int64)),
                "tasks": np.fromiter((took.get(c, 0) for c in range(n)), np.int64, n),
                **{k: links[:, i] for i, k in enumerate(latency.COLUMNS)}}
        hists = getattr(self.histograms, "hists", None)  # natural: the described clients'
        cols["labels"] = np.asarray(self.histograms if hists is None else hists, np.int64)
        if self.cfg.attack.name != "none":
            cols["malicious"] = np.isin(np.arange(n), malicious_ids(self.cfg))
        return cols

    def _write_model(self, out: Path) -> None:
        with atomic_file(out / "final_model.npz") as fh:  # plain arrays (allow_pickle=False)
            np.savez(fh, allow_pickle=False, **self.algo.eval_arrays())  # (numbers only)

    def _plots(self, out: Path) -> None:
        if not self.history.rows:
            return
        try:
            from fednet.metrics.plots import plot_run
            plot_run(out, self.history.rows)
        except OutputError:
            raise
        except Exception:  # plots are a convenience; a failure must not lose the results
            log.exception("could not draw the plots for %s", out)


def _as_option(kv: str) -> str:
    """'train.batch_size=16' -> '--batch-size 16'; 'algo.params.mu=0.1' -> '--param mu=0.1'."""
    key, _, val = kv.partition("=")
    if key.startswith("algo.params."):
        return f"--param {key[len('algo.params.'):]}={val}"
    return f"--{key.rsplit('.', 1)[-1].replace('_', '-')} {val}"


def private_plan(cfg: RunConfig) -> tuple[RunConfig, str]:
    """(the configuration, what to say): with --dp central|local and no --dp-noise, the noise
    multiplier calibrated to --dp-epsilon over the planned rounds (privacy/plan.py), written
    into the configuration the clients receive and config.toml records."""
    if cfg.dp.mode == "none" or cfg.dp.noise > 0:
        return cfg, ""
    from fednet.privacy.plan import calibrated

    z, said = calibrated(cfg)
    return cfg.replace(**{"dp.noise": z}), said


def _check_private_model(model: nn.Module) -> None:
    """DP-SGD needs per-example gradients of every layer (Opacus's validator)."""
    from fednet.training.dpsgd import check_model

    why = check_model(model)
    if why:
        raise ConfigError(f"--dp-sgd-noise: Opacus cannot compute this model's per-example "
                          f"gradients ({why}); choose a --model without batch norm")


def _residual_check(arrays: dict[str, Any]) -> None:
    """A --compress residual in a client's state file, checked as the client reads it."""
    from fednet.compress.client import UpdateCodec

    UpdateCodec.check_residual(arrays)
