"""`ctl sweep`: train every combination of some bindings' values with several seeds; tabulate.

    ctl sweep dcgan --grid "gan.dcgan_generator.width=[32, 64]" --seeds 3 \\
        --gin "STEPS = 2500"                          # 6 runs, one after another
    ctl sweep dcgan --grid ... --seeds 3 --gin ...    # again: skips what finished
    ctl sweep dcgan --grid ... --seeds 3 --job-list   # the 6 `ctl train` commands
    ctl sweep dcgan --grid ... --seeds 3 --slurm-array sweep.sbatch   # a Slurm array
    ctl sweep dcgan --grid ... --seeds 3 --table-only # the table of what finished

Each run is `ctl train` in a process of its own (ctl/tools/sweep.py plans
them): TensorFlow fixes its devices and strategy once per process, a run that
crashes or leaks memory takes no other with it, and it is what a cluster's job
list runs. The table: ctl/tools/sweep_table.py; the rest: `_DESCRIPTION` below.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from ctl.base import constants
from ctl.cli import jobs
from ctl.cli import parity

_DESCRIPTION = """\
Trains CONFIG (as ctl train: a .gin file or a shipped config's name) once for
every combination of the --grid bindings' values and every seed, one run after
another, each in <sweep dir>/<combination>/seed-<k> with its output in
train.log; then writes each combination's final and best metrics (from the
runs' metrics.jsonl and history.jsonl), mean ± std over the seeds, to
results.md and results.csv, and TensorBoard HParams data (tensorboard --logdir
<sweep dir>). Rerunning the same command skips the finished runs and resumes
the others. Ctrl-C stops the run in progress after it saved, then the sweep. A
run that fails is reported, with the end of its log, and the sweep goes on.

On a cluster: --job-list prints one ctl train command per run, --slurm-array
FILE writes a Slurm array script whose task i runs this command with
--only-index i; once they have ended, --table-only writes the table."""


def add_parser(subparsers: Any) -> None:
  """Adds `sweep` to the `ctl` command's subparsers."""
  parser = subparsers.add_parser(
      "sweep", help="train every combination of bindings' values with several seeds; "
      "tabulate mean ± std", description=_DESCRIPTION,
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="example:\n  ctl sweep dcgan --grid 'gan.dcgan_generator.width=[32, 64]' "
             "--grid 'gan.penalties.r1_penalty.weight=[0.5, 1.0]' --seeds 3 "
             "--gin 'STEPS = 2500'\n\nexit code: 0 when every run finished; 1 when one "
             "failed; 2 for a mistake in the command or config; 130 after Ctrl-C and 42 "
             "after SIGTERM (the run in progress saved: rerun to resume).")
  jobs.add_config_arguments(parser)
  parser.add_argument("--grid", action="append", default=[], metavar="BINDING=[V1, V2]",
                      help="a binding and the values to sweep, in gin's syntax, e.g. "
                      "'gan.Experiment.batch_size=[16, 32]' (repeatable: every "
                      "combination of the grids' values is trained)")
  parser.add_argument("--seeds", default="1", metavar="SEEDS",
                      help="how many seeds (N: 0 to N-1), or which: 0,1,2 or 0-4 "
                      "(default: 1, seed 0)")
  parser.add_argument("--seed-binding", metavar="PARAMETER",
                      help="the gin parameter that seeds a run (default: the "
                      "experiment's seed, e.g. gan.Experiment.seed)")
  parser.add_argument("--sweep-dir", metavar="DIR", help="where the runs, the table and "
                      "sweep.json go (default: runs/sweeps/<config name or file stem>)")
  jobs.add_run_arguments(parser)  # each run's
  parser.add_argument("--best-mode", action="append", default=[], metavar="METRIC=MODE",
                      help="min or max: whether METRIC's best is its lowest or highest "
                      "value (default: from its name, e.g. min for fid, kid and *loss*, "
                      "max for *accuracy*, *score*, precision and recall; none for "
                      "other names)")
  parser.add_argument("--metrics", metavar="NAMES",
                      help="the metrics to tabulate, comma-separated, e.g. "
                      "classifier_fid,train/generator_loss (default: every metric the "
                      "runs report, and train/KEY for each training result)")
  parser.add_argument("--last-steps", type=int, metavar="N",
                      help="average each training result over a run's last N steps "
                      "(default: 100)")
  cluster = parser.add_mutually_exclusive_group()
  cluster.add_argument("--job-list", action="store_true",
                       help="print each run's ctl train command, one per line; train "
                       "nothing")
  cluster.add_argument("--slurm-array", metavar="FILE",
                       help="write a Slurm batch script of one array task per run; "
                       "train nothing")
  cluster.add_argument("--only-index", type=int, metavar="I",
                       help="train run I alone (0-based, in --job-list's order), unless it "
                       "finished; write no table (what a Slurm array task runs)")
  cluster.add_argument("--table-only", action="store_true",
                       help="train nothing; write the table of the runs that finished")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  """`ctl sweep`: returns the exit code."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  from ctl.tools import sweep  # pylint: disable=import-outside-toplevel
  try:
    axes, seeds, modes = _check_arguments(args)
    stem = os.path.splitext(os.path.basename(args.config))[0]
    directory = args.sweep_dir or os.path.join("runs", "sweeps", stem)
    seed_binding = _check_config(args, axes, seeds)
    runs = sweep.plan(axes, seeds, directory, seed_binding)
    if args.only_index is not None and not 0 <= args.only_index < len(runs):
      raise ValueError(f"--only-index {args.only_index}: this sweep has {len(runs)} runs; "
                       f"give 0 to {len(runs) - 1}.")
    sweep.write_record(directory, sweep.record(args.config, args.gin, seed_binding,
                                               args.experiment, runs))
  except (ValueError, experiments.ConfigError) as e:
    return jobs.fail("sweep", e, jobs.USAGE_ERROR)
  except KeyboardInterrupt:
    print("ctl sweep: interrupted; no run was started.", file=sys.stderr)
    return constants.INTERRUPTED_EXIT_CODE
  if args.job_list:
    for one in runs:
      print(shlex.join(["ctl", *_train_command(args, one)]))
    return 0
  if args.slurm_array:
    return _write_slurm_array(args, runs, directory)
  try:
    if args.table_only:
      return _write_table(args, axes, runs, directory, modes)
    code = _train_all(args, runs if args.only_index is None else [runs[args.only_index]])
    if args.only_index is not None or code in (constants.INTERRUPTED_EXIT_CODE,
                                               constants.PREEMPTED_EXIT_CODE):
      return code
    return _write_table(args, axes, runs, directory, modes) or code
  except KeyboardInterrupt:  # while no run was in progress (e.g. writing the table)
    _say("interrupted; rerun the same command to finish (finished runs are skipped).")
    return constants.INTERRUPTED_EXIT_CODE


def _check_arguments(args):
  """The grids, seeds and best modes; raises ValueError naming a bad argument."""
  from ctl.tools import sweep  # pylint: disable=import-outside-toplevel
  axes = [sweep.parse_grid(text) for text in args.grid]
  sweep.check_axes(axes)
  seeds = parse_seeds(args.seeds)
  modes = {}
  for text in args.best_mode:
    metric, _, mode = text.partition("=")
    if not metric.strip() or mode.strip() not in ("min", "max"):
      raise ValueError(f"--best-mode {text!r}: give METRIC=min or METRIC=max, e.g. "
                       "--best-mode reconstruction_ratio=min.")
    modes[metric.strip()] = mode.strip()
  if args.last_steps is not None and args.last_steps < 1:
    raise ValueError(f"--last-steps {args.last_steps}: give at least 1.")
  if args.seed_binding is not None and "=" in args.seed_binding:
    raise ValueError(f"--seed-binding {args.seed_binding!r}: give the parameter alone, "
                     "e.g. gan.Experiment.seed; each run's seed is its value.")
  return axes, seeds, modes


def parse_seeds(text: str) -> list[int]:
  """`--seeds`: N (seeds 0 to N-1), or a list or range as for `ctl parity`, 0,1,2 or 0-4."""
  if text.strip().isdigit():
    count = int(text)
    if not 1 <= count <= parity.MAX_SEEDS:
      raise ValueError(f"--seeds {text}: give a count from 1 to {parity.MAX_SEEDS} "
                       "(seeds 0 to N-1), or the seeds, e.g. 0,1,2 or 3-5.")
    return list(range(count))
  return parity.parse_seeds(text)


def _check_config(args, axes, seeds):
  """Checks the config and each grid value now, not in each run; the seed's binding."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  config = experiments.find_config(args.config)
  name = args.experiment or experiments.default_experiment()
  make = experiments.resolve_experiment(name)
  jobs.check_devices(args)
  seed_binding = args.seed_binding
  if seed_binding is None:
    gin_name = experiments.gin_name(make)
    if gin_name is None:
      raise experiments.ConfigError(
          f"the experiment {name} is not registered with gin, so ctl sweep cannot bind its "
          "seed; pass --seed-binding with the gin parameter that seeds a run.")
    seed_binding = f"{gin_name}.seed"
  _check_seed_unbound(args, axes, seed_binding)
  # The config, with the seed's binding, and with each grid value alone (an error
  # names its grid): (bindings, what goes before and after an error's message).
  macros = [axis for axis in axes if "." not in axis.binding]

  def firsts(but=None):
    """Each macro grid's first value but `but`'s: gin refuses a %W of `--gin` without one."""
    return [f"{a.binding} = {a.values[0]}" for a in macros if a is not but]
  checks = [(firsts(), "", ""),
            ([*firsts(), f"{seed_binding} = {seeds[0]}"], f"--seed-binding {seed_binding}: ",
             " Pass --seed-binding with the gin parameter that seeds a run of this experiment.")]
  checks += [([*firsts(but=axis), f"{axis.binding} = {value}"],
              f"--grid {axis.text!r}, value {value}: ", "")
             for axis in axes for value in axis.values]
  import gin  # pylint: disable=import-outside-toplevel
  try:
    for bindings, before, after in checks:
      try:
        experiments.parse_gin([config], [*args.gin, *bindings])
      except experiments.ConfigError as e:
        raise experiments.ConfigError(f"{before}{e}{after}") from None
    referenced = experiments.referenced_macros()
    for axis in macros:  # a macro no binding refers to: every run would be the same
      name = axis.binding.strip()
      if name not in referenced:
        raise experiments.ConfigError(
            f"--grid {axis.text!r}: {name} is a gin macro nothing in {args.config} or --gin "
            f"refers to (%{name}), so every run would train the same; check its name "
            "against the config's macros, or grid a parameter (e.g. gan.dcgan_generator.width).")
  finally:  # the runs parse it in their own processes: leave gin as it was found
    gin.clear_config()
  return seed_binding


def _check_seed_unbound(args, axes, seed_binding):
  """Raises ConfigError if a grid or --gin sets the seed, which --seeds' binding would override."""
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  bound = lambda binding: binding.replace(" ", "") == seed_binding  # noqa: E731
  for axis in axes:
    if bound(axis.binding):
      raise experiments.ConfigError(
          f"--grid {axis.text!r}: {seed_binding} is each run's seed, which --seeds sets "
          f"(it would override these values); pass --seeds "
          f"{','.join(v.strip() for v in axis.values)} instead.")
  for binding in args.gin:
    if bound(binding.partition("=")[0]):
      raise experiments.ConfigError(
          f"--gin {binding!r}: {seed_binding} is each run's seed, which --seeds sets (it "
          "would override this binding); drop it and pass --seeds, e.g. --seeds 3,4.")


def _options(args, *names):
  """`[--name, value, ...]` of the options `names` given in `args` (a list repeats it)."""
  command = []
  for name in names:
    value = getattr(args, name.replace("-", "_"))
    for one in value if isinstance(value, list) else [] if value is None else [value]:
      command += [f"--{name}", str(one)]
  return command


def _train_command(args, one):
  """`ctl train ...` of run `one` (without the program)."""
  from ctl.tools import sweep  # pylint: disable=import-outside-toplevel
  options = _options(args, "experiment", "strategy", "logical-cpus")
  options += [arg for name in dict.fromkeys(args.logger) for arg in ("--logger", name)]
  return sweep.train_command(args.config, args.gin, one, options)


def _sweep_command(args):
  """This sweep as a `ctl sweep` command, its cluster options aside."""
  return ["ctl", "sweep", args.config,
          *_options(args, "grid", "gin", "best-mode", "logger", "seeds", "seed-binding",
                    "sweep-dir", "experiment", "strategy", "logical-cpus", "metrics",
                    "last-steps")]


def _write_slurm_array(args, runs, directory):
  from ctl.tools import sweep  # pylint: disable=import-outside-toplevel
  command = _sweep_command(args)
  if args.sweep_dir is None:  # the tasks and the table must find the same directory
    command += ["--sweep-dir", directory]
  name = f"ctl-sweep-{os.path.basename(os.path.normpath(directory))}"
  script = sweep.slurm_array_script(command, len(runs), directory, name)
  try:
    with open(args.slurm_array, "w") as f:
      f.write(script)
  except OSError as e:
    return jobs.fail("sweep", f"--slurm-array {args.slurm_array}: {e}", jobs.FAILURE)
  print(f"ctl sweep: wrote {args.slurm_array}, a Slurm array of {len(runs)} tasks; submit "
        f"it with: sbatch {shlex.quote(args.slurm_array)}\nthen, when every task has "
        f"ended, the table: {shlex.join(command)} --table-only", file=sys.stderr)
  return 0


class _Forwarder:
  """While the sweep runs: SIGINT, SIGTERM and SIGHUP are passed on to the run in
  progress (in a session of its own, so that a Ctrl-C reaches it once) and
  remembered, so the sweep stops after it. An ignored SIGINT stays ignored."""

  def __init__(self):
    self.child = None
    self.received = None
    self._previous = {}
    self._forwarded = False  # to the child in progress

  def __enter__(self):
    self._terminals = [fd for fd in (1, 2) if jobs.is_terminal(fd)]
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
      previous = signal.getsignal(signum)
      if signum == signal.SIGINT and previous is signal.SIG_IGN:
        continue
      self._previous[signum] = previous
      signal.signal(signum, self._on_signal)
    return self

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)

  def run(self, command: list[str], log: Any) -> int:
    """Runs `command` in a session of its own, output to the file `log`; its exit code."""
    self._forwarded = False
    from ctl.distribute import launch  # pylint: disable=import-outside-toplevel
    # It stops (saved) if this process is killed: it cannot pass a SIGKILL on.
    self.child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, **launch.stopped_with_this_process()})
    if self.received and not self._forwarded:  # came while it started: it saves at once
      self.child.send_signal(self.received)
    try:
      return self.child.wait()
    finally:
      self.child = None

  def _on_signal(self, signum, frame):
    del frame
    if signum == signal.SIGHUP:  # the terminal is gone: a write to it would fail
      jobs.detach(self._terminals)
    self.received = self.received or signum
    if self.child is not None and self.child.poll() is None:
      self._forwarded = True
      self.child.send_signal(signum)


