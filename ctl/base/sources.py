"""Where in the user's code something happened: the innermost frame outside
TensorFlow, Keras and ctl.

    where = sources.user_line(_tf_internal.stack())   # "my_gan.py:42: z = ..."

Errors and `ctl.parity`'s diagnoses name the user's line, not the library
frame that noticed the problem.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf


def _folder(module_file):
  return os.path.dirname(os.path.abspath(module_file)) + os.sep


_TENSORFLOW, _KERAS = (_folder(f) for f in (tf.__file__, keras.__file__))
_CTL = os.path.dirname(_folder(__file__).rstrip(os.sep)) + os.sep  # ctl/, above ctl/base/
_PYTHON = _folder(os.__file__)  # the standard library (site-packages excepted)


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
      where = f"{_short(filename)}:{frame.lineno}"
      return f"{where}: {code}" if code else where
  return None


def user_call(frames: Iterable[Any]) -> str | None:
  """Like `user_line`, but only if the user's code called TensorFlow directly:
  None when the innermost frame outside TensorFlow is Keras' or ctl's (an op that
  a layer or ctl made)."""
  for frame in reversed(list(frames)):
    filename = getattr(frame, "filename", None) or ""
    if os.path.abspath(filename).startswith(_TENSORFLOW):
      continue
    return None if is_library(filename) else user_line([frame])
  return None


def _short(filename):
  """`filename` relative to the working directory when it is under it."""
  relative = os.path.relpath(filename)
  return filename if relative.startswith("..") else relative
