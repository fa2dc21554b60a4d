"""training/batched.py (issue 56 item 1): clients trained together equal each client trained
alone with the plain loop (training/local.train), step by step.

Not bitwise: the batched kernels (a bmm for G linear layers, a grouped convolution for G
convolutions, a masked sum for each client's mean loss) add the same float32 terms in another
order, so each step may differ in the last bits (in float64: within 1e-12, also checked).
Checked per step: every trainable tensor within RTOL = 1e-5 of that tensor's largest magnitude
(measured: about 2e-7 for these two, 2e-6 for the bag of words' near-zero embedding), the
losses within RTOL, the steps and samples exactly.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fednet.models import build_model
from fednet.training import hooks
from fednet.training.batched import ClientJob, batchable, train_batched
from fednet.training.local import train
from fednet.training.objective import Classification, Objective
from fednet.training.optim import OptimSpec

RTOL = 1e-5

MODELS = {"mclr": (10, (1, 1, 60)), "digits_cnn": (10, (1, 8, 8)),
          "fedseq_cnn": (10, (3, 32, 32))}  # per_client's rule: each client on its own


def _data(model: str, sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    k, shape = MODELS[model]
    g = torch.Generator().manual_seed(7)
    return [(torch.randn((n,) + shape, generator=g), torch.randint(0, k, (n,), generator=g))
            for n in sizes]


def _settings(i: int, prox: bool, momentum: float) -> dict:
    """Client i's own settings: lr, momentum (Nesterov for one), weight decay, epochs, batch
    size, mu all vary."""
    return dict(lr=0.05 * (1 + i % 3), momentum=momentum * (i % 2),
                weight_decay=4e-4 if i % 2 == 0 else 0.0, nesterov=i % 4 == 1, epochs=1 + i % 2,
                batch_size=4 + i % 3, mu=0.1 * (1 + i) if prox else 0.0)


def _alone(model: nn.Module, x, y, seed: int, c: dict, correction=None, objective=None):
    """The plain loop on one client: its stats and its parameters after each step."""
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    trace: list[list[torch.Tensor]] = []
    extra = [lambda ps: trace.append([p.detach().clone() for p in ps])]  # before each step
    if c["mu"]:
        extra.append(hooks.prox([p.detach().clone() for p in params], c["mu"]))
    if correction is not None:
        extra.append(hooks.control_variate(correction, [torch.zeros_like(t) for t in correction]))
    stats = train(m, x, y, epochs=c["epochs"], batch_size=c["batch_size"], lr=c["lr"],
                  generator=torch.Generator().manual_seed(seed), hooks=extra,
                  optim=OptimSpec("sgd", c["lr"], c["momentum"], c["weight_decay"],
                                  nesterov=c["nesterov"]),
                  **({"objective": objective} if objective is not None else {}))
    trace.append([p.detach().clone() for p in params])
    return stats, trace[1:]  # after step 1, 2, ..., the last


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


@pytest.mark.parametrize("model_name", list(MODELS) + ["fedseq_cnn-vmap"])
@pytest.mark.parametrize("prox,momentum", [(False, 0.0), (True, 0.0), (True, 0.9)],
                         ids=["fedavg", "fedprox", "fedprox-momentum"])
def test_batched_equals_alone_per_step(model_name, prox, momentum, monkeypatch):
    """Each client's parameters after each of its steps within RTOL of the plain loop's; past
    its last step unchanged. fedseq_cnn trains client by client (per_client's rule), and, as
    "fedseq_cnn-vmap" with the rule off, under vmap (grouped convolutions)."""
    import fednet.training.batched as batched

    if model_name.endswith("-vmap"):
        model_name = model_name.removesuffix("-vmap")
        monkeypatch.setattr(batched, "CONV_FLOPS_PER_CLIENT", float("inf"))
    sizes = [3, 13, 40, 22] if model_name == "mclr" else [9, 17, 30, 5, 12]  # 3 < a batch
    k, shape = MODELS[model_name]
    model = build_model(model_name, k, shape, seed=0)
    data = _data(model_name, sizes)
    cs = [_settings(i, prox, momentum) for i in range(len(sizes))]
    if model_name == "fedseq_cnn":  # lr / 10: at 0.05-0.15 on random images a last-bit
        cs = [dict(c, lr=c["lr"] / 10) for c in cs]  # difference flips a ReLU within 5 steps
    jobs = [ClientJob(x, y, torch.Generator().manual_seed(100 + i), **c)
            for i, ((x, y), c) in enumerate(zip(data, cs))]
    after: list[dict[str, torch.Tensor]] = []
    res = train_batched(model, jobs, on_step=lambda s, p: after.append(
        {n: t.clone() for n, t in p.items()}))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(after) == max(s.steps for s in res.stats)
    for i, ((x, y), c) in enumerate(zip(data, cs)):
        stats, trace = _alone(model, x, y, 100 + i, c)
        assert (res.stats[i].steps, res.stats[i].samples) == (stats.steps, stats.samples)
        assert stats.samples == len(y) * c["epochs"]
        assert abs(res.stats[i].loss - stats.loss) <= RTOL * abs(stats.loss)
        for s, ps in enumerate(trace):  # every step this client took
            for n, p in zip(names, ps):
                assert _close(after[s][n][i], p) <= RTOL, (i, s, n)
        for s in range(len(trace), len(after)):  # past its last step: unchanged
            for n in names:
                assert torch.equal(after[s][n][i], after[len(trace) - 1][n][i])
        for n, p in zip(names, trace[-1]):
            assert _close(res.client(i)[n], p) <= RTOL
    fresh = dict(build_model(model_name, k, shape, seed=0).named_parameters())
    for n, p in model.named_parameters():  # the model itself untouched
        assert torch.equal(p, fresh[n])


def test_batched_starts_and_corrections_per_client():
    """Clients starting from different models (job.start) with a constant gradient term each
    (SCAFFOLD's c - c_k, hooks.control_variate), augmented batches drawn from each client's own
    generator in the plain loop's order."""
    k, shape = MODELS["mclr"]
    model = build_model("mclr", k, shape, seed=0)
    data = _data("mclr", [11, 6, 19])

    def augment(xb: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return xb + 0.1 * torch.randn(xb.shape, generator=g)

    jobs, alone = [], []
    for i, (x, y) in enumerate(data):
        start = copy.deepcopy(model)
        with torch.no_grad():
            for p in start.parameters():
                p.add_(0.01 * (i + 1))
        corr = [0.001 * (i + 1) * torch.ones_like(p) for p in start.parameters()]
        c = _settings(i, True, 0.5)
        jobs.append(ClientJob(x, y, torch.Generator().manual_seed(5 + i), **c,
                              start=dict(start.named_parameters()),
                              correction={n: t for (n, _), t in zip(start.named_parameters(), corr)}))
        m = copy.deepcopy(start)
        params = list(m.parameters())
        extra = [hooks.prox([p.detach().clone() for p in params], c["mu"]),
                 hooks.control_variate(corr, [torch.zeros_like(t) for t in corr])]
        stats = train(m, x, y, epochs=c["epochs"], batch_size=c["batch_size"], lr=c["lr"],
                      generator=torch.Generator().manual_seed(5 + i), hooks=extra, augment=augment,
                      optim=OptimSpec("sgd", c["lr"], c["momentum"], c["weight_decay"],
                                      nesterov=c["nesterov"]))
        alone.append((stats, dict(m.named_parameters())))
    res = train_batched(model, jobs, augment=augment)
    for i, (stats, params) in enumerate(alone):
        assert res.stats[i].steps == stats.steps
        assert abs(res.stats[i].loss - stats.loss) <= RTOL * abs(stats.loss)
        for n, p in params.items():
            assert _close(res.client(i)[n], p) <= RTOL, (i, n)
    target = copy.deepcopy(model)
    res.load(target, 2)
    assert torch.equal(dict(target.named_parameters())["fc.weight"], res.params["fc.weight"][2])


def test_batched_embedding_with_padding_index():
    """sent140_bow's Embedding(padding_idx=0): the padding row gets no gradient in any client
    (torch's vmap of a plain forward loses padding_idx in autograd's backward for every client
    but the first; vmap(grad) keeps it)."""
    model = build_model("sent140_bow", 2, (25,), seed=0)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randint(0, 40, (n, 25), generator=g), torch.randint(0, 2, (n,), generator=g))
            for n in (9, 17, 30)]
    cs = [_settings(i, False, 0.0) for i in range(3)]
    res = train_batched(model, [ClientJob(x, y, torch.Generator().manual_seed(i), **c)
                                for i, ((x, y), c) in enumerate(zip(data, cs))])
    for i, ((x, y), c) in enumerate(zip(data, cs)):
        stats, trace = _alone(model, x, y, i, c)
        assert res.stats[i].steps == stats.steps
        for (n, _), p in zip(model.named_parameters(), trace[-1]):
            assert _close(res.client(i)[n], p) <= RTOL, (i, n)
        assert torch.equal(res.params["words.weight"][i, 0], torch.zeros(2))


@pytest.mark.parametrize("mu", [0.0, 0.1], ids=["fedavg", "fedprox"])
def test_a_block_of_client_updates_equals_each_rule_alone(mu):
    """algorithms/updates.local_sgd_block: FedAvg's and FedProx's rules for a block of clients
    (their contexts and tasks as the runtime holds them) give each client's model, steps and
    loss as rule.run does alone, and the batch sizes its loop charges the clock with."""
    from fednet.algorithms.contract import ClientContext
    from fednet.algorithms.updates import Plain, Prox, block_refusal, local_sgd_block
    from fednet.config import RunConfig
    from fednet.models.arrays import state_arrays
    from fednet.types import Task

    cfg = RunConfig(seed=3).replace(**{"train.epochs": 2, "train.momentum": 0.5})
    k, shape = MODELS["digits_cnn"]
    model = build_model("digits_cnn", k, shape, seed=0)
    data = _data("digits_cnn", [9, 17, 30])
    arrays = state_arrays(copy.deepcopy(model))
    tasks = [Task(task_id=i, round=4, route=[10 + i], arrays=arrays,
                  body={"lr": 0.05 * (i + 1)} if i else {}) for i in range(3)]

    def contexts() -> list[ClientContext]:
        return [ClientContext(10 + i, copy.deepcopy(model), x, y, cfg, torch.device("cpu"))
                for i, (x, y) in enumerate(data)]

    rules = [Prox(mu) if mu else Plain() for _ in data]
    together, alone = contexts(), contexts()
    assert block_refusal(together, rules) == ""
    bodies, sizes = local_sgd_block(together, tasks, rules)
    for i, (ctx, task) in enumerate(zip(alone, tasks)):
        body = rules[i].run(ctx, task)
        assert (bodies[i]["steps"], bodies[i]["samples"]) == (body["steps"], body["samples"])
        assert set(bodies[i]) == set(body)
        assert abs(bodies[i]["loss"] - body["loss"]) <= RTOL * abs(body["loss"])
        assert sizes[i] == [len(b) for b in torch.arange(len(data[i][1])).split(8)] * 2
        for (n, p), q in zip(together[i].model.named_parameters(), ctx.model.parameters()):
            assert _close(p, q) <= RTOL, (i, n)
    assert "DP-SGD" in block_refusal(
        [ClientContext(1, model, *data[0], cfg.replace(**{"dp.sgd_noise": 1.0}),
                       torch.device("cpu"))], [Plain()])


@pytest.mark.parametrize("model_name", ["digits_cnn", "fedseq_cnn"])
def test_float64_agrees_to_rounding(model_name):
    """In float64 a block tracks each client alone to 1e-12 at every step: the batched update is
    the plain loop's arithmetic, only summed in another order (float32's 1e-5 is its rounding);
    under vmap (the digits CNN) and client by client (fedseq_cnn: per_client's rule)."""
    k, shape = MODELS[model_name]
    model = build_model(model_name, k, shape, seed=0).double()
    sizes = [9, 17, 30] if model_name == "digits_cnn" else [5, 9, 13]  # fedseq: < 2 s
    data = [(x.double(), y) for x, y in _data(model_name, sizes)]
    cs = [dict(_settings(i, True, 0.9), epochs=3) for i in range(3)]
    after: list[dict[str, torch.Tensor]] = []
    train_batched(model, [ClientJob(x, y, torch.Generator().manual_seed(i), **c)
                          for i, ((x, y), c) in enumerate(zip(data, cs))],
                  on_step=lambda s, p: after.append({n: t.clone() for n, t in p.items()}))
    names = [n for n, _ in model.named_parameters()]
    for i, ((x, y), c) in enumerate(zip(data, cs)):
        _, trace = _alone(model, x, y, i, c)
        for s, ps in enumerate(trace):
            for n, p in zip(names, ps):
                assert _close(after[s][n][i], p) <= 1e-12, (i, s, n)


def test_the_same_block_gives_the_same_bits():
    """What `fednet local` and `fednet launch` rely on to agree bit for bit in batched mode:
    one block, trained twice (fresh generators, the same seeds), gives identical parameters and
    losses."""
    k, shape = MODELS["digits_cnn"]
    model = build_model("digits_cnn", k, shape, seed=0)
    data = _data("digits_cnn", [9, 17, 30])

    def once():
        return train_batched(model, [ClientJob(x, y, torch.Generator().manual_seed(i),
                                               **_settings(i, True, 0.9))
                                     for i, (x, y) in enumerate(data)])
    a, b = once(), once()
    assert all(torch.equal(a.params[n], b.params[n]) for n in a.params)
    assert [s.loss for s in a.stats] == [s.loss for s in b.stats]


@pytest.mark.parametrize("model_name", list(MODELS))
def test_index_views_of_shared_images_give_the_copies_bits(model_name):
    """Clients whose x are index views (data/views.Rows) of one shared tensor, or of their own
    arrays, train to the same bits as with their rows gathered into tensors of their own: a
    block gathers its batches from the shared images themselves (nothing copied) or from its
    clients' arrays concatenated once (training/batched._sources)."""
    from fednet.data.views import Rows

    k, shape = MODELS[model_name]
    model = build_model(model_name, k, shape, seed=0)
    sizes = [9, 17, 30, 5]
    pool = torch.randn((80,) + shape, generator=torch.Generator().manual_seed(3))
    rows = torch.randperm(80, generator=torch.Generator().manual_seed(4))[:sum(sizes)].split(sizes)
    labels = [torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(n)) for n in sizes]
    own = [pool[r].clone() for r in rows]

    def run(xs):
        return train_batched(model, [ClientJob(x, y, torch.Generator().manual_seed(i),
                                               **_settings(i, True, 0.9))
                                     for i, (x, y) in enumerate(zip(xs, labels))])
    want = run(own)
    big = torch.cat([torch.zeros((500,) + shape), pool, torch.zeros((500,) + shape)])
    for xs in ([Rows(pool, r) for r in rows],  # one shared base
               [Rows(big, r + 500) for r in rows],  # a few rows of a large base: those only
               [Rows(o, torch.arange(len(o))) for o in own],  # each client's own array
               [Rows(pool, torch.arange(80))[r] if i % 2 else Rows(pool, r)  # mixed
                for i, r in enumerate(rows)]):
        got = run(xs)
        assert all(torch.equal(got.params[n], want.params[n]) for n in want.params)
        assert [s.loss for s in got.stats] == [s.loss for s in want.stats]
        assert got.batch_sizes == want.batch_sizes


