"""The runner: builds models under a strategy and runs a per-replica step.

    def build():
      models = {"generator": make_generator(), "discriminator": make_discriminator()}
      optimizers = {"generator": keras.optimizers.Adam(2e-4),
                    "discriminator": keras.optimizers.Adam(2e-4)}
      return models, optimizers

    runner = ctl.Runner(train_step, build, dataset, strategy="mirrored", steps_per_loop=10)
    history = runner.train(1000)   # 1000 more steps: {"generator_loss": array of 1000 values, ...}
    runner.fit(10_000, "runs/x")   # up to step 10000, resumable: checkpoints, summaries
    runner.history.plot()          # every step trained, as curves
    metrics = runner.evaluate(eval_step, eval_dataset)
    runner.export("generator", "runs/x/export")

The same `train_step` runs eagerly (`eager=True`: print and pdb work), compiled, or
distributed; only the `strategy` argument changes. The runner makes the parts
that do the work (`ctl.distribute`, `ctl.parts`: placement, state, data feed,
compiled step, evaluation, export); the outer loop (`ctl.loop`), checkpoints,
stopping and `ctl check` take those parts, not the runner.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import tensorflow as tf

from ctl.base import arguments
from ctl.distribute import strategies
from ctl.loop import checkpoints
from ctl.loop import fit as loop_lib
from ctl.loop import history as history_lib
from ctl.loop import workdir as workdir_lib
from ctl.parts import data as data_lib
from ctl.parts import evaluation
from ctl.parts import export as export_lib
from ctl.parts import state as state_lib
from ctl.parts import steps

# The 16-bit Keras policies a user picks; a runner also takes None (float32) and
# "float64" (ctl parity's replay).
MIXED_PRECISIONS = ("mixed_float16", "mixed_bfloat16")

if TYPE_CHECKING:
  import keras

  from ctl.loop.actions import Action
  from ctl.loop.actions import Summaries
  from ctl.loop.loggers import Logger
  from ctl.parts.state import BuildFn
  from ctl.step.context import StepFn


class Runner:
  """Runs `step_fn(ctx, batch)` on every replica, `steps_per_loop` steps per call.

  Results: the step returns a dict of scalars, each logged as its global-batch
  value: a share of a global-batch mean (from `ctx.average`, `ctx.minimize`, or
  a sum or multiple of such) is summed over replicas, a per-replica mean (an
  accuracy) is averaged, and a value mixing the two is an error (`ctl.step.reduction`).

  Args:
    step_fn: the step function, `(ctx, batch) -> dict`, run in replica
      context; `ctx` is a `ctl.StepContext` (`ctx.step` is the step's number),
      `batch` this replica's rows of the global batch (a tuple of
      `batches_per_step` of them when that is above 1).
    build: function of no arguments returning `(models, optimizers)`, two
      dicts of Keras models and optimizers; called inside the strategy scope.
      An optimizer is built on the model of the same name; one that updates
      something else must be built in `build` (`optimizer.build(variables)`).
    data: `tf.data.Dataset` of global batches, or a function of a
      `tf.distribute.InputContext` returning per-replica batches (then pass
      `global_batch_size`). See `ctl.parts.data`.
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
    mixed_precision: None, "mixed_float16" or "mixed_bfloat16" (Keras' global
      policy, set before `build`; float16 wraps every optimizer in a
      `LossScaleOptimizer`); or "float64": the variables, computations, data,
      draws and results in float64, as `ctl.tools.parity` replays runs.
    global_batch_size: needed only when `data` is a dataset function.
    batches_per_step: batches each step takes (e.g. one per critic update).

  Attributes:
    history: every step's results so far (`ctl.History`); `train` and `fit` append.
    strategy, seed, eager, steps_per_loop: as given (a strategy name made into one).
    placement: where the step runs (`ctl.distribute.placement.Placement`).
    state: the models, optimizers and step counter (`ctl.parts.state.State`).
    feed: the training data's `ctl.parts.data.Feed`.
    compiled_step: the compiled step (`ctl.parts.steps.TrainStep`: `run(n)`,
      `replica_step`, `trace_count`). These four are the parts the runner made,
      which the loop and the tools take.
  """

  def __init__(self, step_fn: StepFn, build: BuildFn, data: data_lib.Data, *,
               strategy: tf.distribute.Strategy | str = "default", seed: int = 0,
               steps_per_loop: int = 1, jit_compile: bool = False, eager: bool = False,
               mixed_precision: str | None = None, global_batch_size: int | None = None,
               batches_per_step: int = 1):
    arguments.integer("steps_per_loop", steps_per_loop, minimum=1)
    arguments.integer("batches_per_step", batches_per_step, minimum=1)
    arguments.integer("seed", seed)
    if not callable(step_fn):
      raise TypeError(f"step_fn must be a function (ctx, batch) -> dict, got {step_fn!r}.")
    if not callable(build):
      raise TypeError(f"build must be a function () -> (models, optimizers), got {build!r}.")
    _check_order(step_fn, build)
    if mixed_precision not in (None, *MIXED_PRECISIONS, "float64"):
      raise ValueError(f"mixed_precision {mixed_precision!r} is not known; use None, "
                       "'mixed_float16', 'mixed_bfloat16' or 'float64'.")
    if eager and jit_compile:
      raise ValueError("eager=True and jit_compile=True contradict each other: XLA "
                       "compiles a graph, eager mode runs Python; pick one.")
    if isinstance(strategy, str):
      strategy = strategies.make_strategy(strategy)
    kind = strategies.kind_of(strategy)
    if eager and kind.not_eager:
      raise ValueError(f"eager=True cannot run under {kind} ({kind.not_eager}); debug "
                       "eagerly under 'default', then switch the strategy.")
    self.placement = strategies.placement(strategy)
    self.strategy: tf.distribute.Strategy = strategy
    self.steps_per_loop = steps_per_loop
    self.eager = eager
    self.seed = int(seed)
    self._arguments = dict(  # for `with_options`
        step_fn=step_fn, build=build, data=data, strategy=strategy, seed=seed,
        steps_per_loop=steps_per_loop, jit_compile=jit_compile, eager=eager,
        mixed_precision=mixed_precision, global_batch_size=global_batch_size,
        batches_per_step=batches_per_step)
    self._coordinator = (
        tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        if self.placement.kind.asynchronous else None)
    float_dtype = tf.float64 if mixed_precision == "float64" else tf.float32
    if float_dtype != tf.float32:
      data = data_lib.cast_floats(data, float_dtype)
    # Data first: its checks are cheap, and fail before any model is built.
    self.feed: data_lib.Feed = data_lib.make_feed(
        data, self.placement, global_batch_size=global_batch_size,
        batches_per_step=batches_per_step, static_shapes=jit_compile,
        coordinator=self._coordinator)
    self.state = state_lib.build_state(build, self.placement, seed=self.seed,
                                       mixed_precision=mixed_precision)
    if self._coordinator is None:
      data_lib.warn_if_outside_outputs(self._arguments["data"], self.state.models,
                                       stacklevel=2)
    self.compiled_step = steps.TrainStep(
        step_fn, self.state, self.feed, self.placement, eager=eager,
        jit_compile=jit_compile, coordinator=self._coordinator,
        steps_per_loop=steps_per_loop, float_dtype=float_dtype)
    self._evaluator = evaluation.Evaluator(self.state, self.placement, eager=eager,
                                           float_dtype=float_dtype)
    self.history = history_lib.History()

  @property
  def mixed_precision(self) -> str | None:
    """The `mixed_precision` it was made with (None: float32)."""
    return self._arguments["mixed_precision"]

  @property
  def models(self) -> dict[str, keras.Model]:
    """name -> `keras.Model`, as `build` returned them."""
    return self.state.models

  def with_options(self, **options: Any) -> Runner:
    """A new runner of the same step, build function, data and seed, with some of
    `Runner`'s keyword arguments changed (e.g. `eager=True`, `steps_per_loop=5`).

    It builds models of its own (the same initial weights) and reads the data
    from its start: `ctl.tools.parity` runs experiments this way.
    """
    allowed = set(self._arguments) - {"step_fn", "build", "data"}
    unknown = sorted(set(options) - allowed)
    if unknown:
      raise TypeError(f"with_options: {unknown} are not options it changes; give any "
                      f"of {sorted(allowed)}.")
    return Runner(**{**self._arguments, **options})

  @property
  def optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
    """name -> `keras.optimizers.Optimizer` (float16 ones wrapped for loss scaling)."""
    return self.state.optimizers

  @property
  def global_step(self) -> tf.Variable:
    """int64 variable: the steps trained."""
    return self.state.global_step

  def fit(self, total_steps: int, workdir: str | None = None, *,
          checkpoint: bool | checkpoints.Checkpoint = True,
          summaries: bool | Summaries = True, actions: Sequence[Action] = (),
          loggers: Sequence[Logger] = (), progress: bool = True,
          dry_run: bool = False) -> history_lib.History:
    """Trains until the global step is `total_steps`; resumes from `workdir`.

    With a `workdir`, training starts from the newest checkpoint in
    `<workdir>/checkpoints` (if any). On SIGTERM it saves and exits with code 42
    (`ctl.PREEMPTED_EXIT_CODE`); on Ctrl-C it saves and raises `ctl.Interrupted`
    (see `ctl.loop.stopping`). Another run on the same work directory fails at
    once with `ctl.WorkdirInUse`. A NaN or Inf result stops training with a
    FloatingPointError before anything later is saved.

    Args:
      total_steps: the global step to train up to (not a number of new steps,
        which is `train`'s argument), so that rerunning the same call after an
        interruption finishes the run.
      workdir: directory for checkpoints, events, samples and exports (a
        leading `~` is the user's home; "" is refused); None writes nothing
        and does not resume.
      checkpoint: True (with a workdir: every 1000 steps or 10 minutes, and at
        the end), False (nothing to resume from), or a `ctl.Checkpoint(...)`.
      summaries: True (with a workdir: TensorBoard scalars every 100 steps to
        `<workdir>/events/train`), False, or a `ctl.Summaries(every)`.
      actions: a list of actions run on their schedule and at the end (see
        `ctl.Action`): `ctl.Samples`, `ctl.Evaluate`, `ctl.Export`, or your own.
      loggers: experiment trackers that also get the run's records (see
        `ctl.Logger`): `ctl.MLflow(...)`, `ctl.WandB(...)`, or your own; on the
        chief. TensorBoard and `history.jsonl` are written anyway.
      progress: show a progress bar (log lines when stderr is not a terminal).
      dry_run: run each part once, tiny, writing nothing that stays, then put
        the runner back as it was (see `ctl.loop.dry_run`).

    Every step's results go to `runner.history` and `<workdir>/history.jsonl`
    (from which a resumed `fit` starts it); each fit appends its manifest to
    `<workdir>/manifest.jsonl` (`ctl.loop.manifest`).

    Returns:
      A `ctl.History` of the steps this call ran.
    """
    return loop_lib.fit(self.compiled_step, self.history, total_steps, workdir,
                        evaluator=self._evaluator, checkpoint=checkpoint,
                        summaries=summaries, actions=actions, loggers=loggers,
                        progress=progress, dry_run=dry_run, seed=self.seed)

  def evaluate(self, step_fn: StepFn, data: data_lib.Data, *,
               global_batch_size: int | None = None,
               num_batches: int | None = None) -> dict[str, float]:
    """Runs `step_fn(ctx, batch)` over all of `data`; returns each result's mean.

    `step_fn` returns a dict of scalars, reduced over replicas like a training
    step's; the batches' values are averaged weighted by their size: the mean
    over the whole dataset. `data` (a dataset of global batches, or a dataset
    function with `global_batch_size`) is read from its start on every call; an
    endless one is refused unless `num_batches` bounds it. `ctx.step` is the global step.
    """
    return self._evaluator.evaluate(step_fn, data, global_batch_size=global_batch_size,
                                    num_batches=num_batches)

  def over_samples(self, fn: Callable[[dict, tf.Tensor], dict[str, tf.Tensor]],
                   num_samples: int, *, batch_size: int = 500,
                   moments: Sequence[str] = ()) -> dict[str, Any]:
    """Runs `fn(models, indices)` on every replica over samples 0 .. N - 1:
    each output gathered in sample order, or its `ctl.Moments`.

    For metrics of what a model generates (FID and its kin): with noise drawn
    by `ctl.normal_by_index`, sample i, and so the result, is the same on any
    number of replicas and workers. See `ctl.parts.evaluation.Evaluator.over_samples`.
    """
    return self._evaluator.over_samples(fn, num_samples, batch_size=batch_size,
                                        moments=moments)

  def export(self, name: str, directory: str) -> tuple[str, str]:
    """Writes model `name` to `<directory>/<name>.keras` and a SavedModel in
    `<directory>/<name>/`; returns the two paths.

    Neither needs this library to load: `keras.saving.load_model(path)` and
    `tf.saved_model.load(path).serve(inputs)`. Each replaces any earlier
    export only once it is complete. Off the chief, nothing is kept.
    """
    return export_lib.export(self.models, name, directory,
                             is_chief=self.placement.is_chief)

  def restore(self, workdir: str, checkpoint: str | int = "newest") -> int:
    """Restores a checkpoint of `<workdir>/checkpoints`; returns its step.

    `checkpoint`: "newest"; "best": the best that `ctl.BestCheckpoints` kept
    (in `<workdir>/checkpoints/best/`; the name of its `directory=` if you gave
    one); or a step, e.g. 2000 (or "2000", "ckpt-2000"): the checkpoint saved
    at that step, if `keep` has not removed it. Raises FileNotFoundError if
    there is none. `fit` restores by itself; this is for evaluating or
    exporting a trained run.
    """
    workdir = workdir_lib.path(workdir)
    step = checkpoints.step_named(checkpoint)
    if step is not None:
      path = checkpoints.of_step(workdir, step)
      directory = os.path.dirname(path)
    else:
      directory, path = self._kept_or_newest(workdir, checkpoint)
    return checkpoints.Checkpointer(self.placement, self.state, self.feed,
                                    directory).restore(path=path)

  @staticmethod
  def _kept_or_newest(workdir, checkpoint):
    """The checkpoints' directory and the path to restore: None (the newest that reads
    whole), or in kept folder `checkpoint` its best (its `checkpoint` file's first)."""
    negative = str(checkpoint).strip().startswith("-")  # -1: no step is
    if checkpoint != "newest" and (negative or not checkpoints.is_kept_name(checkpoint)):
      raise ValueError(f"restore(checkpoint={checkpoint!r}): give 'newest', 'best' (the "
                       "folder of ctl.BestCheckpoints' kept checkpoints) or a step (>= 0).")
    kept = None if checkpoint == "newest" else checkpoint
    directory = os.path.join(workdir, "checkpoints", *([kept] if kept else []))
    newest = checkpoints.newest(workdir, kept)
    if newest is None:
      if kept is None:
        raise FileNotFoundError(
            f"no checkpoint in {directory}: train first (`fit`, or "
            "`ctl train CONFIG.gin --workdir ...`), or point workdir at a trained run.")
      folders = checkpoints.kept_folders(workdir)
      kept_there = (f"; the folders of kept checkpoints there are {folders}" if folders
                    else "; none is kept there")
      raise FileNotFoundError(
          f"no kept checkpoint in {directory}: ctl.BestCheckpoints keeps them there "
          f"(fit(actions=[..., ctl.BestCheckpoints(metric, ...)]); with the GAN kit, "
          f"gan.Schedule.keep_best){kept_there}. Pass checkpoint='newest' (`ctl eval "
          "--checkpoint newest`) for the newest.")
    return directory, newest if kept else None

  def train(self, num_steps: int) -> history_lib.History:
    """Runs `num_steps` steps; returns a `ctl.History` of them (each result
    key's per-step values, numpy), also appended to `runner.history`."""
    arguments.integer("num_steps", num_steps, minimum=1)
    data_lib.check_data_lasts(self.feed, num_steps, f"train({num_steps})")
    ran, calls = history_lib.History(), []
    step = int(self.global_step.numpy())
    per_call = self.compiled_step.steps_per_call
    try:
      for done in range(0, num_steps, per_call):
        n = min(per_call, num_steps - done)
        # Read once all calls are made: the device need not wait for the host.
        calls.append((step + done, self.compiled_step.run(n, fetch=False)))
    finally:  # what ran before an error is kept too
      for first, results in calls:
        results = steps.fetched(results)
        ran.append(first, results)
        self.history.append(first, results)
    return ran


def _required_positional(fn):
  """How many positional arguments `fn` needs (None: it cannot tell)."""
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):  # some builtins and C callables
    return None
  return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
             for p in parameters)


def _check_order(step_fn, build):
  """Refuses `Runner(build, step_fn, ...)` if both disagree (gin can give build's arguments)."""
  if _required_positional(step_fn) == 0 and _required_positional(build):
    raise TypeError(
        f"step_fn and build look swapped: step_fn {getattr(step_fn, '__name__', step_fn)!r} "
        f"takes no arguments and build {getattr(build, '__name__', build)!r} needs some. "
        "The order is Runner(step_fn, build, data): step_fn(ctx, batch) runs one "
        "training step, build() makes the models and optimizers.")

