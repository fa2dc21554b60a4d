"""The clock's compute seconds against the CPU seconds the same work really takes, per
component, on this host's profile calibrated in the same run (issue 52 item 5).

    python3 benchmarks/bench_compute.py [--profile host.json --server-profile server.json]
        [--reps 3] [--cohorts 100 1000] [--robust-n 1000 --robust-d 100000] [--json F]

The host's rates are `fednet calibrate`'s measurements (training FLOP/s: ResNet-18 3x32x32
batch 32, 1 thread; seconds per dispatched operation and per convolution: mclr and the digits
CNN, 1x8x8 batch 8; every protocol and server operation: secagg/rates.py), or the files given.
Components:
- client training as fednet runs it (training/local.train or training/dpsgd.train_private, 1
  torch thread, inside a training/flops Meter as core/executor opens one): mclr and the digits
  CNN on digits-shaped data (1x8x8, batch 8), ResNet-18 on CIFAR-shaped data (3x32x32, batch
  32), DP-SGD on the digits CNN; simulated = network/latency.compute_time of the meter's count
  (FLOPs / the rate + dispatched operations x s_per_op + convolutions x s_per_conv + noise
  draws / their rate), measured =
  the process's CPU seconds (median of --reps);
- secure aggregation (SecAgg+ and full SecAgg, and SecAgg+ on --compress int8's common grid
  (plus-int8), one `fednet local` round of mclr on digits, no
  dropouts, --latency and --server-profile the calibrated files) at each --cohorts size: per
  stage, a client's protocol and training seconds on the clock (the round's critical path,
  sim_split_by_stage) against the clients' mean CPU seconds of that stage (secagg_client_s /
  clients; each client doing its own end of every pair's key exchange and mask, as in a
  deployment: DEPLOYED_ENDS), and the server's simulated seconds (secagg_server_sim_s) against
  its CPU seconds (secagg_server_s: the keys and shares stages' bookkeeping, uncharged, included);
- the uplink codecs (--codecs; compress/codecs.py) on a client's update of --codec-model's
  sizes (ResNet-18: 11.2 M float32 values in 62 tensors), as the client runs them
  (compress.encode_result against the task's arrays: the update's flattening, the encoding and,
  for a codec with error feedback (top-k, sign), its residual and the decoding of its own
  output; numpy's BLAS on one thread, as launch's clients run), inside an opcount count (what
  encode_result and the codec charge) against their CPU seconds (median of --reps), at the
  client's code and select rates (the 'int8 SecAgg+ input' cell's quantize and pack at its
  field rate, secagg/rates.py's timing of those two functions);
- Krum and Bulyan on --robust-n updates of --robust-d float64 values (f = 20 %, as
  algorithms/robust.apply runs them: one BLAS thread), against the count the clock charges (the
  rule's declared work, robust_spec.bulyan_work; else network/server_cost.defense_ops).
The ratio simulated / measured is 1 where the clock is right (target 0.75-1.25).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fednet.models import build_model
from fednet.training import flops
from fednet.training.local import train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import metrics, run  # noqa: E402
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

STAGES = ("keys", "shares", "input", "unmask")

WORKLOADS = (  # name, model, example shape, batch, how it trains
    ("mclr", "mclr", (1, 8, 8), 8, "plain"),
    ("digits CNN", "digits_cnn", (1, 8, 8), 8, "plain"),
    ("ResNet-18", "resnet18", (3, 32, 32), 32, "plain"),
    ("digits CNN, DP-SGD", "digits_cnn", (1, 8, 8), 8, "dpsgd"),
)


def _rates(a: argparse.Namespace) -> tuple[dict[str, float], dict[str, float], str]:
    """(the client's profile row, the server's rates, where they came from)."""
    from fednet.opcount import CLIENT_RATES, OPS
    from fednet.secagg import rates as host_rates

    if a.profile and a.server_profile:
        from fednet.network.server_cost import server_rates

        row = json.loads(Path(a.profile).read_text())[0]
        return row, server_rates(a.server_profile), f"{a.profile}, {a.server_profile}"
    from fednet.training.calibrate import measure

    c = measure(seconds=a.calibrate_seconds)
    ops = host_rates.measure(OPS, a.ops_scale)
    for op, r in ops.items():
        print(f"  {op:8s} {r.what}: {r.seconds:.3f} s = {r.per_s:.4g}/s")
    server = {f"{op}_per_s": r.per_s for op, r in ops.items()}
    row = {"train_flops_per_s": c.flops_per_s, "rtt_s": 0.0, "up_bps": 0.0, "down_bps": 0.0,
           **{k: server[k] for k in CLIENT_RATES}, "s_per_op": c.s_per_op,
           "s_per_conv": c.s_per_conv}
    return row, server, (f"calibrated now: {c.model} {'x'.join(map(str, c.input_shape))} batch "
                         f"{c.batch}, {c.steps} steps in {c.seconds:.2f} s; fixed costs: mclr and "
                         f"the digits CNN 1x8x8 batch 8, {c.s_per_op * 1e6:.3g} us an "
                         f"operation, {c.s_per_conv * 1e6:.3g} us a convolution; "
                         "secagg/rates.py")


def _once(model_name: str, shape: tuple[int, ...], batch: int, how: str, n: int
          ) -> tuple[int, float, int, dict[str, float]]:
    """(FLOPs counted, CPU seconds, examples trained, operations counted: DP-SGD's noise) of one
    epoch over n examples."""
    model = build_model(model_name, 10, shape, seed=0)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn((n, *shape), generator=g), torch.randint(0, 10, (n,), generator=g)
    if how == "dpsgd":
        from fednet.training.dpsgd import train_private
        from fednet.training.optim import OptimSpec

        def run() -> Any:
            return train_private(model, x, y, epochs=1, batch_size=batch,
                                 spec=OptimSpec("sgd", 0.05, 0.0, 0.0, nesterov=False),
                                 generator=torch.Generator().manual_seed(1),
                                 noise_generator=torch.Generator().manual_seed(2),
                                 noise=1.0, clip=1.0)
    else:
        def run() -> Any:
            return train(model, x, y, epochs=1, batch_size=batch, lr=0.05,
                         generator=torch.Generator().manual_seed(1))
    with flops.metered() as m:
        t = time.process_time()
        stats = run()
        cpu = time.process_time() - t
    return m.flops, cpu, stats.samples, m.ops


def measure_all(a: argparse.Namespace, client: dict[str, float]) -> list[dict[str, Any]]:
    from fednet.network.latency import compute_time
    from fednet.network.profiles import Profile

    profile = Profile.from_dict(client)
    rows = []
    for name, model, shape, batch, how in WORKLOADS:
        n = a.resnet_examples if model == "resnet18" else a.examples
        _once(model, shape, batch, how, min(n, 2 * batch))  # warm-up: kernels, Opacus import
        runs = [_once(model, shape, batch, how, n) for _ in range(a.reps)]
        counted, _, samples, ops = runs[0]
        cpu = statistics.median(r[1] for r in runs)
        sim = compute_time(profile, samples, counted, ops)  # FLOPs, operations, noise
        rows.append({"workload": name, "model": model, "how": how, "examples": samples,
                     "flops": counted, "ops": ops, "flops_per_example": counted / max(samples, 1),
                     "cpu_s": cpu, "cpu_s_runs": [r[1] for r in runs], "sim_s": sim,
                     "sim_over_cpu": sim / cpu if cpu > 0 else None})
    return rows


DEPLOYED_ENDS = [sys.executable, "-c", "from fednet.secagg import crypto; "
                 "crypto.SHARE_ENDS = False; from fednet.cli import main; main()"]
"""`fednet ARGS` whose clients each do their own end's work (secagg/crypto.SHARE_ENDS off): in
one process the two ends of a pair otherwise share one key exchange and one mask expansion,
which a deployment's client, and the clock, never skip. The same bits either way."""


def secagg_cell(mode: str, n: int, files: tuple[str, str], tmp: Path) -> dict[str, Any]:
    """One round of `--secagg mode` over n clients (mode plus-CODEC: --secagg plus --compress
    CODEC, its common grid): per stage, a client's seconds on the clock and measured (mean over
    the cohort), the server's."""
    out = tmp / f"secagg-{mode}-{n}"
    secagg, _, codec = mode.partition("-")
    r = run(DEPLOYED_ENDS + ["local", "--dataset", "digits", "--model", "mclr", "--clients",
                          str(n), "--rounds", "1", "--epochs", "1", "--batch-size", "8",
                          "--secagg", secagg, *(("--compress", codec) if codec else ()),
                          "--latency", files[0], "--server-profile", files[1], "-q", "--out",
                          str(out)])
    if r.rc != 0:
        return {"mode": mode, "clients": n, "error": r.stderr[-600:]}
    row = metrics(out)[0]
    split = row.get("sim_split_by_stage", {})
    cpu_c, cpu_s = row.get("secagg_client_s", {}), row.get("secagg_server_s", {})
    sim_s = row.get("secagg_server_sim_s", {})
    stages = {st: {"client_sim_s": split.get(st, {}).get("protocol_s", 0.0)
                   + split.get(st, {}).get("client_compute_s", 0.0),
                   "client_cpu_s": cpu_c.get(st, 0.0) / n,
                   "server_sim_s": sim_s.get(st, 0.0), "server_cpu_s": cpu_s.get(st, 0.0)}
              for st in STAGES}
    tot = {k: sum(v[k] for v in stages.values()) for k in next(iter(stages.values()))}
    return {"mode": mode, "clients": n, "neighbours": row.get("secagg_neighbours"),
            "wall_s": r.wall_s, "stages": stages, **tot,
            "client_ratio": _ratio(tot["client_sim_s"], tot["client_cpu_s"]),
            "server_ratio": _ratio(tot["server_sim_s"], tot["server_cpu_s"]),
            "unmask_ratio": _ratio(stages["unmask"]["server_sim_s"],
                                   stages["unmask"]["server_cpu_s"])}


def _ratio(sim: float, cpu: float) -> float | None:
    return sim / cpu if cpu > 0 else None


def secagg_all(a: argparse.Namespace, client: dict[str, float], server: dict[str, float]
               ) -> list[dict[str, Any]]:
    """Every --secagg-modes x --cohorts cell (full SecAgg up to --full-max clients)."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        files = (str(tmp / "host.json"), str(tmp / "server.json"))
        Path(files[0]).write_text(json.dumps([client]))
        Path(files[1]).write_text(json.dumps(server))
        return [secagg_cell(mode, n, files, tmp) for n in a.cohorts for mode in a.secagg_modes
                if mode != "full" or n <= a.full_max]


def codec_all(a: argparse.Namespace, client: dict[str, float], server: dict[str, float]
              ) -> list[dict[str, Any]]:
    """Each --codecs codec on an update of --codec-model's sizes: CPU seconds against the
    clock's (the client's rates); then each one's decoding by the server (a result against
    its reference: compress.decode_counted, at the server's rates) and by a client (a
    --compress-down task: compress/downlink.decode, at the client's), and SecAgg's field work
    around a codec's grid and distributed DP (_grid_input, _grid_unpack, _ddp_input)."""
    import numpy as np

    from fednet import opcount
    from fednet.algorithms.robust import one_blas_thread
    from fednet.compress import encode_result, parse
    from fednet.compress.codecs import REGISTERED

    if not a.codecs:
        return []
    shape = (3, 32, 32) if a.codec_model == "resnet18" else (1, 8, 8)
    model = build_model(a.codec_model, 10, shape, seed=0)  # type: ignore[arg-type]
    g = np.random.default_rng(0)
    arrays = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    reference = {n: (v - 0.01 * g.standard_normal(v.shape)).astype(np.float32)  # (the task's)
                 for n, v in arrays.items()}
    sizes = [int(v.size) for v in arrays.values()]
    values = sum(sizes)
    rows = []
    for name in a.codecs:
        spec = parse(name)
        residual = ((1e-3 * g.standard_normal(values)).astype(np.float32) if spec.feedback
                    else None)

        def once(spec: Any = spec, residual: Any = residual) -> tuple[float, dict[str, float]]:
            rng = np.random.default_rng(1) if spec.random else None
            with opcount.counted() as got, one_blas_thread():  # (as launch's clients: 1 thread)
                t = time.process_time()
                encode_result(spec, arrays, reference, residual, rng)  # (compress/client.py's)
                return time.process_time() - t, dict(got)
        once()  # warm-up
        runs = [once() for _ in range(a.reps)]
        cpu = statistics.median(r[0] for r in runs)
        sim = opcount.seconds(runs[0][1], client)
        rows.append({"codec": name, "model": a.codec_model, "values": values,
                     "tensors": len(sizes), "ops": runs[0][1], "cpu_s": cpu,
                     "cpu_s_runs": [r[0] for r in runs], "sim_s": sim, "ratio": _ratio(sim, cpu)})
    rows += [_decode_cell(a, name, arrays, reference, client, server) for name in a.codecs]
    rows += [_decode_cell(a, name, arrays, {}, client, server) for name in a.codecs
             if parse(name).on and REGISTERED[parse(name).kind].values]
    if "int8" in a.codecs:
        rows += [_grid_input(a, client, arrays, reference), _grid_unpack(a, server, values),
                 _ddp_input(a, client, arrays, reference)]
    return rows


