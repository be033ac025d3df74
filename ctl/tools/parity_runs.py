"""What one `ctl parity` process runs: a configuration's runs, their state, and
the step's analysis.

    parity_runs.run_one("my_gan.py", parity.Config.parse("mirrored:2"), 10, "out.npz",
                        seeds=[0, 1])

`ctl.tools.parity.check` starts a process per configuration (`ctl parity ... --run-one
CONFIG`), which calls `run_one` and writes every run's state for `check` to compare.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import traceback
import warnings
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from ctl.base import sources
from ctl.tools import parity


def run_one(path: str, config: parity.Config, steps: int, out: str, *, role: str = "config",
            seeds: Sequence[int] | None = None, float64: bool = True,
            floor_samples: int = parity.FLOOR_SAMPLES, bindings: Sequence[str] = (),
            experiment: str | None = None) -> None:
  """Trains the module's (or the .gin file's experiment's) step `steps` steps under
  `config`, once per seed (None: its own), and writes each run's `state_arrays` to
  `out` (npz, keys `<seed>|<run label>|<key>`), with a JSON sidecar: `describe`,
  and per seed the runs that failed and what `analyze` found.

  Roles: "config" runs "main" and its float64 replay "main64"; "reference" also
  analyzes the step and runs the floors (`parity.perturb`): "floor64-0", and
  "floor-0" if float64 can decide, else `floor_samples` of them; "floors" runs
  "floor-1" on. A float64 run that fails is recorded, not raised.
  """
  import ctl  # pylint: disable=import-outside-toplevel

  # The strategy first: the module or the gin file may run TensorFlow ops.
  strategy = ctl.make_strategy(
      config.strategy,
      logical_cpus=config.replicas if config.strategy in ("mirrored", "central_storage")
      else None)
  make = _runner_factory(path, strategy, dict(config.options), bindings, experiment)
  arrays, about = {}, {"seeds": {}}
  compiled = {}  # float64 -> a compiled runner, started anew for each later seed

  def runner_for(seed, float64):
    """A new runner, or the compiled first one `start_as` it: tracing is the cost."""
    with _in_precision(float64):
      runner = make(seed, float64)
    traced = compiled.get(float64)
    if traced is not None and start_as(traced, runner):
      return traced
    if not runner.eager:
      compiled[float64] = runner
    return runner

  def train(seed, label, initial=None, *, float64=False, perturbation=None, runner=None):
    """`label`'s runner (or a new one), trained from `initial` weights (perturbed for
    a floor run), its state kept; None if a float64 run failed."""
    try:
      runner = runner or runner_for(seed, float64)
      with _in_precision(float64):
        with strategy.scope():
          if initial is not None:
            for variable, value in zip(_model_variables(runner), initial):
              variable.assign(np.asarray(value, variable.dtype))
          if perturbation is not None:
            parity.perturb(runner.models, perturbation)
        history = runner.train(steps)
    except Exception as e:  # pylint: disable=broad-except
      compiled.pop(float64, None)  # a failed run's runner is not reused
      if not float64:
        raise
      found["errors"][label] = _one_line(e)
      return None
    arrays.update({f"{seed}|{label}|{k}": v
                   for k, v in state_arrays(runner, history).items()})
    if "paths" not in about:
      about.update(describe(runner))
    return runner

  analysis = None
  for seed in seeds if seeds is not None else [None]:
    found = about["seeds"].setdefault(str(seed), {"errors": {}})
    if role == "floors":
      for i in range(1, floor_samples):
        train(seed, f"floor-{i}", perturbation=i)
      continue
    # The float64 replay starts from the float32 run's initial weights: Keras'
    # initializers draw other numbers in float64.
    runner = runner_for(seed, False)
    initial = [v.numpy() for v in _model_variables(runner)]
    train(seed, "main", runner=runner)
    runner64 = train(seed, "main64", initial, float64=True) if float64 else None
    if role != "reference":
      continue
    if analysis is None:  # the step's graph is the same for every seed
      traced = runner64
      if float64 and traced is None:  # a new float64 runner's trace shows what made float32
        with contextlib.suppress(Exception):  # it fails to build: its error says why
          traced = runner_for(seed, True)
      with _in_precision(traced is not None):
        analysis = analyze(traced or runner)
    found["analysis"] = analysis
    decides = (runner64 is not None and not parity.float64_blockers(analysis) and
               train(seed, "floor64-0", initial, float64=True, perturbation=0) is not None)
    for i in range(1 if decides else floor_samples):
      train(seed, f"floor-{i}", perturbation=i)
  if ctl.worker(strategy).is_chief:  # the chief, under multi_worker
    np.savez(out, **arrays)
    with open(out + ".json", "w") as f:
      json.dump(about, f)


def _in_precision(float64):
  """What a float64 replay runs in: every float the module names made float64
  (`_tf_internal.promoted_to_float64`), so that it needs no edit."""
  if float64:
    from ctl.base import _tf_internal  # pylint: disable=import-outside-toplevel
    return _tf_internal.promoted_to_float64()
  return contextlib.nullcontext()


def start_as(runner: Any, new: Any) -> bool:
  """Puts the traced `runner` where `new`, a new runner of the same step, starts
  (variables, draws' key, data position), to train as `new` would, to the bit.
  Returns False, having changed nothing, where the data's position cannot be
  carried over (a dataset function, a stateful op) or the variables differ."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  position, new_position = (r.feed.iterator if r.feed.checkpointable else None
                            for r in (runner, new))
  if position is None or new_position is None:
    return False
  mine, theirs = ([*tf.nest.flatten(r.state.variables()), r.state.draw_key]
                  for r in (runner, new))
  if [(v.dtype, tuple(v.shape)) for v in mine] != [(v.dtype, tuple(v.shape))
                                                   for v in theirs]:
    return False
  with tempfile.TemporaryDirectory(prefix="ctl-parity-start-") as directory:
    start = os.path.join(directory, "start")
    try:
      tf.train.Checkpoint(data=new_position).write(start)
    except tf.errors.OpError:
      return False
    tf.train.Checkpoint(data=position).read(start).assert_consumed()
  with runner.strategy.scope():
    for variable, value in zip(mine, theirs):
      variable.assign(tf.convert_to_tensor(value))
  runner.seed = new.seed  # (the draws' key came with the variables)
  return True


