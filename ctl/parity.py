"""Parity: does a strategy switch change a run's numbers by more than float rounding?

    report = ctl.parity.check("my_gan.py", ["compiled", "mirrored:2"], steps=10)
    print(report)                 # per model and variable: difference, floor, verdict
    report.ok                     # every configuration within rounding

    ctl parity my_gan.py --against compiled,mirrored:2,multi_worker:2 --steps 10

"The same numbers" cannot mean bit for bit: a strategy sums a gradient over
replicas in another order, oneDNN picks kernels by shape, XLA fuses. It means:

1. One step from the same state agrees to float rounding: each variable's
   largest difference, relative to the largest weight of its model, within
   `ONE_STEP_TOLERANCE` (a small multiple of float32's epsilon).
2. Over many steps, the difference a configuration makes is no larger than
   what float rounding alone makes. The *rounding floor* is measured, not
   assumed: the reference run again with every initial weight moved by one
   unit in the last place (`perturb`), a change no strategy can be blamed for.
   Training amplifies both differences alike, so a configuration is within
   rounding when its difference is at most `FLOOR_FACTOR` times the floor, or
   within `ONE_STEP_TOLERANCE` per step trained: each step can add a
   rounding that a moved weight does not reproduce (a gradient that sums to
   exactly 0 on one device and to 4e-9 over two replicas, which Adam turns
   into a step of its own).

A difference past that is a bug, and `diagnose` names the likely one from the
evidence: a loss scaled by the replica count, draws made per replica
(noise not from `ctx.normal`, Keras Dropout, unsynchronised batch norm), or a
step that is not deterministic on its own (an unseeded Python-side draw).

The user's module provides `build()`, `step(ctx, batch)` and `data()` (a
function returning a dataset of global batches), and may set
`batches_per_step` and `seed`; or a .gin file describes an experiment, whose
runner (its build method) runs with each configuration's options. Each
configuration runs in its own process (`ctl parity` runs `python -m ctl.cli
parity --run-one ...` for each), since TensorFlow fixes its devices and
collectives once per process.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

FLOAT32_EPSILON = float(np.finfo(np.float32).eps)  # 1.19e-7
# One step from the same state: a few roundings of each sum, relative.
ONE_STEP_TOLERANCE = 16 * FLOAT32_EPSILON
# Rounding differences grow through training at the same rate from either
# cause; a factor of 10 leaves room for the spread between two such pairs
# (measured in README's parity table) and none for a real difference, which
# starts at 1e-3 or more at the first step.
FLOOR_FACTOR = 10.0

REFERENCE = "eager"  # the eager default strategy: the step as written
FLOOR = "floor"  # the reference with its initial weights moved by one ulp
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


@dataclasses.dataclass(frozen=True)
class Row:
  """One variable (or one logged value over the steps) of one configuration.

  `difference` and `floor` are the largest absolute differences from the
  reference, divided by the largest weight of the variable's model (a logged
  value's: its largest value).
  """
  config: str
  key: str  # "model/variable path" (in `check`'s report), or "loss/<result key>"
  difference: float
  floor: float
  steps: int = 1  # steps trained

  @property
  def tolerance(self) -> float:
    return max(FLOOR_FACTOR * self.floor, ONE_STEP_TOLERANCE * self.steps)

  @property
  def ok(self) -> bool:
    return bool(self.difference <= self.tolerance)


@dataclasses.dataclass
class Report:
  """What `check` found: a row per configuration and variable, and per failing
  configuration its likely causes."""
  rows: list[Row]
  causes: dict[str, list[str]]
  errors: dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def ok(self) -> bool:
    return not self.errors and all(r.ok for r in self.rows)

  def worst(self, config: str) -> Row:
    """The row of `config` furthest past its tolerance (or closest to it)."""
    rows = [r for r in self.rows if r.config == config]
    return max(rows, key=lambda r: r.difference / r.tolerance)

  def __str__(self) -> str:
    return format_report(self)


def compare(reference: Mapping[str, np.ndarray], floor: Mapping[str, np.ndarray],
            runs: Mapping[str, Mapping[str, np.ndarray]]) -> list[Row]:
  """A row per configuration in `runs` and per key of `reference`.

  A variable's difference is relative to the largest weight of its model
  (keys `model/...`), so that a bias that training brings near zero is judged
  on the model's scale, not its own; a logged value's (`loss/...`) to its
  largest value over the steps.

  Args:
    reference: the reference run's arrays (`run_one`'s output), by key.
    floor: the same run with its initial weights perturbed (`perturb`).
    runs: configuration name -> its arrays.
  """
  scales = _scales(reference)
  # The steps trained: the length of a logged value's history.
  steps = max([np.size(v) for k, v in reference.items() if k.startswith("loss/")] or [1])
  rows = []
  for config, run in runs.items():
    missing = sorted(set(reference) ^ set(run))
    if missing:
      raise ValueError(f"parity: configuration {config!r} has other variables or "
                       f"results than the reference: {missing[:5]}")
    for key in reference:
      scale = scales[key]
      rows.append(Row(config, key, relative_difference(reference[key], run[key], scale),
                      relative_difference(reference[key], floor[key], scale), steps))
  return rows


def _scales(reference):
  """key -> the magnitude its differences are divided by."""
  largest = {k: float(np.max(np.abs(np.asarray(v, np.float64)), initial=0.0))
             for k, v in reference.items()}
  by_model = {}
  for key, value in largest.items():
    if not key.startswith("loss/") and np.isfinite(value):
      model = key.split("/")[0]
      by_model[model] = max(by_model.get(model, 0.0), value)
  return {k: largest[k] if k.startswith("loss/") else by_model.get(k.split("/")[0], 0.0)
          for k in reference}


def relative_difference(reference: np.ndarray, other: np.ndarray,
                        scale: float | None = None) -> float:
  """max |other - reference| / scale (default max |reference|; absolute if 0)."""
  reference = np.asarray(reference, np.float64)
  other = np.asarray(other, np.float64)
  if reference.shape != other.shape:
    return float("inf")
  if not (np.isfinite(reference).all() and np.isfinite(other).all()):
    same = np.array_equal(reference, other, equal_nan=True)
    return 0.0 if same else float("inf")
  if scale is None:
    scale = float(np.max(np.abs(reference), initial=0.0))
  difference = float(np.max(np.abs(other - reference), initial=0.0))
  return difference / scale if scale > 0 else difference


def perturb(models: Mapping[str, Any]) -> None:
  """Moves every floating-point weight of `models` by one unit in the last place
  (towards +inf): the smallest change there is, to measure the rounding floor."""
  for model in models.values():
    for variable in model.weights:
      value = np.asarray(variable.numpy())
      if np.issubdtype(value.dtype, np.floating):
        variable.assign(np.nextafter(value, np.array(np.inf, value.dtype)))


def diagnose(config: Config, rows: Sequence[Row], reference: Mapping[str, np.ndarray],
             floor: Mapping[str, np.ndarray], run: Mapping[str, np.ndarray],
             layers: Mapping[str, list[str]]) -> list[str]:
  """The likely causes of a configuration's difference, from the evidence.

  Args:
    config: the configuration.
    rows: its rows (`compare`).
    reference, floor, run: the arrays of the reference, the floor run and it.
    layers: model name -> the kinds of its layers that draw or average per
      replica ("Dropout", "BatchNormalization"), as `run_one` records them.
  """
  if all(r.ok for r in rows):
    return []
  causes = []
  losses = [k for k in reference if k.startswith("loss/")]
  first = {k: (float(reference[k][0]), float(run[k][0])) for k in losses
           if np.size(reference[k]) and np.isfinite(run[k][0])}
  floor_first = {k: float(floor[k][0]) for k in first if np.size(floor[k])}
  # One ulp moves a loss by about epsilon; an unseeded draw moves it by its own size.
  if any(abs(floor_first[k] - r) > 1e-4 * (1 + abs(r))
         for k, (r, _) in first.items() if k in floor_first):
    causes.append(
        "the step is not deterministic on its own: the floor run, eager like the "
        "reference, already differs at the first step. Look for a draw that ctl "
        "does not seed: np.random or random in the step, tf.random.normal without "
        "a seed (use ctx.normal, ctx.uniform or ctx.seed()).")
  replicas = config.replicas if config.strategy != "default" else 1
  if replicas > 1:
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
    drawn = sorted(f"{m} ({', '.join(sorted(set(kinds)))})" for m, kinds in layers.items()
                   if kinds)
    first_differs = any(abs(c - r) > 1e-5 * (1 + abs(r)) for r, c in first.values())
    if drawn:
      causes.append(
          "layers that work per replica: " + "; ".join(drawn) + ". Keras Dropout "
          "draws its own mask on each replica, and BatchNormalization averages over "
          "each replica's rows only (use synchronized=True, or draw the mask with "
          "ctx.uniform).")
    if first_differs and not causes:
      causes.append(
          f"the first step already differs with {replicas} replicas: something is "
          "computed per replica. Most often noise drawn without ctx.normal/"
          "ctx.uniform (tf.random.* with the replica's own batch size draws the same "
          "rows on every replica), or a value taken from the replica's batch alone.")
  if not causes:
    options = dict(config.options)
    if options.get("jit_compile"):
      causes.append("only with XLA: an op XLA computes differently (look at "
                    "reductions over large tensors), or randomness in a Keras layer.")
    elif config.strategy == "default" and replicas == 1:
      causes.append(
          "compiling alone changes it: a draw that ctl does not make (tf.random.* "
          "ops draw other numbers compiled than eagerly; use ctx.normal, ctx.uniform "
          "or ctx.seed()), a Python value frozen when the step was traced (np.random, "
          "random, time, a Python counter), or a Python branch on a tensor's value.")
    else:
      causes.append("no known cause matched: compare the first step's results "
                    "and each model's variables to see where it starts.")
  return causes


def format_report(report: Report) -> str:
  """A table: per configuration, its worst variable against the rounding floor,
  and the variables past tolerance; then the causes."""
  lines = [f"{'configuration':28} {'worst variable':40} {'difference':>10} "
           f"{'floor':>9} {'verdict':>8}"]
  configs = list(dict.fromkeys(r.config for r in report.rows))
  for config in configs:
    row = report.worst(config)
    verdict = "rounding" if all(r.ok for r in report.rows if r.config == config) else "DIFFERS"
    lines.append(f"{config:28} {row.key[:40]:40} {row.difference:10.2e} "
                 f"{row.floor:9.2e} {verdict:>8}")
  for config, error in report.errors.items():
    lines.append(f"{config:28} failed: {error}")
  for config in configs:
    bad = [r for r in report.rows if r.config == config and not r.ok]
    if bad:
      lines.append("")
      lines.append(f"{config}: {len(bad)} of "
                   f"{sum(r.config == config for r in report.rows)} past tolerance, e.g.")
      for r in sorted(bad, key=lambda r: -r.difference / r.tolerance)[:5]:
        lines.append(f"  {r.key}: {r.difference:.2e} (tolerance {r.tolerance:.2e})")
      for cause in report.causes.get(config, []):
        lines.append(f"  likely: {cause}")
  lines.append("")
  steps = report.rows[0].steps if report.rows else 1
  lines.append(f"difference and floor: max |x - reference| per variable / its model's "
               f"largest weight (a logged value: its largest); within rounding when <= "
               f"max({FLOOR_FACTOR:g} x floor, {ONE_STEP_TOLERANCE:.1e} x {steps} steps).")
  return "\n".join(lines)


_NEEDED = ("build", "step", "data")


def check_module(path: str) -> None:
  """Checks, without importing it (which would start TensorFlow here), that
  `path` is a Python file defining `build`, `step` and `data` at its top level,
  or the name of a module that can be found."""
  if path.endswith(".gin"):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"parity: no file {path!r}; give the path of a .gin file "
                              "(or of a Python file that defines build, step and data).")
    return
  if not (path.endswith(".py") or os.sep in path):
    if importlib.util.find_spec(path) is None:
      raise FileNotFoundError(f"parity: no module {path!r}; give a Python file's path "
                              "or an importable module name.")
    return
  if not os.path.isfile(path):
    raise FileNotFoundError(f"parity: no file {path!r}; give the path of a Python "
                            "file that defines build, step and data.")
  with open(path) as f:
    tree = ast.parse(f.read(), filename=path)
  defined = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      defined.add(node.name)
    elif isinstance(node, ast.Assign):
      defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      defined.update((a.asname or a.name).split(".")[0] for a in node.names)
  _require_parts(path, [n for n in _NEEDED if n not in defined])


def _require_parts(path, missing):
  if missing:
    raise AttributeError(
        f"parity: {path} does not define {', '.join(missing)}: a parity module "
        "defines build() -> (models, optimizers), step(ctx, batch) -> dict and "
        "data() -> a dataset of global batches (and may set batches_per_step, seed).")


def load_module(path: str) -> Any:
  """The user's module, from a file path (`my_gan.py`) or a module name."""
  if path.endswith(".py") or os.sep in path:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"parity: no file {path!r}; give the path of a Python "
                              "file that defines build, step and data.")
    name = os.path.splitext(os.path.basename(path))[0]
    # As `python path` would: the file's own folder first on the path, so
    # that it can import the modules beside it.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  else:
    module = importlib.import_module(path)
  _require_parts(path, [n for n in _NEEDED if not callable(getattr(module, n, None))])
  return module


