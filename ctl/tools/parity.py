"""Parity: does a strategy switch change a run's numbers by more than float rounding?

    from ctl.tools import parity
    report = parity.check("my_gan.py", ["compiled", "mirrored:2"], steps=10)
    print(report)                 # per configuration: its largest differences, verdict
    report.ok                     # every configuration within rounding

    ctl parity my_gan.py --against compiled,mirrored:2,multi_worker:2 --steps 10

"The same numbers" means that a configuration changes only float rounding: a
float64 replay of every run decides where it can run, elsewhere float32 against
a floor (`perturb`); docs/parity.md explains both. Past rounding, `diagnose`
names the likely bug. Each configuration runs in its own process
(`ctl.tools.parity_runs.run_one`): TensorFlow fixes its devices once per process.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from ctl.base import constants
from ctl.distribute import launch

FLOAT32_EPSILON = float(np.finfo(np.float32).eps)  # 1.19e-7
# One step from the same state: a few roundings of each sum, relative.
ONE_STEP_TOLERANCE = 16 * FLOAT32_EPSILON
# Rounding differences grow through training at the same rate from either
# cause; a factor of 10 leaves room for the spread between such pairs, and none
# for a real difference, which starts at 1e-3 or more at the first step.
FLOOR_FACTOR = 10.0
# float32 floor runs: the floor is their largest difference (one run is a single
# sample of a random quantity).
FLOOR_SAMPLES = 3
# float64, relative, per step trained: float64's rounding (1e-16) amplified a
# million times stays under it; a bug's float32-sized difference is far past it.
FLOAT64_TOLERANCE = 1e-9
# float32 alone: a difference past its tolerance by less than this is
# "undecided", not DIFFERS: training amplifies rounding unevenly, and a bug can
# be small in float32, so neither side of the band is trusted alone.
UNDECIDED_FACTOR = 10.0

REFERENCE = "eager"  # the eager default strategy: the step as written
# name -> (strategy, takes a count, Runner options)
KINDS = {
    "eager": ("default", False, {"eager": True}),
    "compiled": ("default", False, {}),
    "jit": ("default", False, {"jit_compile": True}),
    "one_device": ("one_device", False, {}),
    "mirrored": ("mirrored", True, {}),
    "central_storage": ("central_storage", True, {}),
    "multi_worker": ("multi_worker", True, {}),
    "steps_per_loop": ("default", True, {}),
}

Arrays = Mapping[str, np.ndarray]
"""A run's numbers by key: `loss/<result>` (one value per step), `<model>/<i>`
(the model's i-th variable), `optimizer:<name>/<slot>/<i>` (the optimizer's i-th
variable, and what kind of slot it is), `counter:step`."""


@dataclasses.dataclass(frozen=True)
class Config:
  """One configuration to compare with the reference, from a name such as
  `mirrored:2`, `steps_per_loop:5`, `jit`, or a combination with `+`
  (`mirrored:2+jit`, `mirrored:4+steps_per_loop:10`)."""
  name: str
  strategy: str = "default"
  replicas: int = 1  # logical CPUs for mirrored/central_storage, workers for multi_worker
  options: tuple[tuple[str, Any], ...] = ()

  @classmethod
  def parse(cls, name: str) -> Config:
    strategy, replicas, options = "default", 1, {}
    for part in name.strip().split("+"):
      kind, _, count = part.strip().partition(":")
      if kind not in KINDS:
        raise ValueError(f"parity configuration {name!r}: {kind!r} is not one of "
                         f"{sorted(KINDS)}; e.g. 'mirrored:2', 'steps_per_loop:5', "
                         "'mirrored:2+jit'.")
      kind_strategy, counted, kind_options = KINDS[kind]
      if counted != bool(count):
        raise ValueError(
            f"parity configuration {name!r}: {kind!r} "
            + (f"needs a count, e.g. '{kind}:2'." if counted else "takes no count."))
      if counted and not (count.isdigit() and int(count) >= 1):
        raise ValueError(f"parity configuration {name!r}: the count of {kind!r} must be "
                         f"an int >= 1, got {count!r}.")
      options.update(kind_options)
      if kind == "steps_per_loop":
        options["steps_per_loop"] = int(count)
      elif kind_strategy != "default":
        strategy, replicas = kind_strategy, int(count or 1)
    return cls(name.strip(), strategy, replicas, tuple(sorted(options.items())))

  @property
  def processes(self) -> int:
    """The processes it runs in (its workers under multi_worker)."""
    return self.replicas if self.strategy == "multi_worker" else 1


@dataclasses.dataclass(frozen=True)
class Row:
  """One variable (or logged value) of one configuration, in one precision;
  `difference` and `floor` are relative to its group's scale (`scales`)."""
  config: str
  key: str  # the variable's path (in `check`'s report), or "loss/<result key>"
  precision: str  # "float32" or "float64"
  difference: float
  tolerance: float
  floor: float = 0.0

  @property
  def ok(self) -> bool:
    return bool(self.difference <= self.tolerance)

  @property
  def margin(self) -> float:
    """difference / tolerance: past 1 is past rounding."""
    if self.tolerance > 0:
      return self.difference / self.tolerance
    return 0.0 if self.difference == 0 else float("inf")


