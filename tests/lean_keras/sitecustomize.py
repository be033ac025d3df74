"""The test processes' Keras skips the optional integrations ctl never uses.

Keras imports scikit-learn (its scikit-learn wrappers), matplotlib (its image
gallery) and pandas (its data adapters) wherever they are installed, and the
test extras install all three (MLflow brings them, and the notebook extra): 2.3
of the 7.9 CPU-seconds a process spends importing ctl, ctl.loop.fit and
gan.experiment (farm-bench, 5 pairs), in each of the ~280 processes the suite
starts. conftest.py puts this folder on PYTHONPATH (and runs this file in the
pytest processes): an import of those packages *by Keras* fails as if they were
not installed. Anyone else's import of them (ctl's History.plot, MLflow) finds
them as usual. (Being first on the path, this file hides a system
`sitecustomize`, such as Debian's apport hook, from the tests' processes.)
"""

import sys

_SKIPPED = ("sklearn", "matplotlib", "pandas")


class _SkipKerasOptionals:
  """A meta path finder that refuses `_SKIPPED` to an importer in Keras."""

  def find_spec(self, name, path=None, target=None):
    if name.partition(".")[0] not in _SKIPPED:
      return None
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
        ("importlib", "_frozen_importlib")):
      frame = frame.f_back  # the import machinery, up to the module importing
    importer = frame.f_globals.get("__name__", "") if frame is not None else ""
    if importer.startswith("keras."):
      raise ModuleNotFoundError(f"{name}: not for Keras in ctl's tests", name=name)
    return None


# Once, though conftest.py runs this file again in a process that imported it.
if not any(type(f).__name__ == "_SkipKerasOptionals" for f in sys.meta_path):
  sys.meta_path.insert(0, _SkipKerasOptionals())