def run_one(path: str, config: Config, steps: int, out: str, *,
            perturbed: bool = False, bindings: Sequence[str] = (),
            experiment: str | None = None) -> None:
  """Trains the module's step (or the experiment's, for a .gin file) for `steps`
  steps under `config` in this process and writes every step's results and
  every variable to `out` (npz), with a JSON sidecar naming the layers that
  work per replica.

  The strategy is made first, before the module is imported or the gin file
  parsed (either may run TensorFlow ops).
  """
  import ctl  # pylint: disable=import-outside-toplevel
  strategy = ctl.make_strategy(
      config.strategy,
      logical_cpus=config.replicas if config.strategy in ("mirrored", "central_storage")
      else None)
  if path.endswith(".gin"):
    runner = _experiment_runner(path, strategy, bindings, experiment)
    if config.options:
      runner = runner.with_options(**dict(config.options))
  else:
    module = load_module(path)
    runner = ctl.Runner(module.step, module.build, module.data(), strategy=strategy,
                        seed=getattr(module, "seed", 0),
                        batches_per_step=getattr(module, "batches_per_step", 1),
                        **dict(config.options))
  if perturbed:
    with strategy.scope():
      perturb(runner.models)
  history = runner.train(steps)
  arrays = {f"loss/{k}": np.asarray(v) for k, v in history.items()}
  layers, paths = {}, {}
  seen = set()  # a layer shared by two models is compared once, under the first
  for name, model in runner.models.items():
    # By position: a layer's name depends on how many Keras made before it.
    for i, variable in enumerate(model.weights):
      if id(variable) in seen:
        continue
      seen.add(id(variable))
      arrays[f"{name}/{i}"] = np.asarray(variable.numpy())
      paths[f"{name}/{i}"] = f"{name}/{variable.path}"
    layers[name] = [type(layer).__name__ for layer in _layers(model)
                    if _works_per_replica(layer)]
  if strategy.extended.should_checkpoint:  # the chief, under multi_worker
    np.savez(out, **arrays)
    with open(out + ".json", "w") as f:
      json.dump({"layers": layers, "paths": paths}, f)