def _model_variables(runner):
  """Every variable of the runner's models, each once, in order."""
  return [v for key, _, v in _keyed_variables(runner) if not key.startswith("optimizer:")]


def _keyed_variables(runner):
  """(key, path, variable) of every model variable (one shared by two models once,
  under the first) and every optimizer variable, in order (see `parity.Arrays`).
  By position: a layer's name depends on how many Keras made before it."""
  keyed, seen = [], set()
  for name, model in runner.models.items():
    for i, variable in enumerate(model.variables):
      if id(variable) not in seen:
        seen.add(id(variable))
        keyed.append((f"{name}/{i}", f"{name}/{variable.path}", variable))
  model_paths = [v.path for m in runner.models.values() for v in m.variables]
  for name, optimizer in runner.optimizers.items():
    for i, variable in enumerate(optimizer.variables):
      keyed.append((f"optimizer:{name}/{_slot(variable.path, model_paths)}/{i}",
                    f"optimizer {name}: {variable.path}", variable))
  return keyed


def _runner_factory(path, strategy, options, bindings, experiment):
  """(seed, float64) -> a fresh runner of the step (seed None: the module's own)."""
  import keras  # pylint: disable=import-outside-toplevel

  import ctl  # pylint: disable=import-outside-toplevel
  if path.endswith(".gin"):  # the runner its experiment's build method makes
    from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
    experiments.require_config_file(path)
    experiment, maker = experiments.load(path, bindings, experiment)
    base = experiments.make_experiment(maker, experiment, needs=("build",)).build(
        strategy=strategy)
    unused = [base]

    def make(seed, float64):
      changed = dict(options, **({"mixed_precision": "float64"} if float64 else {}),
                     **({} if seed is None else {"seed": seed}))
      if unused and not changed:
        return unused.pop()  # the experiment's own runner
      unused.clear()
      return base.with_options(**changed)

    return make
  parity.load_module(path)  # a mistake in it fails here, before any run

  def make(seed, float64):
    module = parity.load_module(path)  # anew: no Python state from an earlier run
    seed = getattr(module, "seed", 0) if seed is None else seed
    # TF combines a shuffle's seed with the global seed, which the runner before
    # this one set: every run of a seed builds its data under that seed instead.
    keras.utils.set_random_seed(seed)
    return ctl.Runner(module.train_step, module.build, module.data(), strategy=strategy,
                      seed=seed,
                      batches_per_step=getattr(module, "batches_per_step", 1),
                      mixed_precision="float64" if float64 else None, **options)

  return make


