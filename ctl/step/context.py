"""What a per-replica step is given: `StepContext`.

The runner calls the step function, `train_step(ctx, batch)`, once per replica,
in replica context. `ctx` carries what a step needs to give the same numbers
under any replica count:

    def train_step(ctx, batch):
      generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
      z = ctx.normal([64])                      # same noise for example i, any strategy
      with tf.GradientTape() as tape:
        fake = generator(z, training=True)
        loss = ctx.average(per_example_losses)  # mean over the *global* batch
      ctx.minimize(loss, "discriminator", tape=tape)
      return {"discriminator_loss": loss}       # logged as the global-batch value
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import TypeAlias

import keras
import tensorflow as tf

from ctl.base import _tf_internal
from ctl.base import arguments
from ctl.step import reduction

# Philox, named, not "auto_select", so that every device and XLA draw the same bits.
_ALGORITHM = "philox"
_PHILOX = 1  # its number in TF's raw random ops
# A draw's Philox counter is (draw << _DRAW_SHIFT + block, step): each draw of
# a step owns 2**_DRAW_SHIFT blocks of 4 numbers, far more than any draw reads.
_DRAW_SHIFT = 40


def _philox_key(seed):
  """The uint64 [1] Philox key of `seed` ([2] ints): TF's stateless draw of two uint32."""
  halves = tf.cast(tf.random.stateless_uniform([2], seed=seed, minval=None, maxval=None,
                                               dtype=tf.uint32, alg=_ALGORITHM), tf.uint64)
  return tf.reshape(tf.bitwise.bitwise_or(halves[0], tf.bitwise.left_shift(
      halves[1], tf.constant(32, tf.uint64))), [1])


def draw_key(seed: int) -> tf.Tensor:
  """The Philox key of a run's draws from `seed`, as an int64 [1] of its bits: what the
  key variable holds (`State.draw_key`, `StepContext(key=)`), so that a step takes
  another seed without a new trace (`ctl.tools.parity_runs.start_as`)."""
  return tf.bitcast(_philox_key(tf.constant([seed, 0], tf.int64)), tf.int64)


# The second word of an evaluation draw's Philox counter: no training step reaches it.
_SAMPLE_TAG = 1 << 63


# How the ValueError of a `ctx` draw inside a tf.cond or tf.while_loop begins, for
# code that adds advice to it (a subclass would reach the user as a StagingError).
DRAW_IN_CONTROL_FLOW = "ctx.normal, ctx.uniform or ctx.seed was called inside"


