"""The server's model: initial weights and test-set evaluation."""
from __future__ import annotations

import torch

from fednet.config import RunConfig
from fednet.algorithms import model_name
from fednet.data import load_dataset, natural, run_test_split
from fednet.models import build_model
from fednet.models.factorized import matching_layer
from fednet.models.param_kinds import state_kinds
from fednet.models.arrays import clone_arrays, load_arrays, state_arrays, state_nbytes
from fednet.platform.malloc import reuse_freed_memory
from fednet.core.work import PlainWork
from fednet.training.local import evaluate
from fednet.training.objective import get_objective
from fednet.types import Arrays


class Evaluator:
    """Holds one model and the held-out test set; evaluates arrays on demand."""

    def __init__(self, cfg: RunConfig) -> None:
        d = cfg.data
        full = load_dataset(d.dataset, d.data_root or None, d.download)
        full = natural.test_dataset(full, d, cfg.clients, cfg.seed)  # natural: the run's held-out set
        ds, self.exemplars = run_test_split(full, d.exemplars, cfg.seed)
        self.num_classes = ds.num_classes
        self.objective = get_objective(ds.objective)  # the loss and the score of the task
        self.x = torch.from_numpy(ds.test_x)
        self.y = torch.from_numpy(ds.test_y)
        self.model = build_model(model_name(cfg), ds.num_classes, ds.input_shape, dataset=d.dataset,
                                 seed=cfg.seed)
        self.model_bytes = state_nbytes(self.model)  # one copy of the model's state
        reuse_freed_memory(self.model_bytes)  # big models: results joined into mapped pages
        self.trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        self.kinds = state_kinds(self.model)
        self.matching = matching_layer(self.model) if "v" in self.kinds.values() else ""
        self.linears = [m.weight.numel() for m in self.model.modules()
                        if isinstance(m, torch.nn.Linear)]  # FedSeq's classifier representation
        self.initial: Arrays = clone_arrays(state_arrays(self.model))
        self._shape = (model_name(cfg), ds.num_classes, ds.input_shape, d.dataset, cfg.seed)

    def pretrain_init(self) -> Arrays:
        """FedSeq's theta_pre: another random init of the same model (seed + 1,000,003), built
        only when an algorithm asks for it (Strategy.wants_pretrain_init: FedSeq)."""
        name, classes, shape, dataset, seed = self._shape
        pre = build_model(name, classes, shape, dataset=dataset, seed=seed + 1_000_003)
        return clone_arrays(state_arrays(pre))

    def __call__(self, arrays: Arrays) -> tuple[float, float]:
        """(accuracy, loss) of the model given by `arrays` on the test set."""
        return self.score(arrays, self.x, self.y)

    def score(self, arrays: Arrays, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(accuracy, loss) of the model given by `arrays` on examples x, y (an attack's own
        metric: the test set transformed)."""
        load_arrays(self.model, arrays)
        return evaluate(self.model, x, y, objective=self.objective)

    def plain_work(self, batch_size: int) -> PlainWork:
        """Plain training's work on this model, its batches shaped as the test set's examples
        (core/work.PlainWork: FLOPs counted once per batch shape)."""
        return PlainWork(self.model, self.x, batch_size)

    def test_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out examples and labels (not to be written)."""
        return self.x, self.y
