"""The runner: builds models under a strategy and runs a per-replica step.

    def build():
      models = {"generator": make_generator(), "discriminator": make_discriminator()}
      optimizers = {"generator": keras.optimizers.Adam(2e-4),
                    "discriminator": keras.optimizers.Adam(2e-4)}
      return models, optimizers

    runner = ctl.Runner(step, build, dataset, strategy="mirrored", steps_per_loop=10)
    history = runner.train(1000)   # {"generator_loss": array of 1000 values, ...}
    runner.fit(10_000, "runs/x")   # resumable: checkpoints, summaries, progress
    metrics = runner.evaluate(eval_step, eval_dataset)
    runner.export("generator", "runs/x/export")

The same `step` runs eagerly (`eager=True`: print and pdb work), compiled, or
distributed; only the `strategy` argument changes.
"""

import inspect
import os
import re
import shutil
import tempfile

import numpy as np
import tensorflow as tf
import keras

from ctl import _tf_internal
from ctl import data as data_lib
from ctl import loop as loop_lib
from ctl.context import StepContext
from ctl.strategies import is_parameter_server
from ctl.strategies import make_strategy

# Compiled evaluations kept (each holds a traced function and an input feed).
_EVALUATIONS_KEPT = 4

# Strategies whose gradient sum is a cross-replica merge_call, which XLA
# cannot compile: under them jit_compile compiles each update on its own.
_MERGE_CALL_STRATEGIES = (tf.distribute.MirroredStrategy,
                          tf.distribute.MultiWorkerMirroredStrategy)


