"""commands.exit_now: the `fednet` command's process ends without the interpreter's teardown,
yet with everything an ordinary exit leaves (atexit handlers, logging handlers, non-daemon
threads, buffered stdout) and the same exit code; a caller's own process is never ended."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(f"""
        import atexit, logging, sys, threading, time
        from pathlib import Path
        from fednet.cli.commands import exit_now
        out = Path({str(tmp_path)!r})
        atexit.register(lambda: (out / "atexit").write_text("ran"))
        h = logging.FileHandler(out / "log.txt")  # flushed and closed by logging.shutdown
        logging.getLogger("t").addHandler(h)
        def late():
            time.sleep(0.2)
            (out / "thread").write_text("done")
        threading.Thread(target=late).start()
        def command():
            logging.getLogger("t").warning("logged")
            sys.stdout.write("buffered")  # no newline, a pipe: still in the buffer
        """) + body
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("end, code", [("None", 0), ("sys.exit(None)", 0), ("sys.exit(3)", 3),
                                       ("sys.exit(130)", 130)])
def test_exit_code_and_what_an_exit_leaves(tmp_path: Path, end: str, code: int) -> None:
    ran = _run(tmp_path, f"exit_now(lambda: (command(), {end}))\nprint('not reached')")
    assert ran.returncode == code, ran.stderr
    assert ran.stdout == "buffered"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "log.txt").read_text() == "logged\n"


def test_a_message_exit_is_printed_with_code_1(tmp_path: Path) -> None:
    ran = _run(tmp_path, "exit_now(lambda: sys.exit('fednet: bad'))")
    assert (ran.returncode, ran.stderr) == (1, "fednet: bad\n")


def test_an_exception_keeps_its_traceback(tmp_path: Path) -> None:
    ran = _run(tmp_path, "exit_now(lambda: 1 / 0)")
    assert ran.returncode == 1 and "ZeroDivisionError" in ran.stderr
    assert (tmp_path / "atexit").read_text() == "ran"


def test_main_called_in_a_callers_process_raises_systemexit() -> None:
    """Only the installed script's process ends in exit_now; a script calling main() (e.g.
    benchmarks/bench_secagg.py) gets SystemExit and goes on."""
    from fednet.cli import main

    argv = sys.argv
    sys.argv = ["fednet", "--version"]
    try:
        with pytest.raises(SystemExit) as e:
            main()
    finally:
        sys.argv = argv
    assert e.value.code == 0


def test_an_idle_thread_pool_does_not_hold_the_exit():
    """A ThreadPoolExecutor still referenced and never shut down: an ordinary exit wakes its
    idle workers (threading's exit callbacks) before joining them; exit_now does the same."""
    script = ("from concurrent.futures import ThreadPoolExecutor\n"
              "from fednet.cli.commands import exit_now\n"
              "pool = ThreadPoolExecutor(2)\n"
              "pool.submit(lambda: 1).result()\n"
              "exit_now(lambda: None)\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=30)
    assert ran.returncode == 0, ran.stderr
