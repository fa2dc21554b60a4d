"""training/flops' disk cache (flops.CACHE_ENV): torch's counter's counts made by one process are
read by the next ones, which then never start the counter (its first use imports torch._dynamo
and sympy: ~0.75 s a process, fednet launch's server and zygote both paid it); a count is kept
under everything it depends on, so a changed model file counts again."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from fednet.training import flops

ROOT = Path(__file__).resolve().parent.parent


def _torch_count(model: nn.Module, shape: tuple[int, ...]) -> int:
    """One training batch of zeros through `model` under torch's own counter, directly."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(shape)).sum().backward()
    return int(counter.get_total_flops())


def _in_process(code: str, cache: Path, *path: Path) -> dict:
    """Run `code` in a fresh interpreter with the cache at `cache`; its last line's JSON."""
    env = {"FEDNET_FLOPS_CACHE": str(cache), "PYTHONPATH": ":".join(map(str, (ROOT, *path))),
           "PATH": "/usr/bin:/bin", "HOME": str(cache.parent)}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


COUNT = """
    import json, sys
    from fednet.models import build_model
    from fednet.training import flops
    model = build_model("digits_cnn", 10, (1, 8, 8), seed=0)
    known = flops.known(model, (1, 8, 8), range(1, 9))
    work = [list(flops.batch_work(model, (n, 1, 8, 8))) for n in (1, 8)]
    print(json.dumps({"known": known, "work": work, "dynamo": "torch._dynamo" in sys.modules}))
"""


def test_a_count_is_read_by_the_next_process_which_starts_no_counter(tmp_path):
    cache = tmp_path / "flops"
    first = _in_process(COUNT, cache)
    assert not first["known"] and first["dynamo"]  # counted: torch's counter started
    assert len(list(cache.glob("*.json"))) == 1
    second = _in_process(COUNT, cache)
    assert second["work"] == first["work"] and not second["dynamo"]
    model = build_digits()
    assert [w[0] for w in first["work"]] == [_torch_count(model, (n, 1, 8, 8)) for n in (1, 8)]


def build_digits() -> nn.Module:
    from fednet.models import build_model

    return build_model("digits_cnn", 10, (1, 8, 8), seed=0)


def test_off_keeps_nothing_and_a_damaged_file_is_counted_again(tmp_path, monkeypatch):
    off = _in_process(COUNT.replace("import json, sys", "import json, sys, os\n"
                                    "    os.environ['FEDNET_FLOPS_CACHE'] = 'off'"),
                      tmp_path / "flops")
    assert off["dynamo"] and not (tmp_path / "flops").exists()
    cache = tmp_path / "flops"
    first = _in_process(COUNT, cache)
    (f,) = cache.glob("*.json")
    f.write_text('{"counts": {"train|torch.float32|1,1,8,8": [1, 2]}}')  # not a count's shape
    again = _in_process(COUNT, cache)
    assert again["dynamo"] and again["work"] == first["work"]
    assert json.loads(f.read_text())["counts"]["train|torch.float32|1,1,8,8"] == first["work"][0]


MODEL = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return {body}
"""

COUNT_NET = """
    import json, sys
    import netmod
    from fednet.training import flops
    work = flops.batch_work(netmod.Net(), (4, 6))
    print(json.dumps({"flops": work.flops, "dynamo": "torch._dynamo" in sys.modules}))
"""


def test_a_changed_model_file_is_counted_again(tmp_path):
    """The same class, the same parameters' shapes and settings, another forward: the file's
    contents are part of the key, so the new forward is counted, as torch's counter counts it."""
    cache, src = tmp_path / "flops", tmp_path / "src"
    src.mkdir()
    (src / "netmod.py").write_text(textwrap.dedent(MODEL.format(body="self.fc(x)")))
    once = _in_process(COUNT_NET, cache, src)
    assert once["dynamo"] and not _in_process(COUNT_NET, cache, src)["dynamo"]
    (src / "netmod.py").write_text(textwrap.dedent(MODEL.format(body="self.fc(self.fc(x))")))
    twice = _in_process(COUNT_NET, cache, src)
    assert twice["dynamo"] and twice["flops"] > once["flops"]
    sys.path.insert(0, str(src))
    try:
        sys.modules.pop("netmod", None)
        import netmod  # type: ignore[import-not-found]

        assert twice["flops"] == _torch_count(netmod.Net(), (4, 6))
    finally:
        sys.path.remove(str(src))
        sys.modules.pop("netmod", None)


ZYGOTE = """
    import json, sys
    from fednet.launch import zygote
    zygote.PREPARE_S = 60.0  # (a loaded test machine: every size, whatever it takes)
    zygote.warm_up("digits", "", batch_size=8)
    zygote._keep_model({"name": "auto", "num_classes": 10, "input_shape": [1, 8, 8],
                        "dataset": "digits", "seed": 0}, 8)
    print(json.dumps({"dynamo": "torch._dynamo" in sys.modules}))
"""


