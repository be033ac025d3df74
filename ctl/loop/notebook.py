"""What `fit` shows when it runs in a Jupyter notebook.

There `fit` draws tqdm's widget bar (a text bar would print a line per refresh)
and `ctl.Samples` shows its newest grid under the cell, replaced in place.
"""

from __future__ import annotations

import sys
from typing import Any


def in_notebook() -> bool:
  """True in a Jupyter kernel (a notebook, JupyterLab, VS Code's notebooks, Colab)."""
  if "IPython" not in sys.modules:  # no kernel imported it: not a notebook
    return False
  from IPython import get_ipython  # pylint: disable=import-outside-toplevel
  shell = get_ipython()
  return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def show_png(png: bytes, handle: Any = None, *, width: int | None = None) -> Any:
  """Shows PNG bytes under the running cell; returns a handle that `show_png(...,
  handle)` updates in place (a new image replaces the old one)."""
  from IPython import display  # pylint: disable=import-outside-toplevel
  image = display.Image(data=png, format="png", width=width)
  if handle is None:
    return display.display(image, display_id=True)
  handle.update(image)
  return handle
