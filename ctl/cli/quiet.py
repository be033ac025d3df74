"""Quiet by default: TensorFlow's start-up chatter kept off the `ctl` command's stderr.

    from ctl.cli import quiet
    quiet.from_command_line()    # a script, before it imports TensorFlow: --verbose keeps it all
    with quiet.unless_verbose(args.verbose):   # what `ctl` does around each command
      ...

Quiet means (docs/strategies.md says why): TF_CPP_MIN_LOG_LEVEL=3 unless the user
set it, inherited by processes ctl starts; absl's lines below that level filtered out
of stderr while `tensorflow` is first imported; the "tensorflow" Python logger at
WARNING and "absl"'s at ERROR, unless configured. `--verbose` or CTL_VERBOSE=1 keeps
it all, in processes ctl starts too. The library (`import ctl`, `import gan`)
changes none of this. Leaving the `with` puts back what it changed.
"""

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable
from collections.abc import Iterator

VERBOSE_VARIABLE = "CTL_VERBOSE"
_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
_SEVERITIES = "IWEF"  # absl's line prefixes, in TF_CPP_MIN_LOG_LEVEL's order 0..3
_ABSL_LINE = re.compile(r"([IWEF])\d{4} ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"


def verbose_requested(argv: list[str] | None = None) -> bool:
  """Whether `--verbose` is in `argv` (default: the process's arguments) or CTL_VERBOSE is set."""
  argv = sys.argv[1:] if argv is None else argv
  return "--verbose" in argv or os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")


def apply(verbose: bool = False) -> Callable[[], None]:
  """Quiets TensorFlow (the module's synopsis) unless `verbose` or CTL_VERBOSE; returns
  what puts it back."""
  verbose = verbose or verbose_requested([])
  saved_env = {name: os.environ.get(name) for name in (VERBOSE_VARIABLE, _LEVEL_VARIABLE)}
  tf_logger = logging.getLogger("tensorflow")
  saved_level = tf_logger.level
  finder = _FilteredImport()
  if verbose:
    os.environ[VERBOSE_VARIABLE] = "1"
  else:
    os.environ.setdefault(_LEVEL_VARIABLE, "3")
    if tf_logger.level == logging.NOTSET:
      tf_logger.setLevel(logging.WARNING)
      finder.quiet_tf_logger = True
      if "tensorflow" in sys.modules:
        _configure_tf_logger()
    if "tensorflow" not in sys.modules and (_min_level() > 0 or finder.quiet_tf_logger):
      sys.meta_path.insert(0, finder)

  def restore() -> None:
    if finder in sys.meta_path:
      sys.meta_path.remove(finder)
    for name, value in saved_env.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value
    tf_logger.setLevel(saved_level)
    if finder.quieted_absl:
      logging.getLogger("absl").setLevel(logging.NOTSET)

  return restore


def from_command_line() -> None:
  """A script's one call, before it imports TensorFlow: quiet unless --verbose or CTL_VERBOSE."""
  apply(verbose_requested())


@contextlib.contextmanager
def unless_verbose(verbose: bool = False) -> Iterator[None]:
  """Quiets TensorFlow meanwhile, unless `verbose` or CTL_VERBOSE; puts it back afterwards."""
  restore = apply(verbose)
  try:
    yield
  finally:
    restore()


def _configure_tf_logger():
  """Has TensorFlow set up its logger, then sets it to WARNING: its set-up on first
  use sets INFO in an interactive session (a notebook), which would undo ours."""
  sys.modules["tensorflow"].get_logger().setLevel(logging.WARNING)  # imported by now


def _min_level() -> int:
  try:
    return int(os.environ.get(_LEVEL_VARIABLE, "0"))
  except ValueError:
    return 0


def _is_chatter(line: str, min_level: int) -> bool:
  match = _ABSL_LINE.match(line)
  if match:
    return _SEVERITIES.index(match.group(1)) < min_level
  return line.startswith(_ABSL_NOTICE)


class _FilteredImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds `tensorflow` (once) and loads it with its loader, filtering stderr meanwhile."""

  quieted_absl = False  # whether the import set the "absl" logger to ERROR
  quiet_tf_logger = False  # whether to set up the "tensorflow" logger at WARNING
  _loader = None  # tensorflow's own

  def find_spec(self, name, path=None, target=None):
    if name != "tensorflow":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)  # by the finders after this one
    if spec is not None and spec.loader is not None:
      self._loader, spec.loader = spec.loader, self
    return spec

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    module.__loader__ = self._loader
    if _min_level() == 0:  # only the logger to set up (a user's TF_CPP_MIN_LOG_LEVEL=0)
      self._loader.exec_module(module)
      self._after()
      return
    with tempfile.TemporaryFile() as captured:
      sys.stderr.flush()
      saved = os.dup(2)
      os.dup2(captured.fileno(), 2)
      try:
        self._loader.exec_module(module)
      finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        captured.seek(0)
        level = _min_level()
        text = captured.read().decode(errors="replace")
        sys.stderr.write("".join(
            line for line in text.splitlines(keepends=True) if not _is_chatter(line, level)))
        sys.stderr.flush()
    self._after()

  def _after(self):
    if self.quiet_tf_logger:
      _configure_tf_logger()
    absl = logging.getLogger("absl")  # made by `import tensorflow`, which imports absl
    if absl.level == logging.NOTSET:
      absl.setLevel(logging.ERROR)
      self.quieted_absl = True
