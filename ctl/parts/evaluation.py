"""Evaluation: an evaluation step over a finite dataset, reduced like a training step.

    evaluator = Evaluator(state, placement)
    metrics = evaluator.evaluate(eval_step, eval_data)   # {"accuracy": 0.93}

What `Runner.evaluate` does. Each (step, data) pair is compiled once and kept
(a few of them), so that periodic evaluation on the same data does not retrace.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

import tensorflow as tf

from ctl.parts import data as data_lib
from ctl.parts import steps as steps_lib
from ctl.step import reduction

if TYPE_CHECKING:
  from ctl.distribute.strategies import Placement
  from ctl.parts.state import State
  from ctl.step.context import StepFn

# Compiled evaluations kept (each holds a traced function and an input feed).
_EVALUATIONS_KEPT = 4
# The batches read from evaluation data whose length tf.data cannot tell (a
# `filter`, a generator) when `num_batches` is not given: such data may never
# end (`.repeat().filter(...)`), and an evaluation would then run forever.
UNKNOWN_LENGTH_BATCHES = 1000
# After this long without a batch, an evaluation says it is still waiting
# (data that never yields one, a filter that matches nothing, blocks silently).
QUIET_SECONDS = 60.0
_log = logging.getLogger("ctl")


class Evaluator:
  """Runs evaluation steps on the models of `state` under `placement`'s strategy.

  Args:
    state: the `ctl.state.State` (its models, and the step `ctx.step` reports).
    placement: the `ctl.strategies.Placement` the state was built under.
    eager: run as plain Python.
    float_dtype: the run's float type (`ctl.steps.run_on_replica`).
  """

  def __init__(self, state: State, placement: Placement, *,
               eager: bool = False, float_dtype: tf.DType = tf.float32):
    self._state = state
    self._placement = placement
    self._strategy = placement.strategy
    self._eager = eager
    self._float_dtype = float_dtype
    self._compiled = {}  # (eval step, data, global batch size) -> (feed, function)

  def evaluate(self, step_fn: StepFn, data: data_lib.Data, *,
               global_batch_size: int | None = None,
               num_batches: int | None = None) -> dict[str, float]:
    """Runs `step_fn(ctx, batch)` over all of `data`; returns each result's mean.

    See `Runner.evaluate`.
    """
    data_lib.check_evaluation_data(data, num_batches)
    if self._placement.kind.asynchronous:
      raise ValueError(
          f"evaluate does not run under {self._placement.kind.name}: the coordinator only "
          "schedules training steps. Evaluate a checkpoint in another process "
          "under 'default' (e.g. `ctl eval`), or call the models directly in an "
          "action (a ctl.Action run on the coordinator).")
    key = (step_fn, data, global_batch_size)
    if key not in self._compiled:
      if self._float_dtype != tf.float32:
        data = data_lib.cast_floats(data, self._float_dtype)
      feed = data_lib.make_feed(data, self._placement, global_batch_size=global_batch_size)
      self._compiled[key] = (feed, self._one_batch_fn(step_fn, feed))
      while len(self._compiled) > _EVALUATIONS_KEPT:  # a new dataset per call
        del self._compiled[next(iter(self._compiled))]
    feed, one_batch = self._compiled[key]
    bound = num_batches
    if bound is None and _length_unknown(data):
      bound = UNKNOWN_LENGTH_BATCHES
    iterator = feed.make_iterator()
    totals, examples, batches = {}, 0.0, 0
    with _said_if_quiet() as beat:
      while bound is None or batches < bound:
        try:
          results, rows = one_batch(iterator)
        except tf.errors.OutOfRangeError:
          break
        batches += 1
        beat(batches)
        rows = float(rows)
        for k, v in results.items():
          totals[k] = totals.get(k, 0.0) + float(v) * rows
        examples += rows
    if not examples:
      raise ValueError("evaluate: data gave no batch; pass a dataset with at least "
                       "one (and without .repeat(), which never ends).")
    if num_batches is None and batches == bound:
      _log.warning(
          "evaluate: the evaluation data's length is unknown (a dataset after a "
          "filter, from a generator, or a dataset function) and it had not ended "
          "after %d batches: "
          "stopped there (ctl.evaluation.UNKNOWN_LENGTH_BATCHES), and the metrics "
          "are over those batches. Pass num_batches=N to choose how many, or make "
          "the data finite (data.take(N); no .repeat() before a filter).", bound)
    return {k: v / examples for k, v in totals.items()}

  def _one_batch_fn(self, step_fn, feed):
    """One batch on every replica: (reduced results, rows over all replicas)."""
    reductions = {}

    def on_replica(batch, step):
      results = steps_lib.run_on_replica(
          step_fn, batch, step, state=self._state, replicas=self._placement.replicas,
          global_batch_size=feed.global_batch_size,
          reductions=reductions, float_dtype=self._float_dtype)
      return results, tf.shape(tf.nest.flatten(batch)[0])[0]

    def one_batch(iterator):
      batch = feed.next(iterator)
      results, rows = self._strategy.run(
          on_replica, args=(batch, self._state.global_step.read_value()))
      reduced = reduction.across_replicas(self._strategy, reductions, results)
      return reduced, reduction.across_replicas(self._strategy, {"rows": "SUM"},
                                                {"rows": rows})["rows"]

    return one_batch if self._eager else steps_lib.OneTrace(
        tf.function(one_batch, autograph=False))


def _length_unknown(data):
  """Whether tf.data cannot tell how many batches `data` holds (a dataset
  function's data is made on each worker: its length is unknown here too)."""
  if not isinstance(data, tf.data.Dataset):
    return True
  return int(data.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)


@contextlib.contextmanager
def _said_if_quiet():
  """Inside, a thread warns once if no batch came for `QUIET_SECONDS`; the
  body calls the yielded `beat(batches)` after each batch."""
  last = [time.monotonic(), 0]
  done = threading.Event()

  def watch():
    while not done.wait(min(1.0, QUIET_SECONDS)):
      if time.monotonic() - last[0] > QUIET_SECONDS:
        _log.warning(
            "evaluate: no batch from the evaluation data for %g s after %d batches (a "
            "filter that matches nothing? a generator that blocks?); still waiting. "
            "Ctrl-C or SIGTERM saves and stops a fit; check the data with "
            "next(iter(data)).", QUIET_SECONDS, last[1])
        return

  thread = threading.Thread(target=watch, daemon=True, name="ctl-evaluate-watch")
  thread.start()

  def beat(batches):
    last[:] = [time.monotonic(), batches]

  try:
    yield beat
  finally:
    done.set()