def _timed_count(a: argparse.Namespace, run: Any, rates: dict[str, float]
                 ) -> tuple[float, list[float], dict[str, float], float]:
    """(median CPU s, each run's, what run() charged, its simulated s at `rates`) of --reps
    runs after a warm-up, each inside an opcount count and on one BLAS thread."""
    from fednet import opcount
    from fednet.algorithms.robust import one_blas_thread

    def once() -> tuple[float, dict[str, float]]:
        with opcount.counted() as got, one_blas_thread():
            t = time.process_time()
            run()
            return time.process_time() - t, dict(got)
    once()  # warm-up
    runs = [once() for _ in range(a.reps)]
    return (statistics.median(r[0] for r in runs), [r[0] for r in runs], runs[0][1],
            opcount.seconds(runs[0][1], rates))


def _decode_cell(a: argparse.Namespace, name: str, arrays: dict[str, Any],
                 reference: dict[str, Any], client: dict[str, float],
                 server: dict[str, float]) -> dict[str, Any]:
    """The server's decoding of a result of codec `name` against its `reference`
    (compress.decode_counted, as core/replies.py decodes it: at the server's rates), or, with
    no reference, a client's decoding of a --compress-down task of that codec
    (compress/downlink.decode, as core/executor.py runs it inside its meter: the client's)."""
    import numpy as np

    from fednet.compress import decode_result, encode_result, parse
    from fednet.compress.downlink import decode, encode_values

    spec = parse(name)
    expect = {n: (v.shape, v.dtype) for n, v in arrays.items()}
    rng = np.random.default_rng(1) if spec.random else None
    if reference:
        wire, _ = encode_result(spec, arrays, reference, None, rng)
        cpu, runs, ops, sim = _timed_count(
            a, lambda: decode_result(spec, wire, expect, reference), server)
        what = f"{name} decode (server)"
    else:
        down = encode_values(spec, arrays, 0, "compress-down", 0)
        cpu, runs, ops, sim = _timed_count(a, lambda: decode(spec, down), client)
        what = f"{name} decode (client, --compress-down)"
    return {"codec": what, "model": a.codec_model, "values": sum(int(v.size) for v in
                                                                 arrays.values()),
            "ops": ops, "cpu_s": cpu, "cpu_s_runs": runs, "sim_s": sim,
            "ratio": _ratio(sim, cpu)}