@dataclasses.dataclass
class Report:
  """What `check` found, per configuration: its rows in each precision, which
  precision decided, why float64 could not (if it could not), and for a
  configuration past rounding, its likely causes."""
  rows: list[Row]
  causes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
  errors: dict[str, str] = dataclasses.field(default_factory=dict)
  decided_by: dict[str, str] = dataclasses.field(default_factory=dict)
  notes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
  steps: int = 1
  floor_samples: int = FLOOR_SAMPLES
  unsteady: set[str] = dataclasses.field(default_factory=set)  # `not_deterministic`
  first_differs: set[str] = dataclasses.field(default_factory=set)  # `first_step_differs`

  @property
  def configs(self) -> list[str]:
    """The configurations (with their seeds), in the order they were checked."""
    return list(dict.fromkeys([r.config for r in self.rows] + list(self.errors)))

  def precision(self, config: str) -> str:
    """The precision whose rows give `config`'s verdict."""
    return self.decided_by.get(config, "float32")

  def decisive(self, config: str) -> list[Row]:
    """`config`'s rows in the precision that decides."""
    return self._rows(config)

  def within_rounding(self, config: str) -> bool:
    """Whether `config` ran, its reference was deterministic, and its rows are ok."""
    return (config not in self.errors and config not in self.unsteady and
            all(r.ok for r in self.decisive(config)))

  def verdict(self, config: str) -> str:
    """"rounding", "DIFFERS", "failed" or "undecided" (`format_report` says when)."""
    if config in self.errors:
      return "failed"
    if self.within_rounding(config):
      return "rounding"
    if all(r.ok for r in self.decisive(config)):
      return "undecided"  # unsteady
    if self.precision(config) == "float32" and (
        self.worst(config).margin < UNDECIDED_FACTOR or config not in self.first_differs):
      return "undecided"
    return "DIFFERS"

  @property
  def ok(self) -> bool:
    """Every configuration within rounding."""
    return all(self.within_rounding(c) for c in self.configs)

  @property
  def differs(self) -> bool:
    """Some configuration past rounding (or failed), beyond doubt."""
    return any(self.verdict(c) in ("DIFFERS", "failed") for c in self.configs)

  def largest(self, config: str, precision: str | None = None) -> Row:
    """`config`'s row of the largest difference (in the deciding precision)."""
    return max(self._rows(config, precision), key=lambda r: (r.difference, r.margin))

  def worst(self, config: str, precision: str | None = None) -> Row:
    """`config`'s row closest to (or furthest past) its tolerance."""
    return max(self._rows(config, precision), key=lambda r: r.margin)

  def _rows(self, config, precision=None):
    precision = precision or self.precision(config)
    return [r for r in self.rows if r.config == config and r.precision == precision]

  def format(self, verbose: bool = False) -> str:
    """The table (`format_report`); `verbose` adds every variable."""
    return format_report(self, verbose=verbose)

  def __str__(self) -> str:
    return format_report(self)


def relative_difference(reference: np.ndarray, other: np.ndarray,
                        scale: float | None = None) -> float:
  """max |other - reference| / scale (default max |reference|; absolute if 0)."""
  reference, other = np.asarray(reference, np.float64), np.asarray(other, np.float64)
  if reference.shape != other.shape:
    return float("inf")
  if not (np.isfinite(reference).all() and np.isfinite(other).all()):
    return 0.0 if np.array_equal(reference, other, equal_nan=True) else float("inf")
  if scale is None:
    scale = float(np.max(np.abs(reference), initial=0.0))
  difference = float(np.max(np.abs(other - reference), initial=0.0))
  return difference / scale if scale > 0 else difference


def group(key: str) -> str:
  """`key`'s group: its model, its optimizer's slots of one kind
  (`optimizer:generator/momentum`), every logged value (`loss`), or the counter."""
  if key.startswith("loss/"):
    return "loss"
  if key.startswith("optimizer:"):
    return key.rsplit("/", 1)[0]
  if key.startswith("counter:"):
    return key
  return key.split("/")[0]


def scales(reference: Arrays) -> dict[str, float]:
  """key -> the magnitude its differences are divided by: the largest value of its
  group (`group`), so that a bias that training brings near zero is judged on
  its model's scale, not its own; a logged value's own largest value."""
  largest = {k: float(np.max(np.abs(np.asarray(v, np.float64)), initial=0.0))
             for k, v in reference.items()}
  by_group = {}
  for key, value in largest.items():
    if np.isfinite(value):
      by_group[group(key)] = max(by_group.get(group(key), 0.0), value)
  return {k: largest[k] if k.startswith("loss/") else by_group.get(group(k), 0.0)
          for k in reference}


def steps_trained(reference: Arrays) -> int:
  """The length of a logged value's history (1 if nothing is logged)."""
  return max([np.size(v) for k, v in reference.items() if k.startswith("loss/")] or [1])


