"""The compiled training step, in three layers.

    compiled_step = TrainStep(step_fn, state, feed, placement)
    results = compiled_step.run(10)   # {"loss": array of 10 values, ...}

1. `run_on_replica`: a step function on one replica, given a `StepContext`;
   checks what it returns and records how each result is reduced over replicas
   (evaluation steps run through it too).
2. `step_across_replicas()`: the next batch, `strategy.run`, the reduction of
   the results, the step counter.
3. The in-graph loop: `num_steps` steps in one `tf.function` call, `num_steps` a
   tensor so that another count does not retrace (under parameter servers, one
   scheduled call on a worker; eagerly, plain Python).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeAlias

import keras
import numpy as np
import tensorflow as tf

from ctl.base import _tf_internal
from ctl.base import arguments
from ctl.base import constants
from ctl.base import sources
from ctl.step import reduction
from ctl.step.context import StepContext
from ctl.step.context import autograph

if TYPE_CHECKING:
  from ctl.distribute.placement import Placement
  from ctl.distribute.strategies import ClusterCoordinator
  from ctl.parts.data import Feed
  from ctl.parts.state import State
  from ctl.step.context import StepFn

Results: TypeAlias = dict[str, np.ndarray]
"""What training returns: each result key's values, one per step (numpy)."""

def run_on_replica(step_fn: StepFn, batch: Any, step: tf.Tensor, *, state: State, replicas: int,
                   global_batch_size: int | None, reductions: dict[str, tf.distribute.ReduceOp],
                   compile_update: Callable[[Callable], Callable] | None = None,
                   expected_keys: Sequence[str] | None = None,
                   float_dtype: tf.DType = tf.float32) -> dict[str, tf.Tensor]:
  """Runs `step_fn(ctx, batch)` on this replica; returns its results as `float_dtype`.

  `step` is what `ctx.step` reports; `global_batch_size` None takes this replica's
  batch size (one replica, dynamic batch). Fills in `reductions`: how each result is
  reduced over replicas. `expected_keys`: an earlier trace's result keys, which must
  not change. `float_dtype`, the run's float type, is also `ctx.normal`'s default.
  """
  if global_batch_size is None:
    global_batch_size = tf.shape(tf.nest.flatten(batch)[0])[0]
  shares = reduction.Shares()
  ctx = StepContext(
      models=state.models, optimizers=state.optimizers, step=step, key=state.draw_key,
      global_batch_size=global_batch_size, num_replicas=replicas,
      replica_id=tf.distribute.get_replica_context().replica_id_in_sync_group,
      compile_update=compile_update, float_dtype=float_dtype, shares=shares)
  step_fn = autograph(step_fn)  # only the user's code: see ctl.step.context.autograph
  with shares.recording(batch):  # eagerly, the reductions below need its tapes
    with tf.variable_creator_scope(_refuse_new_variable), _keras_floatx(float_dtype):
      results = step_fn(ctx, batch)
    if not tf.executing_eagerly():
      rows = tf.nest.flatten(batch)[0].shape  # the replica's batch size, if static
      sources.warn_of_layout_dependent_draws(rows[0] if rows.rank else None,
                                             constants.STEP_DRAWS_FIX)
    return reduction.step_results(shares, results, reductions, num_replicas=replicas,
                                  expected_keys=expected_keys, float_dtype=float_dtype)


@contextlib.contextmanager
def _keras_floatx(float_dtype):
  """Keras' floatx while the step runs: float64 in a float64 run, so that a learning-rate
  schedule's value is float64 too (float32 rounds it differently eagerly and compiled)."""
  previous = keras.config.floatx()
  # Already set: under mirrored the replicas run in threads, and the one that set
  # it must be the one to put it back, or a later thread leaves float64 global.
  if float_dtype == tf.float32 or previous == float_dtype.name:
    yield
    return
  keras.config.set_floatx(float_dtype.name)
  try:
    yield
  finally:
    keras.config.set_floatx(previous)


def _refuse_new_variable(next_creator, **kwargs):
  """Refuses a variable made in the step at its first call, eager or compiled."""
  del next_creator
  name, shape = _keras_variable_made() or (kwargs.get("name"), kwargs.get("shape"))
  initial = kwargs.get("initial_value")
  if shape is None and hasattr(initial, "shape"):
    shape = initial.shape
  where = sources.user_line(_tf_internal.stack())
  raise ValueError(
      f"the step created a variable ({name or 'unnamed'!r}"
      + (f", shape {tuple(tf.TensorShape(shape).as_list())}" if shape is not None else "")
      + ")" + (f" at {where}" if where else "") + ". A step runs at every call: "
      "eagerly it would make a new variable each time (trained once, never "
      "checkpointed), and compiled TensorFlow cannot make one there. Create it in "
      "build(): a layer as part of a model (built there, with keras.Input or one "
      "call), an optimizer returned by build(), or a model of its own for any "
      "other state (e.g. an EMA copy), so that checkpoints keep it.")


