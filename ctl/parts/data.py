"""Feeding data to replicas: each global batch is split, in order, across replicas.

Two kinds of input are accepted:

    feed = make_feed(dataset, placement)      # a tf.data.Dataset of global batches
    feed = make_feed(dataset_fn, placement, global_batch_size=256)
    # dataset_fn(input_context) -> per-replica batches, one pipeline per worker

A dataset of global batches is read through a plain iterator, which can be
checkpointed, and sliced per replica (replica r of n gets rows [r*G/n, (r+1)*G/n)):
every strategy sees the same examples in the same place. TPUs and dataset
functions use TF's distributed datasets.
"""

from __future__ import annotations

import atexit
import ctypes
import inspect
import warnings
from collections.abc import Callable
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeAlias

import tensorflow as tf

from ctl.base import arguments

if TYPE_CHECKING:
  from ctl.distribute.placement import Placement
  from ctl.distribute.strategies import ClusterCoordinator

DatasetFn: TypeAlias = Callable[[tf.distribute.InputContext], tf.data.Dataset]
"""`dataset_fn(input_context)`: one input pipeline's dataset of per-replica batches."""
Data: TypeAlias = tf.data.Dataset | DatasetFn
"""Training or evaluation data: a dataset of global batches, or a `DatasetFn`."""


def make_feed(data: Data, placement: Placement, *,
              global_batch_size: int | None = None, batches_per_step: int = 1,
              static_shapes: bool = False,
              coordinator: ClusterCoordinator | None = None) -> Feed:
  """Returns the feed for `data` under `placement`'s strategy.

  `data`, `global_batch_size` and `batches_per_step` are `ctl.Runner`'s (with a dataset,
  a `global_batch_size` given must equal its batch size). `static_shapes`: a static
  batch dimension even on one replica (XLA). With a parameter-server run's
  `coordinator`, each worker reads its own copy of the data.
  """
  is_dataset = isinstance(data, tf.data.Dataset)
  if not is_dataset and not (callable(data) and len(inspect.signature(data).parameters) == 1):
    raise TypeError(f"data must be a tf.data.Dataset of global batches or a function "
                    f"taking a tf.distribute.InputContext, got {type(data).__name__}.")
  if global_batch_size is not None and (not isinstance(global_batch_size, int) or
                                        isinstance(global_batch_size, bool)):
    raise TypeError(f"global_batch_size must be an int, got {global_batch_size!r} "
                    f"({type(global_batch_size).__name__}); pass e.g. "
                    f"global_batch_size={_as_int_hint(global_batch_size)}.")
  if not is_dataset and global_batch_size is None:
    raise ValueError("data is a dataset function, so the runner cannot see the "
                     "global batch size; pass global_batch_size=... (the sum of "
                     "the per-replica batches).")
  if coordinator is not None:
    feed = PerWorkerBatches(data, placement, coordinator,
                            global_batch_size=global_batch_size,
                            batches_per_step=batches_per_step)
  elif is_dataset:
    feed = GlobalBatches(data, placement, batches_per_step=batches_per_step,
                         static_shapes=static_shapes)
  else:
    return DistributedBatches(data, placement, global_batch_size=global_batch_size,
                              batches_per_step=batches_per_step)
  if is_dataset and global_batch_size is not None:
    if feed.global_batch_size is None:
      raise ValueError(f"global_batch_size is {global_batch_size} but data has no "
                       "static batch size; batch it with drop_remainder=True.")
    if global_batch_size != feed.global_batch_size:
      raise ValueError(f"global_batch_size ({global_batch_size}) differs from the "
                       f"batch size of data ({feed.global_batch_size}); drop "
                       "global_batch_size or batch the dataset by it.")
  return feed


def cast_floats(data: Data, dtype: tf.DType) -> Data:
  """`data` with every float tensor cast to `dtype` (integers stay): a float64 run's data."""
  def cast(*element):
    element = element[0] if len(element) == 1 else element
    return tf.nest.map_structure(
        lambda t: tf.cast(t, dtype) if t.dtype.is_floating else t, element)

  if isinstance(data, tf.data.Dataset):
    return data.map(cast)
  return lambda input_context: data(input_context).map(cast)