def _experiment_runner(path, strategy, bindings, name):
  """The runner of the experiment a .gin file describes (its build method)."""
  from ctl import experiments  # pylint: disable=import-outside-toplevel
  experiments.require_config_file(path)
  name = name or experiments.default_experiment()
  make = experiments.resolve_experiment(name)
  experiments.parse_gin([path], bindings)
  return experiments.make_experiment(make, name, needs=("build",)).build(strategy=strategy)


def _layers(model):
  seen, stack = [], [model]
  while stack:
    layer = stack.pop()
    if any(layer is s for s in seen):
      continue
    seen.append(layer)
    stack.extend(getattr(layer, "layers", []) or [])
  return seen


def _works_per_replica(layer):
  import keras  # pylint: disable=import-outside-toplevel
  if isinstance(layer, keras.layers.BatchNormalization):
    return not getattr(layer, "synchronized", False)
  return isinstance(layer, (keras.layers.Dropout, keras.layers.GaussianNoise,
                            keras.layers.GaussianDropout, keras.layers.SpatialDropout1D,
                            keras.layers.SpatialDropout2D))


def check(path: str, configs: Sequence[str], *, steps: int = 10,
          timeout: float = 900, bindings: Sequence[str] = (),
          experiment: str | None = None) -> Report:
  """Runs the module's step under the eager reference, the floor run and each of
  `configs`, each in a process of its own, and compares them.

  Args:
    path: a Python file (or module name) defining `build`, `step` and `data`;
      or a .gin file, whose experiment's runner (its build method) is run with
      each configuration's options (`Runner.with_options`).
    configs: configuration names (`Config.parse`), e.g. ["compiled", "mirrored:2"].
    steps: steps each run trains.
    timeout: seconds a run may take before it counts as failed.
    bindings: gin bindings for a .gin file (as `ctl train --gin`).
    experiment: for a .gin file, what makes the experiment (as `ctl train
      --experiment`); default: the installed one.

  Returns:
    A `Report`; `print` it for the table.
  """
  parsed = [Config.parse(c) for c in configs]
  if steps < 1:
    raise ValueError(f"parity: steps must be an int >= 1, got {steps!r}.")
  with tempfile.TemporaryDirectory(prefix="ctl-parity-") as directory:
    outputs, errors = {}, {}
    runs = [(REFERENCE, Config.parse(REFERENCE), False),
            (FLOOR, Config.parse(REFERENCE), True)] + [(c.name, c, False) for c in parsed]
    for name, config, perturbed in runs:
      out = os.path.join(directory, f"{len(outputs) + len(errors)}.npz")
      error = _run_process(path, config, steps, out, perturbed, timeout, bindings,
                           experiment)
      if error:
        errors[name] = error
      else:
        with open(out + ".json") as f:
          outputs[name] = (dict(np.load(out)), json.load(f))
  if REFERENCE in errors or FLOOR in errors:
    raise RuntimeError(f"parity: the eager reference run of {path} failed:\n"
                       f"{errors.get(REFERENCE) or errors.get(FLOOR)}")
  reference, about = outputs[REFERENCE]
  floor = outputs[FLOOR][0]
  compared = {c.name: outputs[c.name][0] for c in parsed if c.name in outputs}
  rows = compare(reference, floor, compared)
  causes = {c.name: diagnose(c, [r for r in rows if r.config == c.name], reference, floor,
                             outputs[c.name][0], about["layers"])
            for c in parsed if c.name in outputs}
  # Name variables by their paths in the reference run.
  rows = [dataclasses.replace(r, key=about["paths"].get(r.key, r.key)) for r in rows]
  # A difference that compiling on one device already makes shows again under
  # every strategy, which compiles too: it is the one to fix first.
  one_device = [c.name for c in parsed if causes.get(c.name) and c.strategy == "default"
                and "eager" not in dict(c.options)]
  for c in parsed:
    if causes.get(c.name) and c.strategy != "default" and one_device:
      causes[c.name].append(f"compiled on one device it differs already ({one_device[0]}, "
                            "above): fix that first.")
  return Report(rows, causes, errors)


