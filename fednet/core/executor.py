"""Runs Tasks inside one client: builds the local data and model, stamps simulated time.

No sockets here: the in-process runtime and the ZeroMQ client both call `on_task`.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import NoReturn

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from fednet import algorithms, opcount
from fednet.network import latency
from fednet.algorithms.attack_client import attacker_for, snapshot
from fednet.algorithms.common import evaluate_own
from fednet.algorithms.contract import ClientContext
from fednet.algorithms.state import Shapes, to_device
from fednet.core.work import check_work
from fednet.compress.client import UpdateCodec
from fednet.core.state_files import StateStore, decode_client, encode_client, state_bound
from fednet.config import RunConfig, from_dict
from fednet.errors import ConfigError, Dropout
from fednet.metrics.files import OutputError
from fednet.data import load_dataset, run_partition
from fednet.data.partition import part_size, part_sizes
from fednet.data.client_data import checked_indices, client_data
from fednet.data.augment import augmentation, identity
from fednet.data.views import Examples, Rows
from fednet.network.latency import Profile
from fednet.models import build_model
from fednet.models.arrays import adopt_arrays, load_arrays, state_arrays, state_nbytes
from fednet.network.availability import Availability, from_welcome
from fednet.network.churn import offline_reason
from fednet.platform.malloc import CLIENT_RESERVE_MODELS, reserve_once, reuse_freed_memory
from fednet.training.flops import metered
from fednet.training.objective import get_objective
from fednet.protocol import Message, MsgKind
from fednet.protocol.schema import parse_client
from fednet.protocol.frames import is_private
from fednet.core.wire import failure_message, message_task, result_message

log = logging.getLogger("fednet.client")
algorithms.preload()  # every algorithm's halves, imported once (in the zygote, before it forks)


_WORKING: dict[tuple, torch.nn.Module] | None = None  # see share_working_models
_STORE_WARNED = False  # a store that cannot be written is reported once per process


def share_working_models(on: bool = True) -> None:
    """From now on, clients built in this process whose algorithm keeps no model between tasks
    (ClientUpdate.keeps_model False) share one working model per (model, device): each task
    loads the received model into it before training, and the process runs its clients' tasks
    one at a time (client.host, which also lets every earlier send finish first). Saves one
    model per further client (FedSeq CNN: 3 MiB). on=False: every client builds its own again."""
    global _WORKING
    _WORKING_BYTES.clear()
    if not on:
        _WORKING = None
    elif _WORKING is None:
        _WORKING = {}


_WORKING_BYTES: dict[tuple, tuple[torch.nn.Module, int]] = {}  # key -> (its model, state_nbytes)


def _working_nbytes(key: tuple, model: torch.nn.Module) -> int:
    """state_nbytes of the shared working model of `key`, read once (its state's arrays are
    loaded into, never replaced: ~20 us a client built)."""
    got = _WORKING_BYTES.get(key)
    if got is None or got[0] is not model:
        got = _WORKING_BYTES[key] = (model, state_nbytes(model))
    return got[1]


@functools.lru_cache(maxsize=16)
def _augment(name: str, dataset: str):
    """The train-time augmentation, or None when it is the identity (no random draws at all);
    one function per (name, dataset) in a process, so that --batch-clients sees a block's
    clients share it (algorithms/updates.block_refusal compares them by identity)."""
    fn = augmentation(name, dataset)
    return None if fn is identity else fn


@dataclass
class Outcome:
    """A reply message plus the simulated delays it accumulated (for real-time mode)."""

    reply: Message
    sim_delay: float
    real_elapsed: float


class Executor:
    """One client's data, model and algorithm state."""

    def __init__(self, cid: int, cfg: RunConfig, profile: Profile, device: str = "cpu",
                 run_id: str = "", indices: np.ndarray | None = None, files: bool = True,
                 out: str = "") -> None:
        self.cid, self.cfg, self.profile, self.run_id = cid, cfg, profile, run_id
        self.device = torch.device(device)
        d = cfg.data
        ds = load_dataset(d.dataset, d.data_root or None, d.download)
        cd = client_data(ds, d, cfg.clients, cfg.seed, cid, indices)
        # index views of the run's shared images (data/views.py): nothing copied on the CPU; on a
        # device only the client's own partition is, and test rows travel batch by batch
        rows = Rows.of(cd.images, cd.rows, self.device)
        x: Examples = rows if self.device.type == "cpu" else rows.materialize()
        y = torch.from_numpy(np.ascontiguousarray(cd.y)).to(self.device)
        # the same seeded initial weights as the server's, so personal models need no download
        self._initial = lambda: build_model(algorithms.model_name(cfg), ds.num_classes,
                                            ds.input_shape, dataset=d.dataset, seed=cfg.seed)
        self.update = algorithms.build_client(cfg)  # the client half only
        self.dataset = ds
        self.attack = attacker_for(cfg, cid)  # --attack: None unless this client is malicious
        working = None if self.update.keeps_model else _WORKING
        if working is not None:
            key = (algorithms.model_name(cfg), ds.num_classes, tuple(ds.input_shape), d.dataset,
                   cfg.seed, str(self.device))
            model = working.get(key)
            if model is None:
                model = working[key] = self._initial().to(self.device)
            nbytes = _working_nbytes(key, model)
        else:
            model = self._initial().to(self.device)
            nbytes = state_nbytes(model)
        self._own_model_bytes = 0 if working is not None else nbytes  # (kept_bytes)
        self._kept: tuple[tuple, int] | None = None  # kept_bytes' count and the objects it read
        if reuse_freed_memory(nbytes):  # big models: into mapped pages
            reserve_once(CLIENT_RESERVE_MODELS * nbytes)  # while the process registers
        self.availability: Availability | None = None  # --availability: set by the runtime
        # a stateful client keeps its state in the run's store (core/state_files.py) between
        # tasks, so that its objects can be dropped; without a results folder (or once the store
        # cannot be written) the state stays in this object and it must be kept (holds_state)
        out = out or cfg.out
        n = cfg.net
        c = n.codecs()
        self.codec = UpdateCodec(c.up, cfg.seed, cid, c.down, c.handoff)  # --compress and co.
        self.stateful = self.update.stateful() or self.codec.spec.feedback
        bound = state_bound(nbytes, len(cd.y))
        self.store = (StateStore(out, cfg.algo.name, bound) if files and out and self.stateful
                      else None)
        self.session: str | None = None  # the server session whose state this object holds
        dev = self.device
        self.ctx = ClientContext(cid, model, x, y, cfg, dev, self.update.new_state(),
                                 test_x=Rows.of(cd.test_images, cd.test_rows, dev),
                                 test_y=torch.from_numpy(cd.test_y).to(dev),
                                 augment=_augment(cfg.train.augment, d.dataset),
                                 objective=get_objective(ds.objective),
                                 pooled=lambda: (torch.from_numpy(ds.train_x).to(dev),
                                                 torch.from_numpy(ds.train_y).to(dev)))
        if self.attack is not None:  # label flipping, the backdoor: its own data poisoned
            self.attack.poison(self.ctx, ds.num_classes, tuple(ds.input_shape))

    @property
    def num_examples(self) -> int:
        """Local training examples."""
        return self.ctx.num_examples

    def kept_bytes(self) -> int:
        """About what keeping this object between tasks costs (a stateless client's: fednet
        local keeps those within a budget, core/inproc.Executors): the index and the labels of
        its training and test rows (a natural client's own images too; the whole partition
        where a device holds it), its model unless it is the shared working one, and its Python
        objects."""
        c = self.ctx
        held = (c.x, c.y, c.test_x, c.test_y, self.dataset, self._own_model_bytes)
        got = self._kept
        if got is not None and len(got[0]) == len(held) and all(
                a is b for a, b in zip(got[0], held)):  # the same objects: the same bytes
            return got[1]
        natural = getattr(self.dataset, "natural", None) is not None
        n = OBJECT_BYTES + self._own_model_bytes + _held_bytes(c.x, natural) + _held_bytes(
            c.y, natural) + _held_bytes(c.test_x, natural) + _held_bytes(c.test_y, natural)
        self._kept = (held, n)
        return n

    def on_task(self, msg: Message, nbytes: int) -> Outcome:
        """Run a TASK received with `nbytes` on the wire; return RESULT (or FAILURE)."""
        t0 = time.perf_counter()
        recv = msg.sim_time + latency.receive_delay(self.profile, nbytes, self.sender_link(msg))
        off = offline_reason(self.availability, self.cid, msg.sim_time, recv, "while the task "
                             "arrived")
        if off is not None:  # gone before the model was in: nothing to train
            return self._offline(msg, off, t0)
        try:
            task = message_task(msg)
            handoff = msg.kind == MsgKind.HANDOFF
            decoded: opcount.Ops = {}  # nothing to decode (no --compress-down/-handoff):
            if (self.codec.peer if handoff else self.codec.down).on:  # no count opened either
                with opcount.counted() as decoded:  # --compress-down, --compress-handoff: the
                    # decoding is the client's work, on the clock with its training (below)
                    task.arrays = self.codec.received(task.arrays, handoff,
                                                      self._layout() if handoff else None)
            check_work(task.body, self.cfg)
            ckpt = task.body.get("ckpt")
            if self.store is not None and self.session != msg.run_id:  # from the store
                self.take_back(self.store.take(self.cid, msg.run_id, ckpt))
            self.session = msg.run_id
            ref = {} if self.update.sends_updates else self.codec.reference(task.arrays)
            received = snapshot(task.arrays) if self.attack is not None else None
            if getattr(self.update, "adopts_received", False):  # one copy: the joined buffers
                own = {k: a for k, a in task.arrays.items() if is_private(a)}
                if own:
                    adopt_arrays(self.ctx.model, own)
            with metered(self.profile.train_flops_per_s > 0) as work:  # its batches' FLOPs
                arrays, body = self.update.run(self.ctx, task)
                if self.attack is not None and received is not None:  # --attack: the values
                    # lie, the layout and count do not
                    arrays = self.attack.forge(self, task, arrays, received)
                arrays = self.codec.encode(arrays, ref, task.round)
                if task.body.get("evaluate"):  # personalized evaluation: its model, its split
                    body.update(evaluate_own(self.ctx))
            if self.store is not None:
                self._save(task.round, msg.run_id, ckpt)
        except Dropout as e:  # a simulated dropout (--secagg-drop): no traceback to log
            reply = failure_message(self.cid, msg.task_id, msg.round, str(e), recv, self.run_id)
            return Outcome(reply, recv - msg.sim_time, time.perf_counter() - t0)
        except Exception as e:  # a failing update is data for the server, not a dead client
            log.exception("client %d: task %d failed", self.cid, msg.task_id)
            reply = failure_message(self.cid, msg.task_id, msg.round, f"{type(e).__name__}: {e}",
                                    recv, self.run_id)
            return Outcome(reply, recv - msg.sim_time, time.perf_counter() - t0)
        examples = self.num_examples  # (read once: the body's default and the result's n)
        samples = int(body.get("samples", examples))
        opcount.add(work.ops, decoded)  # (the task's decoding, before its training)
        send = recv + latency.compute_time(self.profile, samples, work.flops, work.ops)
        off = offline_reason(self.availability, self.cid, recv, send, "during local training")
        if off is not None:
            return self._offline(msg, off, t0)
        reply = result_message(self.cid, task, arrays, body, examples, send, self.run_id)
        return Outcome(reply, send - msg.sim_time, time.perf_counter() - t0)

    def _layout(self) -> dict | None:
        """This client's model layout (name -> (shape, dtype)), what a compressed hand-off
        must rebuild; None without --compress-handoff."""
        if not self.codec.peer.on:
            return None
        return {k: (tuple(a.shape), a.dtype) for k, a in state_arrays(self.ctx.model).items()}

    links: Sequence[Profile] | None = None  # every client's profile: set by the runtime (or lazily)

    def sender_link(self, msg: Message) -> Profile | None:
        """The peer's profile when `msg` is a hand-off (its uplink and latency are paid too,
        latency.peer_delay); None for a task from the server."""
        if msg.kind != MsgKind.HANDOFF:
            return None
        if self.links is None:
            cfg = self.cfg
            if cfg.latency.file:  # WELCOME carried no table: its Spec says it has no hand-offs
                raise RuntimeError(
                    f"client {self.cid}: a hand-off arrived, but algorithm {cfg.algo.name!r} is "
                    "registered with handoffs=False, so WELCOME carried no peer links; register "
                    "it with Spec(..., handoffs=True)")
            self.links = latency.profiles(cfg.latency, cfg.clients, cfg.seed)
        cid = parse_client(msg.sender)  # a real client of the run unless a peer without a
        # run key lies: then no link of its own is charged (never an IndexError)
        return self.links[cid] if cid is not None and cid < len(self.links) else None

    def welcome(self, run_id: str, arrays: dict[str, np.ndarray]) -> Availability | None:
        """Take a WELCOME's run id, every client's profile and availability (presets rebuilt,
        traces from arrays)."""
        self.run_id = run_id
        self.links, self.availability = welcome_tables(self.cfg, arrays)
        return self.availability

    def _offline(self, msg: Message, off: tuple[float, str], t0: float) -> Outcome:
        """The FAILURE of a client that went offline at off[0] (--availability)."""
        reply = failure_message(self.cid, msg.task_id, msg.round, off[1], off[0], self.run_id)
        return Outcome(reply, off[0] - msg.sim_time, time.perf_counter() - t0)

    # ---- state in the store ----------------------------------------------------------------
    @property
    def holds_state(self) -> bool:
        """True when this object is the only home of the client's state (no store): dropping it
        would lose the state."""
        return self.store is None and self.stateful

    def _save(self, rnd: int, run_id: str, ckpt: int | None) -> None:
        """The state after this task into the store; when it cannot be written the state stays
        here (one warning per process) and the store marks the client's state unsaved, so that
        a --resume says it cannot restore it (fednet local keeps it in its checkpoint)."""
        store = self.store
        assert store is not None, "a state is saved only into a store"
        try:
            arrays, meta = encode_client(*self.client_state())
            store.put(self.cid, rnd, run_id, ckpt, {**arrays, **self.codec.state()}, meta)
        except (OSError, OutputError) as e:  # a full disk, a read-only one, no permission
            global _STORE_WARNED
            if not _STORE_WARNED:
                log.warning("client %d: cannot write its state into %s (%s); clients whose state "
                            "cannot be written keep it in memory from now on (a --resume of a "
                            "later checkpoint cannot restore it, except under fednet local)",
                            self.cid, store.out, e)
                _STORE_WARNED = True
            store.unsaved(self.cid)
            self.store = None

    def client_state(self) -> tuple[object, dict[str, np.ndarray] | None]:
        """(the typed client state, the personal model or None): what a checkpoint keeps."""
        keep = self.update.keeps_model
        return self.ctx.state, state_arrays(self.ctx.model) if keep else None

    def restore(self, state: object, model: dict[str, np.ndarray] | None) -> None:
        """Take a checkpointed client state back (tensors moved to this client's device)."""
        self.ctx.state = to_device(state, self.device)
        if model is not None:
            load_arrays(self.ctx.model, model)

    def take_back(self, got: tuple[dict[str, np.ndarray], dict] | None) -> None:
        """Restore (arrays, meta) from this client's own file, checked first; None: its initial
        state (nothing to do for an object built for this task)."""
        if got is None:
            if self.session is None:
                return
            self.codec.residual = None
            self.ctx.state = self.update.new_state()
            if self.update.keeps_model:
                load_arrays(self.ctx.model, state_arrays(self._initial()))
            return
        arrays, meta = dict(got[0]), got[1]
        self.codec.restore(arrays)
        model = self.ctx.model
        shapes = Shapes(state_arrays(model), [tuple(p.shape) for p in model.parameters()
                                              if p.requires_grad], self.cfg.clients)

        def fail(problem: str) -> NoReturn:
            raise ValueError(f"client {self.cid}: saved state: {problem}")
        state, saved = decode_client(self.update.State, arrays, meta or {}, shapes, fail,
                                     self.device)
        self.restore(state, saved if self.update.keeps_model else None)


