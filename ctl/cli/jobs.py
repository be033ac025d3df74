"""`ctl train`, `ctl eval` and `ctl export`: run an experiment described by a .gin file.

    ctl train dcgan --gin "gan.Schedule.total_steps = 100"   # a shipped config, by name
    ctl train my.gin --strategy mirrored --logical-cpus 2  # any .gin file, by path
    ctl eval dcgan                       # runs/dcgan: {"step": 100, "classifier_fid": 9.1, ...}
    ctl eval dcgan --across default,mirrored:2,multi_worker:2   # the same numbers?
    ctl export dcgan --out exported/

The configuration is a .gin file's path or the name of one an installed package
ships (ctl/tools/configs.py); the work directory is runs/<name> unless --workdir
says otherwise. Each subcommand makes the experiment once the .gin file is parsed
and calls one of its methods (ctl/tools/experiments.py defines the contract). A
mistake in the configuration exits with code 2 and one paragraph naming the
binding, not a traceback. gin and TensorFlow are imported when a subcommand runs.
"""

import argparse
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from ctl.base import arguments
from ctl.base import constants

USAGE_ERROR = constants.USAGE_ERROR_EXIT_CODE  # as argparse for a bad command line
FAILURE = 1

_TRAIN = """\
Makes the experiment a .gin file describes (a path, or the name of a config an
installed package ships, e.g. dcgan) and calls its train method. Checkpoints,
TensorBoard events, sample grids and the export go to the work directory
(default runs/<name>); the operative gin config is saved next to the
checkpoints. Rerunning the same command resumes from the newest checkpoint (and
does nothing if the run is complete)."""

_EVAL = """\
Makes the experiment and calls its evaluate method: it restores the newest
checkpoint in <workdir>/checkpoints and evaluates it once under --strategy,
every replica and worker taking part (the GAN kit's: classifier FID, KID,
scores, precision/recall/density/coverage of the generator or its EMA copy,
each with its N; label accuracy for a conditional GAN, encoder metrics for a
BiGAN). Prints the metrics as one JSON object on stdout, e.g. {"step": 25000,
"classifier_fid": 5.19, ...}. Logs go to stderr. With --across, evaluates under
each layout in a process of its own and prints, for every number, each layout's
value and its relative difference from the first layout's, a line each
(evaluation parity)."""

_EXPORT = """\
Makes the experiment and calls its export method: it restores the newest
checkpoint in <workdir>/checkpoints and exports the experiment's model (the GAN
kit's: the generator, or its EMA copy), e.g. as <name>.keras and a SavedModel
<name>/, in <workdir>/export or --out; prints the paths. Neither needs ctl to
load: keras.saving.load_model(path) or tf.saved_model.load(path).serve(z)."""


