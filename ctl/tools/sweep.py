"""Sweeps: every combination of some gin bindings' values, each trained with several seeds.

    from ctl.tools import sweep
    axes = [sweep.parse_grid("gan.Experiment.batch_size=[16, 32]")]
    runs = sweep.plan(axes, seeds=[0, 1], directory="runs/sweeps/dcgan",
                      seed_binding="gan.Experiment.seed")
    for run in runs:  # 4 runs: batch_size=16/seed-0, batch_size=16/seed-1, ...
      command = sweep.train_command("dcgan", ["gan.Schedule.total_steps = 500"], run)
      print(sweep.finished(run.workdir), " ".join(command))

A grid is `BINDING=[v1, v2]` in gin's syntax (`@references` and `%macros`
included). A combination takes one value of each grid and is named like
`batch_size=16,width=8` (`<directory>/sweep.json` maps names to bindings). Each
run, a combination and a seed, is trained in `<directory>/<combination>/seed-<seed>`
by `ctl train` with the seed as one more binding (e.g. `gan.Experiment.seed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import shlex
import socket
import tokenize
from collections.abc import Sequence
from typing import Any

from gin import config_parser

RECORD_FILE = "sweep.json"
LOG_FILE = "train.log"
# Combination names are kept this short at most: a path component must stay
# under the filesystem's 255 bytes with room for the rest.
_MAX_NAME = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclasses.dataclass(frozen=True)
class Axis:
  """One `--grid`: a gin binding (or a macro), its values as gin text (`16`,
  `@gan.losses.hinge`) and as gin parsed them; `text` as the user wrote it."""
  binding: str
  values: tuple[str, ...]
  parsed: tuple[Any, ...]
  text: str = ""


@dataclasses.dataclass(frozen=True)
class Combination:
  """One value of each axis: its name (a directory name) and `{binding: value}`."""
  name: str
  values: dict[str, str]

  @property
  def bindings(self) -> list[str]:
    """The values as gin bindings, `BINDING = VALUE`, in the axes' order."""
    return [f"{binding} = {value}" for binding, value in self.values.items()]


@dataclasses.dataclass(frozen=True)
class Run:
  """A combination trained with a seed, in `workdir`; `index` is its place in the
  sweep's job list (`ctl sweep --only-index`)."""
  index: int
  combination: Combination
  seed: int
  workdir: str
  seed_binding: str

  @property
  def bindings(self) -> list[str]:
    """The combination's bindings, then the seed's."""
    return [*self.combination.bindings, f"{self.seed_binding} = {self.seed}"]

  @property
  def name(self) -> str:
    """`<combination>/seed-<seed>`, as the run's directory is named in the sweep's."""
    return f"{self.combination.name}/seed-{self.seed}"

  @property
  def log(self) -> str:
    """The file the run's `ctl train` writes its output to."""
    return os.path.join(self.workdir, LOG_FILE)


@dataclasses.dataclass(frozen=True)
class _Placeholder:
  """A `@reference` or `%macro` of a grid, kept as its text (gin resolves it in
  `ctl train`); `repr` gives that text back, also inside a list or tuple."""
  text: str

  def __repr__(self) -> str:
    return self.text