def _train_all(args, runs):
  """Trains each run of `runs` that has not finished, one after another; the exit code."""
  from ctl.tools import sweep  # pylint: disable=import-outside-toplevel
  failed, total = [], len(runs)
  with _Forwarder() as forwarder:
    for i, one in enumerate(runs, 1):
      label = (f"[{i}/{total}] {one.name}" if args.only_index is None
               else f"run {one.index}: {one.name}")
      if forwarder.received:
        break
      if sweep.finished(one.workdir):
        _say(f"{label}: skipped: finished")
        continue
      code, seconds = _train_one(args, one, label, forwarder)
      if forwarder.received:
        return _stopped(forwarder.received, one, code)
      if code == 0:
        _say(f"{label}: finished in {seconds:.0f} s")
      else:
        failed.append((one, code))
        _say(f"{label}: failed ({_exit(code)}) after {seconds:.0f} s; the end of "
             f"{one.log}:\n{_tail(one.log)}")
  if forwarder.received:
    return _stopped(forwarder.received, None, None)
  if failed:
    listed = "\n".join(f"  {one.name} ({_exit(code)}): {one.log}" for one, code in failed)
    _say(f"{len(failed)} of {total} runs failed:\n{listed}\nrerun the same command to "
         "retry them (the finished runs are skipped).")
    return failed[-1][1] if args.only_index is not None else jobs.FAILURE
  return 0