def add_parser(subparsers: Any) -> None:
  """Adds `train`, `eval` and `export` to the `ctl` command's subparsers."""
  for name, run, summary, description, example in (
      ("train", run_train, "train an experiment from a .gin file (resumes)", _TRAIN,
       "ctl train dcgan --gin 'gan.Schedule.total_steps = 100'\n"
       "  ctl train my.gin --strategy mirrored --logical-cpus 2"),
      ("eval", run_eval, "evaluate the newest checkpoint; print JSON metrics", _EVAL,
       "ctl eval dcgan --workdir runs/dcgan"),
      ("export", run_export, "export the model of the newest checkpoint", _EXPORT,
       "ctl export dcgan --workdir runs/dcgan --out exported/dcgan"),
  ):
    parser = subparsers.add_parser(
        name, help=summary, description=description, epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    add_run_arguments(parser, logger=name == "train")
    parser.add_argument("--workdir", metavar="DIR",
                        help="the run's directory (default: runs/<config name or "
                        "file stem>; a leading ~ is your home, also in --workdir=~/x)")
    if name == "train":
      parser.add_argument("--profile", type=profile_steps, metavar="START:STEPS",
                          help="capture a TensorFlow profiler trace of STEPS steps from "
                          "step START (e.g. 100:5) into <workdir>/events/train, for "
                          "TensorBoard's Profile tab")
      parser.add_argument("--resume-from", type=int, metavar="STEP",
                          help="go back: resume from the checkpoint of step STEP although "
                          "newer ones exist; they are moved, with the run's records as "
                          "they were, into <workdir>/checkpoints/after-ckpt-STEP/ (once: "
                          "rerun with it, the run resumes from its newest again)")
      parser.add_argument("--restart-data", action="store_true",
                          help="on resume, restore the models and optimizers but start "
                          "the data from its beginning: needed to resume with another "
                          "global batch size (ctl.Checkpoint(restore_data=False))")
      parser.add_argument("--dry-run", action="store_true",
                          help="run each part once, tiny (one step, a checkpoint save "
                          "and restore, every action, evaluations over a handful of "
                          "samples), write nothing that stays, and report the time each "
                          "took")
    if name == "export":
      parser.add_argument("--out", metavar="DIR",
                          help="where to export (default: <workdir>/export)")
    if name == "eval":
      parser.add_argument("--across", metavar="LAYOUTS",
                          help="evaluate under each of these layouts in a process of its "
                          "own and compare every number (evaluation parity), e.g. "
                          "default,mirrored:2,mirrored:4,multi_worker:2; prints each "
                          "layout's value of every number and its difference from the "
                          "first's; exit 1 if one differs by more than rounding")
    if name in ("eval", "export"):
      parser.add_argument("--checkpoint", default="newest", metavar="WHICH",
                          help="newest (the default); best: the best that "
                          "ctl.BestCheckpoints kept (gan.Schedule.keep_best); or a "
                          "step, e.g. 2000: the checkpoint saved at that step "
                          "(checkpoints/ckpt-2000), if it is still kept")
    parser.set_defaults(run=run)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
  """The options every experiment subcommand shares: the .gin file and bindings."""
  from ctl.tools import configs  # pylint: disable=import-outside-toplevel
  shipped = ", ".join(configs.shipped()) or "none installed"
  parser.add_argument("config", metavar="CONFIG.gin", help="the experiment's .gin file, "
                      f"or the name of a config a package ships ({shipped})")
  parser.add_argument("--gin", action="append", default=[], metavar="BINDING",
                      help="an extra binding, e.g. 'gan.Schedule.total_steps = 100' "
                      "(repeatable; applied after the file)")
  parser.add_argument("--experiment", metavar="NAME",
                      help="the class or function that makes the experiment: its gin "
                      "name or module.path:attribute (default: the one an installed "
                      "package registers under the entry points ctl.experiments)")


def add_run_arguments(parser: argparse.ArgumentParser, logger: bool = True) -> None:
  """`--strategy`, `--logical-cpus` and (with `logger`) `--logger`, as `ctl train` takes them."""
  parser.add_argument("--strategy", metavar="NAME", help="a ctl.make_strategy name "
                      "(default, mirrored, multi_worker, tpu, auto, ...); overrides "
                      "the config's")
  parser.add_argument("--logical-cpus", type=int, metavar="N", help="split the CPU "
                      "into N devices first (e.g. for --strategy mirrored)")
  if logger:
    parser.add_argument("--logger", action="append", default=[], metavar="NAME",
                        choices=constants.LOGGER_NAMES,
                        help="also log the run to an experiment tracker: mlflow "
                        "(MLFLOW_TRACKING_URI, e.g. sqlite:///runs/mlflow.db) or "
                        "wandb (offline unless WANDB_MODE=online); repeatable")


def profile_steps(value: str) -> tuple[int, int]:
  """`--profile START:STEPS` as `(start, steps)`; argparse reports a bad form."""
  try:
    start, steps = (int(n) for n in value.split(":"))  # not two numbers: ValueError
  except ValueError:
    start = steps = 0
  if start < 1 or steps < 1:
    raise argparse.ArgumentTypeError(
        f"{value!r} is not START:STEPS with START >= 1 and STEPS >= 1; e.g. --profile "
        "100:5 traces steps 100 to 105")
  return start, steps


def run_train(args: argparse.Namespace) -> int:
  """`ctl train`: returns the exit code."""
  def report(runner, workdir):
    placement = getattr(runner, "placement", None)
    if placement is not None and not placement.is_chief:
      return  # another worker: the chief keeps (and reports) the outputs
    if args.dry_run:
      print(f"ctl train --dry-run: every part ran once; nothing was written to {workdir}")
    else:
      step = (f"step {int(runner.global_step.numpy())}, " if hasattr(runner, "global_step")
              else "")
      print(f"ctl train: {step}outputs in {workdir}:")
      for name in ("checkpoints", "events", "samples", "export"):
        if os.path.exists(os.path.join(workdir, name)):
          print(f"  {os.path.join(workdir, name)}")
    # A dry run calls every part once, so it lists what the real run would.
    if getattr(getattr(runner, "compiled_step", None), "ran", False):  # it trained
      warn_unused_bindings("train", "this dry run" if args.dry_run else "this run")
  # Each passed only when given: an experiment may lack the option.
  kwargs = {"profile": args.profile} if args.profile else {}
  if args.dry_run:
    kwargs["dry_run"] = True
  if args.resume_from is not None:
    kwargs["resume_from"] = args.resume_from
  if args.restart_data:
    kwargs["restore_data"] = False
  if args.logger:
    from ctl.loop import loggers  # pylint: disable=import-outside-toplevel
    try:
      kwargs["loggers"] = [loggers.by_name(name) for name in dict.fromkeys(args.logger)]
    except ImportError as e:
      return fail(args.command, e, USAGE_ERROR)
  return _run(args, "train", report, **kwargs)


def run_eval(args: argparse.Namespace) -> int:
  """`ctl eval`: returns the exit code."""
  if args.across is not None:
    return _eval_across(args)
  def report(metrics, workdir):
    del workdir
    print(json.dumps(metrics, default=float))
  return _run(args, "evaluate", report, **_checkpoint(args))


def run_export(args: argparse.Namespace) -> int:
  """`ctl export`: returns the exit code."""
  def report(paths, workdir):
    del workdir
    for path in ([paths] if isinstance(paths, str) else paths):
      print(path)
  return _run(args, "export", report, directory=args.out, **_checkpoint(args))


def _eval_across(args):
  """`ctl eval --across LAYOUTS`: the same evaluation per layout, compared."""
  from ctl.tools import eval_parity  # pylint: disable=import-outside-toplevel
  if args.strategy or args.logical_cpus:
    return fail(args.command, "--across chooses each layout's strategy and devices; "
                "drop --strategy and --logical-cpus.", USAGE_ERROR)
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  try:
    layouts = eval_parity.parse_layouts(args.across)
    workdir = run_workdir(args)
  except (ValueError, experiments.ConfigError) as e:
    return fail(args.command, e, USAGE_ERROR)
  eval_args = [args.config, "--workdir", workdir, "--checkpoint", args.checkpoint,
               *(arg for binding in args.gin for arg in ("--gin", binding))]
  if args.experiment:
    eval_args += ["--experiment", args.experiment]
  raise_on_termination()  # stops the layout's processes, as Ctrl-C does
  try:
    return eval_parity.run(layouts, eval_args)
  except (KeyboardInterrupt, Terminated) as e:
    return stopped("eval --across", e, "the evaluation in progress was stopped")


class Terminated(Exception):
  """SIGTERM or SIGHUP, raised by `raise_on_termination`'s handler."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def raise_on_termination() -> None:
  """From now on SIGTERM, and SIGHUP unless ignored (`nohup`), raise `Terminated`, so
  that the command stops the processes it started, as at Ctrl-C. After SIGHUP, a
  lost terminal's stdout and stderr write to /dev/null (a write to it would fail)."""
  terminals = [fd for fd in (1, 2) if is_terminal(fd)]

  def terminated(signum, frame):
    del frame
    if signum == signal.SIGHUP:
      detach(terminals)
    raise Terminated(signum)

  signal.signal(signal.SIGTERM, terminated)
  if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
    signal.signal(signal.SIGHUP, terminated)


def stopped(command: str, stop: BaseException, what: str) -> int:
  """Says that Ctrl-C or `Terminated` stopped `command` (and `what` was done); the
  exit code, 130 or 128 + the signal. Further signals are ignored, to keep that code."""
  _ignore_signals()
  name = str(stop) if isinstance(stop, Terminated) else "interrupted"
  print(f"ctl {command}: {name}; {what}.", file=sys.stderr)
  return 128 + stop.signum if isinstance(stop, Terminated) else constants.INTERRUPTED_EXIT_CODE


def _ignore_signals():
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)