class Runner:
  """Runs `step(ctx, batch)` on every replica, `steps_per_loop` steps per call.

  Results: the step returns a dict of scalars. A share of a global-batch mean
  (a value from `ctx.average`, `ctx.average_regularization` or `ctx.minimize`,
  or a sum or constant multiple of such values) is summed over replicas; a
  value that does not depend on one (a per-replica mean such as an accuracy)
  is averaged. Either way the logged number is the global-batch value. A value
  that mixes the two is an error (see `StepContext.reduction`).

  Args:
    step: function `(ctx, batch) -> dict` run in replica context; `ctx` is a
      `ctl.StepContext`, `batch` this replica's rows of the global batch (a
      tuple of `batches_per_step` of them when that is above 1).
    build: function of no arguments returning `(models, optimizers)`, two
      dicts of Keras models and optimizers; called inside the strategy scope.
      An optimizer is built on the model of the same name; one that updates
      something else must be built in `build` (`optimizer.build(variables)`).
    data: `tf.data.Dataset` of global batches, or a function of a
      `tf.distribute.InputContext` returning per-replica batches (then pass
      `global_batch_size`). See `ctl.data`.
    strategy: a `tf.distribute.Strategy` or a name for `ctl.make_strategy`.
      Under `parameter_server` this process is the coordinator: each step is
      scheduled on a free worker (asynchronous training), every worker reads
      its own copy of `data`, and `evaluate` is not available.
    seed: seeds the initial weights (`keras.utils.set_random_seed(seed)` runs
      just before `build`) and the per-example draws (`ctx.normal`, `ctx.uniform`).
    steps_per_loop: steps run inside one compiled call (an in-graph loop).
    jit_compile: compile the step with XLA; under `mirrored`/`multi_worker`
      each `ctx.minimize(loss_fn, ...)` is compiled instead (see there).
    eager: run the step as plain Python (for debugging); slow.
    mixed_precision: None, "mixed_float16" or "mixed_bfloat16"; sets Keras'
      global policy before `build`, and float16 wraps every optimizer in a
      `LossScaleOptimizer`.
    global_batch_size: needed only when `data` is a dataset function.
    batches_per_step: batches each step takes (e.g. one per critic update).
  """

  def __init__(self, step, build, data, *, strategy="default", seed=0,
               steps_per_loop=1, jit_compile=False, eager=False,
               mixed_precision=None, global_batch_size=None, batches_per_step=1):
    _require_positive_int("steps_per_loop", steps_per_loop)
    _require_positive_int("batches_per_step", batches_per_step)
    _require_int("seed", seed)
    if not callable(step):
      raise TypeError(f"step must be a function (ctx, batch) -> dict, got {step!r}.")
    if not callable(build):
      raise TypeError(f"build must be a function () -> (models, optimizers), got {build!r}.")
    _check_order(step, build)
    if mixed_precision not in (None, "mixed_float16", "mixed_bfloat16"):
      raise ValueError(f"mixed_precision {mixed_precision!r} is not known; use None, "
                       "'mixed_float16' or 'mixed_bfloat16'.")
    if eager and jit_compile:
      raise ValueError("eager=True and jit_compile=True contradict each other: XLA "
                       "compiles a graph, eager mode runs Python; pick one.")
    if isinstance(strategy, str):
      strategy = make_strategy(strategy)
    _check_supported(strategy, eager)
    self.strategy = strategy
    # Parameter-server training: this process coordinates; the workers run
    # the steps it schedules, asynchronously, each on its own copy of the data.
    self._coordinator = (
        tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        if is_parameter_server(strategy) else None)
    self.steps_per_loop = steps_per_loop
    self.eager = eager
    self._step_fn = step
    self._mixed_precision = mixed_precision
    self.seed = int(seed)
    # Data first: its checks are cheap, and fail before any model is built.
    self._feed = data_lib.make_feed(
        data, strategy, global_batch_size=global_batch_size,
        batches_per_step=batches_per_step, static_shapes=jit_compile,
        coordinator=self._coordinator)
    with strategy.scope():
      self.models, self.optimizers = self._build(build)
      # A plain tf.Variable: Keras 3 variables' assign_add is not atomic under
      # parameter servers (see TF field notes).
      self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="global_step")
    self._seed = tf.constant([self.seed, 0], tf.int64)
    self._reductions = {}  # result key -> ReduceOp, filled in when the step is traced
    self._evaluations = {}  # (eval step, data) -> (feed, compiled function, reductions)
    self._result_keys = None
    self._ran = False  # whether a call of the step has succeeded
    self._compile_update = None
    replica_step = self._replica_step
    if jit_compile and isinstance(strategy, _MERGE_CALL_STRATEGIES):
      self._compile_update = lambda fn: tf.function(fn, jit_compile=True)
    elif jit_compile and not isinstance(strategy, tf.distribute.TPUStrategy):
      # (A TPU compiles the whole step with XLA anyway.)
      replica_step = tf.function(self._replica_step, jit_compile=True)
    self._run_replicas = replica_step
    # Under parameter servers each scheduled call is one step on one worker.
    loop = self._one_step if self._coordinator is not None else self._loop_fn
    self._loop = None if eager else tf.function(loop)

  @property
  def global_batch_size(self):
    return self._feed.global_batch_size

  @property
  def examples_per_step(self):
    """Examples one step consumes over all replicas (None if unknown)."""
    size = self._feed.global_batch_size
    return None if size is None else size * self._feed.batches_per_step

  @property
  def data_iterator(self):
    """The training data's iterator if a checkpoint can hold it, else None."""
    return self._feed.iterator if self._feed.checkpointable else None

  def fit(self, num_steps, workdir=None, *, actions=None, progress=True):
    """Trains until the global step is `num_steps`; resumes from `workdir`.

    With a `workdir`, training starts from the newest checkpoint in
    `<workdir>/checkpoints` (if any) and by default checkpoints every 1000
    steps or 10 minutes and at the end, and writes TensorBoard scalars every
    100 steps to `<workdir>/events/train`; pass `ctl.Checkpoint(...)` or
    `ctl.Summaries(...)` in `actions` to change that. On SIGTERM it saves and
    exits with code 42 (`ctl.PREEMPTED_EXIT_CODE`); on Ctrl-C it saves and
    raises `ctl.Interrupted` (a second Ctrl-C quits at once); see
    `ctl.stopping`. One run at a time may write a work directory: another
    fails at once with `ctl.WorkdirInUse`. A NaN or Inf result stops training
    with a FloatingPointError before anything later is saved.

    Args:
      num_steps: the global step to train up to (not a number of new steps),
        so that rerunning the same call after an interruption finishes the run.
      workdir: directory for checkpoints, events, samples and exports; None
        writes nothing and does not resume.
      actions: periodic actions (see `ctl.actions`): `ctl.Checkpoint`,
        `ctl.Summaries`, `ctl.Samples`, `ctl.Evaluate`, `ctl.Export`, or your own.
      progress: show a progress bar (log lines when stderr is not a terminal).

    Returns:
      Each result key's per-step values for the steps this call ran (numpy).
    """
    return loop_lib.fit(self, num_steps, workdir, actions=actions, progress=progress)

  def evaluate(self, step, data, *, global_batch_size=None, num_batches=None):
    """Runs `step(ctx, batch)` over all of `data`; returns each result's mean.

    `step` returns a dict of scalars, reduced over replicas like a training
    step's results (so `ctx.average(per_example)` gives the batch mean); the
    batches' values are then averaged weighted by their size, which gives the
    mean over the whole dataset. `data` is a finite dataset of global batches
    (or a dataset function with `global_batch_size`), read from its start on
    every call; an endless one is refused unless `num_batches` bounds it.
    `ctx.step` is the current global step.
    """
    data_lib.check_evaluation_data(data, num_batches)
    if self._coordinator is not None:
      raise ValueError(
          "evaluate does not run under parameter_server: the coordinator only "
          "schedules training steps. Evaluate a checkpoint in another process "
          "under 'default' (e.g. `ctl eval`), or call the models directly in an "
          "action, as gan.ClassifierFID does.")
    key = (step, data, global_batch_size)
    if key not in self._evaluations:
      feed = data_lib.make_feed(data, self.strategy, global_batch_size=global_batch_size)
      self._evaluations[key] = (feed,) + self._evaluation_fn(step, feed)
      while len(self._evaluations) > _EVALUATIONS_KEPT:  # a new dataset per call
        del self._evaluations[next(iter(self._evaluations))]
    feed, fn, _ = self._evaluations[key]
    iterator = feed.make_iterator()
    totals, examples, batches = {}, 0.0, 0
    while num_batches is None or batches < num_batches:
      batches += 1
      try:
        results, rows = fn(iterator)
      except tf.errors.OutOfRangeError:
        break
      rows = float(rows)
      for k, v in results.items():
        totals[k] = totals.get(k, 0.0) + float(v) * rows
      examples += rows
    if not examples:
      raise ValueError("evaluate: data gave no batch; pass a dataset with at least "
                       "one (and without .repeat(), which never ends).")
    return {k: v / examples for k, v in totals.items()}

  def _evaluation_fn(self, step_fn, feed):
    reductions = {}

    def replica(batch, step):
      results = self._replica_step(batch, step, step_fn=step_fn, reductions=reductions,
                                   global_batch_size=feed.global_batch_size)
      return results, tf.shape(tf.nest.flatten(batch)[0])[0]

    def one_batch(iterator):
      batch = feed.next(iterator)
      results, rows = self.strategy.run(replica, args=(batch, self.global_step.read_value()))
      reduced = {k: self.strategy.reduce(reductions[k], v, axis=None)
                 for k, v in results.items()}
      return reduced, self.strategy.reduce("SUM", rows, axis=None)

    return (one_batch if self.eager else tf.function(one_batch)), reductions

  def export(self, name, directory):
    """Writes model `name` to `<directory>/<name>.keras` and a SavedModel in
    `<directory>/<name>/`; returns the two paths.

    Neither needs this library to load: `keras.saving.load_model(path)` and
    `tf.saved_model.load(path).serve(inputs)`. Each replaces any earlier
    export only once it is complete. Off the chief, nothing is kept.
    """
    if name not in self.models:
      raise ValueError(f"export: no model named {name!r}; the models are "
                       f"{sorted(self.models)}.")
    model = self.models[name]
    if not self.strategy.extended.should_checkpoint:
      directory = tempfile.mkdtemp(prefix="ctl-export-")  # every worker takes part
    os.makedirs(directory, exist_ok=True)
    keras_path = os.path.join(directory, f"{name}.keras")
    saved_path = os.path.join(directory, name)
    scratch = tempfile.mkdtemp(prefix=f".{name}-", dir=directory)
    try:
      model.save(os.path.join(scratch, "model.keras"))
      model.export(os.path.join(scratch, "saved_model"), verbose=False)
      os.replace(os.path.join(scratch, "model.keras"), keras_path)
      if os.path.exists(saved_path):  # a directory cannot be replaced in one step
        os.replace(saved_path, os.path.join(scratch, "previous"))
      os.replace(os.path.join(scratch, "saved_model"), saved_path)
    except (OSError, tf.errors.OpError) as e:  # a full disk, a file-size limit, ...
      raise OSError(
          f"could not export model {name!r} to {directory}: {e}. An earlier export "
          "there, if any, is unchanged; free disk space or fix the directory's "
          "permissions, then export again.") from e
    finally:
      shutil.rmtree(scratch, ignore_errors=True)
    if not self.strategy.extended.should_checkpoint:
      shutil.rmtree(directory, ignore_errors=True)
    return keras_path, saved_path

  def train(self, num_steps):
    """Runs `num_steps` steps; returns each result key's per-step values (numpy)."""
    _require_positive_int("num_steps", num_steps)
    chunks = []
    done = 0
    while done < num_steps:
      n = min(self.steps_per_loop, num_steps - done)
      chunks.append(self.run_steps(n))
      done += n
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}

  def run_steps(self, num_steps):
    """Runs `num_steps` steps in one call (one compiled loop unless eager)."""
    _require_positive_int("num_steps", num_steps)
    try:
      results = self._run_steps(num_steps)
    except tf.errors.OutOfRangeError:
      raise ValueError(f"data ran out at step {int(self.global_step.numpy())}: the "
                       "dataset holds fewer batches than the steps asked for; "
                       "call .repeat() on it or ask for fewer steps.") from None
    except Exception as e:  # pylint: disable=broad-except
      if not self._ran:
        note = _data_note(e, self._feed.element_spec)
        if note:
          e.add_note(note)
      raise
    self._ran = True
    return results

  def _run_steps(self, num_steps):
    if self._coordinator is not None:
      return self._schedule_steps(num_steps)
    if self.eager:
      results = []
      for _ in range(num_steps):
        results.append(self._one_step())
        self._result_keys = self._result_keys or list(results[0])
      return {k: np.array([r[k].numpy() for r in results]) for k in results[0]}
    if self._result_keys is None:
      self._trace_result_keys()
    out = self._loop(tf.constant(num_steps, tf.int32))
    return {k: v.numpy() for k, v in out.items()}

  def _build(self, build):
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(self._mixed_precision or "float32")
    keras.utils.set_random_seed(self.seed)
    try:
      built = build()
    finally:  # the policy is for this runner's models, not for later ones
      keras.mixed_precision.set_global_policy(previous_policy)
    if not (isinstance(built, tuple) and len(built) == 2 and
            all(isinstance(d, dict) for d in built)):
      raise TypeError(f"build() must return (models, optimizers), two dicts, "
                      f"got {type(built).__name__}.")
    models, optimizers = built
    for kind, named in (("models", models), ("optimizers", optimizers)):
      for name in named:
        if not isinstance(name, str) or not name:
          raise TypeError(f"the {kind} dict has key {name!r} ({type(name).__name__}); "
                          "name models and optimizers with strings, e.g. 'generator'.")
    for name, model in models.items():
      if not isinstance(model, keras.Model):
        raise TypeError(f"models[{name!r}] is a {type(model).__name__}, not a keras.Model.")
      if not model.built or not model.variables:
        raise ValueError(f"model {name!r} has no variables yet; give it an input "
                         "shape (keras.Input) or call it once inside build().")
    _refuse_shared_optimizers(optimizers)
    for name, opt in list(optimizers.items()):
      optimizers[name] = self._prepare_optimizer(name, opt, models)
    self._check_in_scope(models, optimizers)
    return models, optimizers

  def _prepare_optimizer(self, name, opt, models):
    """Checks `opt`, wraps it for float16 loss scaling, and builds its slots."""
    if not isinstance(opt, keras.optimizers.Optimizer):
      raise TypeError(f"optimizers[{name!r}] is a {type(opt).__name__}, not a "
                      "keras.optimizers.Optimizer.")
    if (self._mixed_precision == "mixed_float16" and
        not isinstance(opt, keras.optimizers.LossScaleOptimizer)):
      inner, opt = opt, keras.optimizers.LossScaleOptimizer(opt)
      if inner.built:  # built by the user on variables of their choice
        opt.build(_tf_internal.optimizer_variables(inner))
    if not opt.built:
      if name not in models:
        raise ValueError(
            f"optimizer {name!r} has no model of the same name to build its "
            f"slots for (models: {sorted(models)}); call "
            f"optimizer.build(variables) inside build().")
      # Keras 3 fails under Mirrored if the slots are created lazily by the
      # first apply_gradients inside a tf.function.
      opt.build(models[name].trainable_variables)
    return opt

  def _check_in_scope(self, models, optimizers):
    owners = [("model", n, m.variables) for n, m in models.items()]
    owners += [("optimizer", n, o.variables) for n, o in optimizers.items()]
    for kind, name, variables in owners:
      for v in variables:
        if not self.strategy.extended.variable_created_in_scope(getattr(v, "value", v)):
          raise ValueError(f"{kind} {name!r} was created outside the strategy's "
                           "scope, so its variables are not replicated; create it "
                           "inside build(), which the runner calls in the scope.")

  def _replica_step(self, batch, step, *, step_fn=None, reductions=None,
                    global_batch_size=None):
    """Runs the step (or `step_fn`) on one replica; records each result's reduction."""
    step_fn = step_fn or self._step_fn
    reductions = self._reductions if reductions is None else reductions
    training = step_fn is self._step_fn
    context = tf.distribute.get_replica_context()
    if training:
      global_batch_size = self.global_batch_size
    if global_batch_size is None:  # one replica, dynamic batch
      global_batch_size = tf.shape(tf.nest.flatten(batch)[0])[0]
    ctx = StepContext(
        models=self.models, optimizers=self.optimizers, step=step, seed=self._seed,
        global_batch_size=global_batch_size,
        num_replicas=self.strategy.num_replicas_in_sync,
        replica_id=context.replica_id_in_sync_group,
        compile_update=self._compile_update)
    with ctx.recording():
      results = step_fn(ctx, batch)
    if not isinstance(results, dict):
      raise TypeError(f"step must return a dict of scalar values, got "
                      f"{type(results).__name__}; e.g. return {{'loss': loss}}.")
    if (training and self._result_keys is not None and
        sorted(results) != sorted(self._result_keys)):
      raise ValueError(f"step results changed keys from {sorted(self._result_keys)} "
                       f"to {sorted(results)}; return the same keys at every step.")
    out = {}
    for key, value in results.items():
      if tf.executing_eagerly() and ctx.num_replicas > 1 and not tf.is_tensor(value):
        # float(share) has lost what says it is a share: it would be averaged.
        raise TypeError(
            f"step result {key!r} is a {type(value).__name__} ({value!r}), not a "
            f"tensor, on {ctx.num_replicas} replicas: the runner cannot tell a "
            "replica's share of a global-batch average (summed over replicas) "
            "from a per-replica value (averaged), so the logged number could be "
            f"1/{ctx.num_replicas} of the truth. Return the tensor itself (e.g. "
            "loss, not float(loss)), or tf.constant(...) for a constant.")
      value = _scalar(key, value)
      reductions[key] = ctx.reduction(value, f"step result {key!r}")
      out[key] = tf.cast(value, tf.float32)
    return out

  def _schedule_steps(self, num_steps):
    """Parameter servers: `num_steps` one-step calls, spread over the workers.

    Each call is scheduled on whichever worker is free, so the workers train
    in parallel on the shared variables (asynchronous updates); the results
    come back in the order the steps were scheduled.
    """
    calls = [self._coordinator.schedule(self._loop, args=(self._feed.iterator,))
             for _ in range(num_steps)]
    self._coordinator.join()
    results = [call.fetch() for call in calls]
    self._result_keys = self._result_keys or list(results[0])
    return {k: np.array([r[k] for r in results]) for k in results[0]}

  def _one_step(self, iterator=None):
    batch = self._feed.next(iterator)
    results = self.strategy.run(self._run_replicas,
                                args=(batch, self.global_step.read_value()))
    reduced = {k: self.strategy.reduce(self._reductions[k], v, axis=None)
               for k, v in results.items()}
    # Count the step only once it got its data and ran: in a graph the
    # increment has no data dependence on either.
    done = tf.nest.flatten(batch, expand_composites=True)
    with tf.control_dependencies(done + list(reduced.values())):
      self.global_step.assign_add(1)
    return reduced

  def _trace_result_keys(self):
    # The loop stacks each result per step in a TensorArray made before the
    # loop, so it must know the keys first: trace one step (no run) to see
    # them. The loop then calls that traced step, so the step is traced once.
    self._traced_step = tf.function(self._one_step)
    self._traced_step.get_concrete_function()
    self._result_keys = list(self._reductions)

  def _loop_fn(self, num_steps):
    arrays = {k: tf.TensorArray(tf.float32, size=num_steps) for k in self._result_keys}
    for i in tf.range(num_steps):
      results = self._traced_step()
      arrays = {k: a.write(i, results[k]) for k, a in arrays.items()}
    return {k: a.stack() for k, a in arrays.items()}