def differences(reference: Arrays, run: Arrays) -> dict[str, float]:
  """key -> `run`'s relative difference from `reference` (see `scales`)."""
  missing = sorted(set(reference) ^ set(run))
  if missing:
    raise ValueError(f"parity: a run has other variables or results than the "
                     f"reference: {missing[:5]}")
  scale = scales(reference)
  return {k: relative_difference(reference[k], run[k], scale[k]) for k in reference}


def float32_tolerances(reference: Arrays,
                       floors: Sequence[Arrays]) -> dict[str, tuple[float, float]]:
  """key -> (floor, tolerance) in float32; the floor is the largest difference of
  its group in any of the `floors` runs (one variable in one run is one sample)."""
  steps = steps_trained(reference)
  by_group = {}
  for floor in floors:
    for key, value in differences(reference, floor).items():
      by_group[group(key)] = max(by_group.get(group(key), 0.0), value)
  return {k: (by_group.get(group(k), 0.0),
              max(FLOOR_FACTOR * by_group.get(group(k), 0.0), ONE_STEP_TOLERANCE * steps))
          for k in reference}


def float64_tolerances(reference: Arrays, floor: Arrays,
                       float32: Mapping[str, tuple[float, float]]
                       ) -> dict[str, tuple[float, float]]:
  """key -> (floor, tolerance) in float64: `FLOAT64_TOLERANCE` per step, except
  for a key that float64 rounding alone (`floor`, the float64 reference with
  perturbed weights) moves past it, which keeps its float32 tolerance (or 10
  times that floor, if larger)."""
  base = FLOAT64_TOLERANCE * steps_trained(reference)
  # Past `base`, rounding alone moves it: a direction the loss does not fix.
  return {key: (value, base if value <= base else max(FLOOR_FACTOR * value, float32[key][1]))
          for key, value in differences(reference, floor).items()}


def compare(config: str, reference: Arrays, run: Arrays,
            tolerances: Mapping[str, tuple[float, float]], precision: str = "float32",
            names: Mapping[str, str] | None = None) -> list[Row]:
  """A row per key of `reference`: `run`'s difference against its tolerance
  (`float32_tolerances` or `float64_tolerances`); `names`: key -> the row's name."""
  names = names or {}
  return [Row(config, names.get(k, k), precision, value, tolerances[k][1], tolerances[k][0])
          for k, value in differences(reference, run).items()]


def perturb(models: Mapping[str, Any], seed: int = 0) -> None:
  """Moves every floating-point weight of `models` by one unit in the last place,
  up or down as drawn from `seed` for each weight: the smallest change there is,
  to measure the rounding floor."""
  rng = np.random.default_rng(seed)
  for model in models.values():
    for variable in model.weights:
      value = np.asarray(variable.numpy())
      if np.issubdtype(value.dtype, np.floating):
        signs = rng.integers(0, 2, value.shape).astype(bool)
        target = np.where(signs, np.array(np.inf, value.dtype), np.array(-np.inf, value.dtype))
        variable.assign(np.nextafter(value, target).astype(value.dtype))


def diagnose(config: Config, rows: Sequence[Row], reference: Arrays, run: Arrays,
             about: Mapping[str, Any] | None = None, *, floors: Sequence[Arrays] = (),
             floor_reference: Arrays | None = None) -> list[str]:
  """The likely causes of a configuration's difference, from its deciding `rows`
  and arrays; `about`: `parity_runs.describe`'s keys and "analysis" (`analyze`);
  `floors`: the float32 floor runs of `floor_reference` (default `reference`)."""
  unsteady = not_deterministic(reference if floor_reference is None else floor_reference,
                               floors)
  if all(r.ok for r in rows) and not unsteady:
    return []
  about = about or {}
  analysis = about.get("analysis") or {}
  draws = analysis.get("draws", [])
  causes = []
  if unsteady:
    causes.append(
        "the step is not deterministic on its own: a floor run, eager like the "
        "reference, already differs at the first step. "
        + (f"It draws with tf.random: {'; '.join(draws[:3])} (use ctx.normal, ctx.uniform "
           "or ctx.seed())." if draws else
           "Look for a draw that ctl does not seed: np.random or random in the step, "
           "tf.random.normal without a seed (use ctx.normal, ctx.uniform or ctx.seed()), "
           "or data() shuffling without a seed (give shuffle a seed)."))
  elif draws:
    causes.append(
        "draws whose numbers depend on the layout: " + "; ".join(draws[:3]) + ". A "
        "tf.random op draws other numbers on each replica, eagerly and compiled, and a "
        "stateless draw of the replica's rows draws the same rows on every replica. "
        + constants.STEP_DRAWS_FIX)
  key = next((k for k in reference if (k.startswith("counter:") or "/iteration/" in k)
              and not np.array_equal(reference[k], run[k])), None)
  if key is not None:
    causes.append(
        f"{about.get('paths', {}).get(key, key)} is {run[key]} here and {reference[key]} "
        "in the reference: another number of steps or updates ran (a Python `if` on a "
        "tensor's value runs one branch eagerly and becomes a tf.cond compiled; "
        "a LossScaleOptimizer skips an update whose gradient is not finite).")
  if config.replicas > 1:
    causes += _replica_causes(config.replicas, reference, run, about, named=bool(draws))
  if not causes:
    if dict(config.options).get("jit_compile"):
      causes.append("only with XLA: an op XLA computes differently (look at "
                    "reductions over large tensors), or randomness in a Keras layer.")
    elif config.strategy == "default":
      causes.append(
          "compiling alone changes it: a draw that ctl does not make (tf.random.* "
          "ops draw other numbers compiled than eagerly; use ctx.normal, ctx.uniform "
          "or ctx.seed()), a Python value frozen when the step was traced (np.random, "
          "random, time, a Python counter), or a Python branch on a tensor's value.")
    else:
      causes.append("no known cause matched: compare the first step's results "
                    "and each model's variables to see where it starts.")
  return causes