def _grid_unpack(a: argparse.Namespace, server: dict[str, float], values: int
                 ) -> dict[str, Any]:
    """The server's input stage on --compress int8's grid, per input: a masked input of the
    update's values + 1 (the loss) unpacked from wire_bits(GRID_COHORT, L) (secagg/field.unpack,
    as algorithms/secagg.py takes it in) and added to the sum, against cost.summed(1, d,
    packed) at the server's rates."""
    import numpy as np

    from fednet import opcount
    from fednet.compress.field import grid_levels
    from fednet.secagg import cost, field

    d = values + 1
    levels = grid_levels("int8", 0.0)
    wbits = field.wire_bits(GRID_COHORT, levels)
    dt = field.dtype_of(field.field_bits(GRID_COHORT, 0, levels=levels))
    y = np.random.default_rng(0).integers(0, 1 << wbits, d).astype(dt)
    buf = field.pack(y, wbits)
    total = np.zeros(d, dt)

    def run() -> None:
        np.add(total, field.unpack(buf, wbits, d, dt), out=total)
    cpu, runs, _, _ = _timed_count(a, run, server)
    ops = cost.summed(1, d, packed=True)  # (the server's count: outside any client meter)
    sim = opcount.seconds(ops, server)
    return {"codec": "int8 SecAgg server input (unpack, sum)", "model": a.codec_model,
            "values": d, "wbits": wbits, "ops": ops, "cpu_s": cpu, "cpu_s_runs": runs,
            "sim_s": sim, "ratio": _ratio(sim, cpu)}


