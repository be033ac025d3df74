"""What `fit` shows when it runs in a Jupyter notebook.

A notebook is no terminal (a text bar would print a line per refresh), so there
`fit` draws tqdm's widget bar (`ctl.loop.progress`) and `ctl.Samples` shows its
newest grid under the cell, replaced in place. Outside a notebook nothing here
is used, and IPython is imported only if already loaded.
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