def _train_one(args, one, label, forwarder):
  """Runs `ctl train` of run `one` to its end, output to its log; (exit code, seconds)."""
  command = _train_command(args, one)
  resuming = os.path.exists(os.path.join(one.workdir, "checkpoints", "checkpoint"))
  os.makedirs(one.workdir, exist_ok=True)
  _say(f"{label}: {'resuming' if resuming else 'training'}; log: {one.log}")
  start = time.monotonic()
  with open(one.log, "a") as log:
    log.write(f"# ctl sweep, {time.strftime('%Y-%m-%d %H:%M:%S')}: "
              f"{shlex.join(['ctl', *command])}\n")
    log.flush()
    code = forwarder.run([sys.executable, "-m", "ctl.cli", *command], log)
  return code, time.monotonic() - start


def _stopped(signum, one, code):
  """The message and exit code of a sweep stopped by `signum` (during run `one`)."""
  what = "interrupted (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
  if one is None:
    _say(f"{what}; rerun the same command to train the rest.")
  else:
    saved = code in (constants.INTERRUPTED_EXIT_CODE, constants.PREEMPTED_EXIT_CODE)
    _say(f"{what}: {one.name} stopped ({_exit(code)}"
         f"{', saved' if saved else ''}); rerun the same command to resume it and "
         f"train the rest (log: {one.log}).")
  if signum == signal.SIGINT:
    return constants.INTERRUPTED_EXIT_CODE
  return constants.PREEMPTED_EXIT_CODE if code == constants.PREEMPTED_EXIT_CODE else 128 + signum