def _flattened(arrays: dict[str, Any], reference: dict[str, Any]) -> Any:
    """The update flattened as algorithms/secagg_client.py flattens it (charging it)."""
    import numpy as np

    from fednet import opcount
    from fednet.secagg import cost

    names = sorted(arrays)
    ref = np.concatenate([reference[n].ravel() for n in names]).astype(np.float64)
    new = np.concatenate([np.asarray(arrays[n]).ravel() for n in names]).astype(np.float64)
    opcount.charge(cost.flattened(new.size))
    return new - ref


def _ddp_input(a: argparse.Namespace, client: dict[str, float], arrays: dict[str, Any],
               reference: dict[str, Any]) -> dict[str, Any]:
    """A client's input under --dp distributed (z 1, t 3): the update flattened and encoded
    (privacy/distributed.encode: clipped, rounded, noised), as algorithms/secagg_client.py
    runs and charges it (cost.flattened, cost.ddp_encoded, the draws distributed.py charges),
    at the client's rates. (Its masking is the SecAgg+ cell's.)"""
    import numpy as np

    from fednet import opcount
    from fednet.privacy import distributed
    from fednet.secagg import cost

    def run() -> None:
        x = _flattened(arrays, reference)
        opcount.charge(cost.ddp_encoded(x.size))
        distributed.encode(x, 1.0, 1.0, 3, np.random.default_rng(2))
    cpu, runs, ops, sim = _timed_count(a, run, client)
    return {"codec": "distributed DP SecAgg input (flatten, encode)", "model": a.codec_model,
            "values": sum(int(v.size) for v in arrays.values()), "ops": ops, "cpu_s": cpu,
            "cpu_s_runs": runs, "sim_s": sim, "ratio": _ratio(sim, cpu)}