def normal_by_index(seed: int, indices: tf.Tensor, shape: int | Sequence[int]) -> tf.Tensor:
  """Standard normals `[len(indices), *shape]` in which row i is a function of
  `(seed, indices[i])` alone: sample i's noise, whatever the batch it is in.

  What makes `Evaluator.over_samples` independent of the replica count and the
  batch size. `indices` must be consecutive (`first, first + 1, ...`), as
  `over_samples` gives them; float32, TF's normal kernel (not for XLA).
  """
  shape = [int(shape)] if isinstance(shape, int) else [int(d) for d in shape]
  numbers = math.prod(shape)
  blocks = -(-numbers // 4)  # the kernel makes 4 float32 normals per Philox block
  indices = tf.cast(indices, tf.int64)
  consecutive = tf.debugging.assert_equal(
      indices, indices[0] + tf.range(tf.size(indices, out_type=tf.int64)),
      message="normal_by_index: indices must be consecutive (first, first + 1, ...), as "
              "over_samples gives them; draw each run of consecutive indices apart")
  with tf.control_dependencies([consecutive]):
    indices = tf.identity(indices)
  counter = tf.stack([tf.cast(indices[0] * blocks, tf.uint64),
                      tf.constant(_SAMPLE_TAG, tf.uint64)])
  with tf.init_scope():  # the key once, eagerly: a constant of the traced graph
    key = _philox_key(tf.constant([int(seed), 0], tf.int64))
  draws = tf.raw_ops.StatelessRandomNormalV2(
      shape=tf.stack([tf.size(indices), 4 * blocks]), key=key, counter=counter,
      alg=_PHILOX, dtype=tf.float32)
  return tf.reshape(draws[:, :numbers], [-1] + shape)


def _uniform(bits):
  """Philox bits as floats in [0, 1): 24 random bits, exact in float32."""
  return tf.cast(tf.bitwise.right_shift(bits, 8), tf.float32) * (2.0 ** -24)


def _as_unit_float(bits):
  """TF's kernels' uint32 -> float in [0, 1): 23 random bits as the mantissa of [1, 2), minus 1."""
  mantissa = tf.bitwise.bitwise_and(bits, 0x7FFFFF)
  return tf.bitcast(tf.bitwise.bitwise_or(mantissa, 0x3F800000), tf.float32) - 1.0


def _as_unit_double(high, low):
  """TF's kernels' two uint32 -> double in [0, 1): 20 bits of `high`, all of `low`."""
  mantissa = tf.bitwise.bitwise_or(
      tf.bitwise.left_shift(tf.cast(tf.bitwise.bitwise_and(high, 0xFFFFF), tf.uint64),
                            tf.constant(32, tf.uint64)), tf.cast(low, tf.uint64))
  one = tf.constant(1023 << 52, tf.uint64)
  return tf.bitcast(tf.bitwise.bitwise_or(mantissa, one), tf.float64) - 1.0


def _box_muller(u1, u2):
  """TF's normal kernel (Box-Muller) in ops, for XLA, whose own normal turns the same
  bits into other numbers (float32 within a few ulps: sine, cosine and log differ)."""
  radius = tf.sqrt(-2.0 * tf.math.log(tf.maximum(u1, 1e-7)))
  # 2 pi times the uniform in double, then in its own type, as the C++ does.
  angle = tf.cast(tf.cast(u2, tf.float64) * (2 * math.pi), u2.dtype)
  return tf.reshape(tf.stack([tf.sin(angle) * radius, tf.cos(angle) * radius], -1), [-1])


class StepContext:
  """Per-replica view of one training step.

  Attributes:
    models: dict of name -> Keras model, as returned by the runner's `build`.
    optimizers: dict of name -> Keras optimizer; an optimizer updates the model
      of the same name unless told otherwise.
    step: int64 scalar tensor, the index of this step (0 for the first).
    global_batch_size: examples in one step over all replicas.
    per_replica_batch_size: examples this replica sees (`global / num_replicas`);
      inside a loss function given `micro_batches`, the rows of one slice.
    num_replicas: replicas in sync, over all workers.
    replica_id: int32 scalar tensor, this replica's index over all workers.
  """

  def __init__(self, *, models: Mapping[str, keras.Model],
               optimizers: Mapping[str, keras.optimizers.Optimizer], step: tf.Tensor,
               seed: tf.Tensor | None = None, global_batch_size: int | tf.Tensor,
               num_replicas: int, replica_id: int | tf.Tensor,
               compile_update: Callable[[Callable], Callable] | None = None,
               float_dtype: tf.DType = tf.float32, key: Any = None,
               shares: reduction.Shares | None = None):
    if (seed is None) == (key is None):
      raise ValueError("StepContext: give exactly one of seed (an int64 [2] tensor) "
                       "and key (a variable holding draw_key(seed)).")
    self.models = _Named("model", models)
    self.optimizers = _Named("optimizer", optimizers)
    self.step = step
    self.global_batch_size = global_batch_size
    self.num_replicas = num_replicas
    self.per_replica_batch_size = global_batch_size // num_replicas
    self._replica_rows = self.per_replica_batch_size  # while a micro-batch runs too
    self.replica_id = replica_id
    self._key = (_philox_key(seed) if key is None
                 else tf.bitcast(tf.convert_to_tensor(key), tf.uint64))
    self._draws = 0
    self._rows = None  # while a micro-batch runs, its rows (a slice i::k)
    self._compile_update = compile_update
    self._float_dtype = float_dtype  # float64 in a float64 run
    self._shares = reduction.Shares() if shares is None else shares  # of global-batch means
    self._tape_updates = []  # (tape, optimizer name) of each tensor-form update

  def average(self, per_example_loss: tf.Tensor,
              sample_weight: tf.Tensor | float | None = None) -> tf.Tensor:
    """Sum of `per_example_loss` over this replica divided by the *global* batch.

    Summed over replicas (by the runner, and by the optimizer for its gradients)
    this is the global-batch mean, as on one device. A scalar (a mean already
    taken) is refused: it would be divided by the global batch size again.
    """
    per_example_loss = tf.convert_to_tensor(per_example_loss)
    if per_example_loss.shape.rank == 0:
      op = getattr(per_example_loss, "op", None) if not tf.executing_eagerly() else None
      raise ValueError(
          f"ctx.average got a scalar (shape (){f', from a {op.type} op' if op else ''}), "
          "not per-example values: it sums them over this replica's rows and divides by "
          f"the global batch size ({self.global_batch_size}). Pass one loss per row, e.g. "
          "ctx.average(tf.square(y - target)), not ctx.average(tf.reduce_mean(...)).")
    self._check_slice(per_example_loss)
    if sample_weight is not None:
      # In the loss's dtype: compute_average_loss weighs in float32, rounding float64.
      per_example_loss *= tf.cast(sample_weight, per_example_loss.dtype)
    value = tf.nn.compute_average_loss(per_example_loss,
                                       global_batch_size=self.global_batch_size)
    return self._shares.mark(value)

  def _check_slice(self, per_example_loss):
    rows = per_example_loss.shape[0] if per_example_loss.shape.rank else None
    if self._rows is not None and rows not in (None, self.per_replica_batch_size):
      raise ValueError(
          f"ctx.average got {rows} per-example values inside a loss function run on "
          f"slices of {self.per_replica_batch_size} rows (micro_batches): the loss must "
          "come from the function's argument, the slice, and so must everything per "
          "example, such as generated images: make them inside the function (ctx.normal "
          "there gives the slice's rows). A value computed outside from the whole batch "
          "would be counted once per slice.")

  def average_regularization(self, losses: Iterable[tf.Tensor]) -> tf.Tensor:
    """Weight penalties (e.g. `model.losses`) scaled so that replicas sum to one copy."""
    return self._shares.mark(tf.nn.scale_regularization_loss(tf.add_n(list(losses))))

  def minimize(self, loss: tf.Tensor | Callable[..., tf.Tensor], optimizer: str, *,
               tape: tf.GradientTape | None = None,
               variables: Iterable[tf.Variable] | None = None,
               batch: Any = None, micro_batches: int = 1) -> tf.Tensor:
    """Applies one update of `optimizer` that lowers `loss`.

    One forward pass can feed several updates: pass the same persistent tape.
    Only the function form compiles with `jit_compile=True` under `mirrored` and
    `multi_worker`, where XLA cannot hold the cross-replica gradient sum: the
    loss and its gradient are then compiled and applied outside XLA.

    With `micro_batches=k` the loss function runs on `k` slices of `batch` in
    turn, and the update applies the sum of their gradients: the whole batch's
    update at a k-th of the activation memory.
    `ctx.normal` and `ctx.uniform` inside give each slice its rows of the whole
    batch's draws, so the result equals one pass up to rounding (BatchNormalization
    sees each slice alone).

    The gradient is summed over replicas before the optimizer sees it, so
    clipnorm, global_clipnorm and clipvalue clip the global batch's gradient, and
    a `LossScaleOptimizer` (mixed_float16) skips a step for an inf on any replica.

    Args:
      loss: scalar tensor from `ctx.average` (with `tape`), or a function returning
        one, of no arguments or of `batch` when it is given.
      optimizer: name of the optimizer in `ctx.optimizers`.
      tape: the `tf.GradientTape` that recorded `loss` (tensor form only).
      variables: variables to update; default: the trainable variables of the
        model with the optimizer's name.
      batch: this replica's batch (a tensor or a nested structure of them), passed
        to the loss function (function form only).
      micro_batches: how many slices of `batch` to accumulate the gradient over;
        it must divide the per-replica batch size.

    Returns:
      The loss, marked as a global-batch value for the runner's reduction.
    """
    if isinstance(loss, str) and not isinstance(optimizer, str):
      raise TypeError(f"minimize: got the name {loss!r} as the loss; the loss comes "
                      f"first: ctx.minimize(loss, {loss!r}, tape=tape).")
    opt = self._optimizer(optimizer)
    updates = ("the variables passed" if variables is not None else
               f"the trainable variables of model {optimizer!r}")
    variables = self._variables(optimizer, variables)
    micro_batches = arguments.integer(
        "micro_batches", micro_batches, minimum=1, meaning="slices of the batch to "
        "accumulate the gradient over")
    if callable(loss):
      if tape is not None:
        raise ValueError("minimize: pass either a loss function or a loss tensor "
                         "with its tape, not both.")
      if micro_batches > 1 and batch is None:
        raise ValueError(
            f"minimize({optimizer!r}, micro_batches={micro_batches}): say which "
            "batch to slice: pass batch=... and take it as the loss function's "
            f"argument: ctx.minimize(lambda batch: ..., {optimizer!r}, batch=real, "
            f"micro_batches={micro_batches}).")
      value, grads = self._loss_and_gradients(loss, opt, variables, optimizer, batch,
                                              micro_batches)
      _check_some_gradient(grads, optimizer, updates)
    else:
      if batch is not None or micro_batches > 1:
        raise ValueError(
            f"minimize({optimizer!r}): batch= and micro_batches= need the loss as a "
            "function of the batch, which ctl can call once per slice: "
            f"ctx.minimize(lambda batch: ..., {optimizer!r}, batch=real, "
            f"micro_batches={micro_batches}). A loss tensor was already computed "
            "on the whole batch.")
      if tape is None:
        raise ValueError(f"minimize({optimizer!r}): a loss tensor needs the "
                         "GradientTape that recorded it: minimize(loss, "
                         f"{optimizer!r}, tape=tape), or pass a loss function.")
      if self._compile_update is not None:
        raise ValueError(
            "jit_compile=True under this strategy compiles each update on its "
            "own, so the loss must be given as a function: "
            f"ctx.minimize(lambda: ..., {optimizer!r}).")
      self._check_loss(loss, optimizer)
      self._check_fresh_tape(tape, optimizer)
      value, grads = loss, _gradients(tape, loss, opt, variables)
      _check_some_gradient(grads, optimizer, updates, tape=tape, variables=variables)
    self._apply(opt, grads, variables)
    return self._shares.mark(value)

  def normal(self, shape: int | Sequence[int], stddev: float = 1.0,
             dtype: tf.DType | None = None) -> tf.Tensor:
    """Standard-normal draws of `shape` per example: `[per_replica_batch, *shape]`.

    Row `i` is the draw for global example `replica_id * per_replica + i` at
    this step, under any layout. `dtype` defaults to float32; a float64 run draws
    float64 (TF's float64 kernel: other numbers from the same seed).
    """
    return self._as_dtype(self._draw(self._normal, shape, "normal"), stddev, dtype)

  def uniform(self, shape: int | Sequence[int], minval: float = 0.0, maxval: float = 1.0,
              dtype: tf.DType | None = None) -> tf.Tensor:
    """Uniform draws in [minval, maxval) per example, like `normal`."""
    u = self._draw(lambda full_shape: _uniform(self._bits(full_shape)), shape, "uniform")
    return self._as_dtype(u, maxval - minval, dtype, offset=minval)

  def _as_dtype(self, draws, scale, dtype, offset=0.0):
    """`offset + scale * draws` in `dtype` (the run's float type by default)."""
    dtype = tf.as_dtype(dtype or self._float_dtype)
    if self._float_dtype == tf.float64 and dtype.is_floating:
      dtype = tf.float64  # a float64 replay runs a step that names float32 as it is
    if dtype == tf.float64:  # computed in float64: nothing rounded to float32
      draws = tf.cast(draws, dtype)
    return tf.cast(offset + scale * draws if offset else draws * scale, dtype)

  def seed(self) -> tf.Tensor:
    """A fresh stateless seed (int32, shape [2]) for this step, equal on every replica,
    for draws that are not per example (any `tf.random.stateless_*`)."""
    return self._bits([2], tf.int32)

  def _counter(self):
    """The next draw's Philox counter: (this draw, this step)."""
    if _tf_internal.in_control_flow_branch():
      # Draws are numbered as the step is traced: compiled, both branches of an
      # `if` (and a loop's body once), eagerly one branch (the body each time).
      raise ValueError(
          f"{DRAW_IN_CONTROL_FLOW} a Python `if` or "
          "`for` on a tensor (a tf.cond or tf.while_loop in the compiled step): its "
          "draws would not be the eager step's. Draw before the `if` or the loop "
          "and use the tensor inside it, or loop with Python's range().")
    self._draws += 1
    return tf.stack([tf.constant(self._draws << _DRAW_SHIFT, tf.uint64),
                     tf.cast(self.step, tf.uint64)])

  def _bits(self, shape, dtype=tf.uint32, counter=None):
    """The next draw's Philox bits: the same on every device, eagerly and under XLA."""
    return tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=shape, key=self._key, counter=self._counter() if counter is None else counter,
        alg=_PHILOX, dtype=dtype)

  def _normal(self, shape):
    """The next draw's normals: TF's kernel, one op; under XLA `_box_muller`."""
    counter = self._counter()
    # float64 in a float64 run: float32 draws differ by rounding under XLA.
    dtype = tf.float64 if self._float_dtype == tf.float64 else tf.float32
    if not _tf_internal.in_xla_context():
      return tf.raw_ops.StatelessRandomNormalV2(
          shape=shape, key=self._key, counter=counter, alg=_PHILOX, dtype=dtype)
    size = tf.reduce_prod(shape)
    if dtype == tf.float64:  # 4 Philox numbers a pair of normals
      bits = self._bits(tf.stack([(size + 1) // 2, 4]), counter=counter)
      u1, u2 = _as_unit_double(bits[:, 0], bits[:, 1]), _as_unit_double(bits[:, 2], bits[:, 3])
    else:
      bits = self._bits(tf.stack([(size + 1) // 2, 2]), counter=counter)
      u1, u2 = _as_unit_float(bits[:, 0]), _as_unit_float(bits[:, 1])
    return tf.reshape(_box_muller(u1, u2)[:size], shape)

  def _draw(self, sampler, shape, name):
    # Every replica draws the whole global batch and keeps its rows: small for
    # noise vectors, and the numbers do not depend on the strategy.
    shape = _example_shape(shape, name)
    _warn_of_a_batch_dimension(shape, name, self.global_batch_size)
    full = sampler([self.global_batch_size] + shape)
    start = tf.cast(self.replica_id, tf.int32) * self._replica_rows
    rows = tf.slice(full, [start] + [0] * len(shape), [self._replica_rows] + shape)
    if self._rows is not None:  # a slice of micro_batches: its rows only
      rows = rows[self._rows]
    self._shares.watch_source(rows)
    return rows

  def _optimizer(self, name):
    if name not in self.optimizers:
      raise ValueError(f"minimize: no optimizer named {name!r}; build() returned "
                       f"optimizers {sorted(self.optimizers)}.")
    return self.optimizers[name]

  def _variables(self, name, variables):
    if variables is not None:
      return list(variables)
    if name not in self.models:
      raise ValueError(f"minimize({name!r}): no model named {name!r} to take "
                       f"variables from (models: {sorted(self.models)}); pass "
                       "variables=... to say what the optimizer updates.")
    return self.models[name].trainable_variables

  def _check_loss(self, loss, name):
    kind, _ = self._shares.kind(loss)
    if kind != reduction.GLOBAL:
      raise ValueError(
          f"minimize({name!r}): the loss is not an average over the global "
          "batch; compute it with ctx.average(per_example_losses) (plus "
          "ctx.average_regularization(...) for weight penalties). A per-replica "
          "mean such as tf.reduce_mean makes the gradients, summed over "
          "replicas, num_replicas times too large.")

  def _check_fresh_tape(self, tape, name):
    if any(t is tape and n == name for t, n in self._tape_updates):
      raise ValueError(
          f"minimize({name!r}) was called twice with the same tape: the tape "
          "recorded one forward pass, so the second update would apply the "
          "gradient of the weights before the first one (the same stale "
          "gradient twice). Record each update under its own tape (e.g. `with "
          "tf.GradientTape() as tape:` inside the loop of critic updates), or "
          f"pass the loss as a function: ctx.minimize(lambda: ..., {name!r}).")
    self._tape_updates.append((tape, name))

  def _apply(self, optimizer, grads, variables):
    """Applies the global batch's gradient, summed here (`gradients_summed_by_caller`)."""
    if self.num_replicas == 1:
      optimizer.apply_gradients(zip(grads, variables))
      return
    with _tf_internal.gradients_summed_by_caller(optimizer) as summed_here:
      if summed_here:
        grads = _sum_over_replicas(grads)
      optimizer.apply_gradients(zip(grads, variables))

  def _loss_and_gradients(self, loss_fn, opt, variables, name, batch, micro_batches):
    loss_fn = autograph(loss_fn)

    def one_pass(args):
      with tf.GradientTape() as tape:
        value = loss_fn(*args)
      self._check_loss(value, name)
      return value, _gradients(tape, value, opt, variables)

    def compute():
      if batch is None:
        return one_pass(())
      if micro_batches == 1:
        return one_pass((batch,))
      return self._accumulate(one_pass, batch, micro_batches, name)

    if self._compile_update is None:
      return compute()
    return self._compile_update(compute)()

  def _accumulate(self, one_pass, batch, micro_batches, name):
    """`one_pass` on each slice of `batch` in turn; the summed loss and gradients.

    Slice i of k holds rows i, i + k, ...: the global rows whose index is i modulo k
    under any strategy, so a synchronized BatchNormalization sees the same examples.
    """
    size = self.per_replica_batch_size
    if not isinstance(size, int) or size % micro_batches:
      raise ValueError(
          f"minimize({name!r}, micro_batches={micro_batches}): the per-replica "
          f"batch size ({size}) must be a known multiple of micro_batches; batch "
          "the data with drop_remainder=True and a global batch size divisible by "
          f"num_replicas x micro_batches ({self.num_replicas} x {micro_batches}).")
    values, total, after = [], None, []
    first_draw = self._draws
    for i in range(micro_batches):
      # Each slice waits for the gradients of the one before, so that only one
      # slice's activations are alive at a time.
      with tf.control_dependencies(after):
        piece = tf.nest.map_structure(lambda t, i=i: t[i::micro_batches], batch)
      self._draws = first_draw  # every slice draws from the same seeds ...
      self._rows = slice(i, None, micro_batches)  # ... and keeps its own rows
      self.per_replica_batch_size = size // micro_batches
      try:
        value, grads = one_pass((piece,))
      finally:
        self._rows, self.per_replica_batch_size = None, size
      values.append(value)
      total = grads if total is None else [
          a if b is None else b if a is None else a + b for a, b in zip(total, grads)]
      after = [g for g in grads if g is not None]
    return self._shares.mark(tf.add_n(values)), total


def _example_shape(shape, name):
  """One example's draw shape as Python ints; a tensor in it (a batch size from
  `tf.shape`) is refused eagerly too, where int() would take it."""
  if hasattr(shape, "tolist") and not tf.is_tensor(shape):  # a NumPy array or number
    shape = shape.tolist()
  parts = list(shape) if isinstance(shape, (list, tuple, tf.TensorShape)) else [shape]
  if not any(tf.is_tensor(d) for d in parts):
    try:
      ints = [int(d) for d in parts]
      if all(i == d for i, d in zip(ints, parts)):  # 4.5 is not cut to 4, nor "4" read
        return ints
    except (TypeError, ValueError):
      pass
  described = ", ".join("<tensor>" if tf.is_tensor(d) else repr(d) for d in parts)
  raise ValueError(
      f"ctx.{name}(shape): shape must be Python ints, the shape of one example's "
      f"draw, got [{described}]. ctx adds the batch dimension itself: "
      f"ctx.{name}(noise_dim) gives [per-replica batch, noise_dim], row i drawn for "
      f"example i, so leave the batch size (tf.shape(x)[0]) out.")


_warned_shapes = set()  # (name, shape) already warned of, once per process


def _warn_of_a_batch_dimension(shape, name, global_batch):
  """Warns (once) when a draw's shape starts with the global batch size, as for
  `tf.random.normal`: a dimension that Dense layers may take silently. Not for batch 1
  (WGAN-GP's `[1, 1, 1]`), a square map (`[32, 32, 1]` at batch 32), or the
  per-replica batch size (`[8, 512]` at batch 16 on 2 replicas): false alarms."""
  square_map = len(shape) >= 3 and shape[0] == shape[1]
  if (len(shape) < 2 or not isinstance(global_batch, int) or shape[0] != global_batch
      or global_batch == 1 or square_map
      or (name, tuple(shape)) in _warned_shapes):
    return
  _warned_shapes.add((name, tuple(shape)))
  fix = shape[1] if len(shape) == 2 else shape[1:]
  warnings.warn(
      f"ctx.{name}({shape}): the first dimension is the batch size ({shape[0]}), but ctx "
      f"adds the batch dimension itself, so this draws [per-replica batch, "
      f"{', '.join(map(str, shape))}]. For one draw of {shape[1:]} per example, call "
      f"ctx.{name}({fix}).", UserWarning, stacklevel=_callers_level())


def _callers_level() -> int:
  """The `stacklevel` of the user's first frame, for a warning raised inside
  ctx: the step's line when it runs eagerly; when it is traced (autograph's
  copy of it runs), the line that started training."""
  skipped = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # ctl
             os.path.dirname(os.path.abspath(tf.__file__)))
  frame, level = sys._getframe(2), 2  # pylint: disable=protected-access
  while frame is not None and (
      os.path.abspath(frame.f_code.co_filename).startswith(skipped)
      or "__autograph_generated_file" in frame.f_code.co_filename):
    frame, level = frame.f_back, level + 1
  return level


StepFn: TypeAlias = Callable[[StepContext, Any], dict[str, tf.Tensor]]
"""A step function, `step_fn(ctx, batch) -> {name: scalar}`: what the runner runs per replica."""


class _Named(dict):
  """`ctx.models` and `ctx.optimizers`: a missing name lists the names there are."""

  def __init__(self, kind, items):
    super().__init__(items)
    self._kind = kind

  def __missing__(self, name):
    raise KeyError(f"no {self._kind} named {name!r}; build() returned "
                      f"{self._kind}s {sorted(self)}")


def _sum_over_replicas(grads):
  """Each gradient summed over the replicas; a None stays for the optimizer to report."""
  present = [g for g in grads if g is not None]
  if not present:
    return grads
  summed = iter(tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, present))
  return [None if g is None else next(summed) for g in grads]


def _check_some_gradient(grads, name, updates, *, tape=None, variables=()):
  """Refuses an update whose every gradient is None (Keras would say only "No gradients
  provided for any variable"); some None (an unused layer) the optimizer skips."""
  if not grads or any(g is not None for g in grads):
    return
  if tape is not None:
    watched = {id(v) for v in tape.watched_variables()}
    if not any(id(v) in watched or id(getattr(v, "value", v)) in watched for v in variables):
      raise ValueError(
          f"minimize({name!r}): the loss was not recorded by the tape passed to "
          f"ctx.minimize: none of the {len(grads)} variables it updates ({updates}) "
          "was read under that tape, so every gradient is None. Compute the loss "
          "inside the `with tf.GradientTape() as tape:` block, or pass it as a "
          f"function: ctx.minimize(lambda: ..., {name!r}).")
  what = "the loss function's result" if tape is None else "the loss"
  raise ValueError(
      f"minimize({name!r}): {what} does not depend on any of the {len(grads)} "
      f"variables it updates ({updates}), so every gradient is None. Pass the loss "
      f"that model {name!r} should lower (e.g. the discriminator's loss for "
      "'discriminator', not the generator's), and look for a tf.stop_gradient "
      "between those variables and the loss"
      + ("; a loss finished after the `with tf.GradientTape()` block (e.g. "
         "`minimize(d_loss + penalty, ...)`) was not recorded: add the terms inside "
         "the block." if tape is not None else "."))


def _gradients(tape, loss, optimizer, variables):
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    with tape:  # Re-entering the tape records the scaling, so gradients flow.
      loss = optimizer.scale_loss(loss)
  return tape.gradient(loss, variables)


@tf.autograph.experimental.do_not_convert  # as written, also in a tf.function of the user's
def autograph(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` as autograph converts what a `tf.function` calls, in a graph.

  Only the user's functions are converted (the step, a loss given to `minimize`):
  ctl's own code is written for graphs, and converting it slows the first trace.
  `fn` may be any callable; one autograph cannot convert runs as written.
  """
  if tf.executing_eagerly():
    return fn
  _tf_internal.gin_errors_not_converted_by_autograph()  # gin's wrapper is converted

  def call(*args, **kwargs):
    return fn(*args, **kwargs)

  return tf.autograph.to_graph(call)


# ctl's own code runs as written in a graph (see `autograph`).
for _name, _method in list(vars(StepContext).items()):
  if not _name.startswith("__") and callable(_method):
    setattr(StepContext, _name, tf.autograph.experimental.do_not_convert(_method))