def is_terminal(fd: int) -> bool:
  """Whether `fd` is a terminal (read before a SIGHUP: after it, it may fail to say)."""
  try:
    return os.isatty(fd)
  except OSError:
    return False


def detach(fds: list[int]) -> None:
  """`fds` (a lost terminal's) write to /dev/null from now on."""
  null = os.open(os.devnull, os.O_WRONLY)
  try:
    for fd in fds:
      os.dup2(null, fd)
  finally:
    os.close(null)


def _checkpoint(args):
  """`--checkpoint` as a keyword, only if not the default (a method may not take it)."""
  return {"checkpoint": args.checkpoint} if args.checkpoint != "newest" else {}


def _run(args, method, report, **kwargs):
  """Makes the experiment, calls `method` on it and reports; returns the exit code."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  try:
    name, make = load_experiment(args)
    workdir = run_workdir(args)
  except experiments.ConfigError as e:
    return fail(args.command, e, USAGE_ERROR)
  from ctl.loop import checkpoints  # pylint: disable=import-outside-toplevel
  from ctl.loop import loggers  # pylint: disable=import-outside-toplevel
  from ctl.loop import stopping  # pylint: disable=import-outside-toplevel
  from ctl.loop import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  try:
    experiment = experiments.make_experiment(make, name, needs=(method,))
    _check_takes(experiment, method, kwargs)
    result = getattr(experiment, method)(workdir, strategy=args.strategy or "default",
                                         **kwargs)
  except (experiments.ConfigError, arguments.VariableError, arguments.LayoutError) as e:
    return fail(args.command, e, USAGE_ERROR)
  except (OSError, workdir_lib.WorkdirInUse, checkpoints.CheckpointError,
          loggers.TrackerError) as e:  # e.g. no checkpoint yet, or another run's
    return fail(args.command, e, FAILURE)
  except stopping.Interrupted as e:
    _ignore_signals()  # the code stays 130
    print(f"ctl {args.command}: {e}", file=sys.stderr)
    if args.command == "train":  # raised after a compiled call: the step was traced
      warn_unused_bindings("train", "this run", " up to the Ctrl-C")
    return stopping.INTERRUPTED_EXIT_CODE
  except KeyboardInterrupt:  # Ctrl-C outside a fit: eval and export write nothing partial
    print(f"ctl {args.command}: interrupted; nothing was written.", file=sys.stderr)
    return stopping.INTERRUPTED_EXIT_CODE
  except (TypeError, ValueError) as e:
    return fail_on_binding(args.command, e, args)
  report(result, workdir)
  return 0


# The options passed to an experiment's method only when given: the flag of each.
_FLAGS = {"checkpoint": "--checkpoint", "profile": "--profile", "dry_run": "--dry-run",
          "loggers": "--logger", "resume_from": "--resume-from",
          "restore_data": "--restart-data"}


def _check_takes(experiment, method, kwargs):
  """Raises ConfigError naming the flag if `experiment.<method>` cannot take a kwarg."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  parameters = inspect.signature(getattr(experiment, method)).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
    return
  for name in kwargs:
    if name not in parameters and name in _FLAGS:
      what = ("so it evaluates only the newest" if name == "checkpoint"
              else "so this experiment does not support it")
      raise experiments.ConfigError(
          f"{_FLAGS[name]}: {type(experiment).__name__}.{method} takes no {name} "
          f"argument, {what}; drop {_FLAGS[name]}, or add a {name} parameter to "
          f"{method} and pass it to runner.fit.")