def first_step_differs(reference: Arrays, run: Arrays, relative: float = 1e-5) -> bool:
  """Whether a logged value of `run` differs from the reference's at the first step,
  before any update could amplify rounding, by more than `relative`."""
  firsts = [(float(np.ravel(reference[k])[0]), float(np.ravel(run[k])[0])) for k in reference
            if k.startswith("loss/") and np.size(reference[k]) and np.size(run.get(k, []))]
  return any(np.isfinite(c) and abs(c - r) > relative * (1 + abs(r)) for r, c in firsts)


def not_deterministic(reference: Arrays, floors: Sequence[Arrays]) -> bool:
  """Whether a floor run already differs from `reference` at the first step: one
  ulp moves a loss by about an epsilon, an unseeded draw by its own size. Its
  differences are then no rounding floor, and no configuration can be judged."""
  return any(first_step_differs(reference, floor, relative=1e-4) for floor in floors)


def _replica_causes(replicas, reference, run, about, named=False):
  """The causes that only several replicas reveal (`named`: a cause with its line
  is already given, which the generic ones would only blur)."""
  causes = []
  first = {k: (float(reference[k][0]), float(run[k][0])) for k in reference
           if k.startswith("loss/") and np.size(reference[k]) and np.isfinite(run[k][0])}
  for key, (r, c) in first.items():
    if r != 0 and abs(c / r - replicas) < 1e-3 * replicas:
      causes.append(
          f"{key} is {replicas} times the reference at the first step, with "
          f"{replicas} replicas: the loss is scaled by the replica count (e.g. "
          "ctx.average(...) * ctx.num_replicas, or a mean taken per replica and "
          "then summed). ctx.average alone is already the global-batch mean.")
    elif r != 0 and abs(c * replicas / r - 1) < 1e-3:
      causes.append(
          f"{key} is 1/{replicas} of the reference at the first step: the loss is "
          "divided by the replica count once too often.")
  drawn = sorted(f"{m} ({', '.join(sorted(set(kinds)))})"
                 for m, kinds in about.get("layers", {}).items() if kinds)
  if drawn:
    causes.append(
        "layers that work per replica: " + "; ".join(drawn) + ". Keras Dropout "
        "draws its own mask on each replica, and BatchNormalization averages over "
        "each replica's rows only (use synchronized=True, or draw the mask with "
        "ctx.uniform).")
  if causes:
    return causes
  analysis = about.get("analysis", {})
  # Found in the step's graph: evidence even where the first step agrees (a
  # regulariser whose per-replica value is small next to the loss).
  for line in analysis.get("batch_reductions", [])[:3]:
    causes.append(
        f"a value computed over the replica's batch: {line}. It reduces over the "
        "batch axis, and each replica sees its own rows: compute it per example "
        "(e.g. a norm over axis=1 and the axes after it, not the whole tensor), or "
        "as a global-batch mean with ctx.average.")
  if not first_step_differs(reference, run):
    return causes
  if not causes and not named:
    causes.append(
        f"the first step already differs with {replicas} replicas: something is "
        "computed per replica. Most often noise drawn without ctx.normal/"
        "ctx.uniform (tf.random.* with the replica's own batch size draws the same "
        "rows on every replica), or a value taken from the replica's batch alone.")
  statistics = sorted(f"{m} ({', '.join(sorted(set(kinds)))})"
                      for m, kinds in about.get("statistics", {}).items() if kinds)
  if statistics and not named:
    micro = analysis.get("micro_batches")
    causes.append(
        "batch statistics: " + "; ".join(statistics) + " compute their statistics "
        "over the batch they are given. A synchronized layer averages over the "
        "replicas' rows: each replica must give it the same global examples as one "
        "device does"
        + (" (ctx.minimize(..., micro_batches=k) does: slice i holds the global rows "
           "i, i+k, ...; slices the step cuts itself must do the same)." if micro else
           ", so a step that slices the batch itself must take the same global rows "
           "on every replica count."))
  return causes


def _kind_order(name):
  """Logged values first, then model variables, the step counter, optimizer variables."""
  if name.startswith("loss/"):
    return 0
  if name.startswith("optimizer "):
    return 3
  return 2 if name == "step counter" else 1


