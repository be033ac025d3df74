"""Evaluation: an evaluation step over a finite dataset, reduced like a training
step; and a pass over numbered samples, for what a generative model is judged by.

    evaluator = Evaluator(state, placement)
    metrics = evaluator.evaluate(eval_step, eval_data)   # {"accuracy": 0.93}
    out = evaluator.over_samples(features_of_samples, 10_000, moments=("features",))
    out["features"].mean, out["features"].covariance     # a `Moments`, merged exactly
    out["logits"]                                        # [10000, 10], in sample order

What `Runner.evaluate` and `Runner.over_samples` do. Each is compiled once
per function (and data) and kept (a few of them), so that periodic evaluation
does not retrace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from ctl.base import arguments
from ctl.base import sources
from ctl.parts import data as data_lib
from ctl.parts import steps as steps_lib
from ctl.step import reduction

if TYPE_CHECKING:
  from collections.abc import Callable
  from collections.abc import Sequence

  from ctl.distribute.placement import Placement
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


@dataclasses.dataclass(frozen=True)
class Moments:
  """The count, sum and sum of outer products of feature rows, in float64.

  Statistics that merge exactly: the moments of two sets of rows are the sum
  of their moments (`a + b`), in any order, so a pass split over replicas,
  workers and batches gives those of the whole set to float64 rounding.

  Attributes:
    count: rows.
    total: [d], their sum.
    outer: [d, d], the sum of x x^T over rows x.
  """

  count: int
  total: np.ndarray
  outer: np.ndarray

  @classmethod
  def of(cls, features: np.ndarray) -> Moments:
    """The moments of `features` [N, d] (computed in float64)."""
    x = np.asarray(features, np.float64)
    return cls(len(x), x.sum(0), x.T @ x)

  def __add__(self, other: Moments) -> Moments:
    return Moments(self.count + other.count, self.total + other.total,
                   self.outer + other.outer)

  @property
  def mean(self) -> np.ndarray:
    return self.total / self.count

  @property
  def covariance(self) -> np.ndarray:
    """The unbiased (count - 1) covariance, symmetric."""
    mean = self.mean
    covariance = (self.outer - self.count * np.outer(mean, mean)) / (self.count - 1)
    return (covariance + covariance.T) / 2


class Evaluator:
  """Runs evaluation steps on the models of `state` under `placement`'s strategy.

  Made by `ctl.Runner`: its `state` (whose step `ctx.step` reports), `placement`,
  `eager` and float type.
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
    """Runs `step_fn(ctx, batch)` over all of `data`; see `Runner.evaluate`."""
    data_lib.check_evaluation_data(data, num_batches)
    if self._placement.kind.asynchronous:
      raise ValueError(
          f"evaluate does not run under {self._placement.kind.name}: the coordinator only "
          "schedules training steps. Evaluate a checkpoint in another process "
          "under 'default' (e.g. `ctl eval`), or call the models directly in an "
          "action (a ctl.Action run on the coordinator).")
    bound = (UNKNOWN_LENGTH_BATCHES if num_batches is None and _length_unknown(data)
             else num_batches)
    key = (step_fn, data, global_batch_size, bound)
    if key not in self._compiled:
      source = data
      if self._float_dtype != tf.float32:
        source = data_lib.cast_floats(source, self._float_dtype)
      if bound is not None and isinstance(source, tf.data.Dataset):
        source = source.take(bound)  # it ends in the pipeline (`_read`)
      feed = data_lib.make_feed(source, self._placement, global_batch_size=global_batch_size)
      self._compiled[key] = (feed, self._one_batch_fn(step_fn, feed))
      while len(self._compiled) > _EVALUATIONS_KEPT:  # a new dataset per call
        del self._compiled[next(iter(self._compiled))]
    feed, one_batch = self._compiled[key]
    iterator = feed.make_iterator()
    try:
      totals, examples, batches = _read(
          iterator, one_batch, None if isinstance(data, tf.data.Dataset) else bound)
    except BaseException:  # a signal, an error: the pipeline may be mid-read
      data_lib.abandon(iterator)
      raise
    if not examples:
      raise ValueError("evaluate: data gave no batch; pass a dataset with at least "
                       "one (and without .repeat(), which never ends).")
    if num_batches is None and batches == bound:
      _log.warning(
          "evaluate: the evaluation data's length is unknown (a dataset after a "
          "filter, from a generator, or a dataset function) and it had not ended "
          "after %d batches: "
          "stopped there (ctl.parts.evaluation.UNKNOWN_LENGTH_BATCHES), and the metrics "
          "are over those batches. Pass num_batches=N to choose how many, or make "
          "the data finite (data.take(N); no .repeat() before a filter).", bound)
    return {k: v / examples for k, v in totals.items()}

  def over_samples(self, fn: Callable[[dict, tf.Tensor], dict[str, tf.Tensor]],
                   num_samples: int, *, batch_size: int = 500,
                   moments: Sequence[str] = ()) -> dict[str, np.ndarray | Moments]:
    """Runs `fn(models, indices)` on every replica and worker over samples
    `0 .. num_samples - 1`; returns its outputs for exactly those samples.

    `fn` gets a replica's consecutive sample indices (int64 `[rows]`); its
    result for a sample must depend on the index only (draw noise with
    `ctl.normal_by_index`), so that it is the same under any layout and batch
    size. Padded rows of the last batch are computed and dropped. Every worker
    gets the same result.

    Args:
      fn: `(models, indices) -> {name: [rows, ...] tensor}`.
      num_samples: samples to run, N >= 1.
      batch_size: samples per pass over all replicas (rounded up to a multiple
        of the replica count); memory only, the result is the same.
      moments: names of `fn`'s outputs (`[rows, d]`) to return as their `Moments`,
        summed in float64; every other output is one NumPy array
        `[num_samples, ...]` in sample order.
    """
    arguments.integer("num_samples", num_samples, minimum=1)
    arguments.integer("batch_size", batch_size, minimum=1)
    if isinstance(moments, str):
      raise TypeError(f"over_samples: moments must be a sequence of output names, got the "
                      f"string {moments!r}; write moments=({moments!r},).")
    batch_size = min(batch_size, num_samples)  # no pass larger than the samples
    # Under a parameter server the coordinator runs the samples itself: its
    # workers only take scheduled training steps.
    here = self._placement.kind.asynchronous
    replicas = 1 if here else self._placement.replicas
    rows = -(-batch_size // replicas)
    key = ("samples", fn, rows, tuple(moments))
    if key not in self._compiled:
      self._compiled[key] = self._samples_fn(fn, rows, tuple(moments), here=here)
      while len(self._compiled) > _EVALUATIONS_KEPT:
        del self._compiled[next(iter(self._compiled))]
    one_batch = self._compiled[key]
    summed, pieces = {name: Moments(0, 0.0, 0.0) for name in moments}, {}
    limit = tf.constant(num_samples, tf.int64)
    for first in range(0, num_samples, rows * replicas):  # no data to wait for
      sums, rows_out = one_batch(tf.constant(first, tf.int64), limit)
      for name in moments:
        count, total, outer = (np.asarray(v) for v in sums[name])
        summed[name] += Moments(int(count), total, outer)
      for name, value in rows_out.items():
        pieces.setdefault(name, []).append(np.asarray(value))
    out = {name: np.concatenate(values)[:num_samples] for name, values in pieces.items()}
    return {**out, **summed}

  def _samples_fn(self, fn, rows, moments, *, here=False):
    """One batch of `over_samples` on every replica (`here`: in this process only)."""

    def on_replica(first, limit):
      replica = (0 if here else tf.distribute.get_replica_context().replica_id_in_sync_group)
      indices = first + tf.cast(replica, tf.int64) * rows + tf.range(rows, dtype=tf.int64)
      outputs = fn(self._state.models, indices)
      _check_sample_outputs(outputs, rows, moments)
      if not tf.executing_eagerly():
        sources.warn_of_layout_dependent_draws(
            rows, "Draw a sample's noise from its index with ctl.normal_by_index.")
      mask = tf.cast(indices < limit, tf.float64)
      sums = {}
      for name in moments:
        x = tf.cast(outputs[name], tf.float64) * mask[:, None]
        sums[name] = (tf.reduce_sum(mask), tf.reduce_sum(x, 0),
                      tf.matmul(x, x, transpose_a=True))
      return sums, {k: v for k, v in outputs.items() if k not in moments}

    def one_batch(first, limit):
      if here:
        return on_replica(first, limit)
      sums, rows_out = self._strategy.run(on_replica, args=(first, limit))
      flat = {f"{name}/{i}": part for name in moments for i, part in enumerate(sums[name])}
      reduced = reduction.across_replicas(self._strategy, dict.fromkeys(flat, "SUM"), flat)
      return ({name: tuple(reduced[f"{name}/{i}"] for i in range(3)) for name in moments},
              reduction.gathered(self._strategy, rows_out))

    return one_batch if self._eager else tf.function(one_batch, autograph=False)

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


def _read(iterator, one_batch, bound):
  """Runs `one_batch` over `iterator` to its end, or `bound` batches; returns each
  result's sum over the rows, the rows and the batches. An iterator cut here (a
  dataset function's; a dataset is cut by its `take`) is abandoned mid-read."""
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
    else:
      data_lib.abandon(iterator)
  return totals, examples, batches


def _check_sample_outputs(outputs, rows, moments):
  if not isinstance(outputs, dict) or not outputs:
    raise TypeError("over_samples: fn must return a dict of per-sample tensors "
                    f"[rows, ...], got {type(outputs).__name__}; e.g. "
                    "return {'features': features}.")
  missing = [name for name in moments if name not in outputs]
  if missing:
    raise ValueError(f"over_samples: moments names {missing}, which fn does not return "
                     f"(it returns {sorted(outputs)}).")
  for name, value in outputs.items():
    shape = value.shape
    if shape.rank is None or shape.rank < 1 or shape[0] not in (None, rows):
      raise ValueError(f"over_samples: fn's output {name!r} has shape {shape}; each "
                       f"output must have one row per sample index ({rows} here).")
    if name in moments and shape.rank != 2:
      raise ValueError(f"over_samples: moments of {name!r} need rows of features "
                       f"[rows, d], got shape {shape}.")


def _length_unknown(data):
  """Whether tf.data cannot tell how many batches `data` holds (a dataset
  function's data is made on each worker: its length is unknown here too)."""
  return not isinstance(data, tf.data.Dataset) or (
      int(data.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY))


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

  threading.Thread(target=watch, daemon=True, name="ctl-evaluate-watch").start()

  def beat(batches):
    last[:] = [time.monotonic(), batches]

  try:
    yield beat
  finally:
    done.set()