def warn_unused_bindings(command: str, what: str, later: str = "") -> None:
  """Prints to stderr the gin bindings nothing has used (`experiments.unused_bindings`)."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  unused = experiments.unused_bindings()
  if not unused:
    return
  listed = "\n".join(f"  {binding}" for binding in unused)
  print(f"ctl {command}: warning: {what} used none of these gin bindings, so they changed "
        f"nothing{later}:\n{listed}\ngin checks a binding's function and parameter, not "
        "its scope, nor whether the run calls the function: check the scope's spelling, "
        "that the config calls the function through gin (a penalty's weight with no "
        "penalty set is unused, and so is a rate on a default optimizer, which passes "
        "its own: bind the optimizer by reference first, e.g. "
        "gan.Experiment.generator_optimizer = @generator/keras.optimizers.Adam), and "
        "that its caller does not pass that argument itself.", file=sys.stderr)


def fail_on_binding(command: str, error: Exception, args: argparse.Namespace) -> int:
  """Exit code 2 naming the gin binding whose value `error` refused, else re-raises."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  binding = experiments.binding_of(error, [args.config], args.gin)
  if binding is None:
    raise error
  return fail(command, f"{experiments.first_line(error)} That value comes from "
              f"{binding}; fix the binding.", USAGE_ERROR)