# Words of Keras' and TF's errors about an input that does not fit a layer.
_INPUT_MISMATCH = ("incompatible with the layer", "Input 0 of layer", "expected shape",
                   "expected axis", "expected min_ndim", "expected ndim",
                   "Incompatible shapes", "cannot be converted", "Cannot convert",
                   "must be one of the following types", "expected dtype")


def _data_note(error, element_spec):
  """A note for an error of the step's first call, if the data is its likely cause."""
  text = str(error)
  # A KeyError in the step reaches here as itself or, through autograph's
  # nested functions, as its StagingError quoting "KeyError: 'name'".
  missing = re.search(r"KeyError: '([^']*)'", text) if not isinstance(error, KeyError) else (
      re.match(r"'([^']*)'$", str(error)))
  if missing and isinstance(element_spec, dict) and "no model named" not in text and (
      "no optimizer named" not in text):
    if missing.group(1) in element_spec:
      return None
    return (f"ctl: the batch is a dict with keys {sorted(element_spec)}; "
            f"{missing.group(1)!r} is not one of them.")
  specs = [s for s in tf.nest.flatten(element_spec) if hasattr(s, "shape")]
  about_data = any(w in text for w in _INPUT_MISMATCH) or any(
      str(tuple(s.shape)) in text or str(s.shape) in text or
      (s.dtype != tf.float32 and s.dtype.name in text) for s in specs)
  if not about_data:
    return None
  return (f"ctl: this came from the step's first call, on data elements "
          f"{element_spec}: check that the data fits the models' inputs (their "
          "keras.Input): shapes, dtypes and value ranges.")


