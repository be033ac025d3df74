"""Where in the user's code something happened: the innermost frame outside
TensorFlow, Keras and ctl.

    where = sources.user_line(_tf_internal.stack())   # "my_gan.py:42: z = ..."

Errors and `ctl.tools.parity`'s diagnoses name the user's line, not the library
frame that noticed the problem.
"""

from __future__ import annotations

import linecache
import os
import warnings
from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf


def _folder(module_file):
  return os.path.dirname(os.path.abspath(module_file)) + os.sep


_TENSORFLOW, _KERAS = (_folder(f) for f in (tf.__file__, keras.__file__))
_CTL = os.path.dirname(_folder(__file__).rstrip(os.sep)) + os.sep  # ctl/, above ctl/base/
_PYTHON = _folder(os.__file__)  # the standard library (site-packages excepted)
# Where ctl wraps TF's own functions (the float64 replay's): TF's frames, to user_call.
_TF_WRAPPERS = os.path.join(_CTL, "base", "_tf_internal.py")


def is_library(filename: str) -> bool:
  """Whether a frame of `filename` is ctl's, TensorFlow's, Keras' or Python's own."""
  if filename.startswith("<"):  # <frozen ...>, <string>
    return True
  filename = os.path.abspath(filename)
  return filename.startswith((_CTL, _TENSORFLOW, _KERAS)) or (
      filename.startswith(_PYTHON) and "-packages" + os.sep not in filename)


def user_line(frames: Iterable[Any]) -> str | None:
  """`"file:line: code"` of the innermost of `frames` (outermost first, as
  `traceback.extract_stack()` and TF's `op.traceback` give them) outside the
  library, or None."""
  for frame in reversed(list(frames)):
    filename = getattr(frame, "filename", None)
    if filename and not is_library(filename):
      code = (getattr(frame, "line", "") or linecache.getline(filename, frame.lineno)).strip()
      relative = os.path.relpath(filename)  # shown when under the working directory
      where = f"{filename if relative.startswith('..') else relative}:{frame.lineno}"
      return f"{where}: {code}" if code else where
  return None


def user_call(frames: Iterable[Any], through_keras: bool = False) -> str | None:
  """Like `user_line`, but only if the user's code called TensorFlow directly (or
  through Keras, with `through_keras`): None when the innermost frame outside
  TensorFlow is ctl's (an op that ctl made), or Keras' (a layer's)."""
  skipped = (_TENSORFLOW, _KERAS) if through_keras else (_TENSORFLOW,)
  for frame in reversed(list(frames)):
    filename = os.path.abspath(getattr(frame, "filename", None) or "")
    if filename.startswith(skipped) or filename == _TF_WRAPPERS:
      continue
    return None if is_library(filename) else user_line([frame])
  return None


# Draws whose numbers come from the op's own state: other numbers on each
# replica and worker, eagerly and compiled, and after a restart.
_STATEFUL_DRAWS = frozenset({
    "RandomStandardNormal", "RandomUniform", "RandomUniformInt", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "Multinomial", "RandomShuffle", "StatefulStandardNormalV2", "StatefulUniform",
    "StatefulUniformInt", "StatefulUniformFullInt", "StatefulTruncatedNormal",
    "StatefulRandomBinomial"})
_STATELESS_DRAWS = ("StatelessRandom", "StatelessTruncatedNormal", "StatelessMultinomial",
                    "StatelessParameterizedTruncatedNormal")


def layout_dependent_draws(graph: Any, rows: int | None = None) -> list[str]:
  """The user's lines in `graph` (and the functions it calls) that draw numbers
  the layout changes, each once, as "file:line: code (OpType)": a stateful draw
  (`tf.random.normal`, a `tf.random.Generator`), or a stateless one of `rows`, the
  replica's batch (each replica would draw the same rows). A Keras draw is named
  by the user's line that called Keras; ctx's own draws are not listed.
  """
  from ctl.base import _tf_internal  # pylint: disable=import-outside-toplevel
  found = []
  for inner in [graph] + _tf_internal.function_graphs(graph):
    for op in inner.get_operations():
      stateless = op.type.startswith(_STATELESS_DRAWS) and rows and rows > 1 and (
          op.outputs and op.outputs[0].shape.rank and op.outputs[0].shape[0] == rows)
      if op.type in _STATEFUL_DRAWS or stateless:
        line = user_call(_tf_internal.op_stack(op), through_keras=True)
        if line:
          found.append(f"{line} ({op.type})")
  return list(dict.fromkeys(found))


_warned_draws = set()


def warn_of_layout_dependent_draws(rows: int | None, fix: str) -> None:
  """While a function is traced: warns, once per line, of the user's draws in
  it that the layout changes (`layout_dependent_draws`), with `fix`."""
  graph = tf.compat.v1.get_default_graph()
  for line in layout_dependent_draws(graph, rows):
    if line not in _warned_draws:
      _warned_draws.add(line)
      warnings.warn(
          f"{line}: a random draw whose numbers depend on the layout (other numbers on "
          "each replica and worker, eagerly and compiled), so this run's numbers would "
          f"not be another layout's. {fix}", UserWarning, stacklevel=2)