def test_channels_last_pooling_gives_the_plain_poolings_bits(monkeypatch):
    """A CNN block pools its stacked feature maps channels-last (training/batched._FastPool, the
    same values and indices): its parameters equal, bit for bit, those of the same block pooled
    by torch's own batching rule, on inputs whose poolings tie (ReLU zeros, flat background)."""
    import fednet.training.batched as batched

    k, shape = MODELS["digits_cnn"]
    model = build_model("digits_cnn", k, shape, seed=0)
    data = [(x.clamp(min=0.5).round(), y) for x, y in _data("digits_cnn", [9, 17, 30])]

    def once():
        return train_batched(model, [ClientJob(x, y, torch.Generator().manual_seed(i),
                                               **_settings(i, True, 0.9))
                                     for i, (x, y) in enumerate(data)])
    assert batched._with_fast_pools(model) is not model  # the digits CNN's pools are replaced
    fast = once()
    monkeypatch.setattr(batched, "_with_fast_pools", lambda m: m)
    plain = once()
    assert all(torch.equal(fast.params[n], plain.params[n]) for n in plain.params)
    assert [s.loss for s in fast.stats] == [s.loss for s in plain.stats]

class _Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x))


def test_refused_models_say_why():
    assert batchable(build_model("mclr", 10, (1, 1, 60))) == ""
    assert batchable(build_model("digits_cnn", 10, (1, 8, 8))) == ""
    bn = build_model("factorized_digits", 10, (1, 8, 8))
    why = batchable(bn)
    assert "BatchNorm2d" in why and "bn1" in why
    assert "Dropout with p > 0" in batchable(_Dropped())
    assert batchable(nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.0))) == ""
    assert "LSTM" in batchable(build_model("char_lstm", 80, (80,)))
    holder = nn.Linear(4, 2)
    holder.register_buffer("seen", torch.zeros(1))
    assert "buffers" in batchable(holder) and "seen" in batchable(holder)

    class Regression(Objective):
        name = "mse"
    assert "not classification" in batchable(holder, Regression())
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
    with pytest.raises(ValueError, match="Dropout"):
        train_batched(_Dropped(), [ClientJob(x, y, torch.Generator(), lr=0.1)])
    with pytest.raises(ValueError, match="inputs"):
        train_batched(nn.Linear(4, 2), [ClientJob(x[:0], y[:0], torch.Generator(), lr=0.1)])