OBJECT_BYTES = 8 << 10
"""An executor's Python objects and tensor headers (3.3 KiB of Python objects measured with
tracemalloc on digits, the tensors' own headers besides), rounded up."""


def _held_bytes(t: object, own_base: bool) -> int:
    """Bytes behind a client's rows: a tensor's, or a Rows view's index (and its base images
    when they are the client's own, `own_base`)."""
    if isinstance(t, Rows):
        return t.index.nbytes + (t.base.nbytes if own_base else 0)
    return t.nbytes if isinstance(t, torch.Tensor) else 0


def welcome_tables(cfg: RunConfig, arrays: dict[str, np.ndarray], peers: bool = True
                   ) -> tuple[Sequence[Profile] | None, Availability | None]:
    """(every client's profile, the availability) as a WELCOME gives them: presets rebuilt from
    the configuration, traces from its arrays. Without `peers` (the run hands no model between
    clients) no client's link is needed: None, not a table of the whole population (a million
    profiles: ~184 MB in every client process, from 184 B a profile measured on 20,000)."""
    return (latency.links(cfg.latency, cfg.clients, cfg.seed, arrays) if peers else None,
            from_welcome(cfg.latency.availability, cfg.clients, cfg.seed, arrays))


def num_examples(cfg: RunConfig, cid: int, indices: np.ndarray | None) -> int:
    """Client cid's training examples (Executor.num_examples) without building it: its share
    of the server's partition, else its part of the run's (a natural client's size alone)."""
    d = cfg.data
    ds = load_dataset(d.dataset, d.data_root or None, d.download)  # cached: once per process
    if indices is None:
        return part_size(run_partition(ds, d, cfg.clients, cfg.seed), cid)
    if getattr(ds, "natural", None) is None:  # a host with other data: one line at WELCOME
        checked_indices(indices, len(ds.train_y))
    return int(len(indices))


