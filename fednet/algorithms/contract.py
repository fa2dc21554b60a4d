"""The algorithm contract: a server Strategy and a client ClientUpdate, each with typed state.

An algorithm is two classes and a Spec (registry.py):

- **Strategy** (server half). `self.state` is a dataclass derived from ServerState: the global
  model, the task counter and whatever else the server keeps between rounds. Each round the
  driver calls `configure_round` (tasks for the clients), `absorb` for every reply as it arrives
  (optional: streaming sums), then `aggregate_round` (new state, metrics to log), and evaluates
  `eval_arrays()` (by default `state.model`).
- **ClientUpdate** (client half). Every client process builds only this half. `run(ctx, task)`
  trains on the client's data and returns (arrays to send, scalar body). Per-client state lives in
  `ctx.state`, an instance of its `State` dataclass; with `keeps_model = True` the client's model
  itself persists between rounds (personal models). A State derived from
  training.optim.OptimizerState keeps the client's optimizer (momentum, Adam's moments) across
  rounds (local.local_sgd(..., keep_optimizer=True)). Losses go through `ctx.loss` /
  `ctx.objective` (training/objective.py: cross-entropy and top-1 accuracy by default).

Both states are checkpointed generically (state.py), so a state field must be one of: arrays keyed
by model entry (`Model`), lists or client-id dicts of them, numpy arrays, torch tensors (client
side: one per trainable parameter in a list, or a tuple of index tensors), or JSON values.
Staged and asynchronous algorithms (FedSeq, FedSeqInter, FedAsync, FedBuff) also override the
optional hooks setup_tasks/setup_results, rounds_per_step, follow_up and interim_points;
FedAsync and FedBuff set `virtual_order` (the driver then hands replies over in simulated-time
order, core/arrivals.py) and `streams_points`, and say when their step ended (step_end). No
method here touches sockets, files or clocks.

A Strategy may hold **pieces** of the server's update path (ServerPiece, added with
`add_piece`: differential privacy's algorithms/private.Privacy is one), each called at declared
points: the state's extra fields (`Fields`, checkpointed with the state), the cohort (`select`),
the round's tasks (`configured`), the round's sum (`sum_of`, FedAvg family), the round's row
(`closed`, FedAvg family), a stop before a round (`stop_before`), the summary (`report`) and
the --resume checks (`resume_problem`, FedAvg family).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fednet import rng, types as roster
from fednet.algorithms.layout import Layout, layout_of
from fednet.algorithms.checks import eval_mode
from fednet.config import RunConfig
from fednet.data.augment import Augment
from fednet.data.views import Examples
from fednet.training.objective import CLASSIFICATION, Objective
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

Model = dict[str, np.ndarray]
"""Arrays named and shaped like entries of the model (a model, an upload, a control variate)."""


@dataclass
class ServerState:
    """What the server half keeps between rounds; algorithms subclass it to add fields."""

    model: Model = field(default_factory=dict)  # the global model (what the server evaluates)
    next_task: int = 0                           # the last task id handed out


@dataclass
class NoState:
    """The client state of an algorithm whose clients keep nothing between rounds."""


@dataclass
class ServerInfo:
    """What the runtime tells the server half about the run (never sent to clients)."""

    num_classes: int
    label_hist: np.ndarray | None = None       # K x N_C, for reports only (e.g. superclient quality)
    exemplars: tuple[np.ndarray, np.ndarray] | None = None  # public exemplar set (x, y)
    pretrain_init: Arrays | None = None        # a second random init (FedSeq's theta_pre; only
    #                                            for a Strategy with wants_pretrain_init)
    kinds: dict[str, str] = field(default_factory=dict)  # state name -> kind (u, v, mu, head, ...)
    matching: str = ""                          # Factorized-FL: the v used for similarity
    linears: list[int] = field(default_factory=list)  # sizes of the Linear weights (FedSeq's clf_*)
    # client id -> its training examples, from the server's partition (DP-SGD's accountant)
    sizes: Callable[[int], int] | None = None


@dataclass
class ClientContext:
    """Everything a local update may touch inside one client process."""

    cid: int
    model: nn.Module
    x: Examples
    y: torch.Tensor
    cfg: RunConfig
    device: torch.device
    state: Any = field(default_factory=NoState)  # the ClientUpdate's State, kept across rounds
    test_x: Examples | None = None  # the test set this client evaluates on (personalized FL)
    test_y: torch.Tensor | None = None
    pooled: Any = None  # callable -> (x, y) of the whole training set (the centralized reference)
    augment: Augment | None = None  # (batch, generator) -> batch, the dataset's train augmentation
    objective: Objective = CLASSIFICATION  # the loss and the score (the dataset's objective)

    @property
    def num_examples(self) -> int:
        """Number of local training examples."""
        return int(len(self.y))

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task's mean loss of a batch (cross-entropy unless the dataset brings another)."""
        return self.objective.loss(out, y)

    def batch_generator(self, rnd: int, purpose: str = "batches") -> torch.Generator:
        """The seeded torch generator for this client's minibatch order in round rnd."""
        return torch.Generator().manual_seed(rng.int_seed(self.cfg.seed, purpose, rnd, self.cid))