GRID_COHORT, GRID_PARTNERS = 100, 8  # the grid cell's cohort (its wire bits) and mask partners


def _grid_input(a: argparse.Namespace, client: dict[str, float], arrays: dict[str, Any],
                reference: dict[str, Any]) -> dict[str, Any]:
    """A SecAgg+ client's input stage on --compress int8's common grid as it runs after
    training (algorithms/secagg_client.py, secagg/client.masked): the update flattened against
    the task's model, clipped, weighted and quantized (secagg/field.quantize), masked by its
    self mask and GRID_PARTNERS pairwise ones (crypto.add_mask: the keystreams' AES-CTR),
    packed in wire_bits(GRID_COHORT, L) (field.pack), against what is charged (cost.flattened
    and weighted, field's quantize and pack, cost.masked: the client's charges, counted here as
    it charges them)."""
    import numpy as np

    from fednet import opcount
    from fednet.compress.field import grid_levels
    from fednet.secagg import cost, crypto, field

    d = sum(int(v.size) for v in arrays.values()) + 1  # (and the loss)
    levels = grid_levels("int8", 0.0)
    wbits = field.wire_bits(GRID_COHORT, levels)
    fbits = field.field_bits(GRID_COHORT, 0, levels=levels)
    keys = [bytes([i]) * 32 for i in range(1 + GRID_PARTNERS)]

    def once() -> tuple[float, dict[str, float]]:
        g = np.random.default_rng(1)
        with opcount.counted() as got:
            t = time.process_time()
            vec = np.concatenate([_flattened(arrays, reference), [0.5]])  # (and the loss)
            x = np.clip(vec, -8.0, 8.0) * 0.75  # (the grid's clip and weight n / n_top)
            opcount.charge(cost.weighted(x.size))
            q = field.quantize(x, 8.0, 16, 1, fbits, g, levels)
            opcount.charge(cost.masked(q.size, q.dtype.itemsize, GRID_PARTNERS))
            y = np.array(q, copy=True)
            for i, key in enumerate(keys):
                crypto.add_mask(y, key, 1 if i % 2 else -1)
            field.pack(y, wbits)
            return time.process_time() - t, dict(got)
    once()  # warm-up
    runs = [once() for _ in range(a.reps)]
    cpu = statistics.median(r[0] for r in runs)
    sim = opcount.seconds(runs[0][1], client)
    return {"codec": "int8 SecAgg+ input", "model": a.codec_model, "values": d,
            "wbits": wbits, "fbits": fbits, "partners": GRID_PARTNERS, "ops": runs[0][1],
            "cpu_s": cpu, "cpu_s_runs": [r[0] for r in runs], "sim_s": sim,
            "ratio": _ratio(sim, cpu)}