def natural_examples(cfg: RunConfig, cids: np.ndarray) -> np.ndarray:
    """num_examples of every natural client of `cids` (their WELCOME carries no indices), in
    one call: a million idle clients of a process counted in ~0.1 s (one by one, ~1 s)."""
    d = cfg.data
    ds = load_dataset(d.dataset, d.data_root or None, d.download)
    return part_sizes(run_partition(ds, d, cfg.clients, cfg.seed), cids)


def welcome_config(b: dict) -> RunConfig:
    """The run's configuration from a WELCOME's body; ConfigError when this client cannot use it."""
    try:
        return from_dict(b["config"])
    except (ConfigError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise ConfigError(f"the server sent a configuration this client cannot use ({e}); "
                          "are both on the same fednet version?") from None


KEEP_BYTES = 32 << 20
"""What the Executors of stateless clients kept between their tasks may weigh in all
(Executor.kept_bytes: ~8 KiB and the client's row index and labels each; 4,000 digits clients)."""


class KeptExecutors:
    """Stateless clients' Executors kept for their next task, least recently used dropped first
    beyond `keep_bytes` (one that alone weighs more is not kept): a small population's clients
    are built once, a large one's idle clients cost nothing. fednet local's (core/inproc.py) and
    each `fednet launch` client process's (client/host.py)."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.kept: OrderedDict[int, tuple[Executor, int]] = OrderedDict()
        self.keep_bytes, self.kept_bytes = keep_bytes, 0

    def take(self, cid: int) -> Executor | None:
        """Client cid's kept Executor (no longer kept), or None."""
        got = self.kept.pop(cid, None)
        if got is None:
            return None
        self.kept_bytes -= got[1]
        return got[0]

    def keep(self, ex: Executor) -> None:
        """Keep ex (a stateless client's) within the budget."""
        n = ex.kept_bytes()
        if n > self.keep_bytes:
            return
        self.kept[ex.cid] = (ex, n)
        self.kept_bytes += n
        while self.kept_bytes > self.keep_bytes:
            self.kept_bytes -= self.kept.popitem(last=False)[1][1]

    def clear(self) -> None:
        """Drop them all (the run ended, or a new WELCOME may have changed the settings)."""
        self.kept.clear()
        self.kept_bytes = 0