def warn_if_outside_outputs(data: Data, models: dict[str, Any], stacklevel: int) -> None:
  """Warns if the first batch, shaped like the output of a model ending in tanh or
  sigmoid, holds values out of its range (for a dataset of global batches only)."""
  if not isinstance(data, tf.data.Dataset):
    return
  ranges = {}  # output shape -> (model name, activation, low, high)
  known = {"tanh": (-1.0, 1.0), "sigmoid": (0.0, 1.0)}
  for name, model in models.items():
    try:
      shape = tuple(model.outputs[0].shape[1:])
      activation = getattr(model.layers[-1], "activation", None)
    except (AttributeError, IndexError, TypeError, ValueError):
      continue  # a subclassed model: no static output
    kind = getattr(activation, "__name__", None)
    if kind in known and None not in shape:
      ranges.setdefault(shape, (name, kind) + known[kind])
  specs = [spec for spec in tf.nest.flatten(data.element_spec)
             if isinstance(spec, tf.TensorSpec) and spec.shape.rank is not None]
  if not any(_output_like(spec.shape[1:], ranges) for spec in specs):
    return  # nothing to compare: the data is not read
  try:
    first = next(iter(data.take(1)))
  except (StopIteration, tf.errors.OpError):
    return  # an empty or failing pipeline: its own error comes with the first step
  flat = tf.nest.flatten(first)
  for i, tensor in enumerate(flat):
    output = _output_like(tensor.shape[1:], ranges) if tensor.shape.rank else None
    if output is None or not (tensor.dtype.is_floating or tensor.dtype.is_integer):
      continue
    name, kind, low, high = ranges[output]
    seen_low = float(tf.reduce_min(tf.cast(tensor, tf.float64)))
    seen_high = float(tf.reduce_max(tf.cast(tensor, tf.float64)))
    if tensor.dtype.is_integer or seen_low < low - 1e-3 or seen_high > high + 1e-3:
      which = f"tensor {i} of the first batch" if len(flat) > 1 else "the first batch"
      scale = "/ 127.5 - 1" if kind == "tanh" else "/ 255"
      warnings.warn(
          f"Runner: {which} ({tensor.dtype.name}, shaped like the output of model {name!r}) "
          f"holds values in [{seen_low:g}, {seen_high:g}], but {name!r} ends in {kind}, "
          f"whose output is in [{low:g}, {high:g}]: the discriminator can tell real "
          "from generated by the range alone, and the GAN learns nothing. Scale the "
          f"data in its pipeline, e.g. data.map(lambda x: tf.cast(x, tf.float32) {scale}) "
          "for images in [0, 255].", stacklevel=stacklevel + 1)
      return


def _output_like(shape, outputs):
  """The shape among `outputs` that `shape` (one example's) matches, or None: the same,
  or for images equal but for axes of size 1 ([28, 28] beside [28, 28, 1]; not labels)."""
  shape = tuple(shape)
  if shape in outputs:
    return shape
  squeezed = tuple(d for d in shape if d != 1)
  for output in outputs:
    if len(squeezed) >= 2 and squeezed == tuple(d for d in output if d != 1):
      return output
  return None


def check_evaluation_data(data: Data, num_batches: int | None) -> None:
  """Refuses, before any work, an evaluation that could never end (every `gan`
  dataset repeats forever, so a forgotten `.take(n)` is the easy mistake)."""
  if num_batches is not None:
    arguments.integer("num_batches", num_batches, minimum=1, meaning="batches to evaluate")
    return
  if (isinstance(data, tf.data.Dataset) and
      int(data.cardinality()) == int(tf.data.INFINITE_CARDINALITY)):
    raise ValueError(
        "evaluation data is endless (infinite cardinality: it repeats without a "
        "count), so the evaluation would never end. Pass a finite dataset, e.g. "
        "data.take(100), or num_batches=100 to evaluate that many batches.")


def check_data_lasts(feed: Feed, num_steps: int, call: str) -> None:
  """Refuses, before any step, training that needs more batches than a finite dataset
  holds: it would stop with an error where the data ends, after training it could not
  keep. Only what can never fit is refused: the iterator may already be part-read."""
  batches = getattr(feed, "batches", -1)
  needed = num_steps * feed.batches_per_step
  if batches <= 0 or needed <= batches:
    return
  per_step = (f" ({feed.batches_per_step} batches a step)" if feed.batches_per_step > 1
              else "")
  raise ValueError(
      f"{call} needs {needed} batches{per_step} but the data holds {batches} (its "
      f"cardinality): training would stop with an error where it ends. Call .repeat() "
      f"on the dataset (dataset.repeat(), before or after batching), or train at most "
      f"{batches // feed.batches_per_step} steps.")


def _as_int_hint(value):
  try:
    return int(value)
  except (TypeError, ValueError):
    return 256


def check_global_batch_size(global_batch_size: int, num_replicas: int) -> None:
  """Raises unless `global_batch_size` splits evenly across `num_replicas`."""
  if global_batch_size < num_replicas:
    raise arguments.LayoutError(
        f"global batch size ({global_batch_size}) is smaller than the {num_replicas} "
        "replicas in sync: every replica needs at least one example; use a multiple of "
        f"{num_replicas}.")
  if global_batch_size % num_replicas:
    multiple = global_batch_size // num_replicas * num_replicas
    raise arguments.LayoutError(
        f"global batch size ({global_batch_size}) is not divisible by the {num_replicas} "
        f"replicas in sync; use a multiple of {num_replicas}, e.g. {multiple}.")