def format_report(report: Report, verbose: bool = False) -> str:
  """The table: per configuration its verdict and largest differences, then what is
  past rounding and the likely causes; `verbose` adds every variable."""
  lines = [f"{'configuration':28} {'verdict':9} {'precision':9} {'difference':>10} "
           f"{'tolerance':>10}  variable"]
  for config in report.configs:
    if config in report.errors:
      lines.append(f"{config:28} failed: {report.errors[config]}")
      continue
    label = [config, report.verdict(config)]
    decided = report.precision(config)
    for precision in sorted({r.precision for r in report.rows if r.config == config},
                            key=lambda p: p != decided):
      largest, worst = report.largest(config, precision), report.worst(config, precision)
      shown = [(largest, "largest")]
      if worst.key != largest.key and (precision == decided or not worst.ok):
        shown.append((worst, "closest to its tolerance" if worst.ok else "furthest past"))
      for row, what in shown:
        lines.append(f"{label[0]:28} {label[1]:9} {precision:9} {row.difference:10.2e} "
                     f"{row.tolerance:10.2e}  {row.key} ({what}{'' if row.ok else ', past'})")
        label = ["", ""]
  sharing = {}  # a note several configurations share is said once
  for config in report.configs:
    for note in report.notes.get(config, []):
      sharing.setdefault(note, []).append(config)
  shared = {note: configs for note, configs in sharing.items() if len(configs) > 1}
  for note, configs in shared.items():
    lines += ["", f"{'every configuration' if configs == report.configs else ', '.join(configs)}"
                  f": {note}"]
  for config in report.configs:
    if config in report.errors:
      continue
    decisive = report.decisive(config)
    bad = [r for r in decisive if not r.ok]
    notes = [n for n in report.notes.get(config, []) if n not in shared]
    if (not bad and not notes and not report.causes.get(config) and
        report.verdict(config) != "undecided"):
      continue
    lines.append("")
    if bad:
      worst = report.worst(config)
      lines.append(f"{config}: {len(bad)} of {len(decisive)} past tolerance in "
                   f"{report.precision(config)} (at most {worst.margin:.3g} times it), e.g.")
      lines += [f"  {r.key}: {r.difference:.2e} (tolerance {r.tolerance:.2e})"
                for r in sorted(bad, key=lambda r: (_kind_order(r.key), -r.margin))[:5]]
    if report.verdict(config) == "undecided":
      lines.append(f"{config}: undecided: " + (
          "nothing is past tolerance, but the reference is not deterministic on its own, "
          "so no difference can be called rounding." if not bad else
          f"float32 alone cannot tell a bug from rounding that training amplified, past its "
          f"tolerance by under {UNDECIDED_FACTOR:g} times, or further with the first "
          "step's logged values alike. Let float64 decide (see why it could not, above), "
          "or run more --seeds: a bug stays past on every seed."))
    lines += [f"{config}: {note}" for note in notes]
    lines += [f"  likely: {cause}" for cause in report.causes.get(config, [])]
  if verbose:
    for config in report.configs:
      for precision in ("float64", "float32"):
        rows = sorted(report._rows(config, precision), key=lambda r: -r.margin)
        if rows:
          lines += ["", f"{config}, {precision}, every variable (difference, tolerance, floor):"]
          lines += [f"  {r.difference:10.2e} {r.tolerance:10.2e} {r.floor:10.2e}  "
                    f"{r.key}{'' if r.ok else '  past'}" for r in rows]
  lines += [
      "",
      "difference: max |x - reference| / the scale of its group (its model's largest "
      "weight; the largest optimizer variable of its kind; a logged value's largest value).",
      "float64 (decides where it can run): the runs replayed in float64; tolerance "
      f"{FLOAT64_TOLERANCE:.0e} x {report.steps} steps, or for a variable that float64 "
      "rounding alone moves further (the float64 floor run), as in float32.",
      "float32: the runs as the module runs them (in its own precision: float32, or "
      f"mixed); tolerance max({FLOOR_FACTOR:g} x floor, {ONE_STEP_TOLERANCE:.1e} x "
      f"{report.steps} steps); the floor is the most that moving every initial weight by "
      "one ulp moves the variable's group (1 run where float64 decides, "
      f"{report.floor_samples} where float32 does). Where float32 decides, DIFFERS needs "
      f"{UNDECIDED_FACTOR:g} times the tolerance and a first step that differs; less is "
      "undecided."]
  return "\n".join(lines)


_NEEDED = ("build", "train_step", "data")


