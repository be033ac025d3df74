"""Export: a model as a `.keras` file and a SavedModel, replaced only when complete.

    keras_path, saved_path = export(models, "generator", "runs/x/export", is_chief=True)

What `Runner.export` and the `ctl.Export` action call. Neither file needs ctl
to load: `keras.saving.load_model(keras_path)`, `tf.saved_model.load(saved_path)`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING

import tensorflow as tf

if TYPE_CHECKING:
  import keras


def export(models: dict[str, keras.Model], name: str, directory: str, *,
           is_chief: bool) -> tuple[str, str]:
  """Writes `models[name]` to `<directory>/<name>.keras` and `<directory>/<name>/`;
  returns the two paths. ValueError if no model is named `name`.

  Each replaces any earlier export only once it is complete: both are written
  into a scratch directory beside them and renamed. Every worker takes part
  (saving may run collectives); off the chief (`is_chief` False), nothing is kept.
  """
  if name not in models:
    raise ValueError(f"export: no model named {name!r}; the models are {sorted(models)}.")
  model = models[name]
  if not is_chief:
    directory = tempfile.mkdtemp(prefix="ctl-export-")
  keras_path = os.path.join(directory, f"{name}.keras")
  saved_path = os.path.join(directory, name)
  try:
    os.makedirs(directory, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{name}-", dir=directory)
  except OSError as e:  # a read-only work directory, a file in the way, ...
    raise OSError(f"could not export model {name!r} to {directory}: {e}. Export to a "
                  "directory you can write to (`ctl export --out DIR`, or the "
                  "directory argument), or fix this one's permissions.") from e
  try:
    model.save(os.path.join(scratch, "model.keras"))
    model.export(os.path.join(scratch, "saved_model"), verbose=False)
    os.replace(os.path.join(scratch, "model.keras"), keras_path)
    if os.path.exists(saved_path):  # a directory cannot be replaced in one step
      os.replace(saved_path, os.path.join(scratch, "previous"))
    os.replace(os.path.join(scratch, "saved_model"), saved_path)
  except (OSError, tf.errors.OpError) as e:  # a full disk, a file-size limit, ...
    raise OSError(
        f"could not export model {name!r} to {directory}: {e}. An earlier export "
        "there, if any, is unchanged; free disk space or fix the directory's "
        "permissions, then export again.") from e
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  if not is_chief:
    shutil.rmtree(directory, ignore_errors=True)
  return keras_path, saved_path


def remove_scratch(directory: str) -> list[str]:
  """Removes what an export stopped mid-way left in `directory` (its `.<name>-*`) and
  returns their paths. Only safe while no export runs there."""
  if not os.path.isdir(directory):
    return []
  removed = []
  for entry in os.listdir(directory):
    path = os.path.join(directory, entry)
    if entry.startswith(".") and os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed
