"""How a step's results are reduced over replicas: one rule, one reduce.

A step returns scalars computed on each replica. A share of a global-batch
mean (what `ctx.average`, `ctx.average_regularization` and `ctx.minimize`
return, or a sum or constant multiple of such values) is summed over
replicas; a value that does not depend on one (a per-replica mean, an
accuracy) is averaged. Either way the number logged is the global batch's. An
integer or boolean tensor (a count) is refused: neither reduction gives it.

    shares = Shares()                      # one per replica and step; the context marks
    with shares.recording(batch):          # eagerly, tapes that the rule reads
      results = step_fn(ctx, batch)
    values = step_results(shares, results, ops, num_replicas=n)   # per replica
    reduced = across_replicas(strategy, ops, per_replica_values)  # cross-replica

Training (`ctl.parts.steps`) and evaluation (`ctl.parts.evaluation`) both reduce here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ctl.base import _tf_internal

# What a value is to the rule.
CONST, LOCAL, GLOBAL, MIXED = "const", "local", "global", "mixed"
# Ops through which a share of a global mean stays one: the first input is the
# value, any other input must be a constant (a shape, an axis).
_PASS_THROUGH = {"Identity", "StopGradient", "Cast", "Neg", "Reshape", "Squeeze",
                 "ExpandDims"}
# A share times or over a constant is a share of a scaled mean; times a
# per-replica value it is not (each replica would scale its share differently).
_SCALE = {"Mul", "RealDiv", "Div", "DivNoNan", "TrueDiv"}
# Shares summed are a share of the summed means.
_SUM = {"Add", "AddV2", "Sub", "AddN"}


class Shares:
  """One replica's shares of global-batch means in one step, and the rule that
  tells from them how a result is reduced over replicas (`op`)."""

  def __init__(self):
    self._global_values = set()  # refs of shares of a global-batch mean
    self._shares = []  # the same tensors, for the eager check
    self._tape = None  # eagerly: records what follows from the shares
    self._sources = None  # eagerly: records what follows from per-replica values
    self._source_tensors = []  # the tensors it watches (the batch, the noise)

  def op(self, value: Any, name: str) -> tf.distribute.ReduceOp:
    """How the runner reduces result `name` over replicas: SUM or MEAN.

    A compiled step is told apart by following the graph back; an eager one by
    gradients: a value made of shares by sums and constant factors equals the sum of
    share x gradient, and no gradient (factor) depends on what differs between
    replicas (the batch, the variables, the noise). Eager blind spots:
    `tf.stop_gradient` hides a share, and a factor from an op without a gradient
    (an argmax) counts as a constant.

    Raises:
      ValueError: `value` is made of shares otherwise (a square root, a sum with a
        per-replica value): neither reduction gives its global-batch value.
    """
    kind, op = self.kind(value)
    if kind == MIXED:
      raise ValueError(
          f"{name} is computed from global-batch averages (ctx.average, "
          f"ctx.minimize) through {op}, after which it is no longer a share of "
          "the global mean, so the runner cannot reduce it over replicas. Return "
          "the averages themselves (sums and constant multiples are fine), or "
          "build it from per-example values with ctx.average(...).")
    return tf.distribute.ReduceOp.SUM if kind == GLOBAL else tf.distribute.ReduceOp.MEAN

  @contextlib.contextmanager
  def recording(self, batch: Any = None) -> Iterator[None]:
    """Around the eager step and its reductions: an outer tape watches what differs
    between replicas (the batch, the variables read, the noise), an inner one the shares."""
    if not tf.executing_eagerly():
      yield
      return
    with tf.GradientTape(persistent=True) as sources:
      self._sources = sources
      for tensor in tf.nest.flatten(batch):
        if tf.is_tensor(tensor) and tensor.dtype.is_floating:
          self.watch_source(tensor)
      with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        self._tape = tape
        yield

  def watch_source(self, tensor: tf.Tensor) -> None:
    """Eagerly: records `tensor` as a value that differs between replicas (noise)."""
    if self._sources is None:
      return
    self._sources.watch(tensor)
    self._source_tensors.append(tensor)

  def mark(self, value: Any) -> tf.Tensor:
    """Records `value` as a share of a global-batch mean; returns it as a tensor."""
    value = tf.convert_to_tensor(value)
    if self._tape is not None and self._shares and _is_eager(value) and (
        self.kind(value)[0] == GLOBAL):
      return value  # a share, or made of shares (2 * ctx.average): counted there already
    self._global_values.add(value.ref())
    self._shares.append(value)
    if self._tape is not None:
      self._tape.watch(value)
    return value

  def kind(self, value: Any) -> tuple[str, str | None]:
    """(kind, where shares stopped being shares) of `value`: kind is `GLOBAL`
    (a share), `LOCAL` (per replica), `CONST` or `MIXED` (neither)."""
    if not isinstance(value, tf.Tensor) or value.ref() in self._global_values:
      return (GLOBAL if isinstance(value, tf.Tensor) else CONST), None
    if not _is_eager(value):
      return _graph_kind(value, self._global_values)
    if self._tape is None or not value.dtype.is_floating:
      return LOCAL, None
    with (self._tape.stop_recording() if _tf_internal.tape_is_recording(self._tape)
          else contextlib.nullcontext()):
      grads = self._tape.gradient(value, self._shares)
    if all(g is None for g in grads):
      return LOCAL, None
    factors = [g for g in grads if g is not None]
    linear = tf.add_n([tf.cast(g, tf.float32) * tf.cast(share, tf.float32)
                       for g, share in zip(grads, self._shares) if g is not None])
    if abs(float(linear) - float(value)) > 1e-5 * (1.0 + abs(float(value))):
      return MIXED, "an operation other than sums and constant factors"
    # Linear in the shares; each share's factor must also be a constant, not
    # a value that differs between replicas.
    if self._depends_on_sources(factors):
      return MIXED, "a product with a per-replica value"
    return GLOBAL, None

  def _depends_on_sources(self, tensors):
    sources = list(self._sources.watched_variables()) + self._source_tensors
    if not sources:
      return False
    with self._sources.stop_recording():
      try:
        grads = self._sources.gradient(tensors, sources)
      except LookupError:  # an op on the path has no gradient: a path all the same
        return True
    return any(g is not None for g in grads)


def step_results(shares: Shares, results: Any, ops: dict[str, tf.distribute.ReduceOp], *,
                 num_replicas: int, expected_keys: Sequence[str] | None = None,
                 float_dtype: tf.DType = tf.float32) -> dict[str, tf.Tensor]:
  """A step's results on one replica, checked, as `float_dtype` scalars;
  records in `ops` how each is reduced over replicas (`Shares.op`)."""
  if not isinstance(results, dict):
    raise TypeError(f"step must return a dict of scalar values, got "
                    f"{type(results).__name__}; e.g. return {{'loss': loss}}.")
  if "step" in results:
    raise ValueError("step returned a result named 'step': that name is the step number's "
                     "in every step's record (history.jsonl, ctl.EachStep); rename the "
                     "result, e.g. 'step_size'.")
  if expected_keys is not None and sorted(results) != sorted(expected_keys):
    raise ValueError(f"step results changed keys from {sorted(expected_keys)} "
                     f"to {sorted(results)}; return the same keys at every step.")
  out = {}
  for key, value in results.items():
    if tf.executing_eagerly() and num_replicas > 1 and not tf.is_tensor(value):
      # float(share) has lost what says it is a share: it would be averaged.
      raise TypeError(
          f"step result {key!r} is a {type(value).__name__} ({value!r}), not a "
          f"tensor, on {num_replicas} replicas: the runner cannot tell a "
          "replica's share of a global-batch average (summed over replicas) "
          "from a per-replica value (averaged), so the logged number could be "
          f"1/{num_replicas} of the truth. Return the tensor itself (e.g. "
          "loss, not float(loss)), or tf.constant(...) for a constant.")
    given = value
    value = _scalar(key, value)
    if tf.is_tensor(given) and (value.dtype.is_integer or value.dtype.is_bool):
      # Neither reduction makes a count the same under every strategy: summed, a
      # counter equal on all replicas grows with their number; averaged (as any
      # per-replica value is), a count of a replica's rows shrinks with it.
      raise TypeError(
          f"step result {key!r} is an {value.dtype.name} tensor: a count over this "
          "replica's rows (tf.shape(x)[0], a number of hits) would be averaged over "
          "replicas and change with their number. Return a float: "
          "ctx.average(tf.cast(hits, tf.float32)) for a fraction of the global batch "
          "(ctx.global_batch_size is its size), or tf.cast(value, tf.float32) for a value "
          "equal on every replica.")
    ops[key] = shares.op(value, f"step result {key!r}")
    out[key] = tf.cast(value, float_dtype)
  return out


def across_replicas(strategy: tf.distribute.Strategy, ops: Mapping[str, Any],
                    values: Mapping[str, Any]) -> dict[str, tf.Tensor]:
  """Each of `values` (from `strategy.run`) reduced by its op in `ops` ("SUM", "MEAN", ...)."""
  return {k: strategy.reduce(ops[k], v, axis=None) for k, v in values.items()}


def gathered(strategy: tf.distribute.Strategy, values: Mapping[str, Any]) -> dict[str, tf.Tensor]:
  """Each of `values` (per-replica `[rows, ...]`) joined along the rows, replica 0's
  first, over all workers: every worker gets the whole."""
  return {k: strategy.gather(v, axis=0) for k, v in values.items()}


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


def _is_eager(value):
  return not hasattr(value, "graph") or tf.executing_eagerly()


def _graph_kind(value, shares):
  """Walks the graph up from `value` (each tensor once) to classify it."""
  kinds, where, stack = dict.fromkeys(shares, GLOBAL), None, [value]
  while stack:
    tensor = stack[-1]
    if tensor.ref() in kinds:
      stack.pop()
      continue
    inputs = [t for t in tensor.op.inputs if t.graph is tensor.graph]
    pending = [t for t in inputs if t.ref() not in kinds]
    if pending:
      stack.extend(pending)
      continue
    stack.pop()
    kinds[tensor.ref()] = kind = _combine(tensor.op.type, [kinds[t.ref()] for t in inputs])
    if kind == MIXED and where is None:
      where = f"a {tensor.op.type} op"
  return kinds[value.ref()], where


def _combine(op_type, kinds):
  if not kinds:
    return CONST if op_type == "Const" else LOCAL
  if MIXED in kinds:
    return MIXED
  if GLOBAL not in kinds:
    return CONST if all(k == CONST for k in kinds) else LOCAL
  others = [k for k in kinds if k != GLOBAL]
  if op_type in _PASS_THROUGH and kinds[0] == GLOBAL and all(k == CONST for k in kinds[1:]):
    return GLOBAL
  if op_type in _SUM and not others:
    return GLOBAL
  if op_type in _SCALE and len(kinds) == 2 and others == [CONST]:
    return GLOBAL if op_type == "Mul" or kinds[0] == GLOBAL else MIXED
  return MIXED