def _exit(code):
  """How a run's process ended: "exit code 1", or "killed by SIGKILL"."""
  if code < 0:
    try:
      return f"killed by {signal.Signals(-code).name}"
    except ValueError:
      return f"killed by signal {-code}"
  return f"exit code {code}"


def _tail(path, lines=15):
  try:
    with open(path, errors="replace") as f:
      return "".join(f"  {line}" for line in f.readlines()[-lines:]).rstrip()
  except OSError as e:
    return f"  ({e})"


def _write_table(args, axes, runs, directory, modes):
  """Writes results.md, results.csv and the HParams data; prints the table."""
  from ctl.tools import sweep_table  # pylint: disable=import-outside-toplevel
  metrics = None if args.metrics is None else [
      m.strip() for m in args.metrics.split(",") if m.strip()]
  table = sweep_table.summarize(runs, modes, args.last_steps or sweep_table.LAST_STEPS,
                                metrics)
  if not table.results and os.path.exists(os.path.join(directory, "results.md")):
    _say(f"no run of this sweep has finished in {directory}, so its results.md is left "
         "as it is; check --grid, --gin and --seeds against the command that trained "
         "it (sweep.json holds its grids).")
    return jobs.FAILURE
  reported = {m for result in table.results for m in result.final}
  missing = [m for m in metrics or () if m not in reported]
  if missing and table.results:
    _say(f"warning: --metrics {','.join(missing)}: no finished run reported "
         f"{'it' if len(missing) == 1 else 'them'}; they reported "
         f"{', '.join(sorted(reported)) or 'nothing'}.")
  markdown = table.markdown()
  header = (f"# Sweep: {args.config}\n\n`{shlex.join(_sweep_command(args))}`: "
            f"{len(table.results)} of {len(runs)} runs finished.\n\n")
  try:
    with open(os.path.join(directory, "results.md"), "w") as f:
      f.write(header + markdown)
    table.write_csv(os.path.join(directory, "results.csv"))
    sweep_table.write_hparams(directory, axes, table)
  except OSError as e:
    return jobs.fail("sweep", e, jobs.FAILURE)
  print(markdown, end="", flush=True)
  _say(f"{len(table.results)} of {len(runs)} runs finished; wrote "
       f"{os.path.join(directory, 'results.md')} and results.csv; the HParams tab: "
       f"tensorboard --logdir {shlex.quote(directory)}")
  return 0


def _say(message):
  print(f"ctl sweep: {message}", file=sys.stderr, flush=True)