def _run_process(path, config, steps, out, perturbed, timeout, bindings, experiment):
  """Runs `run_one` in a new process (under `ctl launch` for multi_worker);
  None, or the error it ended with.

  The process leads a process group of its own, and whatever stops this call
  (Ctrl-C, a SIGTERM turned into an exception, the timeout) stops the whole
  group: no run, launcher or worker outlives `check`.
  """
  one = [sys.executable, "-m", "ctl.cli", "parity", path, "--run-one", config.name,
         "--steps", str(steps), "--out", out] + (["--perturbed"] if perturbed else [])
  for binding in bindings:
    one += ["--gin", binding]
  if experiment:
    one += ["--experiment", experiment]
  if config.strategy == "multi_worker":
    # A short grace: a stopped parity run has nothing to save.
    command = [sys.executable, "-m", "ctl.cli", "launch", "--workers",
               str(config.replicas), "--grace", "3", "--"] + one
  else:
    command = one
  env = dict(os.environ)  # quiet unless CTL_VERBOSE: the run is a `ctl` command (ctl.cli.quiet)
  env.pop("TF_CONFIG", None)
  proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    return f"took more than {timeout:g} s"
  finally:
    _stop_group(proc)
  if proc.returncode != 0 or not os.path.exists(out):
    return _last_error(stderr + stdout) or f"exited {proc.returncode}"
  return None


def _stop_group(proc):
  """SIGTERM to `proc`'s process group, SIGKILL after 10 s; reaps `proc`.

  (`ctl launch` stops its workers, which lead groups of their own, within its
  --grace of 3 s.)
  """
  try:
    os.killpg(proc.pid, signal.SIGTERM)
  except (ProcessLookupError, PermissionError):
    pass  # all gone
  try:
    proc.wait(timeout=10)
  except subprocess.TimeoutExpired:
    pass
  try:
    os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()


def _last_error(output):
  """The exception a run's output ends with (its last one, with what follows)."""
  lines = [line for line in output.splitlines()
           if line.strip() and not line.startswith(("I0000", "W0000", "WARNING: All"))]
  starts = [i for i, line in enumerate(lines)
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\w*: ", line)]
  if starts:
    return "\n".join(lines[starts[-1]:][:12])
  return "\n".join(lines[-12:])