def robust_all(a: argparse.Namespace, server: dict[str, float]) -> list[dict[str, Any]]:
    """Krum and Bulyan on n x d float64 updates: CPU seconds against the clock's."""
    import numpy as np

    from fednet.algorithms import robust as R
    from fednet.algorithms import robust_spec as S
    from fednet.network.server_cost import defense_ops
    from fednet.opcount import seconds

    n, d = a.robust_n, a.robust_d
    if n <= 0 or d <= 0:
        return []
    x = np.random.default_rng(0).normal(size=(n, d))
    w = np.ones(n)
    f = S.byzantine_count(-1, 0.2, n)
    rows = []
    for name in ("krum", "bulyan"):
        R.apply(name, S.ByzantineCount(), 0.2, x[: 4 * f + 3, :1000], w[: 4 * f + 3])  # warm
        t = time.process_time()
        R.apply(name, S.ByzantineCount(), 0.2, x, w)
        cpu = time.process_time() - t
        spec = S.defense_spec(name)  # its declared work, as core/server_clock.py charges it
        work = dict(spec.work(n, d, f)) if spec.work is not None else defense_ops(name, n, d, f)
        sim = seconds(work, server)
        rows.append({"defense": name, "n": n, "d": d, "f": f, "ops": work, "cpu_s": cpu,
                     "sim_s": sim, "ratio": _ratio(sim, cpu)})
    return rows