def _scalar(key, value):
  try:
    value = tf.convert_to_tensor(value)
  except (TypeError, ValueError):
    raise TypeError(f"step result {key!r} is a {type(value).__name__}, not a "
                    "tensor; return numbers or scalar tensors.") from None
  if value.shape.rank != 0:
    raise ValueError(f"step result {key!r} has shape {value.shape}, not a scalar; "
                     "reduce it in the step (e.g. ctx.average(...) or tf.reduce_mean).")
  if not (value.dtype.is_floating or value.dtype.is_integer or value.dtype.is_bool):
    raise TypeError(f"step result {key!r} has dtype {value.dtype.name}; return numbers.")
  return value


def _refuse_shared_optimizers(optimizers):
  """One optimizer object under two names cannot update two models correctly."""
  first = {}
  for name, opt in optimizers.items():
    other = first.setdefault(id(opt), name)
    if other != name:
      kind = type(opt).__name__
      raise ValueError(
          f"optimizers[{other!r}] and optimizers[{name!r}] are the same {kind} "
          f"object. A Keras optimizer keeps slots only for the variables it was "
          f"built on (those of model {other!r}) and counts one iteration per update, so "
          f"it cannot also update model {name!r}. Give each model an optimizer "
          f"of its own in build(): {{{other!r}: keras.optimizers.{kind}(...), "
          f"{name!r}: keras.optimizers.{kind}(...)}}.")