def check_module(path: str) -> None:
  """Checks, without importing it (which would start TensorFlow here), that
  `path` is a Python file defining `build`, `train_step` and `data` at its top level,
  or the name of a module that can be found."""
  if path.endswith(".gin"):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"parity: no file {path!r}; give the path of a .gin file "
                              "(or of a Python file that defines build, train_step and data).")
    return
  if not (path.endswith(".py") or os.sep in path):
    if importlib.util.find_spec(path) is None:
      raise FileNotFoundError(f"parity: no module {path!r}; give a Python file's path "
                              "or an importable module name.")
    return
  if not os.path.isfile(path):
    raise FileNotFoundError(f"parity: no file {path!r}; give the path of a Python "
                            "file that defines build, train_step and data.")
  with open(path) as f:
    tree = ast.parse(f.read(), filename=path)
  defined, functions = set(), []
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      defined.add(node.name)
      functions += [node.name] * isinstance(node, ast.FunctionDef)
    elif isinstance(node, ast.Assign):
      defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      defined.update((a.asname or a.name).split(".")[0] for a in node.names)
  _require_parts(path, [n for n in _NEEDED if n not in defined], functions)


def _require_parts(path, missing, functions=()):
  """Raises AttributeError naming what `path` lacks and the `functions` it defines."""
  if missing:
    renamed = (" (its `step` is now called `train_step`: rename it)"
               if "train_step" in missing and "step" in functions else "")
    if functions and not renamed:
      renamed = f"; it defines the functions {', '.join(functions)}"
    raise AttributeError(
        f"parity: {path} does not define {', '.join(missing)}: a parity module "
        "defines build() -> (models, optimizers), train_step(ctx, batch) -> dict and "
        f"data() -> a dataset of global batches (and may set batches_per_step, seed){renamed}.")


def load_module(path: str) -> Any:
  """The user's module, from a file path (`my_gan.py`) or a module name, executed
  anew at each call: each run starts from the module as written, not from the
  Python state (a counter, a list) that an earlier run in the process left."""
  if path.endswith(".py") or os.sep in path:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"parity: no file {path!r}; give the path of a Python "
                              "file that defines build, train_step and data.")
    name = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.dirname(os.path.abspath(path))  # first, as `python path` puts it
    if sys.path[:1] != [folder]:
      sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  elif path in sys.modules:
    module = importlib.reload(sys.modules[path])
  else:
    module = importlib.import_module(path)
  _require_parts(path, [n for n in _NEEDED if not callable(getattr(module, n, None))],
                 [n for n, v in vars(module).items()
                  if inspect.isfunction(v) and v.__module__ == module.__name__])
  return module


def float64_blockers(analysis: Mapping[str, Any]) -> str:
  """What in `ctl.tools.parity_runs.analyze`'s findings keeps a float64 replay from
  deciding, or ''."""
  if analysis.get("float32_made"):
    return ("the step makes float32 values that the float64 replay cannot widen, at "
            + "; ".join(analysis["float32_made"][:3]) + " (an op whose output is float32 "
            "whatever its input's type), so the replay would carry float32 rounding. "
            "Convert that value to its input's dtype (tf.cast(y, x.dtype)) to let "
            "float64 decide")
  if analysis.get("float32_variables"):
    return ("some variables stay float32 in a float64 run: "
            + ", ".join(analysis["float32_variables"][:3]))
  return ""


def check(path: str, configs: Sequence[str], *, steps: int = 10,
          seeds: Sequence[int] | None = None, timeout: float = 900,
          bindings: Sequence[str] = (), experiment: str | None = None,
          float64: bool = True, floor_samples: int = FLOOR_SAMPLES,
          jobs: int | None = None) -> Report:
  """Runs the module's step under the eager reference (and its floor runs) and
  each of `configs`, each in a process of its own, and compares them.

  Args:
    path: a Python file (or module name) defining `build`, `train_step` and `data`;
      or a .gin file, whose experiment's runner runs with each one's options.
    configs: configuration names (`Config.parse`), e.g. ["compiled", "mirrored:2"].
    steps: steps each run trains.
    seeds: run seeds (`Runner(seed=)`) to check each configuration with; None:
      the module's `seed` (default 0) or the experiment's. With several, each
      (configuration, seed) gets a verdict, named `<configuration> seed=<seed>`.
    timeout: seconds a process may take before it counts as failed.
    bindings: gin bindings for a .gin file (as `ctl train --gin`).
    experiment: for a .gin file, what makes the experiment (as `ctl train
      --experiment`); default: the installed one.
    float64: replay the runs in float64, which then decides; False: float32 alone.
    floor_samples: float32 floor runs where float32 decides (one otherwise).
    jobs: processes at once (multi_worker counts its workers); default:
      `usable_cpus()`, at most 4.

  Returns:
    A `Report`; `print` it for the table.
  """
  parsed = [Config.parse(c) for c in configs]
  if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
    raise ValueError(f"parity: steps must be an int >= 1, got {steps!r}.")
  if not isinstance(floor_samples, int) or floor_samples < 1:
    raise ValueError(f"parity: floor_samples must be an int >= 1, got {floor_samples!r}.")
  seeds = None if seeds is None else [int(s) for s in seeds]
  if seeds is not None and (not seeds or len(set(seeds)) != len(seeds)):
    raise ValueError(f"parity: seeds must be distinct ints, at least one; got {seeds!r}.")
  reference = Config.parse(REFERENCE)
  options = dict(path=path, steps=steps, seeds=seeds, float64=float64,
                 floor_samples=floor_samples, bindings=bindings, experiment=experiment,
                 timeout=timeout, jobs=jobs or min(usable_cpus(), 4))
  with tempfile.TemporaryDirectory(prefix="ctl-parity-") as directory:
    done = _run_processes([("reference", reference, "reference")] +
                          [(c.name, c, "config") for c in parsed], directory, options)
    if isinstance(done["reference"], str):
      raise RuntimeError(f"parity: the eager reference run of {path} failed:\n"
                         f"{done['reference']}")
    report = _report(parsed, done, floor_samples)
    if floor_samples > 1 and any(report.precision(c) == "float32" for c in report.configs
                                 if c not in report.errors):
      # A configuration that float64 could not decide after all: more floors.
      more = _run_processes([("floors", reference, "floors")], directory, options)
      if isinstance(more["floors"], str):
        raise RuntimeError(f"parity: a floor run of {path} failed:\n{more['floors']}")
      for seed, runs in more["floors"][0].items():
        done["reference"][0][seed].update(runs)
      report = _report(parsed, done, floor_samples)
  return report


