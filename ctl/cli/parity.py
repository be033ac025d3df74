"""`ctl parity`: the user's own step under several configurations, against rounding.

    ctl parity my_gan.py --against compiled,mirrored:2,multi_worker:2 --steps 10
    ctl parity dcgan --gin 'gan.Experiment.batch_size = 16'   # a shipped config, by name
"""

import argparse
import importlib.util
import os
from typing import Any

from ctl.cli import jobs

_DESCRIPTION = """\
Trains the step of MODULE (a Python file defining build(), train_step(ctx, batch) and
data(), and optionally batches_per_step and seed; or a .gin file, whose
experiment's runner is used, with --gin bindings as for ctl train) for K steps
eagerly under the default strategy (the reference) and under each configuration
of --against, in processes of their own, and compares every model and optimizer
variable, the step counter and every logged value. Every run is replayed in
float64, which decides: there a correct configuration agrees to about 1e-15
while a bug keeps its size. The rounding floor is the reference again with every
initial weight moved by one ulp (docs/parity.md). Reports per configuration its
verdict, its largest difference with its tolerance and, past rounding, the
variables and the likely cause (--verbose: every variable).

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
             "\n\nExit code 0 if every configuration is within rounding; 1 if one is not, "
             "or a run fails (its error is in the table: a step that raises, a batch "
             "that does not split over the replicas); 2 for a mistake in the command "
             "or a module without build, train_step or data; 3 if none differs but one "
             "is undecided (a reference not deterministic on its own, or float32 "
             "alone, where float64 could not run, unable to tell a bug from "
             "amplified rounding).")
  parser.add_argument("module", help="a Python file defining build, train_step and data, or "
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
  parser.add_argument("--seeds", metavar="SEEDS",
                      help="check each configuration with these run seeds, e.g. 0,1,2 "
                           "or 0-4 (default: the module's seed, or the experiment's)")
  parser.add_argument("--no-float64", dest="float64", action="store_false",
                      help="judge in float32 alone (no float64 replays: about half the "
                           "runs, and a verdict that training's amplified rounding can "
                           "sway)")
  parser.add_argument("--floor-samples", type=int, default=3, metavar="N",
                      help="float32 floor runs where float32 decides (default 3)")
  parser.add_argument("--jobs", type=int, metavar="N",
                      help="processes at once (default: the CPUs this process may use, at most 4)")
  # What each run's process is given (ctl.tools.parity.check starts them).
  parser.add_argument("--run-one", metavar="CONFIG", help=argparse.SUPPRESS)
  parser.add_argument("--role", default="config", help=argparse.SUPPRESS)
  parser.add_argument("--out", help=argparse.SUPPRESS)
  parser.set_defaults(run=run)


def shipped_config(module: str) -> str:
  """The path of the config a package ships named `module` (e.g. dcgan), or `module`
  as given if it is a file, an importable module or no shipped config's name."""
  from ctl.tools import configs  # pylint: disable=import-outside-toplevel
  if not configs.is_name(module) or os.path.exists(module):
    return module
  try:
    if importlib.util.find_spec(module) is not None:
      return module
  except (ImportError, ValueError):  # e.g. a dotted name whose package is missing
    pass
  return configs.shipped().get(module, module)


MAX_SEEDS = 100
UNDECIDED = 3  # the exit code where float32 alone cannot tell (`Report.verdict`)


def parse_seeds(text: str) -> list[int]:
  """"0,1,2" or "0-4" (or a mix, "0-2,7") as a list of distinct ints."""
  seeds = []
  for part in text.split(","):
    low, dash, high = part.strip().partition("-")
    if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
      raise ValueError(f"--seeds {text}: give seeds as 0,1,2 or a range 0-4.")
    last = int(high) if dash else int(low)
    if len(seeds) + last - int(low) + 1 > MAX_SEEDS or last > 2**31 - 1:
      raise ValueError(f"--seeds {text}: give at most {MAX_SEEDS} seeds, each below 2**31 "
                       "(each seed trains every configuration once more).")
    seeds += range(int(low), last + 1)
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"--seeds {text}: a seed is given twice.")
  return seeds


def run(args: argparse.Namespace) -> int:
  """`ctl parity`: runs and compares (or, with --run-one, is one of the runs)."""
  from ctl.tools import parity  # pylint: disable=import-outside-toplevel
  try:
    for flag, value in [("--steps", args.steps), ("--floor-samples", args.floor_samples),
                        ("--jobs", args.jobs)]:
      if value is not None and value < 1:
        raise ValueError(f"{flag} {value}: give at least 1.")
    seeds = None if args.seeds is None else parse_seeds(args.seeds)
    configs = [c for c in args.against.split(",") if c.strip()]
    if not configs:
      raise ValueError("--against: name at least one configuration, e.g. mirrored:2.")
    for config in configs:  # each name checked before any process starts
      parity.Config.parse(config)
    if not args.run_one:
      args.module = shipped_config(args.module)  # each run's process is given the path
      parity.check_module(args.module)  # before any process starts
  except (ValueError, FileNotFoundError, AttributeError) as e:
    return jobs.fail("parity", e, jobs.USAGE_ERROR)
  if args.run_one:
    from ctl.tools import parity_runs  # pylint: disable=import-outside-toplevel
    parity_runs.run_one(args.module, parity.Config.parse(args.run_one), args.steps, args.out,
                        role=args.role, seeds=seeds, float64=args.float64,
                        floor_samples=args.floor_samples, bindings=args.gin,
                        experiment=args.experiment)
    return 0
  jobs.raise_on_termination()  # the runs in flight stopped, their files removed
  try:
    report = parity.check(args.module, configs, steps=args.steps, seeds=seeds,
                          bindings=args.gin, experiment=args.experiment, float64=args.float64,
                          floor_samples=args.floor_samples, jobs=args.jobs)
  except RuntimeError as e:
    return jobs.fail("parity", e, jobs.FAILURE)
  except (KeyboardInterrupt, jobs.Terminated) as e:
    return jobs.stopped("parity", e, "the runs in progress were stopped")
  print(report.format(verbose=args.verbose), flush=True)
  if report.ok:
    return 0
  return jobs.FAILURE if report.differs else UNDECIDED
