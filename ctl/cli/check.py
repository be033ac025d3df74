"""`ctl check`: report what in an experiment would fail on a TPU (ctl/tools/check.py checks).

    ctl check dcgan --steps 3      # a shipped config, by name; a table; exit 1 if anything fails
    ctl check my.gin --steps 3     # any .gin file, by path
"""

import argparse
import textwrap
from typing import Any

from ctl.cli import jobs

_DESCRIPTION = """\
Builds the experiment's runner (its build method, strategy 'default') and reports, on
this CPU, what would fail on a TPU: the step is compiled with XLA as a TPU
compiles it, taking the batch as an argument, and run on K real batches.

checks:
  static input shapes     every dimension of the data is known (drop_remainder=True)
  XLA compiles the step   no op XLA cannot compile (the error quotes the op)
  no retracing            one trace for all K batches
  static shapes in step   no op whose output size depends on the data
                          (tf.boolean_mask, tf.where(cond), tf.unique)
  no host Python          no print, tf.py_function, tf.numpy_function or .numpy()
  draws from ctx          no draw whose numbers depend on the layout (tf.random.*)

With mixed_precision and no GPU or TPU, it also times the step against float32
on this CPU and says which is faster; and it says when this TensorFlow has no TPU
build (neither sets the exit code)."""


def add_parser(subparsers: Any) -> None:
  """Adds `check` to the `ctl` command's subparsers."""
  parser = subparsers.add_parser(
      "check", help="report what in an experiment would fail on a TPU",
      description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="example:\n  ctl check dcgan --gin "
             "'gan.Experiment.batch_size = 16' --steps 3\n\nExit code 0 if every check "
             "passes, 1 if one fails, 2 for a mistake in the command or config.")
  jobs.add_config_arguments(parser)
  parser.add_argument("--steps", type=int, default=3, metavar="K",
                      help="batches to compile and run the step on (default 3)")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  """`ctl check`: builds the experiment's runner (its build method) and checks it."""
  from ctl.tools import experiments as experiments_lib  # pylint: disable=import-outside-toplevel
  try:
    if args.steps < 1:
      raise experiments_lib.ConfigError(f"--steps {args.steps}: give at least 1.")
    name, make = jobs.load_experiment(args)
    experiment = experiments_lib.make_experiment(make, name, needs=("build",))
    runner = experiment.build(strategy="default")
  except experiments_lib.ConfigError as e:
    return jobs.fail("check", e, jobs.USAGE_ERROR)
  except (TypeError, ValueError) as e:
    return jobs.fail_on_binding("check", e, args)
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import ctl  # pylint: disable=import-outside-toplevel
  from ctl.tools import check  # pylint: disable=import-outside-toplevel
  findings = check.check_step(runner.compiled_step, num_batches=args.steps)
  print(check.format_findings(findings))
  precision = runner.mixed_precision
  if precision in ctl.MIXED_PRECISIONS and not any(
      tf.config.list_logical_devices(kind) for kind in ("GPU", "TPU")):
    # This CPU's speed, not a TPU hazard: said, never failed on.
    try:
      speed = check.precision_speed(precision, {
          precision: runner.with_options().train,
          "float32": runner.with_options(mixed_precision=None).train}, num_steps=args.steps)
      said = speed.message
    except (ValueError, tf.errors.OutOfRangeError) as e:  # data too short to time on
      said = f"not timed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    print("\n" + textwrap.fill(f"{check.PRECISION}: {said}", 100))
  from ctl.distribute import strategies  # pylint: disable=import-outside-toplevel
  if note := strategies.tpu_version_note():
    print("\n" + textwrap.fill(f"tpu strategy: {note}", 100))
  steps = f"{args.steps} step" + ("s" if args.steps != 1 else "")
  jobs.warn_unused_bindings("check", f"building the runner and {steps}",
                            " here (a binding used only by evaluation or export is "
                            "used later, by ctl train)")
  return 0 if all(f.ok for f in findings) else jobs.FAILURE