def state_arrays(runner: Any, history: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Everything a run trained, by key (`parity.Arrays`): logged values, model and
  optimizer variables, and the step counter."""
  arrays = {f"loss/{k}": np.asarray(v) for k, v in history.items()}
  arrays.update((key, np.asarray(v.numpy())) for key, _, v in _keyed_variables(runner))
  arrays["counter:step"] = np.asarray(runner.global_step.numpy())
  return arrays


def _slot(path, model_paths):
  """An optimizer variable's slot ("momentum") or own name ("iteration"): Keras names
  a slot `<optimizer>/<model variable's path with _ for />_<slot>`."""
  name = path.split("/", 1)[-1]
  for model_path in sorted(model_paths, key=len, reverse=True):
    prefix = model_path.replace("/", "_") + "_"
    if name.startswith(prefix):
      return name[len(prefix):]
  return name.replace("/", "_")


def describe(runner: Any) -> dict[str, Any]:
  """What the report names: each key's variable path ("paths"), and per model its
  layers that draw or average per replica ("layers") and that compute batch
  statistics ("statistics")."""
  import keras  # pylint: disable=import-outside-toplevel
  paths = {key: path for key, path, _ in _keyed_variables(runner)}
  paths["counter:step"] = "step counter"
  drawing = (keras.layers.Dropout, keras.layers.GaussianNoise, keras.layers.GaussianDropout,
             keras.layers.SpatialDropout1D, keras.layers.SpatialDropout2D)
  layers, statistics = {}, {}
  for name, model in runner.models.items():
    layers[name], statistics[name] = [], []
    for layer in _layers(model):
      kind = type(layer).__name__
      if isinstance(layer, keras.layers.BatchNormalization):
        synchronized = getattr(layer, "synchronized", False)
        statistics[name].append(kind + (" synchronized" if synchronized else ""))
        if not synchronized:  # it averages over the replica's rows only
          layers[name].append(kind)
      elif isinstance(layer, drawing):
        layers[name].append(kind)
  optimizers = {name: type(getattr(o, "inner_optimizer", o)).__name__
                for name, o in runner.optimizers.items()}
  return {"paths": paths, "layers": layers, "statistics": statistics,
          "optimizers": optimizers}


def _layers(model):
  seen, stack = [], [model]
  while stack:
    layer = stack.pop()
    if any(layer is s for s in seen):
      continue
    seen.append(layer)
    stack.extend(getattr(layer, "layers", []) or [])
  return seen


# Reductions whose result can depend on how the batch is split.
_REDUCTIONS = {"Sum", "Mean", "Max", "Min", "Prod", "EuclideanNorm"}
# Ops that change a variable: what the step's updates are made of.
_UPDATES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
            "ResourceApply", "ResourceScatter")


def analyze(runner: Any) -> dict[str, Any]:
  """What the step's graph, traced once on one batch, shows:

  * "float32_variables": model variables that a float64 run keeps narrower;
  * "float32_made": in a float64 run, the user's lines (with the op) that made
    a float32 the replay could not widen (e.g. tf.image.resize);
  * "batch_reductions": the user's lines that reduce over the batch axis a
    value that feeds an update;
  * "micro_batches": whether an update accumulates over micro-batches;
  * "draws": `sources.layout_dependent_draws`;
  * "error": why the step could not be traced, if it could not.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  from ctl.base import _tf_internal  # pylint: disable=import-outside-toplevel
  found = {"float32_variables": [], "float32_made": [], "batch_reductions": [],
           "micro_batches": False, "draws": [], "error": None}
  made = {}  # a line -> its first op that made float32 (what follows only passes it on)
  float64 = any(v.dtype == "float64" for m in runner.models.values() for v in m.weights)
  if float64:
    found["float32_variables"] = sorted(
        f"{name}/{v.path} ({v.dtype})" for name, m in runner.models.items()
        for v in m.weights if v.dtype in ("float32", "float16", "bfloat16"))
  graphs = []  # the graph being traced: kept if tracing fails

  def replica_step(batch, step):
    graphs.append(tf.compat.v1.get_default_graph())
    return runner.compiled_step.replica_step(batch, step)

  batch_size = runner.feed.global_batch_size or 0
  try:
    batch = runner.feed.next(runner.feed.make_iterator())
    step = runner.global_step.read_value()
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # found below, and reported as causes
      tf.function(lambda: runner.strategy.run(replica_step, args=(batch, step)),
                  autograph=False).get_concrete_function()
  except Exception as e:  # pylint: disable=broad-except
    found["error"] = _one_line(e)
  if not graphs:
    return found
  found["draws"] = sources.layout_dependent_draws(graphs[0], batch_size)
  for graph in [graphs[0]] + _tf_internal.function_graphs(graphs[0]):
    feeds_updates = _ancestors_of_updates(graph)
    for op in graph.get_operations():
      frames = _tf_internal.op_stack(op)
      if any(getattr(f, "name", "") == "_micro_batch" for f in frames):
        found["micro_batches"] = True
      if float64 and op.type not in _PASSED_ON and any(
          t.dtype in (tf.float32, tf.float16, tf.bfloat16) for t in op.outputs):
        line = sources.user_line(frames)
        if line:
          made.setdefault(line, f"{line} ({op.type})")
      elif (op.type in _REDUCTIONS and op in feeds_updates and
            _over_examples(op, batch_size) and not _is_gradient(op) and
            any(c in feeds_updates for c in op.outputs[0].consumers())):
        line = sources.user_call(frames)
        if line:
          found["batch_reductions"].append(f"{line} ({op.type} over the batch axis)")
  found["batch_reductions"] = list(dict.fromkeys(found["batch_reductions"]))
  found["float32_made"] = list(made.values())
  return found


# Ops that pass on a narrower float made elsewhere (a variable's: "float32_variables").
_PASSED_ON = {"ReadVariableOp", "Placeholder", "Identity"}


def _ancestors_of_updates(graph):
  """The ops of `graph` that an update of a variable depends on."""
  stack = [op for op in graph.get_operations() if op.type.startswith(_UPDATES)]
  seen = set(stack)
  while stack:
    op = stack.pop()
    for parent in [t.op for t in op.inputs] + list(op.control_inputs):
      if parent not in seen and parent.graph is graph:
        seen.add(parent)
        stack.append(parent)
  return seen


def _over_examples(op, batch_size):
  """Whether `op` reduces axis 0 of a batch (or micro-batch) of examples."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  values, axes = op.inputs[0], tf.get_static_value(op.inputs[1])
  rows = values.shape[0] if values.shape.rank else None
  if axes is None or not rows or rows < 2 or not batch_size or batch_size % rows:
    return False
  return 0 in {int(a) % values.shape.rank for a in np.reshape(axes, [-1])}


def _is_gradient(op):
  """Whether TF made `op` to compute a gradient (under a tape's name scope)."""
  return "gradient_tape/" in op.name or op.name.startswith("gradients")


def _one_line(error):
  """An exception as `Type: its first line`, and the user's line that raised it."""
  text = str(error).strip().splitlines()
  where = sources.user_line(traceback.extract_tb(error.__traceback__))
  return (f"{type(error).__name__}: {text[0] if text else ''}"[:300]
          + (f", at {where}" if where else ""))