def headline(data: dict) -> list:
    """The dashboard's rows (three: its line budget): client training (the model furthest from
    its measurement; each model in the note), DP-SGD's cost over plain training, and the
    protocol and server components (the one furthest from its measurement; each in the note)."""
    rows = {r["workload"]: r for r in data.get("rows", [])}
    prof = data.get("client_profile", {})
    c = rows.get("digits CNN")
    models = [rows[w] for w in ("mclr", "digits CNN", "ResNet-18", "digits CNN, DP-SGD")
              if w in rows and rows[w].get("sim_over_cpu")]
    worst = max(models, key=lambda r: abs(math.log(r["sim_over_cpu"])), default=None)
    out = [None if worst is None else headline_row(
        "network model", "client training on the clock / measured CPU s, furthest of mclr, "
        "digits CNN, ResNet-18, DP-SGD (host profile)", worst["sim_over_cpu"], "x",
        "0.75-1.25x (issue 52)",
        f"{worst['workload']}; " + ", ".join(
            f"{r['workload']} {r['sim_over_cpu']:.3g}x ({r['sim_s']:.3g} s simulated, "
            f"{r['cpu_s']:.3g} s CPU)" for r in models)
        + f"; host profile {data.get('rate', 0) / 1e9:.3g} GFLOP/s, "
        f"{prof.get('s_per_op', 0) * 1e6:.3g} us an operation, "
        f"{prof.get('s_per_conv', 0) * 1e6:.3g} us a convolution")]
    dp = rows.get("digits CNN, DP-SGD")
    if dp and c and c["cpu_s"] > 0:
        clock = (dp["sim_s"] / dp["examples"]) / (c["sim_s"] / c["examples"])
        real = (dp["cpu_s"] / dp["examples"]) / (c["cpu_s"] / c["examples"])
        out.append(headline_row(
            "network model", "DP-SGD / plain training, digits CNN, per example: on the clock",
            clock, "x", "within 25 % of measured (issue 52)", f"measured {real:.2f}x"))
    out.append(_protocol_row(data))
    return measured(*out)