def _keras_variable_made():
  """(path, shape) of the Keras variable whose TF variable is being made, if
  one is (Keras passes TF only its short name and an initializer)."""
  frame = inspect.currentframe()
  for _ in range(8):  # Keras' Variable makes its tf.Variable a few frames out
    frame = frame and frame.f_back
    made = frame and frame.f_locals.get("self")
    if isinstance(made, keras.Variable):
      return made.path, made.shape
  return None


class TrainStep:
  """The user's training step, compiled and distributed; `run(n)` runs n steps.

  Made by `ctl.Runner` from its arguments and the parts it made (state, feed,
  placement; a `ClusterCoordinator` under parameter servers, else None).
  """

  def __init__(self, step_fn: StepFn, state: State, feed: Feed,
               placement: Placement, *, eager: bool = False,
               jit_compile: bool = False, coordinator: ClusterCoordinator | None = None,
               steps_per_loop: int = 1, float_dtype: tf.DType = tf.float32):
    self._step_fn = step_fn
    self._float_dtype = float_dtype
    self.steps_per_loop = steps_per_loop
    self.state = state
    self.feed = feed
    self.placement = placement
    self._coordinator = coordinator
    self._eager = eager
    # result key -> ReduceOp, filled in when the step is traced
    self.reductions: dict[str, tf.distribute.ReduceOp] = {}
    self.result_keys: list[str] | None = None
    self.ran = False  # whether a call of `run` has completed (traced and run)
    self._compile_update = None
    self._on_replica = self.replica_step
    if jit_compile and placement.kind.merge_call_gradients:  # each update compiled alone
      self._compile_update = lambda fn: tf.function(fn, jit_compile=True)
    elif jit_compile and not placement.kind.xla_always:
      self._on_replica = tf.function(self.replica_step, jit_compile=True, autograph=False)
    # One step on every replica, traced once: the in-graph loop calls it, and
    # so does a call of one step, directly (no loop to build or optimize).
    self._step = None if eager else tf.function(self.step_across_replicas, autograph=False)
    self._loop = None if eager else tf.function(self._in_graph_loop, autograph=False)
    self._call_step = None if eager else OneTrace(self._step)
    self._call_loop = None if eager else OneTrace(self._loop)
    self._counts = {}  # num_steps -> its int32 tensor, made once

  @property
  def steps_per_call(self) -> int:
    """The most steps one `run` takes before its results are read: `steps_per_loop`,
    or under parameter servers `steps_per_loop` for each worker (a scheduled
    call each, run in parallel)."""
    return self.steps_per_loop * self.placement.parallel_calls

  @property
  def trace_count(self) -> int:
    """How many times the step was traced (0 when eager). The in-graph loop
    calls the step's one trace, and its count is a tensor: it traces once."""
    if self._step is None:
      return 0
    return (self._step.experimental_get_tracing_count()
            + max(0, self._loop.experimental_get_tracing_count() - 1))

  def replica_step(self, batch: Any, step: tf.Tensor) -> dict[str, tf.Tensor]:
    """Layer 1: the user's step on this replica (in replica context)."""
    return run_on_replica(
        self._step_fn, batch, step, state=self.state, replicas=self.placement.replicas,
        global_batch_size=self.feed.global_batch_size,
        reductions=self.reductions, compile_update=self._compile_update,
        expected_keys=self.result_keys, float_dtype=self._float_dtype)

  def step_across_replicas(self, step: tf.Tensor | None = None,
                           iterator: Iterator[Any] | None = None) -> dict[str, tf.Tensor]:
    """Layer 2: one step on every replica; the reduced results. `step` None reads it."""
    batch = self.feed.next(iterator)
    if step is None:
      step = self.state.global_step.read_value()
    strategy = self.placement.strategy
    results = strategy.run(self._on_replica, args=(batch, step))
    reduced = reduction.across_replicas(strategy, self.reductions, results)
    # Count the step only once it got its data and ran: in a graph the
    # increment has no data dependence on either.
    done = tf.nest.flatten(batch, expand_composites=True)
    with tf.control_dependencies(done + list(reduced.values())):
      self.state.global_step.assign_add(1)
    return reduced

  def _in_graph_loop(self, num_steps, iterator=None):
    """Layer 3: `num_steps` (>= 1) steps in one call, each result stacked per step.

    The first step runs before the loop: its results' keys make the arrays the
    loop writes into. The steps' numbers are a loop variable counted from the
    global step, read once, so that no step waits for the one before to count
    itself; under parameter servers (`iterator` given) calls on other workers
    move the counter, so each step reads it.
    """
    step = None if iterator is not None else self.state.global_step.read_value()
    first = self._step(step, iterator)
    arrays = {k: tf.TensorArray(v.dtype, size=num_steps).write(0, v)
              for k, v in first.items()}

    def body(i, steps, arrays):
      results = self._step(steps[0] if steps else None, iterator)
      return (i + 1, [s + 1 for s in steps],
              {k: a.write(i, results[k]) for k, a in arrays.items()})

    steps = [] if step is None else [step + 1]  # (a loop variable cannot be None)
    _, _, arrays = tf.while_loop(lambda i, *_: i < num_steps, body,
                                 (tf.constant(1), steps, arrays))
    return {k: a.stack() for k, a in arrays.items()}

  def run(self, num_steps: int, fetch: bool = True) -> Results:
    """Runs `num_steps` steps in one call; returns each result's values (numpy).

    `fetch=False` leaves compiled results where they are, as tensors (a
    scalar for one step): a host copy waits for the device, and a caller
    that reads the results later lets the device run ahead. Under parameter
    servers, the steps are scheduled calls of up to `steps_per_loop` each.
    """
    arguments.integer("num_steps", num_steps, minimum=1)
    try:
      results = self._run(num_steps, fetch)
    except tf.errors.OutOfRangeError:
      raise ValueError(f"data ran out at step {int(self.state.global_step.numpy())}: "
                       "the dataset holds fewer batches than the steps asked for; "
                       "call .repeat() on it or ask for fewer steps.") from None
    except Exception as e:  # pylint: disable=broad-except
      note = _collective_note(e) or (None if self.ran else
                                     _data_note(e, self.feed.element_spec))
      if note:
        e.add_note(note)
      raise
    self.ran = True
    self.result_keys = self.result_keys or list(results)
    return results

  def _run(self, num_steps, fetch):
    if self._coordinator is not None:
      return self._schedule(num_steps)
    if self._eager:
      results = []
      for _ in range(num_steps):
        results.append(self.step_across_replicas())
        self.result_keys = self.result_keys or list(results[0])  # checked from the next step
      return {k: np.array([r[k].numpy() for r in results]) for k in results[0]}
    # (iterator=None given too: see OneTrace)
    if num_steps == 1:
      out = self._call_step(self.state.global_step.read_value(), None)
    else:
      out = self._call_loop(self._count(num_steps), None)
    return fetched(out) if fetch else out

  def _count(self, num_steps):
    if num_steps not in self._counts:
      self._counts[num_steps] = tf.constant(num_steps, tf.int32)
    return self._counts[num_steps]

  def _schedule(self, num_steps):
    """Parameter servers: `num_steps` steps in calls of up to `steps_per_loop` steps,
    each on whichever worker is free; the results in the order of the calls."""
    calls = []
    while num_steps > 0:
      n = min(num_steps, self.steps_per_loop)
      calls.append(self._coordinator.schedule(
          self._loop, args=(self._count(n), self.feed.iterator)))
      num_steps -= n
    self._coordinator.join()
    results = [call.fetch() for call in calls]
    return {k: np.concatenate([r[k] for r in results]) for k in results[0]}


