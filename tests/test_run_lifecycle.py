"""core.run.Run: resources stopped in reverse order, the summary written once at its place, the
status set in one place (interrupted, error, an early stop's own), nothing written for a run that
never started."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from fednet.core.run import Run, Stopped
from fednet.errors import FednetError


class FakeDriver:
    status = "running"

    def end(self, status, error: str = "") -> None:  # RoundDriver.end: the one place
        self.status = status


class FakeSession:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.driver = FakeDriver()
        self.progress = SimpleNamespace(message=lambda m: log.append(f"say {m}"))
        self.history = SimpleNamespace(close=lambda: log.append("history closed"))
        self.tracking = SimpleNamespace(end=lambda summary, out: log.append("tracking ended"))
        self.out = None

    def finish(self, clients, extra):
        self.log.append(f"finish {self.driver.status} {sorted(extra)}")
        return {"status": self.driver.status, **extra}


def _run(log: list[str], body=None, start=True, **kw) -> Run:
    with Run("test", on_interrupt="stopping", **kw) as run:
        run.on_stop(log.append, "stop A")
        run.finish_here()
        run.on_stop(log.append, "stop B")
        run.open(FakeSession(log))
        run.reports.append(lambda: run.extra.update(report=1))
        if start:
            run.started()
        if body is not None:
            body()
    return run


def test_a_run_stops_in_reverse_order_and_writes_the_summary_between():
    log: list[str] = []
    run = _run(log)
    assert log == ["stop B", "finish running ['report', 'runtime', 'server_peak_rss_bytes']",
                   "stop A"]
    assert run.summary is not None and run.summary["runtime"] == "test"


@pytest.mark.parametrize("exc,status", [(KeyboardInterrupt, "interrupted"),
                                        (RuntimeError, "error"),
                                        (lambda: Stopped("registration_timeout", "late"),
                                         "registration_timeout")])
def test_the_status_of_a_run_that_fails_is_set_in_one_place(exc, status):
    log: list[str] = []

    def fail():
        raise exc()

    with pytest.raises(BaseException) as info:
        _run(log, fail)
    assert isinstance(info.value, KeyboardInterrupt if status == "interrupted" else Exception)
    assert log[-3:] == ["stop B", f"finish {status} ['report', 'runtime', 'server_peak_rss_bytes']",
                        "stop A"]
    assert ("say stopping" in log) == (status == "interrupted")


def test_stopped_is_a_fednet_error():  # the CLI prints it as one line, exit code 2
    assert isinstance(Stopped("registration_timeout", "x"), FednetError)


def test_a_run_that_never_started_writes_no_summary_and_stops_everything(tmp_path):
    log: list[str] = []
    out = tmp_path / "new"

    def fail():
        out.mkdir()
        (out / "metrics.jsonl").touch()  # empty: removed with the folder
        raise ValueError("bad config")

    with pytest.raises(ValueError):
        _run(log, fail, start=False, out=out)
    assert log == ["history closed", "tracking ended", "stop B", "stop A"]
    assert not out.exists()


def test_a_folder_that_existed_or_holds_files_is_kept(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(ValueError):
        _run([], lambda: (_ for _ in ()).throw(ValueError()), start=False, out=kept)
    assert kept.is_dir()
    out = tmp_path / "new"

    def fail():
        out.mkdir()
        (out / "config.toml").write_text("x")
        raise ValueError()

    with pytest.raises(ValueError):
        _run([], fail, start=False, out=out)
    assert (out / "config.toml").is_file()


def test_a_failing_stop_step_does_not_keep_the_others_from_running():
    log: list[str] = []
    with pytest.raises(OSError):
        with Run("test") as run:
            run.on_stop(log.append, "stop A")
            run.on_stop(lambda: (_ for _ in ()).throw(OSError("disk")))
            run.on_stop(log.append, "stop C")
    assert log == ["stop C", "stop A"]