class GlobalBatches:
  """A dataset of global batches, sliced per replica inside the step function."""

  def __init__(self, dataset: tf.data.Dataset, placement: Placement, *,
               batches_per_step: int = 1, static_shapes: bool = False):
    self.strategy = strategy = placement.strategy
    self.batches_per_step = batches_per_step
    self.global_batch_size: int | None = _batch_size(dataset.element_spec)
    self._replicas = num_replicas = placement.replicas
    if self.global_batch_size is None and (num_replicas > 1 or static_shapes):
      why = (f"splitting it across {num_replicas} replicas" if num_replicas > 1
             else "XLA (jit_compile)")
      raise ValueError(
          f"data has no static batch size (its batch dimension is None), which "
          f"{why} needs; batch it with drop_remainder=True, e.g. "
          "dataset.batch(global_batch_size, drop_remainder=True).")
    if self.global_batch_size is not None:
      check_global_batch_size(self.global_batch_size, num_replicas)
    # Batches the data holds: a count, or INFINITE (-1) or UNKNOWN (-2) cardinality.
    self.batches = int(dataset.cardinality())
    if self.batches == 0:
      size = self.global_batch_size or "B"
      raise ValueError(
          f"data holds no batch (its cardinality is 0): it is empty, or has fewer "
          f"examples than one global batch of {size} with drop_remainder=True. Give it "
          f"at least {size} examples, or repeat before batching: "
          f"dataset.repeat().batch({size}, drop_remainder=True).")
    self.element_spec = dataset.element_spec
    self._dataset = prefetched(dataset)
    # A plain iterator can be checkpointed, TF's distributed one cannot (a TPU's input).
    self.checkpointable = not placement.kind.distributed_datasets
    if self.checkpointable:
      self._split = self._split_across_replicas
    else:
      self._dataset = strategy.experimental_distribute_dataset(self._dataset)
      self._split = lambda batch: batch
    self.iterator = self.make_iterator()

  def make_iterator(self) -> Iterator[Any]:
    """A new iterator from the start of the data."""
    return iter(self._dataset)

  def next(self, iterator: Iterator[Any] | None = None) -> Any:
    """The next step's input: one per-replica batch, or a tuple of them."""
    iterator = self.iterator if iterator is None else iterator
    return _step_input(lambda: self._split(_next(iterator)), self.batches_per_step)

  def _split_across_replicas(self, batch):
    if self._replicas == 1:  # the whole batch, whose size may be unknown
      return self.strategy.experimental_distribute_values_from_function(lambda _: batch)
    size = self.global_batch_size // self._replicas

    def rows_of_replica(context):
      start = context.replica_id_in_sync_group * size
      return tf.nest.map_structure(lambda x: x[start:start + size], batch)

    return self.strategy.experimental_distribute_values_from_function(rows_of_replica)


class DistributedBatches:
  """Per-replica batches from a dataset function, one input pipeline per worker."""

  def __init__(self, dataset_fn: DatasetFn, placement: Placement, *,
               global_batch_size: int, batches_per_step: int = 1):
    replicas = placement.replicas
    check_global_batch_size(global_batch_size, replicas)
    self.strategy = strategy = placement.strategy
    self.batches_per_step = batches_per_step
    self.global_batch_size = global_batch_size
    per_replica = global_batch_size // replicas

    def checked(context):
      dataset = dataset_fn(context)
      size = _batch_size(dataset.element_spec)
      if size != per_replica:
        raise ValueError(
            f"the dataset function gives batches of {size} examples, but each of "
            f"the {replicas} replicas needs {per_replica} "
            f"(global_batch_size {global_batch_size}); batch it by "
            "input_context.get_per_replica_batch_size(global_batch_size) with "
            "drop_remainder=True.")
      return prefetched(dataset)

    self.checkpointable = False  # TF cannot save a distributed iterator
    self._dataset = strategy.distribute_datasets_from_function(checked)
    self.element_spec = self._dataset.element_spec
    self.iterator = self.make_iterator()

  def make_iterator(self) -> Iterator[Any]:
    """A new iterator from the start of the data."""
    return iter(self._dataset)

  def next(self, iterator: Iterator[Any] | None = None) -> Any:
    iterator = self.iterator if iterator is None else iterator
    return _step_input(lambda: _next(iterator), self.batches_per_step)


