"""The training state: named models and optimizers and a step counter, built in scope.

    state = build_state(build, placement, seed=0)
    state.models["generator"], state.optimizers["generator"], state.global_step

`build()` is the user's function of no arguments returning `(models,
optimizers)`; it runs inside the strategy's scope so that every variable is
replicated, and the result is checked here, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeAlias

import keras
import numpy as np
import tensorflow as tf

from ctl.base import _tf_internal
from ctl.step import context

if TYPE_CHECKING:
  from ctl.distribute.placement import Placement

BuildFn: TypeAlias = Callable[
    [], tuple[dict[str, keras.Model], dict[str, keras.optimizers.Optimizer]]]
"""The user's `build()`: no arguments, returns `(models, optimizers)` by name."""


@dataclasses.dataclass
class State:
  """What training changes and a checkpoint holds.

  Attributes:
    models: name -> `keras.Model`.
    optimizers: name -> `keras.optimizers.Optimizer`, each built.
    global_step: int64 variable, the number of steps trained.
    draw_key: int64 [1] variable, `ctl.step.context.draw_key(seed)` (not checkpointed).
  """
  models: dict[str, keras.Model]
  optimizers: dict[str, keras.optimizers.Optimizer]
  global_step: tf.Variable
  draw_key: tf.Variable

  def variables(self) -> dict[str, Any]:
    """Every variable, by kind and name: what a checkpoint saves.

    A Keras 3 model put in a tf.train.Checkpoint saves none of its own
    variables (only those an optimizer reaches): they are listed explicitly, by
    position, which does not depend on Keras' global layer names.
    """
    return dict(
        step=self.global_step,
        models={name: list(m.variables) for name, m in self.models.items()},
        optimizers={name: list(o.variables) for name, o in self.optimizers.items()})


def build_state(build: BuildFn, placement: Placement, *, seed: int = 0,
                mixed_precision: str | None = None) -> State:
  """Calls `build()` in the scope of `placement`'s strategy and checks what it returns.

  `build`, `seed` and `mixed_precision` are `ctl.Runner`'s; "float64" is also Keras'
  floatx while `build` runs, so that `keras.Input` is float64 too.
  """
  with placement.strategy.scope():
    models, optimizers = _call_build(build, seed, mixed_precision)
    _refuse_shared_optimizers(optimizers)
    for name, optimizer in list(optimizers.items()):
      optimizers[name] = _prepare_optimizer(name, optimizer, models, mixed_precision)
      _refuse_options_the_strategy_cannot_run(name, optimizers[name], placement.kind)
      if mixed_precision == "float64":
        _schedule_in_float64(optimizers[name])
    _check_in_scope(placement, models, optimizers)
    _warn_of_variables_two_optimizers_update(optimizers)
    # A plain tf.Variable: Keras 3 variables' assign_add is not atomic under
    # parameter servers (see TF field notes).
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    key = tf.Variable(context.draw_key(seed), trainable=False, name="draw_key")
  return State(models, optimizers, global_step, key)


class SharedVariableWarning(UserWarning):
  """Two optimizers update the same variables (a layer in two models)."""