@pytest.mark.parametrize("model", ["auto", "mclr"])
def test_the_zygote_knows_every_batch_size_before_forking(tmp_path, model):
    """The zygote's warm-up and the run's model (the template, which --model may make another
    than the warm-up's) leave every training batch size's count in its cache (clients forked
    from it count nothing); the next run's zygote reads them all from disk and starts no
    counter."""
    zyg = textwrap.dedent(ZYGOTE.replace('"name": "auto"', f'"name": "{model}"'))
    code = zyg + textwrap.dedent("""
        from fednet.models import build_model
        from fednet.training import flops
        m = build_model("%s", 10, (1, 8, 8), dataset="digits", seed=0)
        arch = flops.structure(m).arch
        print(json.dumps({"cached": all((arch, (n, 1, 8, 8), "torch.float32", "train")
                                        in flops._COUNTS
                                        for n in range(1, 9))}))
    """ % model)
    cache = tmp_path / "flops"
    first = _in_process(code, cache)
    assert first["cached"]
    assert _in_process(code, cache)["cached"]
    assert not _in_process(zyg, cache)["dynamo"]


def test_the_key_holds_the_architecture_and_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv(flops.CACHE_ENV, str(tmp_path))
    a, b = nn.Sequential(nn.Conv2d(1, 2, 3)), nn.Sequential(nn.Conv2d(1, 2, 3, stride=2))
    pa = flops._disk_path(a, flops.architecture(a))
    assert pa is not None and pa.startswith(str(tmp_path))
    assert pa != flops._disk_path(b, flops.architecture(b))
    assert pa == flops._disk_path(nn.Sequential(nn.Conv2d(1, 2, 3)), flops.architecture(a))
    monkeypatch.setenv(flops.CACHE_ENV, "off")
    assert flops._disk_path(a, flops.architecture(a)) is None


BATCHED = """
    import json, sys
    from fednet.launch import zygote
    zygote._keep_model({"name": "%s", "num_classes": 10, "input_shape": [1, 8, 8],
                        "dataset": "digits", "seed": 0}, 8, batched=%s)
    print(json.dumps({"dynamo": "torch._dynamo" in sys.modules}))
"""


@pytest.mark.parametrize("model,batched,dynamo", [("digits_cnn", True, True),
                                                  ("mclr", True, False),
                                                  ("digits_cnn", False, False)])
def test_the_zygote_imports_what_the_batched_engines_gradient_imports(tmp_path, model, batched,
                                                                       dynamo):
    """torch.func's gradient imports torch._dynamo at its first call: a batched run of a model
    the engine differentiates has the zygote import it before forking (else every client
    process pays ~0.75 s in its first block); mclr's closed form and unbatched runs do not
    need it (their counts on disk: nothing starts it)."""
    cache = tmp_path / "flops"
    _in_process(BATCHED % (model, batched), cache)  # the counts, on disk now
    assert _in_process(BATCHED % (model, batched), cache)["dynamo"] is dynamo


def test_a_kept_value_is_made_once_per_host_and_file(tmp_path, monkeypatch):
    """training/batched.per_client's conv_flops (a meta forward: its first run imports
    torch._dynamo) is kept on disk beside the counts, under its rule's source file too."""
    monkeypatch.setenv(flops.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(flops, "_DISKS", {})
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    rule = tmp_path / "rule.py"
    rule.write_text("one")
    made: list[int] = []
    assert flops.kept(model, "x", lambda: made.append(1) or 7, str(rule)) == 7
    monkeypatch.setattr(flops, "_DISKS", {})  # another process: read from the disk
    assert flops.kept(model, "x", lambda: made.append(1) or 8, str(rule)) == 7 and made == [1]
    rule.write_text("two")  # the rule changed: made again
    assert flops.kept(model, "x", lambda: made.append(1) or 9, str(rule)) == 9 and made == [1, 1]


def test_the_zygote_leaves_sizes_past_its_budget_to_the_clients(tmp_path):
    """Past PREPARE_S only the full batch is counted (a large model's sizes take ~0.4 s each):
    the other sizes are left to the clients that meet them, with the counter's imports made
    in the zygote so that their counts are quick."""
    code = """
        import json, sys
        from fednet.launch import zygote
        from fednet.models import build_model
        from fednet.training import flops
        zygote.PREPARE_S = 0.0
        m = build_model("digits_cnn", 10, (1, 8, 8), seed=0)
        zygote.prepare_counts(m, (1, 8, 8), 8)
        arch = flops.structure(m).arch
        have = [n for n in range(1, 9) if (arch, (n, 1, 8, 8), "torch.float32", "train")
                in flops._COUNTS]
        print(json.dumps({"have": have, "dynamo": "torch._dynamo" in sys.modules}))
    """
    got = _in_process(code, tmp_path / "flops")
    assert got["have"] == [8] and got["dynamo"]
