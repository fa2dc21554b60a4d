"""What the tests share: the byte totals they compare, a run's final model, a run under both
runtimes (fednet local and fednet launch) and their agreement, and the benchmark scripts they
use (the golden pins among them), each loaded once."""
from __future__ import annotations

import importlib.util
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
    were set for before the clock counted FLOPs (the presets train it at ~68 us an example)."""
    from fednet.config import LatencyConfig
    from fednet.models import build_model
    from fednet.network import latency
    from fednet.training.flops import batch_flops

    per = batch_flops(build_model("digits_cnn", 10, (1, 8, 8), seed=0), (1, 1, 8, 8))
    scale = per / 1e-3 / latency.EDGE_FLOPS
    rows = ["client,train_flops_per_s,rtt_s,up_bps,down_bps"] + [
        f"{c},{p.train_flops_per_s * scale!r},{p.rtt_s!r},{p.up_bps!r},{p.down_bps!r}"
        for c, p in enumerate(latency.profiles(LatencyConfig(preset=preset), n, seed))]
    f = tmp_path / f"{preset}_1ms.csv"
    f.write_text("\n".join(rows) + "\n")
    return str(f)