def usable_cpus() -> int:
  """The CPUs this process may run on (its affinity: `taskset`, a container's
  cpuset), not the machine's."""
  try:
    return len(os.sched_getaffinity(0)) or 1
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def _report(configs, done, floor_samples):
  """The `Report` of `_run_processes`' outputs."""
  runs, about = done["reference"]
  report = Report([], floor_samples=floor_samples)
  judged = {}  # seed -> what each configuration's runs of it are judged by
  named = []  # (configuration, seed, its name in the report)
  for seed, ours in runs.items():
    floors = [a for label, a in ours.items() if label.startswith("floor-")]
    found = about["seeds"][seed]
    unable = _float64_unable(found, ours.get("main64"), ours.get("floor64-0"))
    tolerances32 = float32_tolerances(ours["main"], floors)
    judged[seed] = (ours, floors, found, unable, tolerances32, None if unable else
                    float64_tolerances(ours["main64"], ours["floor64-0"], tolerances32))
    report.steps = steps_trained(ours["main"])
  for config in configs:
    for seed, (ours, floors, found, unable, tolerances32, tolerances64) in judged.items():
      name = config.name if len(judged) == 1 else f"{config.name} seed={seed}"
      named.append((config, seed, name))
      if isinstance(done[config.name], str):
        report.errors[name] = done[config.name]
        continue
      theirs = done[config.name][0][seed]
      report.rows += compare(name, ours["main"], theirs["main"], tolerances32, "float32",
                             about["paths"])
      why = unable or (None if "main64" in theirs else "its float64 run failed: " +
                       done[config.name][1]["seeds"][seed]["errors"].get("main64", "?"))
      notes = report.notes.setdefault(name, [])
      if why == "--no-float64":
        notes.append(f"float32 decides (--no-float64; floor of {len(floors)} runs).")
      elif why:
        notes.append(f"float64 cannot decide: {why}; float32 decides"
                     + (f" (floor of {len(floors)} runs)." if len(floors) > 1 else "."))
      else:
        report.rows += compare(name, ours["main64"], theirs["main64"], tolerances64, "float64",
                               about["paths"])
        report.decided_by[name] = "float64"
        notes += amplified_note(report, name, about.get("optimizers", {}))
      if not_deterministic(ours["main"], floors):
        report.unsteady.add(name)
      if first_step_differs(ours["main"], theirs["main"]):
        report.first_differs.add(name)
      decided = "main64" if name in report.decided_by else "main"
      report.causes[name] = diagnose(
          config, report.decisive(name), ours[decided], theirs[decided],
          dict(about, analysis=found.get("analysis", {})), floors=floors,
          floor_reference=ours["main"])
  _first_fix_compiling(report, named)
  return report


def _first_fix_compiling(report, named):
  """A difference that compiling on one device already makes shows again under
  every strategy, which compiles too: it is the one to fix first."""
  for config, seed, name in named:
    compiled = [n for c, s, n in named if s == seed and c.strategy == "default" and
                "eager" not in dict(c.options) and report.causes.get(n)]
    if compiled and config.strategy != "default" and report.causes.get(name):
      report.causes[name].append(
          f"compiled on one device it differs already ({compiled[0]}, above): fix that first.")


# Optimizers whose update divides a gradient by its own running size (or takes its sign).
_ADAPTIVE = ("Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Adafactor",
             "Lion", "Lamb", "Ftrl")


def amplified_note(report: Report, name: str, optimizers: Mapping[str, str]) -> list[str]:
  """For a configuration float64 calls rounding: whether float32 alone would not have.
  `optimizers`: model -> its optimizer's class name."""
  past = [r for r in report.rows if r.config == name and r.precision == "float32" and not r.ok]
  if not past or not report.within_rounding(name):
    return []
  worst = max(past, key=lambda r: r.margin)
  count = "1 variable is" if len(past) == 1 else f"{len(past)} variables are"
  kinds = sorted(set(optimizers.values()))
  adaptive = [k for k in kinds if k in _ADAPTIVE]
  how = (f" ({', '.join(adaptive)} divide{'s' if len(adaptive) == 1 else ''} each gradient "
         "by its own running size, or take its sign)" if adaptive else
         f" ({', '.join(kinds)})" if kinds else "")
  return [f"in float32, {count} past tolerance (e.g. {worst.key}, "
          f"{worst.margin:.1f} times it), and float64 agrees within "
          f"{report.largest(name).difference:.1e}: rounding that training "
          f"amplified{how}, not a bug."]