class _Delegate(config_parser.ParserDelegate):
  """Parses references and macros without looking them up (no module imported yet)."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Placeholder(f"@{scoped_configurable_name}{'()' if evaluate else ''}")

  def macro(self, macro_name):
    return _Placeholder(f"%{macro_name}")


_GRID_EXAMPLE = "e.g. --grid 'gan.Experiment.batch_size=[16, 32]'"


def parse_grid(text: str) -> Axis:
  """`BINDING=[v1, v2, ...]` (spaces allowed around `=`) as an `Axis`.

  Raises:
    ValueError: not one binding of a non-empty list of distinct values, in
      gin's syntax; the message names the text and shows the form.
  """
  parser = config_parser.ConfigParser(text, _Delegate())
  try:
    statement = parser.parse_statement()
    if parser.parse_statement() is not None:
      raise SyntaxError("more than one statement")
  except (SyntaxError, tokenize.TokenError) as e:
    reason = ("a bracket or string is not closed" if isinstance(e, tokenize.TokenError)
              else str(e).splitlines()[0])
    raise ValueError(f"--grid {text!r} is not BINDING=[v1, v2] in gin's syntax ({reason}); "
                     f"{_GRID_EXAMPLE}, a string value quoted as in a .gin file.") from None
  if not isinstance(statement, config_parser.BindingStatement):
    raise ValueError(f"--grid {text!r} is not a binding; {_GRID_EXAMPLE}.")
  binding = ((f"{statement.scope}/" if statement.scope else "") + statement.selector
             + (f".{statement.arg_name}" if statement.arg_name else ""))
  values = statement.value
  if not isinstance(values, list):
    raise ValueError(f"--grid {text!r}: the values must be a list in brackets, "
                     f"[v1, v2], got {values!r}; {_GRID_EXAMPLE}.")
  if not values:
    raise ValueError(f"--grid {text!r} has no values; give at least one in the "
                     f"brackets, {_GRID_EXAMPLE}.")
  texts = tuple(repr(v) for v in values)
  repeated = sorted({t for t in texts if texts.count(t) > 1})
  if repeated:
    raise ValueError(f"--grid {text!r} gives {', '.join(repeated)} twice; give each "
                     "value once (each seed of each value is one run).")
  return Axis(binding, texts, tuple(values), text)


def check_axes(axes: Sequence[Axis]) -> None:
  """Raises ValueError, naming it, if a binding is swept by two grids."""
  for i, axis in enumerate(axes):
    if axis.binding in (earlier.binding for earlier in axes[:i]):
      raise ValueError(f"--grid {axis.binding} is given twice; give one --grid per "
                       "binding, with all its values in one list.")


def short_names(bindings: Sequence[str]) -> list[str]:
  """The shortest distinct end of each binding's dotted (and scoped) name:
  `gan.dcgan_generator.width` and `gan.dcgan_discriminator.width` become
  `dcgan_generator.width` and `dcgan_discriminator.width`, a lone one `width`."""
  parts = [re.split(r"[./]", b) for b in bindings]
  names = []
  for mine in parts:
    for length in range(1, len(mine) + 1):
      end = mine[-length:]
      if all(other[-length:] != end for other in parts if other is not mine):
        break
    names.append(".".join(end))
  return names


def _slug(value: str) -> str:
  """A value's gin text as part of a file name: `'a b'` -> `a_b`, `@gan.losses.hinge`
  and `%gan.losses.hinge` -> `hinge`, `('color', 'cutout')` -> `color_cutout`."""
  if re.fullmatch(r"[@%][\w./]+(\(\))?", value):  # a reference or macro: its last name
    value = re.split(r"[./]", value.removesuffix("()"))[-1]
  return _UNSAFE.sub("_", value).strip("_") or "_"


def combinations(axes: Sequence[Axis]) -> list[Combination]:
  """Every combination of one value per axis, the last varying fastest (no axes:
  one named `default`)."""
  if not axes:
    return [Combination("default", {})]
  shorts = short_names([a.binding for a in axes])
  made = []
  for values in itertools.product(*(a.values for a in axes)):
    name = ",".join(f"{s}={_slug(v)}" for s, v in zip(shorts, values))
    made.append(Combination(name, dict(zip((a.binding for a in axes), values))))
  names = [c.name for c in made]
  return [c if len(c.name) <= _MAX_NAME and names.count(c.name) == 1
          else dataclasses.replace(c, name=_unique_name(c)) for c in made]


def _unique_name(combination):
  """The name cut short if long, with a digest of its bindings: distinct when two
  values differ only in characters a file name does not keep ('a b', 'a_b')."""
  digest = hashlib.sha1("\n".join(combination.bindings).encode()).hexdigest()[:8]
  return f"{combination.name[:_MAX_NAME - 9]}-{digest}"


def plan(axes: Sequence[Axis], seeds: Sequence[int], directory: str,
         seed_binding: str) -> list[Run]:
  """Every run of the sweep: each combination of `axes` with each of `seeds`, in
  `directory`; the seeds of a combination next to each other."""
  pairs = [(combination, seed) for combination in combinations(axes) for seed in seeds]
  return [Run(i, c, seed, os.path.join(directory, c.name, f"seed-{seed}"), seed_binding)
          for i, (c, seed) in enumerate(pairs)]


def finished(workdir: str) -> bool:
  """Whether the run in `workdir` finished: its `checkpoints/finished_step` holds a step."""
  try:
    with open(os.path.join(workdir, "checkpoints", "finished_step")) as f:
      int(f.read())
  except (OSError, ValueError):
    return False
  return True


def train_command(config: str, bindings: Sequence[str], run: Run,
                  options: Sequence[str] = ()) -> list[str]:
  """`ctl train` of `run` (without the program): the config, the sweep's fixed
  `bindings`, the run's, `--workdir` and further `options` (e.g. `--strategy`)."""
  command = ["train", config]
  for binding in [*bindings, *run.bindings]:
    command += ["--gin", binding]
  return [*command, "--workdir", run.workdir, *options]