def _check_supported(strategy, eager):
  if eager and is_parameter_server(strategy):
    raise ValueError("eager=True cannot run under ParameterServerStrategy (workers "
                     "run the functions the coordinator schedules); debug eagerly "
                     "under 'default', then switch the strategy.")
  if eager and isinstance(strategy, tf.distribute.TPUStrategy):
    raise ValueError("eager=True cannot run under TPUStrategy (a TPU only runs "
                     "compiled programs); debug eagerly under 'default', then "
                     "switch the strategy.")


def _require_int(name, value):
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
    raise TypeError(f"{name} must be an int, got {value!r}.")


def _required_positional(fn):
  """How many positional arguments `fn` needs (None: it cannot tell)."""
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):  # some builtins and C callables
    return None
  return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
             for p in parameters)


def _check_order(step, build):
  """Refuses `Runner(build, step, ...)`: step and build in each other's place."""
  # Only when both disagree: gin can supply a build's arguments.
  if _required_positional(step) == 0 and _required_positional(build):
    raise TypeError(
        f"step and build look swapped: step {getattr(step, '__name__', step)!r} takes "
        f"no arguments and build {getattr(build, '__name__', build)!r} needs some. "
        "The order is Runner(step, build, data): step(ctx, batch) runs one "
        "training step, build() makes the models and optimizers.")


def _require_positive_int(name, value):
  _require_int(name, value)
  if value < 1:
    raise ValueError(f"{name} must be at least 1, got {value}.")