class ClientUpdate:
    """The client half: the local update a client runs for each task it receives."""

    State: type = NoState  # the per-client state dataclass (ctx.state)
    keeps_model = False    # True: the client's model persists between rounds (personal models)
    sends_updates = False  # True: results hold updates, not models (--compress takes them as is)
    trains_on_pooled = False  # True: it trains on the pooled training set, not its partition

    def __init__(self, cfg: RunConfig, params: Any) -> None:
        self.cfg, self.p = cfg, params

    @classmethod
    def stateful(cls) -> bool:
        """True when clients keep anything between rounds (checkpoints must hold it)."""
        return cls.keeps_model or bool(dataclasses.fields(cls.State))

    def new_state(self) -> Any:
        """A client's state before its first task."""
        return self.State()

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Train for `task` (ctx.model, ctx.state in place); return (arrays to send, body)."""
        raise NotImplementedError


class ServerPiece:
    """A piece of the server's update path that a Strategy holds (Strategy.add_piece), called
    at the declared points below; every hook's default does nothing, so a piece defines only
    what it changes. `srv` is the Strategy it belongs to (attach sets it)."""

    name: ClassVar[str] = ""  # names the state class its fields extend (Private -> PrivateServerState)
    # a dataclass whose fields the piece adds to the Strategy's state (None: none); they are the
    # state's own fields, so checkpoints write and --resume reads them as the Strategy's
    Fields: ClassVar[type | None] = None
    srv: Strategy

    def attach(self, srv: Strategy) -> None:
        """Join `srv` (add_piece calls it once, before setup)."""
        self.srv = srv

    def init_state(self, st: Any) -> None:
        """Fill the piece's fields of the state before round 0 (after the Strategy's own
        init_state; `st` already has them, at their defaults)."""

    def select(self, rnd: int, clients: Sequence[ClientInfo]) -> list[ClientInfo] | None:
        """The round's cohort drawn the piece's way (the step's target becomes its size), or
        None: the Strategy's own draw (the first piece that answers wins)."""
        return None

    def configured(self, rnd: int, clients: Sequence[ClientInfo], tasks: list[Task]) -> None:
        """Round `rnd` among `clients` got its `tasks` (configure_round's end)."""

    def sum_of(self, part: str) -> Any:
        """FedAvg family: the round's running sum named `part` when the piece makes it (an
        object with StreamingMean's interface: add, weights, count, result, mean64), or None."""
        return None

    def closed(self, rnd: int, results: list[Result], failures: list[Failure],
               metrics: dict[str, Any]) -> dict[str, Any]:
        """FedAvg family: the round's row after the server rule stepped (the piece may add to it
        or remove from it); by default `metrics` as it is."""
        return metrics

    def stop_before(self, rnd: int, clients: Sequence[ClientInfo]) -> tuple[str, str] | None:
        """(status, why) to end the run before round `rnd`, or None (Strategy.stop_before)."""
        return None

    def report(self) -> dict[str, Any]:
        """Sections the piece adds to summary.json (Strategy.report)."""
        return {}

    def resume_problem(self, st: Any, rounds_done: int, participants: Any,
                       last_row: dict[str, Any] | None) -> tuple[str, str] | None:
        """FedAvg family: why a checkpointed state `st` cannot go on ('json' or 'npz', one
        line), or None; asked before the Strategy's own checks."""
        return None


_EXTENDED: dict[tuple[type, ...], type] = {}


def extended_state(base: type, extras: tuple[type, ...], name: str) -> type:
    """The state dataclass `base` with the fields of the pieces' `Fields` dataclasses after its
    own (the order checkpoints write them in), called `name`: one class per (base, extras)."""
    key = (base, *extras)
    if key not in _EXTENDED:
        _EXTENDED[key] = dataclasses.make_dataclass(name, [], bases=(*reversed(extras), base))
    return _EXTENDED[key]


STAGED_HOOKS = {"setup_tasks", "setup_results", "rounds_per_step", "follow_up", "interim_points",
                "step_end", "virtual_order", "streams_points"}  # StagedStrategy's, not Strategy's


@dataclass
class RoundContext:
    """What the runtime tells a Strategy of the step it configures (Strategy.start_round), and
    what the Strategy answers in it: `target`, the results the step needs (picks sets it; the
    driver keeps the first `target` arrivals under --over-select)."""

    round: int
    now: float = 0.0  # the simulated time at the start of the step
    online: Callable[[int, float], bool] | None = None  # --availability, else None
    target: int | None = None


class Strategy:
    """The server half: configures rounds, folds results in, holds the typed server state."""

    State: type[ServerState] = ServerState
    wants_pretrain_init = False  # FedSeq: ServerInfo.pretrain_init, a second random init
    calibrated = False  # --dp: the session calibrated the noise (the DP state records it)
    pieces: tuple[ServerPiece, ...] = ()  # the pieces of its update path (add_piece)

    def __init_subclass__(cls, **kw: Any) -> None:
        """A hook of StagedStrategy defined on a plain Strategy would never be called: refused."""
        super().__init_subclass__(**kw)
        misplaced = sorted(STAGED_HOOKS & set(vars(cls)))
        if misplaced and not getattr(cls, "_staged", False):
            raise TypeError(f"{cls.__name__} defines {', '.join(misplaced)}: those are hooks of "
                            "StagedStrategy (fednet.api); subclass it instead of Strategy")

    def __init__(self, cfg: RunConfig, params: Any) -> None:
        self.cfg, self.p = cfg, params
        self.state: Any = self.State()
        self.trainable: set[str] = set()  # names of trainable parameters (set by the runtime)
        self.info = ServerInfo(num_classes=0)
        self.eval_clients = eval_mode(cfg) == "clients"  # clients report their own accuracy
        self.layout: Layout = {}  # the model's names, shapes and dtypes (set by setup)
        self.ctx = RoundContext(0)  # the step being configured (start_round)

    # ---- what an algorithm defines -----------------------------------------------------------
    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """The round's tasks; by default one per selected client, carrying the global model
        (an override ends with `return self.configured(rnd, clients, tasks)`)."""
        return self.configured(rnd, clients, [
            self.new_task(rnd, [c.cid], self.state.model, self.task_body(rnd, c))
            for c in self.select(rnd, clients)])

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """Fold the round's results into the state; return metrics to log."""
        raise NotImplementedError

    def init_state(self, init: Arrays) -> Any:
        """The state before round 0 from the initial model (self.trainable is known)."""
        return self.State(model=dict(init))

    def result_layout(self, task: Task) -> Layout | None:
        """The arrays a result of `task` must carry, exactly (layout.py: checked on arrival,
        before absorb); by default the model's own layout. Override when results carry
        something else; None checks only the sample count."""
        return self.layout

    def absorb(self, done: Result | Failure) -> None:
        """Called for every reply as it arrives: streaming algorithms fold it into running sums
        and drop its arrays; the rest keep results for aggregate_round."""

    def eval_arrays(self) -> Arrays:
        """The model the server evaluates after each round."""
        return self.state.model

    def stop_before(self, rnd: int, clients: Sequence[ClientInfo]) -> tuple[str, str] | None:
        """(status, why) to end the run before round `rnd` among `clients`: by default the
        first piece's (differential privacy: the round would spend more than the budget,
        `budget_spent`); None goes on."""
        for piece in self.pieces:
            halt = piece.stop_before(rnd, clients)
            if halt is not None:
                return halt
        return None

    def report(self) -> dict[str, Any]:
        """What the algorithm adds to summary.json: by default its pieces' sections
        (differential privacy: `dp`); an override adds to super().report()."""
        out: dict[str, Any] = {}
        for piece in self.pieces:
            out.update(piece.report())
        return out

    # ---- given ---------------------------------------------------------------------------------
    def start_round(self, ctx: RoundContext, clients: Sequence[ClientInfo]) -> list[Task]:
        """The runtime's entry to a step: its context (kept as `ctx` for the step's follow-ups),
        then configure_round. The driver reads back `ctx.target`."""
        self.ctx = ctx
        return self.configure_round(ctx.round, clients)

    @property
    def now(self) -> float:
        """The simulated time at the start of the step (ctx.now)."""
        return self.ctx.now

    @property
    def online(self) -> Callable[[int, float], bool] | None:
        """(cid, simulated time) -> online? with --availability, else None (ctx.online)."""
        return self.ctx.online

    @property
    def target(self) -> int | None:
        """Results the step needs (ctx.target: set by picks, --over-select)."""
        return self.ctx.target

    @target.setter
    def target(self, value: int | None) -> None:
        self.ctx.target = value

    def setup(self, init: Arrays, trainable: set[str] | None = None) -> None:
        """Receive the initial model and the names of its trainable parameters; the state from
        init_state, with the pieces' fields (extend_state)."""
        self.trainable = set(trainable) if trainable is not None else {
            k for k, v in init.items() if v.dtype.kind == "f"}
        self.layout = layout_of(init)
        self.state = self.extend_state(self.init_state(init))

    def add_piece(self, piece: ServerPiece) -> None:
        """Hold `piece` (before setup): its hooks are called after those of the pieces added
        before it."""
        piece.attach(self)
        self.pieces = (*self.pieces, piece)

    def extend_state(self, st: Any) -> Any:
        """The state `st` with the fields of the pieces' `Fields` (the same values in a
        dataclass derived from its own, extended_state), each piece's filled in
        (ServerPiece.init_state)."""
        extras = tuple(p.Fields for p in self.pieces if p.Fields is not None)
        if extras:
            name = "".join(p.name for p in self.pieces if p.Fields is not None)
            cls = extended_state(type(st), extras, name + type(st).__name__)
            st = cls(**{f.name: getattr(st, f.name) for f in dataclasses.fields(st)})
        for piece in self.pieces:
            piece.init_state(st)
        return st

    def configured(self, rnd: int, clients: Sequence[ClientInfo], tasks: list[Task]
                   ) -> list[Task]:
        """`tasks`, once every piece heard of them (ServerPiece.configured)."""
        for piece in self.pieces:
            piece.configured(rnd, clients, tasks)
        return tasks

    def closed(self, rnd: int, results: list[Result], failures: list[Failure],
               metrics: dict[str, Any]) -> dict[str, Any]:
        """The round's row once every piece had it (ServerPiece.closed): what a FedAvg-family
        aggregate_round returns."""
        for piece in self.pieces:
            metrics = piece.closed(rnd, results, failures, metrics)
        return metrics

    def bind(self, info: ServerInfo) -> None:
        """Receive the run's server-side facts (number of classes, exemplars, ...)."""
        self.info = info

    @property
    def global_arrays(self) -> Arrays:
        """The global model (state.model)."""
        return self.state.model

    @global_arrays.setter
    def global_arrays(self, arrays: Arrays) -> None:
        self.state.model = arrays

    def select(self, rnd: int, clients: Sequence[ClientInfo]) -> list[ClientInfo]:
        """The first piece's cohort (ServerPiece.select; the step's target: its size), else
        max(floor(fraction * K), 1) clients, uniformly without replacement, seeded by round."""
        for piece in self.pieces:
            picked = piece.select(rnd, clients)
            if picked is not None:
                self.target = len(picked)
                return picked
        ordered = roster.ordered(clients)  # (a dispatcher's roster is: nothing is built)
        m = self.picks(max(int(self.cfg.algo.fraction * len(ordered)), 1), len(ordered))
        if m >= len(ordered):
            return list(ordered)
        pick = rng.generator(self.cfg.seed, "select", rnd).choice(len(ordered), m, replace=False)
        return [ordered[i] for i in sorted(pick)]

    def picks(self, target: int, available: int) -> int:
        """How many to select for a round that needs `target` results: ceil(F x target) with
        --over-select F, at most `available` (the driver keeps the first `target` arrivals)."""
        self.ctx.target = target
        f = self.cfg.latency.over_select
        return target if f == 1 else min(available, math.ceil(round(f * target, 9)))

    def task_body(self, rnd: int, client: ClientInfo) -> dict[str, Any]:
        """Scalar instructions sent with each task (local epochs, lr, ...)."""
        t = self.cfg.train
        body: dict[str, Any] = {"epochs": t.epochs, "lr": t.lr}
        if self.eval_clients:
            body["evaluate"] = True
        return body

    def new_task(self, rnd: int, route: list[int], arrays: Arrays, body: dict[str, Any],
                 task_id: int | None = None, stage: str = "") -> Task:
        """A task with a fresh id (or `task_id`, reserved with reserve_ids); `stage`: the
        stage of a staged protocol it belongs to (what the ledger files its bytes under)."""
        if task_id is None:
            self.state.next_task += 1
            task_id = self.state.next_task
        return Task(task_id=task_id, round=rnd, route=route, arrays=arrays, body=body,
                    stage=stage)

    def reserve_ids(self, n: int) -> int:
        """Reserve n task ids; returns the first. Tasks created in arrival order get ids fixed in
        advance this way, so message sizes (msgpack ints) do not depend on timing."""
        first = self.state.next_task + 1
        self.state.next_task += n
        return first


class StagedStrategy(Strategy):
    """A Strategy with the driver's extra hooks, for the algorithms that need them: a setup stage
    before round 0 (FedSeq's pre-training), steps of several rounds (FedSeqInter's period), tasks
    released by each arrival and evaluation points inside a step (FedSeqInter, FedAsync,
    FedBuff). A plain Strategy gets these defaults (NOT_STAGED)."""

    _staged = True
    # the server's state depends on the order of arrivals (FedAsync, FedBuff): replies reach
    # follow_up in simulated-time order, never in the runtime's (core/arrivals.py)
    virtual_order = False
    # interim_points is asked after every reply released too (with virtual_order), not only at
    # the step's end, and its rows are the run's own (not flagged interim)
    streams_points = False
    chained = False  # follow_up releases tasks within a one-round step (secure aggregation)

    def setup_tasks(self, clients: Sequence[ClientInfo]) -> list[Task]:
        """Tasks of a stage before round 0 (e.g. FedSeq's pre-training); none by default."""
        return []

    def setup_results(self, results: list[Result], failures: list[Failure]) -> dict[str, Any]:
        """Consume the setup stage's results; returns statistics for the summary."""
        return {}

    def rounds_per_step(self) -> int:
        """Logical rounds that one driver step covers (FedSeqInter: its aggregation period)."""
        return 1

    def follow_up(self, done: Result | Failure) -> list[Task]:
        """Tasks released by one arrival, sent at once (asynchronous pipelines); none by default."""
        return []

    def interim_points(self) -> list[tuple[int, Arrays, float, dict[str, Any]]]:
        """(round, model, simulated time, metrics) to evaluate inside a multi-round step."""
        return []

    def step_end(self) -> float | None:
        """When the step ended in simulated time, if not at its last reply (an asynchronous
        step ends at its last server update; replies after it are not used)."""
        return None

    def server_charged(self) -> float:
        """The server's simulated seconds of work charged since the driver last asked (an
        asynchronous server's folds and steps, charged as replies arrive: the rows'
        server_compute_s); 0 for a server the driver charges at the round's end."""
        return 0.0

    def server_tail(self) -> float:
        """The seconds the step's end waited for the server after the reply that closed it
        (the row's sim_split server_s, for a step charged as replies arrive)."""
        return 0.0

    def server_busy(self, until: float) -> None:
        """The server worked on tasks before they left (--compress-down's encoding:
        core/server_clock.ServerClock.before) until `until` in simulated time: a server that
        queues its work as replies arrive (asynchronous) starts its next piece after it."""


NOT_STAGED = StagedStrategy.__new__(StagedStrategy)
"""The hooks' defaults, which the driver asks of a plain Strategy (they read no state)."""