def test_least_clients_keeps_small_stacks_on_the_kernels_of_large_ones():
    """An RGB input's grouped convolution of 2 clients (6 channels) runs another oneDNN kernel
    than 3 or more (measured): fedseq_cnn's steps compute 3 clients at least; the digits CNN's
    (1 channel) and mclr's 2."""
    from fednet.training.batched import least_clients

    assert least_clients(build_model("fedseq_cnn", 10, (3, 32, 32), seed=0)) == 3
    assert least_clients(build_model("digits_cnn", 10, (1, 8, 8), seed=0)) == 2
    assert least_clients(build_model("mclr", 10, (1, 1, 60), seed=0)) == 2
    assert least_clients(nn.Sequential(nn.Conv2d(2, 4, 3))) == 4


def test_heavy_convolutions_train_client_by_client_on_a_cpu(monkeypatch, caplog):
    """per_client's rule: on a CPU, a model whose convolutions take CONV_FLOPS_PER_CLIENT or
    more in one example's forward trains client by client (fedseq_cnn on 3x32x32: 28 MFLOP),
    one under it under vmap (the digits CNN on 8x8: 0.17 MFLOP; mclr: none); on a GPU always
    under vmap. A function of the architecture, the example's shape and the device only (so
    every runtime and every block decides alike), logged once per process."""
    import logging

    import fednet.training.batched as batched
    from fednet.training.batched import conv_flops, per_client

    cpu = torch.device("cpu")
    seq = build_model("fedseq_cnn", 10, (3, 32, 32), seed=0)
    # conv1: 64 x 28 x 28 outputs of 3 x 5 x 5 terms; conv2: 64 x 10 x 10 of 64 x 5 x 5
    assert conv_flops(seq, (3, 32, 32)) == 2 * (64 * 28 * 28 * 75 + 64 * 10 * 10 * 1600)
    assert conv_flops(seq.double(), (3, 32, 32)) == conv_flops(seq, (3, 32, 32))
    assert "28 MFLOP" in per_client(seq, (3, 32, 32), cpu)
    assert per_client(seq, (3, 32, 32), torch.device("cuda")) == ""
    digits = build_model("digits_cnn", 10, (1, 8, 8), seed=0)
    assert conv_flops(digits, (1, 8, 8)) == 2 * (16 * 8 * 8 * 9 + 32 * 4 * 4 * 144)
    assert per_client(digits, (1, 8, 8), cpu) == ""
    assert conv_flops(build_model("mclr", 10, (1, 1, 60)), (1, 1, 60)) == 0
    monkeypatch.setattr(batched, "CONV_FLOPS_PER_CLIENT", 1e5)
    assert "0.166 MFLOP" in per_client(digits, (1, 8, 8), cpu)

    monkeypatch.setattr(batched, "_SAID", set())
    data = _data("digits_cnn", [9, 5])
    with caplog.at_level(logging.WARNING, logger="fednet.client"):
        for _ in range(2):
            train_batched(digits, [ClientJob(x, y, torch.Generator().manual_seed(i), lr=0.1)
                                   for i, (x, y) in enumerate(data)])
    said = [r.getMessage() for r in caplog.records if "compute-bound" in r.getMessage()]
    assert len(said) == 1 and "DigitsNet" in said[0]


