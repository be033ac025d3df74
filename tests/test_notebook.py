"""Runs examples/notebooks/debug_step.ipynb top to bottom; any cell error fails.

The notebook asserts its own results (finite losses, 2 replicas, eager/mirrored
parity), so executing it is the test; this file also checks that what it shows
are pictures: the sample grid and the loss curves as PNG images, and `fit`'s
progress as a widget. It runs in a fresh kernel, i.e. its own process, as its
device setup requires.
"""

import os
import re

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "notebooks", "debug_step.ipynb")


def test_notebook_is_stored_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:80]


def test_notebook_runs(monkeypatch):
  monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # as a user's kernel starts
  monkeypatch.delenv("CTL_VERBOSE", raising=False)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
      nb, timeout=600, kernel_name="python3",
      resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
  client.execute()  # raises CellExecutionError, with the traceback, if a cell fails
  printed = "".join(output.get("text", "") for cell in nb.cells
                    for output in cell.get("outputs", []) if output.get("name"))
  # absl's C++ lines, and the INFO lines of TF's Python logger, which TF sets to
  # INFO on its first use in a notebook (mirrored's "Collective all_reduce ...").
  chatter = re.findall(r"^(?:[IWEF]\d{4} |WARNING: All log messages|INFO:tensorflow).*",
                       printed, re.M)
  assert not chatter, chatter  # quiet.apply() in the first cell: no TensorFlow log lines
  shown = {}  # mime type -> the cells that show one
  for cell in nb.cells:
    for output in cell.get("outputs", []):
      for mime in output.get("data", {}):
        shown.setdefault(mime, []).append(cell.source)
  images = shown.get("image/png", [])
  assert any("ctl.Samples" in source for source in images), shown  # the grid, by fit
  assert any(".plot(" in source for source in images), shown  # the loss curves
  widgets = shown.get("application/vnd.jupyter.widget-view+json", [])
  assert any(".fit(" in source for source in widgets), sorted(shown)  # fit's progress bar