def _float64_unable(found, reference64, floor64):
  """Why float64 cannot decide for the reference's seed, or None."""
  reason = float64_blockers(found.get("analysis", {}))
  if reference64 is None:
    failed = found["errors"].get("main64")
    if not failed:
      return "--no-float64"
    if reason:
      return f"{reason} (the reference fails there in float64: {failed})"
    return (f"the reference fails in float64 ({failed}): the step mixes a float32 value "
            "that the replay cannot widen into float64 tensors (a NumPy float32 array, "
            "a tf.Variable of float32, an op with a float32 output): give it the input's "
            "dtype")
  if reason:
    return reason
  if floor64 is None:
    return "the float64 floor run failed: " + found["errors"].get("floor64-0", "?")
  return None


def _run_processes(processes, directory, options):
  """Runs `processes` ((name, config, role)), `options["jobs"]` workers' worth at a
  time; name -> (runs by seed and label, about), or the error it ended with."""
  pending, running, done = list(processes), [], {}
  try:
    while pending or running:
      while pending and (not running or sum(r[1].processes for r in running)
                         + pending[0][1].processes <= options["jobs"]):
        name, config, role = pending.pop(0)
        out = os.path.join(directory, f"{role}-{len(os.listdir(directory))}.npz")
        running.append((name, config, out, _start(config, role, out, options),
                        time.monotonic()))
      time.sleep(0.05)
      for entry in list(running):
        name, _, out, proc, started = entry
        if proc.poll() is None and time.monotonic() - started < options["timeout"]:
          continue
        running.remove(entry)
        done[name] = _finish(proc, out, options["timeout"])
  finally:
    stop_groups([entry[3] for entry in running])
  return done


def _start(config, role, out, options):
  """Starts `run_one` in a process group of its own (under `ctl launch` for multi_worker)."""
  one = [sys.executable, "-m", "ctl.cli", "parity", options["path"], "--run-one",
         config.name, "--role", role, "--steps", str(options["steps"]),
         "--floor-samples", str(options["floor_samples"]), "--out", out]
  if options["seeds"] is not None:
    one += ["--seeds", ",".join(str(s) for s in options["seeds"])]
  if not options["float64"]:
    one.append("--no-float64")
  one += [arg for binding in options["bindings"] for arg in ("--gin", binding)]
  if options["experiment"]:
    one += ["--experiment", options["experiment"]]
  if config.strategy == "multi_worker":  # a short grace: a stopped run has nothing to save
    one = [sys.executable, "-m", "ctl.cli", "launch", "--workers", str(config.replicas),
           "--grace", "3", "--"] + one
  # Each run is a cluster of its own (or none).
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "CLUSTER_SPEC")}
  env.update(launch.stopped_with_this_process(grace=3))  # nothing to save
  # Output to a file, not a pipe: a pipe nobody reads while others run would fill.
  with open(out + ".log", "w") as log:  # the child has its own copy
    return subprocess.Popen(one, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(proc, out, timeout):
  """What a finished (or timed-out) process left, as `_run_processes` returns it."""
  timed_out = proc.poll() is None
  stop_groups([proc])
  if timed_out:
    return f"took more than {timeout:g} s"
  if proc.returncode != 0 or not os.path.exists(out):
    with open(out + ".log") as f:
      return _last_error(f.read()) or f"exited {proc.returncode}"
  with open(out + ".json") as f:
    about = json.load(f)
  runs = {}
  with np.load(out) as arrays:
    for key in arrays.files:
      seed, label, name = key.split("|", 2)
      runs.setdefault(seed, {}).setdefault(label, {})[name] = arrays[key]
  return runs, about


def stop_groups(procs: list[subprocess.Popen]) -> None:
  """SIGTERM to `procs`' process groups, SIGKILL to what is left after 10 s; reaps
  them. Ctrl-C, SIGTERM and SIGHUP wait until it is done: nothing outlives `check`."""
  stopping = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
  blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
  try:
    _signal_groups(procs, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in procs:
      try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        break
    _signal_groups(procs, signal.SIGKILL)  # what is left of the groups
    for proc in procs:
      proc.wait()
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _signal_groups(procs, signum):
  for proc in procs:
    try:
      os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
      pass  # all gone


def _last_error(output):
  """The exception a run's output ends with (its last one, with what follows)."""
  lines = [line for line in output.splitlines()
           if line.strip() and not line.startswith(("I0000", "W0000", "WARNING: All"))]
  starts = [i for i, line in enumerate(lines)
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\w*: ", line)]
  if starts:
    return "\n".join(lines[starts[-1]:][:12])
  return "\n".join(lines[-12:])