def _protocol_row(data: dict) -> dict | None:
    """SecAgg's clients and server, Krum and Bulyan, the codecs: the ratio furthest from 1, all
    in the note."""
    parts = []
    for c in data.get("secagg", []):
        secagg, _, codec = c["mode"].partition("-")
        name = f"{'SecAgg+' if secagg == 'plus' else 'SecAgg'}{' ' + codec if codec else ''} " \
            f"{c['clients']}"
        for side in ("client", "unmask"):
            if c.get(f"{side}_ratio") is not None:
                parts.append((f"{name} {'server unmask' if side == 'unmask' else side}",
                              c[f"{side}_ratio"]))
    parts += [(f"{r['defense'].capitalize()} {r['n']}x{r['d']}", r["ratio"])
              for r in data.get("robust", []) if r.get("ratio") is not None]
    parts += [(f"{r['codec']}{'' if 'SecAgg' in r['codec'] or 'decode' in r['codec'] else ' encode'}"
               f" ({r['model']})",
               r["ratio"])
              for r in data.get("codecs", []) if r.get("ratio") is not None]
    if not parts:
        return None
    worst = max(parts, key=lambda p: abs(math.log(p[1])) if p[1] > 0 else math.inf)
    return headline_row(
        "network model", "protocol and server compute on the clock / measured CPU s, furthest "
        "component", worst[1], "x", "0.75-1.25x (issue 52)",
        f"{worst[0]}; " + ", ".join(f"{n} {v:.2g}x" for n, v in parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a trace file (the client's rates; with --server-profile: "
                                      "instead of calibrating now)")
    ap.add_argument("--server-profile", help="a server profile file (fednet calibrate "
                                             "--server-out)")
    ap.add_argument("--calibrate-seconds", type=float, default=5.0)
    ap.add_argument("--ops-scale", type=float, default=1.0, help="fednet calibrate --ops-scale")
    ap.add_argument("--examples", type=int, default=1437, help="digits workloads' examples "
                                                                "(digits' training set)")
    ap.add_argument("--resnet-examples", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cohorts", type=int, nargs="*", default=[100, 1000])
    ap.add_argument("--secagg-modes", nargs="*", default=["plus", "full", "plus-int8"],
                    help="plus, full, or plus-CODEC (--secagg plus --compress CODEC)")
    ap.add_argument("--full-max", type=int, default=1000, help="full SecAgg's largest cohort")
    ap.add_argument("--robust-n", type=int, default=1000)
    ap.add_argument("--robust-d", type=int, default=100_000)
    ap.add_argument("--codecs", nargs="*", default=["fp16", "int8", "qsgd", "topk", "sign"],
                    help="the uplink codecs timed (compress/codecs.py)")
    ap.add_argument("--codec-model", default="resnet18", choices=["resnet18", "digits_cnn"],
                    help="the update's sizes the codecs encode")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    torch.set_num_threads(1)  # as every client process trains
    client, server, source = _rates(a)
    rate = client["train_flops_per_s"]
    print(f"host rate {rate / 1e9:.3g} GFLOP/s ({source})")
    # the codecs first, right after the rates were measured: their passes are memory-bound,
    # the most sensitive to this shared machine's load changing between the two (at 58e3a08,
    # timed ~8 min after the calibration, they came out 1.5-2.0x, against 0.84-1.3x with the
    # code rate timed in the same minute)
    codecs = codec_all(a, client, server)
    data = {"machine": machine(), "args": vars(a), "rate": rate, "rate_source": source,
            "client_profile": client, "server_profile": server, "rows": measure_all(a, client),
            "secagg": secagg_all(a, client, server), "robust": robust_all(a, server),
            "codecs": codecs}
    _print(data)
    write_json(a.json, data, headline(data))


def _print(data: dict) -> None:
    print(table(["workload", "examples", "FLOP/example", "CPU s", "simulated s", "sim / CPU"],
                [[r["workload"], r["examples"], f"{r['flops_per_example']:.4g}",
                  f"{r['cpu_s']:.3f}", f"{r['sim_s']:.3f}", f"{r['sim_over_cpu']:.3f}"]
                 for r in data["rows"]]))
    print(table(["secagg", "clients", "client sim s", "client CPU s", "sim / CPU",
                 "server sim s", "server CPU s", "unmask sim / CPU"],
                [[c["mode"], c["clients"], f"{c['client_sim_s']:.4g}", f"{c['client_cpu_s']:.4g}",
                  _fmt(c["client_ratio"]), f"{c['server_sim_s']:.4g}",
                  f"{c['server_cpu_s']:.4g}", _fmt(c["unmask_ratio"])]
                 for c in data["secagg"] if "error" not in c]))
    for c in data["secagg"]:
        if "error" in c:
            print(f"secagg {c['mode']} {c['clients']}: failed: {c['error']}")
    print(table(["defense", "n x d", "f", "CPU s", "simulated s", "sim / CPU"],
                [[r["defense"], f"{r['n']}x{r['d']}", r["f"], f"{r['cpu_s']:.3f}",
                  f"{r['sim_s']:.3f}", _fmt(r["ratio"])] for r in data["robust"]]))
    print(table(["codec", "values", "CPU s", "simulated s", "sim / CPU"],
                [[r["codec"], r["values"], f"{r['cpu_s']:.4f}", f"{r['sim_s']:.4f}",
                  _fmt(r["ratio"])] for r in data.get("codecs", [])]))
    for r in headline(data)[1:]:
        print(f"{r['metric']}: {r['value']:.2f}x ({r['note']})")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main()