def record(config: str, bindings: Sequence[str], seed_binding: str,
           experiment: str | None, runs: Sequence[Run]) -> dict[str, Any]:
  """What `sweep.json` holds."""
  return {"config": config, "bindings": list(bindings), "seed_binding": seed_binding,
          "experiment": experiment,
          "combinations": {run.combination.name: run.combination.values for run in runs}}


def write_record(directory: str, new: dict[str, Any]) -> None:
  """Writes `<directory>/sweep.json`, keeping the combinations an earlier invocation
  recorded there; ValueError if that was a sweep of another config, fixed bindings,
  seed binding or experiment (its finished runs would be taken as this one's)."""
  path = os.path.join(directory, RECORD_FILE)
  old = read_record(directory)
  if old is not None:
    for key, what in (("config", "config"), ("bindings", "--gin bindings"),
                      ("seed_binding", "--seed-binding"), ("experiment", "--experiment")):
      if old.get(key) != new[key]:
        raise ValueError(
            f"--sweep-dir {directory} holds a sweep with {what} {old.get(key)!r}, and this "
            f"one has {new[key]!r}: its finished runs would be taken as this sweep's. Give "
            f"another --sweep-dir, or the same {what} to resume or extend that sweep.")
    new = dict(new, combinations={**old.get("combinations", {}), **new["combinations"]})
  os.makedirs(directory, exist_ok=True)
  # Array tasks on several hosts may write it at once (the same content).
  temporary = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
  with open(temporary, "w") as f:
    json.dump(new, f, indent=1)
    f.write("\n")
  os.replace(temporary, path)


def read_record(directory: str) -> dict[str, Any] | None:
  """`<directory>/sweep.json` as written by `write_record`, or None if there is none."""
  try:
    with open(os.path.join(directory, RECORD_FILE)) as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def slurm_array_script(sweep_command: Sequence[str], count: int, directory: str,
                       job_name: str) -> str:
  """A Slurm batch script of `count` array tasks, task i running `sweep_command`
  (`ctl sweep ...`) with `--only-index i`, requeued after a preemption."""
  command = shlex.join(sweep_command)
  return f"""#!/bin/bash
# {count} runs of a ctl sweep, one per Slurm array task; written by:
#   {command} --slurm-array FILE
# Submit: sbatch FILE. When every task has ended, write the table (mean ± std
# over seeds) with:
#   {command} --table-only
# A task whose run finished already does nothing; rerunning the whole array
# trains only what did not finish. Add what your cluster needs below
# (partition, account, time, GPUs: #SBATCH --gpus-per-task=1) and, to run at
# most K tasks at once, --array=0-{count - 1}%K.
#SBATCH --job-name={job_name}
#SBATCH --array=0-{count - 1}
#SBATCH --ntasks=1
#SBATCH --output={os.path.join(directory, "slurm-%A_%a.out")}
# A requeued task appends to its log, so the preempted run's lines stay.
#SBATCH --open-mode=append
# SIGTERM 120 s before the time limit: ctl saves a checkpoint and exits 42,
# and the task is requeued below to resume from it.
#SBATCH --signal=TERM@120
#SBATCH --requeue

set -u
# The environment that has ctl, e.g.: source .venv/bin/activate
# srun: a job step, which --signal reaches (the batch shell itself it does not).
srun {command} --only-index "$SLURM_ARRAY_TASK_ID"
code=$?
if [ "$code" -eq 42 ]; then
  # Saved after SIGTERM: queue this task again; the rerun resumes.
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$code"
"""