class PerWorkerBatches:
  """Parameter servers: every worker reads the whole dataset, from its own copy.

  TF gives the workers of a parameter-server cluster no input-pipeline index
  (each runs the same dataset graph), and a seeded dataset, as ctl asks for,
  would then give every worker the same batches at the same time. Each
  worker's copy therefore starts at an offset drawn from its own clock: the
  workers read the same sequence, out of step with each other.
  """

  def __init__(self, data: Data, placement: Placement,
               coordinator: ClusterCoordinator, *, global_batch_size: int | None,
               batches_per_step: int = 1):
    if placement.replicas != 1:
      raise ValueError(f"parameter-server workers with "
                       f"{placement.replicas} replicas each are not "
                       "supported; give each worker one device.")
    self.strategy = strategy = placement.strategy
    self.batches_per_step = batches_per_step
    self.checkpointable = False  # one iterator per worker, on the workers
    if isinstance(data, tf.data.Dataset):
      self.global_batch_size = _batch_size(data.element_spec)
      dataset = _out_of_step(data)
    else:  # a dataset function
      self.global_batch_size = global_batch_size
      dataset = lambda: strategy.distribute_datasets_from_function(  # noqa: E731
          lambda context: _out_of_step(data(context)))
    self.iterator = iter(coordinator.create_per_worker_dataset(dataset))
    self.element_spec = getattr(data, "element_spec", None)

  def make_iterator(self) -> Iterator[Any]:
    """Refused: the data is read on the workers, each from its own copy."""
    raise ValueError("the data of a parameter_server run is read on the workers, each "
                     "from its own copy, so the coordinator has no iterator of its own; "
                     "read batches from the dataset itself, or build the runner under "
                     "'default' to look at them.")

  def next(self, iterator: Iterator[Any]) -> Any:
    """The next step's input, from the worker's iterator the scheduled function is given."""
    return _step_input(lambda: next(iterator), self.batches_per_step)


Feed: TypeAlias = GlobalBatches | DistributedBatches | PerWorkerBatches
"""How a runner reads its data: what `make_feed` returns."""

# Batches a worker may skip at its start (see PerWorkerBatches).
_MAX_OFFSET = 64


def _out_of_step(dataset):
  """`dataset`, from a batch chosen by the clock of the worker that runs it."""
  start = tf.data.Dataset.from_tensors(0).map(
      lambda _: tf.cast(tf.timestamp() * 1e6, tf.int64) % _MAX_OFFSET)
  return prefetched(start.flat_map(dataset.skip))


def prefetched(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` as the runner reads it: prefetched, without tf.data's autotune thread.

  Freeing an iterator of an autotuned dataset can wait for that thread's next
  re-tune, up to a minute, at exit too. Without it an `AUTOTUNE` value keeps its
  starting value; a dataset whose options set `autotune.enabled` keeps its choice.
  """
  dataset = dataset.prefetch(tf.data.AUTOTUNE)
  if dataset.options().autotune.enabled is not None:
    return dataset  # the user chose
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


# Iterators left mid-read (an evaluation stopped by a signal or an error), kept
# for the life of the process: freeing one waits for its pipeline's threads, and
# one inside Python (`tf.py_function`, `from_generator`) needs the interpreter lock
# the freeing thread holds, so the process would hang. Finished iterators are safe.
_abandoned = []


def abandon(iterator: Iterator[Any]) -> None:
  """Keeps `iterator`, left mid-read, from ever being freed (see `_abandoned`)."""
  if not _abandoned:
    atexit.register(_keep_abandoned)
  _abandoned.append(iterator)


def _keep_abandoned():
  # At exit Python empties every module's globals, this list too: one more
  # reference, never given back, keeps it (the process is ending).
  ctypes.pythonapi.Py_IncRef(ctypes.py_object(_abandoned))


def _step_input(fetch, batches_per_step):
  batches = tuple(fetch() for _ in range(batches_per_step))
  return batches[0] if batches_per_step == 1 else batches


def _next(iterator):
  try:
    return next(iterator)
  except StopIteration:  # eagerly; in a graph the same end is an OutOfRangeError
    raise tf.errors.OutOfRangeError(None, None, "End of sequence") from None


def _batch_size(element_spec):
  """The common static first dimension of every tensor in a dataset element."""
  sizes = set()
  for spec in tf.nest.flatten(element_spec):
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank in (None, 0):
      raise ValueError(f"data elements must be batches: tensors whose first "
                       f"dimension is the batch, got {spec}; call dataset.batch(...).")
    sizes.add(spec.shape[0])
  if len(sizes) > 1:
    raise ValueError(f"the tensors of one data element have different batch sizes "
                     f"{sorted(sizes, key=str)}; batch them together.")
  return sizes.pop()