def _warn_of_variables_two_optimizers_update(optimizers):
  """Warns, naming the layers, when two optimizers were built on one variable."""
  owners = {}  # id(variable) -> (variable, [optimizer names])
  for name, optimizer in optimizers.items():
    for variable in _tf_internal.optimizer_variables(optimizer):
      owners.setdefault(id(variable), (variable, []))[1].append(name)
  shared = {}  # (optimizer names) -> their layers, as dict keys (in order)
  for variable, names in owners.values():
    if len(names) > 1:
      layer = getattr(variable, "path", variable.name).rsplit("/", 1)[0]
      shared.setdefault(tuple(names), {})[layer] = None
  for names, layers in shared.items():
    listed = ", ".join(f"{layer!r}" for layer in list(layers)[:4]) + (
        f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    which = " and ".join(repr(n) for n in names)
    warnings.warn(
        f"optimizers {which} both update the variables of layer(s) {listed} (a layer "
        "in two models, or one model under two names): every step moves them by "
        "both optimizers and both losses; in a GAN the generator's loss then trains "
        "the discriminator's layer against it. If one optimizer alone should train "
        "them, build the other in build() on the rest (skip = {id(v) for v in "
        "layer.trainable_variables}; rest = [v for v in model.trainable_variables if "
        "id(v) not in skip]; optimizer.build(rest)) and pass ctx.minimize(..., "
        "variables=rest); if both are meant to, silence this with "
        "warnings.filterwarnings('ignore', category=ctl.SharedVariableWarning).",
        SharedVariableWarning, stacklevel=4)


def _call_build(build, seed, mixed_precision):
  previous_policy = keras.mixed_precision.global_policy()
  previous_floatx = keras.config.floatx()
  keras.mixed_precision.set_global_policy(mixed_precision or "float32")
  if mixed_precision == "float64":
    keras.config.set_floatx("float64")
  keras.utils.set_random_seed(seed)
  created = []  # every variable build() makes, to tell a model made before it

  def record(next_creator, **kwargs):
    variable = next_creator(**kwargs)
    created.append(variable)
    return variable

  try:
    with tf.variable_creator_scope(record):
      built = build()
  finally:  # the policy is for this runner's models, not for later ones
    keras.mixed_precision.set_global_policy(previous_policy)
    keras.config.set_floatx(previous_floatx)
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
  _refuse_models_made_before_build(models, created)
  return models, optimizers


def _refuse_models_made_before_build(models, created):
  """Refuses a model whose weights existed before build() ran: they escape
  `Runner(seed=)` and the strategy's scope. Not seen: a model constructed before
  build() but built inside it (Keras drew its initializers' seeds at construction)."""
  made = {id(v) for v in created}
  for name, model in models.items():
    if any(id(getattr(v, "value", v)) not in made for v in model.variables):
      raise ValueError(
          f"model {name!r} was made before build() was called (its variables "
          "existed already), so Runner(seed=...) does not fix its initial weights, "
          "they are outside the strategy's scope, and every runner given it would "
          "train the same weights. Construct the model inside build(), e.g. "
          f"build = lambda: ({{{name!r}: make_{name}(), ...}}, {{...}}).")


def _prepare_optimizer(name, optimizer, models, mixed_precision):
  """Checks `optimizer`, wraps it for float16 loss scaling, and builds its slots."""
  if not isinstance(optimizer, keras.optimizers.Optimizer):
    raise TypeError(f"optimizers[{name!r}] is a {type(optimizer).__name__}, not a "
                    "keras.optimizers.Optimizer.")
  if (mixed_precision == "mixed_float16" and
      not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
    inner, optimizer = optimizer, keras.optimizers.LossScaleOptimizer(optimizer)
    if inner.built:  # built by the user on variables of their choice
      optimizer.build(_tf_internal.optimizer_variables(inner))
  if not optimizer.built:
    if name not in models:
      raise ValueError(
          f"optimizer {name!r} has no model of the same name to build its "
          f"slots for (models: {sorted(models)}); call "
          f"optimizer.build(variables) inside build().")
    # Keras 3 fails under Mirrored if the slots are created lazily by the
    # first apply_gradients inside a tf.function.
    optimizer.build(models[name].trainable_variables)
  return optimizer


def _schedule_in_float64(optimizer):
  """Gives `optimizer` a copy of its learning-rate schedule (from its config, floats as
  float64) that computes in float64: Keras' in its initial rate's dtype, float32."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
  schedule = _tf_internal.learning_rate_schedule(inner)
  if schedule is None:
    return

  def wide(value):
    if isinstance(value, float):
      return np.float64(value)
    return [wide(v) for v in value] if isinstance(value, list) else value

  try:
    copy = type(schedule).from_config({k: wide(v) for k, v in schedule.get_config().items()})
  except (NotImplementedError, TypeError, ValueError):
    return  # a schedule of the user's that cannot be copied: as it is
  inner.learning_rate = copy


def _check_in_scope(placement, models, optimizers):
  for kind, named in (("model", models), ("optimizer", optimizers)):
    for name, owner in named.items():
      if not all(placement.created_in_scope(getattr(v, "value", v)) for v in owner.variables):
        raise ValueError(f"{kind} {name!r} was created outside the strategy's "
                         "scope, so its variables are not replicated; create it "
                         "inside build(), which the runner calls in the scope.")


def _refuse_shared_optimizers(optimizers):
  """One optimizer object under two names cannot update two models correctly."""
  first = {}
  for name, optimizer in optimizers.items():
    other = first.setdefault(id(optimizer), name)
    if other != name:
      kind = type(optimizer).__name__
      raise ValueError(
          f"optimizers[{other!r}] and optimizers[{name!r}] are the same {kind} "
          f"object. A Keras optimizer keeps slots only for the variables it was "
          f"built on (those of model {other!r}) and counts one iteration per update, so "
          f"it cannot also update model {name!r}. Give each model an optimizer "
          f"of its own in build(): {{{other!r}: keras.optimizers.{kind}(...), "
          f"{name!r}: keras.optimizers.{kind}(...)}}.")


def _refuse_options_the_strategy_cannot_run(name, optimizer, kind):
  """Refuses, before anything is traced, the Keras optimizer options that fail in the
  compiled step under a strategy of `kind` (a `ctl.distribute.placement.Kind`)."""
  if not kind.merge_call_updates:
    return
  inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
  where = f"optimizers[{name!r}] ({type(inner).__name__})"
  steps = inner.gradient_accumulation_steps
  if steps:
    raise ValueError(
        f"{where} has gradient_accumulation_steps={steps}, which Keras cannot run "
        f"under {kind.name} (it applies the update inside a tf.cond, where TF cannot "
        "sum over replicas). Accumulate with ctl instead, which gives the same "
        "update as the whole batch and keeps parity under every strategy: drop the "
        "option and pass the loss as a function of the batch, "
        f"ctx.minimize(lambda batch: ..., {name!r}, batch=real, micro_batches={steps}) "
        f"(or a global batch {steps} times larger).")
  if inner.use_ema and inner.ema_overwrite_frequency:
    raise ValueError(
        f"{where} has use_ema=True with ema_overwrite_frequency="
        f"{inner.ema_overwrite_frequency}, which Keras cannot run under {kind.name} (it "
        "overwrites the weights inside a tf.cond, where TF cannot update "
        "replicated variables). Drop ema_overwrite_frequency and copy the average "
        "in once training ends: optimizer.finalize_variable_values("
        "model.trainable_variables); or keep the average as a model of its own, "
        "updated in the step.")
  if not kind.replica_updates and (inner.use_ema or inner is not optimizer):
    option = "use_ema=True" if inner.use_ema else "a LossScaleOptimizer (mixed_float16)"
    raise ValueError(
        f"{where}: {option} cannot run under {kind.name} (Keras updates its "
        "own variables from each replica, which central storage refuses). Use "
        "mirrored, which keeps the same numbers, or drop the option"
        + (": keep the average as a model of its own, updated in the step."
           if inner.use_ema else " (mixed_bfloat16 needs no loss scaling)."))
