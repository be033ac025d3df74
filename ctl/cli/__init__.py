"""The `ctl` command: train, evaluate, export, check and launch runs from .gin files.

    ctl train dcgan --strategy mirrored             # a config the GAN kit ships, by name
    ctl eval examples/configs/dcgan.gin --workdir runs/dcgan   # or any .gin file, by path
    ctl check dcgan                                 # what would fail on a TPU
    ctl sweep dcgan --grid "gan.Experiment.batch_size=[32, 64]" --seeds 3   # mean ± std
    ctl parity my_gan.py --against mirrored:2       # same numbers, up to rounding?
    ctl launch --workers 2 -- ctl train cfg.gin --strategy multi_worker --workdir runs/x

    from ctl import cli                             # the same from Python
    code = cli.main(["eval", "dcgan", "--workdir", "runs/dcgan"])

Each module here adds subcommands with `add_parser(subparsers)`, setting
`run=function(args) -> exit code`, and imports the library inside `run`, so
`--help` imports no TensorFlow (`ray_train` is no subcommand: it runs `ctl train` on
a Ray cluster's workers). While a command runs, the "ctl" logger's INFO
lines go to stderr as `ctl: ...`, and TensorFlow's own log lines are hidden
unless `--verbose` or CTL_VERBOSE=1 (`ctl.cli.quiet`).
"""

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

from ctl.cli import check
from ctl.cli import jobs
from ctl.cli import launch
from ctl.cli import parity
from ctl.cli import quiet
from ctl.cli import records
from ctl.cli import sweep

# The modules that add subcommands, in the order `ctl --help` lists them.
_SUBCOMMANDS = (jobs, sweep, check, parity, launch, records)
_VERBOSE_HELP = (f"show TensorFlow's own log lines too (hidden by default), also in the "
                 f"processes ctl starts; the same as {quiet.VERBOSE_VARIABLE}=1")


def make_parser() -> argparse.ArgumentParser:
  """The `ctl` command's parser, with every subcommand."""
  parser = argparse.ArgumentParser(
      prog="ctl", description="Custom training loops over several models: run an "
      "experiment described by a .gin file on any tf.distribute strategy.")
  parser.add_argument("--verbose", action="store_true", help=_VERBOSE_HELP)
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for module in _SUBCOMMANDS:
    module.add_parser(subparsers)
  for subparser in subparsers.choices.values():  # `ctl train ... --verbose` too
    subparser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                           help=_VERBOSE_HELP)
  return parser


def main(argv: list[str] | None = None) -> int:
  """Runs `ctl ARGV...` (default: the process's arguments); returns the exit code."""
  args = make_parser().parse_args(argv)
  with quiet.unless_verbose(args.verbose), log_to_stderr():
    return args.run(args)


class _StderrHandler(logging.Handler):
  """Writes to the current `sys.stderr` through `tqdm.write`, above a progress bar."""

  def emit(self, record: logging.LogRecord) -> None:
    try:
      from tqdm import tqdm  # pylint: disable=import-outside-toplevel
      tqdm.write(self.format(record), file=sys.stderr)
      sys.stderr.flush()
    except Exception:  # pylint: disable=broad-except
      self.handleError(record)


@contextlib.contextmanager
def log_to_stderr() -> Iterator[None]:
  """Shows the "ctl" logger's INFO lines on stderr as `ctl: message` meanwhile; puts
  the logger back as it was afterwards."""
  logger = logging.getLogger("ctl")
  if any(isinstance(h, _StderrHandler) for h in logger.handlers):
    yield  # a command run from inside a command
    return
  handler = _StderrHandler()
  handler.setFormatter(logging.Formatter("ctl: %(message)s"))
  level, propagate = logger.level, logger.propagate
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False  # shown once, even if the application has a root handler
  try:
    yield
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate
