"""`ctl parity`: the user's own step under several configurations, against rounding.

    ctl parity my_gan.py --against compiled,mirrored:2,multi_worker:2 --steps 10
    ctl parity dcgan --gin 'gan.Experiment.batch_size = 16'   # a shipped config, by name
"""

import argparse
import importlib.util
import os
import signal
import sys
from typing import Any

from ctl.cli import experiments
from ctl.constants import INTERRUPTED_EXIT_CODE


class _Terminated(Exception):
  """A SIGTERM, raised where `ctl parity` waits for its runs."""


def _raise_terminated(signum: int, frame: Any) -> None:
  raise _Terminated()

_DESCRIPTION = """\
Trains the step of MODULE (a Python file defining build(), step(ctx, batch) and
data(), and optionally batches_per_step and seed; or a .gin file, whose
experiment's runner is used, with --gin bindings as for ctl train) for K steps eagerly under the
default strategy (the reference), again with every initial weight moved by one
unit in the last place (the rounding floor), and under each configuration of
--against, each in a process of its own. Reports per configuration the variable
furthest from the reference, relative to its size, against the floor, with a
verdict; for a configuration past rounding, the variables and the likely cause.

configurations (join with + to combine, e.g. mirrored:2+steps_per_loop:5):
  compiled            tf.function, default strategy
  jit                 XLA (jit_compile=True)
  steps_per_loop:N    N steps per compiled call
  one_device          OneDeviceStrategy
  mirrored:N          MirroredStrategy on N logical CPUs
  central_storage:N   CentralStorageStrategy on N logical CPUs
  multi_worker:N      N local worker processes through ctl launch
  eager               the reference's own mode (e.g. mirrored:2+eager)"""


def add_parser(subparsers: Any) -> None:
  """Adds `parity` to the `ctl` command's subparsers."""
  parser = subparsers.add_parser(
      "parity", help="check that a step gives the same numbers under other strategies",
      description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="example:\n  ctl parity my_gan.py --against compiled,mirrored:2 --steps 10"
             "\n\nExit code 0 if every configuration is within rounding, 1 if one is not "
             "or fails, 2 for a mistake in the command or the module.")
  parser.add_argument("module", help="a Python file defining build, step and data, or "
                      "a .gin file or the name of a config a package ships (its "
                      "experiment's build method makes the runner)")
  parser.add_argument("--gin", action="append", default=[], metavar="BINDING",
                      help="a gin binding for a .gin file, e.g. 'gan.Experiment.batch_size "
                           "= 16' (repeatable)")
  parser.add_argument("--experiment", metavar="NAME",
                      help="for a .gin file: what makes the experiment (default: the "
                           "installed one), as for ctl train")
  parser.add_argument("--against", default="compiled,steps_per_loop:5,mirrored:2",
                      help="configurations, comma-separated (default "
                           "compiled,steps_per_loop:5,mirrored:2)")
  parser.add_argument("--steps", type=int, default=10, metavar="K",
                      help="steps each run trains (default 10)")
  # What each run's process is given (ctl.parity.check starts them).
  parser.add_argument("--run-one", metavar="CONFIG", help=argparse.SUPPRESS)
  parser.add_argument("--perturbed", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--out", help=argparse.SUPPRESS)
  parser.set_defaults(run=run)


def shipped_config(module: str) -> str:
  """The path of the config a package ships named `module` (e.g. dcgan), or `module`
  as given if it is a file, an importable module or no shipped config's name."""
  from ctl import configs  # pylint: disable=import-outside-toplevel
  if not configs.is_name(module) or os.path.exists(module):
    return module
  try:
    if importlib.util.find_spec(module) is not None:
      return module
  except (ImportError, ValueError):  # e.g. a dotted name whose package is missing
    pass
  return configs.shipped().get(module, module)


def run(args: argparse.Namespace) -> int:
  """`ctl parity`: runs and compares (or, with --run-one, is one of the runs)."""
  from ctl import parity  # pylint: disable=import-outside-toplevel
  try:
    if args.steps < 1:
      raise ValueError(f"--steps {args.steps}: give at least 1.")
    configs = [c for c in args.against.split(",") if c.strip()]
    if not configs:
      raise ValueError("--against: name at least one configuration, e.g. mirrored:2.")
    for config in configs:  # each name checked before any process starts
      parity.Config.parse(config)
    if not args.run_one:
      args.module = shipped_config(args.module)  # each run's process is given the path
      parity.check_module(args.module)  # before any process starts
  except (ValueError, FileNotFoundError, AttributeError) as e:
    return experiments.fail("parity", e, experiments.USAGE_ERROR)
  if args.run_one:
    parity.run_one(args.module, parity.Config.parse(args.run_one), args.steps, args.out,
                   perturbed=args.perturbed, bindings=args.gin, experiment=args.experiment)
    return 0
  # A SIGTERM (or `timeout`) becomes an exception, so that the runs in flight
  # are stopped and the temporary files removed, as for Ctrl-C.
  signal.signal(signal.SIGTERM, _raise_terminated)
  try:
    report = parity.check(args.module, configs, steps=args.steps,
                          bindings=args.gin, experiment=args.experiment)
  except RuntimeError as e:
    return experiments.fail("parity", e, experiments.FAILURE)
  except KeyboardInterrupt:
    print("ctl parity: interrupted; the runs in progress were stopped.", file=sys.stderr)
    return INTERRUPTED_EXIT_CODE
  except _Terminated:
    print("ctl parity: SIGTERM; the runs in progress were stopped.", file=sys.stderr)
    return 128 + signal.SIGTERM
  print(report, flush=True)
  return 0 if report.ok else experiments.FAILURE
