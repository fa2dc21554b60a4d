"""What the tests share, in one harness (no test module imports another): the byte totals they
compare, a run's final model, a run under both runtimes (fednet local and fednet launch) and
their agreement, the benchmark scripts they use (the golden pins among them, each loaded once),
fake run folders, runs stopped on purpose (Ctrl-C, a crash after a checkpoint), the command
line, and the availability scenarios."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
BYTE_KEYS = ("server_to_client", "client_to_server", "client_to_client", "tensor_bytes")
"""The traffic totals that must agree between runs (and between runtimes)."""
LEDGER_KEYS = BYTE_KEYS + ("header_bytes",)
"""BYTE_KEYS and the header bytes: equal too where both runs send the same headers."""
LIVENESS_SCALE = 0.1
"""The liveness timers' scale of the slow lane's liveness and resource tests (bench_trust)."""
DIGITS_MODEL_BYTES = 4 * 15_466
"""The tensor bytes of the digits CNN (the default model of the tests' runs)."""


def bench(name: str) -> ModuleType:
    """The benchmark script benchmarks/<name>.py as a module, loaded once per test session."""
    key = f"fednet_benchmarks_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


golden = bench("golden")
PINNED, PIN = golden.pinned_for(golden.load(), golden.environment())
"""The golden records for this environment (its float pin where it has one), and which pin."""


def final_model(out: str | Path) -> dict[str, np.ndarray]:
    """RUN/final_model.npz as arrays (no pickle)."""
    with np.load(Path(out) / "final_model.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """Bit-identical arrays under every name."""
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def byte_totals(summary: dict[str, Any], keys: tuple[str, ...] = BYTE_KEYS) -> dict[str, int]:
    """The summary's byte totals under `keys`."""
    return {k: summary["bytes"][k] for k in keys}


def run_both(tmp_path: Path, cfg: Any, prepare: Any = None
             ) -> tuple[dict, dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """cfg under fednet local (tmp_path/local) and fednet launch (tmp_path/launch): both
    summaries and both final models."""
    from fednet.core.inproc import run_local
    from fednet.server.main import run_zmq

    a = run_local(cfg.replace(out=str(tmp_path / "local")), quiet=True, prepare=prepare)
    b = run_zmq(cfg.replace(out=str(tmp_path / "launch")), quiet=True, prepare=prepare)
    return a, b, final_model(tmp_path / "local"), final_model(tmp_path / "launch")


def assert_agree(a: dict, b: dict, ma: dict[str, np.ndarray], mb: dict[str, np.ndarray],
                 keys: tuple[str, ...] = LEDGER_KEYS) -> None:
    """Two runs agree exactly: the same model, simulated time, byte totals (by default the
    whole ledger of the run's traffic: each direction, tensor and header bytes; control
    traffic, which only fednet launch has, aside) and, with the header bytes, the messages."""
    assert ma.keys() == mb.keys()
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    assert byte_totals(a, keys) == byte_totals(b, keys)
    if "header_bytes" in keys:
        assert a["messages"] == b["messages"]
    assert a["sim_time_s"] == b["sim_time_s"]


def preset_at_1ms(tmp_path: Path, preset: str, n: int, seed: int = 7) -> str:
    """A --latency preset's profiles (its links and spreads, from the run's seed) as a trace
    whose clients train the digits CNN at 1 ms an example, the slow ones as much slower as the
    preset makes them: the speeds the timed scenarios (deadlines, stragglers, availability)
    were set for before the clock counted FLOPs (the presets train it at ~68 us an example), in
    FLOPs alone (no fixed cost an operation or a convolution: s_per_op, s_per_conv 0)."""
    from fednet.config import LatencyConfig
    from fednet.models import build_model
    from fednet.network import latency
    from fednet.training.flops import batch_flops

    per = batch_flops(build_model("digits_cnn", 10, (1, 8, 8), seed=0), (1, 1, 8, 8))
    scale = per / 1e-3 / latency.EDGE_FLOPS
    rows = ["client,train_flops_per_s,rtt_s,up_bps,down_bps,s_per_op,s_per_conv"] + [
        f"{c},{p.train_flops_per_s * scale!r},{p.rtt_s!r},{p.up_bps!r},{p.down_bps!r},0,0"
        for c, p in enumerate(latency.profiles(LatencyConfig(preset=preset), n, seed))]
    f = tmp_path / f"{preset}_1ms.csv"
    f.write_text("\n".join(rows) + "\n")
    return str(f)


# ---- run folders, runs stopped on purpose, the command line ------------------------------------

def fake_row(r, acc, loss, train, wall):
    return {"round": r, "accuracy": acc, "loss": loss, "train_loss": train, "wall_s": wall,
            "sim_s": 0.5 * (r + 1), "bytes_total": 1000 * (r + 1),
            "bytes_round": {"server_to_client": 500, "client_to_server": 500,
                            "client_to_client": 0}}

def fake_run(folder: Path, algo="fedavg", failures=(), pss=None, **cfg):
    """A finished run's folder as fednet writes it (config.toml, run.json, summary.json, three
    rows), without running: what the report and sweep tests read."""
    from fednet.config import to_toml
    from tests.conftest import small_config

    folder.mkdir(parents=True)
    c = small_config(algo={"name": algo}, **cfg)
    (folder / "config.toml").write_text(to_toml(c))
    (folder / "run.json").write_text(json.dumps(  # what a run resolves at its start
        {"model": "digits_cnn", "eval": "clients" if algo == "standalone" else "global"}))
    s = {"algorithm": algo, "status": "completed", "clients": 3, "rounds": 2, "rounds_planned": 2,
         "final_accuracy": 0.5, "best_accuracy": 0.5, "bytes": {}, "failures": list(failures)}
    if pss:
        s["client_pss_bytes"] = pss
    (folder / "summary.json").write_text(json.dumps(s))
    rows = [fake_row(r, 0.3 + 0.1 * r, 2.0, 2.0, r + 1.0) for r in range(3)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder

def resume_config(algo: str, out: Path):
    """The golden run of `algo` in 4 rounds (FedSeqInter in periods of 2), for resume tests."""
    cfg = golden.config(algo, str(out)).replace(rounds=4)
    if algo == "fedseq_inter":  # periods of two rounds: the interrupt falls in the second
        cfg = cfg.replace(**{"algo.params.period": 2})
    return cfg

def interrupt_in(rnd: int):
    """Ctrl-C when the first reply of round `rnd` (or a later one) arrives."""
    def prepare(session) -> None:
        absorb = session.algo.absorb

        def hit(done) -> None:
            if done.round >= rnd:
                raise KeyboardInterrupt
            absorb(done)
        session.algo.absorb = hit
    return prepare

class Stop(KeyboardInterrupt):
    """Stands for Ctrl-C (or a crash) right after a checkpoint was written."""

def stop_after(rounds_done: int):
    """Stop (Ctrl-C, or a crash) right after the checkpoint of `rounds_done` rounds is written."""
    def prepare(session) -> None:
        save = session.driver.checkpoints.write

        def checkpoint() -> None:
            save()
            if session.driver.rounds_done == rounds_done:
                raise Stop()
        session.driver.checkpoints.write = checkpoint
    return prepare

def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder (names and bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}

def cli(*args: str):
    """`fednet ARGS` through click's runner (stdout and stderr apart)."""
    from click.testing import CliRunner

    from fednet.cli import main

    return CliRunner().invoke(main, list(args))

def one_line(res) -> str:
    """The one stderr line of a refused command (exit 2, no traceback)."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fednet: error: "), res.stderr
    assert "Traceback" not in res.output + res.stderr
    return lines[0][len("fednet: error: "):]


# ---- availability scenarios (test_availability, integration/test_availability_parity) ---------

def spans_csv(tmp_path, spans):
    rows = ["client,start,end"] + [f"{c},{s},{'' if math.isinf(e) else e}"
                                   for c, sp in enumerate(spans) for s, e in sp]
    p = tmp_path / "trace.csv"
    p.write_text("\n".join(rows) + "\n")
    return str(p)

def hetero_at_1ms(tmp_path, n, seed=7):
    """--latency hetero at the per-example speeds these scenarios were timed with (1 ms an
    example, the slow ones 5 ms): tests/harness.preset_at_1ms."""
    return preset_at_1ms(tmp_path, "hetero", n, seed)

def ring(session):
    """One chain through every selected client per round (a superclient ring)."""
    algo = session.algo
    session.handoffs = True  # FedAvg's routes made rings: WELCOME carries the peers' tables

    def configure_round(rnd, clients):
        ids = sorted(c.cid for c in clients)
        return [algo.new_task(rnd, ids, algo.global_arrays, algo.task_body(rnd, clients[0]))]
    algo.configure_round = configure_round


# ---- data fixtures' names ----------------------------------------------------------------------
CIFAR100_FINE = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
"""CIFAR-100's fine label names, in their order (the torchvision fixtures write them)."""
