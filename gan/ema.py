"""An exponential moving average (EMA) of a model's weights, kept as a model.

    def build():
      generator = gan.dcgan_generator()
      models = {"generator": generator, "generator_ema": gan.ema.ema_copy(generator)}
      ...

    def train_step(ctx, batch):
      ...                                   # update the generator
      gan.ema.update_ema(ctx, ctx.models["generator_ema"], ctx.models["generator"],
                         decay=0.999, start_step=1000)

The average of the generator's recent weights usually gives better samples than
its latest weights (Yazici et al., "The Unusual Effectiveness of Averaging in
GAN Training", 2019, arXiv:1806.04498; used by ProGAN, StyleGAN and BigGAN).
Because the copy is an ordinary model of the runner, checkpoints keep it,
`ctl.Export("generator_ema")` exports it, and samples can come from it.
`gan.Experiment(ema_decay=0.999)` keeps one for you.
"""

import gin
import keras
import tensorflow as tf

import ctl


@gin.register(module="gan.ema")
def ema_copy(model: keras.Model, name: str | None = None) -> keras.Model:
  """A copy of `model` with the same architecture and weights, for `update_ema`.

  Call it inside the runner's `build` (in the strategy's scope), after `model`
  is built.
  """
  if not model.built:
    raise ValueError(f"ema_copy({model.name!r}): the model is not built yet; give it "
                     "an input shape (keras.Input) first.")
  copy = keras.models.clone_model(model)
  copy.name = name or f"{model.name}_ema"
  copy.set_weights(model.get_weights())
  copy.trainable = False  # no optimizer updates it; update_ema does
  return copy


def update_ema(ctx: ctl.StepContext, ema_model: keras.Model, model: keras.Model, *,
               decay: float = 0.999, start_step: int = 0) -> None:
  """Moves `ema_model`'s weights towards `model`'s: `ema = decay*ema + (1-decay)*w`.

  Before `start_step` the copy just follows the model (decay 0): averaging the
  first, fast-changing weights would only drag in the random initialisation.
  Batch-norm statistics are averaged like the weights. Every replica computes
  the same update from the same (mirrored) weights, so the copies stay equal.

  Args:
    ctx: the step's `StepContext` (for `ctx.step`).
    ema_model: the copy made by `ema_copy`.
    model: the model it averages.
    decay: weight of the old average per step, in [0, 1).
    start_step: first step that averages.
  """
  if not 0.0 <= decay < 1.0:
    raise ValueError(f"update_ema: decay must be in [0, 1), got {decay!r}; 0.999 is usual.")
  if len(ema_model.variables) != len(model.variables):
    raise ValueError(f"update_ema: {ema_model.name!r} has {len(ema_model.variables)} "
                     f"variables but {model.name!r} has {len(model.variables)}; make "
                     "the copy with gan.ema.ema_copy(model).")
  rate = tf.where(tf.cast(ctx.step, tf.int64) < start_step, 0.0, decay)
  for average, value in zip(ema_model.variables, model.variables):
    if keras.backend.is_float_dtype(average.dtype):
      average.assign(tf.cast(rate, average.dtype) * average
                     + tf.cast(1.0 - rate, average.dtype) * value)
    else:  # e.g. a seed generator's state: take the latest
      average.assign(value)