class OneTrace:
  """Calls a `tf.function` of ctl's through the one trace its first call makes.

  Skips matching the arguments against the traces at every call, and TF's
  retracing warning, which counts traces across `tf.function` objects (every new
  runner's first call). Give every argument, defaults too: a trace has none.
  """

  def __init__(self, function: Any):
    self._function = function
    self._concrete = None

  def __call__(self, *args: Any) -> Any:
    if self._concrete is None:
      self._concrete = self._function.get_concrete_function(*args)
    return self._concrete(*args)


def fetched(results: dict[str, Any]) -> Results:
  """`TrainStep.run`'s results as numpy arrays of one value per step."""
  return {k: np.asarray(v).reshape(-1) for k, v in results.items()}


# Words of Keras' and TF's errors about an input that does not fit a layer.
_INPUT_MISMATCH = ("incompatible with the layer", "Input 0 of layer", "expected shape",
                   "expected axis", "expected min_ndim", "expected ndim",
                   "Incompatible shapes", "cannot be converted", "Cannot convert",
                   "must be one of the following types", "expected dtype")


def _collective_note(error):
  """A note for TF's all-gather failing across replicas (tests/test_gan_parts.py)."""
  text = str(error)
  if "CollectiveGatherV2" not in text and "in the collective instance" not in text:
    return None
  return ("ctl: TF's all-gather across replicas failed. If the step trains a keras "
          "Embedding: all-gathers are how TF sums its sparse gradient over replicas, "
          "and after a tf.cond in the step (a lazy penalty, r1_penalty(every=k), or "
          "an `if` on a tensor) they can mismatch. Give the embedding as a Dense layer "
          "(use_bias=False) on one-hot labels, as gan.dcgan_discriminator does: a "
          "dense gradient sums alike on every strategy. TF leaves this process's "
          "collectives aborted: restart it (a notebook's kernel too).")


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
  if re.search(r"(^|Error: )minimize\(", text):  # ctx.minimize said what is wrong
    return None
  specs = [s for s in tf.nest.flatten(element_spec) if hasattr(s, "shape")]
  about_data = any(w in text for w in _INPUT_MISMATCH) or any(
      str(tuple(s.shape)) in text or str(s.shape) in text or
      (s.dtype != tf.float32 and s.dtype.name in text) for s in specs)
  if not about_data:
    return None
  return (f"ctl: this came from the step's first call, on data elements "
          f"{element_spec}: check that the data fits the models' inputs (their "
          "keras.Input): shapes, dtypes and value ranges.")