def fail(command: str, error: BaseException | str, code: int) -> int:
  """Prints `error` as `ctl <command>: error: ...` on stderr; returns `code`."""
  print(f"ctl {command}: error: {error}", file=sys.stderr)
  return code


def run_workdir(args: argparse.Namespace) -> str:
  """`--workdir` with a leading `~` expanded (the shell leaves `--workdir=~/x` as it
  is), or `default_workdir`; ConfigError if it is empty."""
  from ctl.loop import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  if args.workdir is None:
    return default_workdir(args.config)
  if not args.workdir.strip():
    raise experiments.ConfigError(
        f"--workdir {args.workdir!r} is an empty path; give the run's directory, or drop "
        f"--workdir for {default_workdir(args.config)}.")
  return workdir_lib.path(args.workdir)


def default_workdir(config: str) -> str:
  """`runs/<config file stem>` (a shipped config's name): where a run goes without --workdir."""
  return os.path.join("runs", os.path.splitext(os.path.basename(config))[0])


def load_experiment(args: argparse.Namespace) -> tuple[str, Callable[[], Any]]:
  """Applies --logical-cpus, finds the experiment (`args.config` becomes the .gin
  file's path), parses the gin file and bindings; `(name, make)` for
  `experiments.make_experiment`. Raises ConfigError naming the bad argument."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  args.config = experiments.find_config(args.config)  # before TensorFlow: a typo fails at once
  check_devices(args)
  if getattr(args, "logical_cpus", None) is not None:
    from ctl.distribute import strategies  # pylint: disable=import-outside-toplevel
    strategies.configure_logical_cpus(args.logical_cpus)  # before any TF op
  return experiments.load(args.config, args.gin, args.experiment)


def check_devices(args: argparse.Namespace) -> None:
  """Raises ConfigError for a `--logical-cpus` below 1 or an unknown `--strategy`."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  cpus, strategy = getattr(args, "logical_cpus", None), getattr(args, "strategy", None)
  if cpus is not None and cpus < 1:
    raise experiments.ConfigError(f"--logical-cpus {cpus}: give a positive count.")
  if not strategy:
    return
  from ctl.distribute import strategies  # pylint: disable=import-outside-toplevel
  if strategy not in strategies.STRATEGY_NAMES:
    raise experiments.ConfigError(
        f"--strategy {strategy!r} is not a strategy name"
        f"{experiments.did_you_mean(strategy, strategies.STRATEGY_NAMES)}; use one of "
        f"{', '.join(strategies.STRATEGY_NAMES)}.")
