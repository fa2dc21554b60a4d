"""examples/quickstart.ipynb runs headless in a real Jupyter kernel (nbclient), as CI runs it:
every cell without an error, the run completed, and the plot cell, whose `%matplotlib inline`
backend was chosen before fednet.api was imported, shows its figure as a PNG (issue 41 item 3:
fednet.api leaves the caller's backend alone)."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow  # starts a kernel process

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def test_the_stored_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_the_quickstart_notebook_runs_headless_with_its_plot(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # as on a CI machine without a display
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    shown = code[2].outputs[0]["data"]["text/plain"]  # the summary cell's dict
    assert "'status': 'completed'" in shown and "'rounds': 4" in shown
    images = [o for o in code[-1].outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    png = base64.b64decode(images[0]["data"]["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert (tmp_path / "runs" / "quickstart" / "summary.json").is_file()