class _Smoothed(Classification):
    """A plugin's classification objective with a loss of its own: label-smoothed
    cross-entropy plus a penalty on the logits' size (not a mean of plain cross-entropy)."""

    name = "smoothed-test"

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (torch.nn.functional.cross_entropy(out, y, label_smoothing=0.3)
                + 0.05 * out.pow(2).mean())


@pytest.mark.parametrize("model_name", ["mclr", "digits_cnn"])
def test_a_classification_subclass_trains_on_its_own_loss(model_name, monkeypatch, caplog):
    """A Classification subclass that overrides loss (own_loss) trains batched on that loss:
    each client's parameters after each step within RTOL of the plain loop's with the same
    objective (before, the batched path computed plain cross-entropy: mclr's closed-form step,
    the digits CNN's vmap, while the plain loop used the subclass's loss), its reported loss
    too, and the console says once why its clients step one at a time."""
    import logging

    import fednet.training.batched as batched
    from fednet.training.batched import own_loss

    monkeypatch.setattr(batched, "_SAID", set())
    objective = _Smoothed()
    assert own_loss(Classification()) == "" and "own loss" in own_loss(objective)
    sizes = [7, 13, 5]
    k, shape = MODELS[model_name]
    model = build_model(model_name, k, shape, seed=0)
    data = _data(model_name, sizes)
    cs = [_settings(i, True, 0.9) for i in range(len(sizes))]
    jobs = [ClientJob(x, y, torch.Generator().manual_seed(100 + i), **c)
            for i, ((x, y), c) in enumerate(zip(data, cs))]
    after: list[dict[str, torch.Tensor]] = []
    with caplog.at_level(logging.WARNING, logger="fednet.client"):
        res = train_batched(model, jobs, objective=objective, on_step=lambda s, p: after.append(
            {n: t.clone() for n, t in p.items()}))
    said = [r.getMessage() for r in caplog.records if "own loss" in r.getMessage()]
    assert len(said) == 1 and "_Smoothed.loss" in said[0]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for i, ((x, y), c) in enumerate(zip(data, cs)):
        stats, trace = _alone(model, x, y, 100 + i, c, objective=objective)
        _, plain = _alone(model, x, y, 100 + i, c)  # plain cross-entropy: another trajectory
        assert max(_close(a, b) for a, b in zip(plain[-1], trace[-1])) > 100 * RTOL
        assert abs(res.stats[i].loss - stats.loss) <= RTOL * abs(stats.loss)
        for s, ps in enumerate(trace):
            for n, p in zip(names, ps):
                assert _close(after[s][n][i], p) <= RTOL, (i, s, n)


def test_stacks_are_as_wide_as_their_clients(monkeypatch):
    """Under vmap the clients train in stacks by their width (their largest batch rounded up to
    a power of two, 2 at least, at most the batch size), not all padded to the batch size:
    clients of 1 or 2, 3 and 12 examples at batch size 8 take 2, 4 and 8 slots a step (a stack
    of one client is computed beside a copy of it: least_clients). A client's bits are those of the same client
    in a block of its own width only, and its steps stay the plain loop's to RTOL."""
    import fednet.training.batched as batched

    widths: list[tuple[int, int]] = []
    plan = batched._plan

    def seen(*a, **k):
        got = plan(*a, **k)
        widths.append((got.width, len(got.steps)))
        return got

    monkeypatch.setattr(batched, "_plan", seen)
    k, shape = MODELS["digits_cnn"]
    model = build_model("digits_cnn", k, shape, seed=0)
    sizes = [2, 1, 12, 3, 1, 2]
    data = _data("digits_cnn", sizes)
    c = dict(lr=0.1, momentum=0.5, epochs=2, batch_size=8)

    def jobs(ids):
        return [ClientJob(*data[i], torch.Generator().manual_seed(100 + i), **c) for i in ids]

    res = train_batched(model, jobs(range(len(sizes))))
    assert widths == [(8, 2), (4, 2), (2, 4)]  # widest first; one of 12 and one of 3
    assert [s.samples for s in res.stats] == [2 * n for n in sizes]  # (each beside a copy)
    assert [len(b) for b in res.batch_sizes] == [2, 2, 4, 2, 2, 2]
    for ids in ([0, 5, 1, 4], [4, 1], [2], [3]):  # each width alone: the same bits
        alone = train_batched(model, jobs(ids))
        for j, i in enumerate(ids):
            assert all(torch.equal(alone.params[n][j], res.params[n][i]) for n in res.params)
            assert alone.stats[j] == res.stats[i]
    for i, (x, y) in enumerate(data):
        stats, trace = _alone(model, x, y, 100 + i, dict(c, weight_decay=0.0, nesterov=False,
                                                          mu=0.0))
        assert res.stats[i].steps == stats.steps
        for n, p in zip(res.params, trace[-1]):
            assert _close(res.params[n][i], p) <= RTOL, (i, n)


@pytest.mark.parametrize("n", [1, 3])
def test_a_repeated_start_is_stacked_as_a_copy(n):
    """A block whose clients all start from one tensor stacks it by one expanded copy: equal to
    torch.stack, contiguous, its own memory (the steps update it in place), for one client too."""
    from fednet.training.batched import _stacked

    t = torch.randn(4, 3)
    got = _stacked([t] * n)
    assert torch.equal(got, torch.stack([t] * n)) and got.is_contiguous()
    got += 1
    assert torch.equal(t + 1, got[0])  # t itself unchanged
    mixed = [t, t.clone()]
    assert torch.equal(_stacked(mixed), torch.stack(mixed))
