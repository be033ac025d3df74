"""Discriminator penalties: per-example values, already weighted, one signature.

    critic = lambda x: discriminator(x, training=True)
    per_example = gan.losses.hinge.discriminator(critic(real), critic(fake))
    per_example += gan.penalties.r1_penalty(ctx, critic, real, fake)
    d_loss = ctx.average(per_example)

Every penalty is `penalty(ctx, discriminator, real, fake, *, weight=...)` and
returns `[per_replica_batch]` float32 values (float64 in a float64 run), so that
a config swaps them by reference (`gan.Experiment.penalty =
@gan.penalties.r1_penalty`). `discriminator` is any callable from images to
logits (a conditional one as a closure over the labels). It must treat examples
independently (no batch norm), because each example's gradient is taken from
the gradient of the summed logits. Gradients are taken with an inner tape, so
an outer tape can differentiate the penalty with respect to the
discriminator's weights.
"""

from collections.abc import Callable

import gin
import tensorflow as tf

import ctl
from ctl import arguments
from gan.losses import at_least_float32

Discriminator = Callable[[tf.Tensor], tf.Tensor]  # images -> logits


def _require_weight(name, weight):
  arguments.number(f"{name}: weight", weight, minimum=0)


def _squared_input_gradient_norm(discriminator, images):
  """Per example: |d D(x) / d x|^2, summed over all but the batch axis."""
  with tf.GradientTape() as tape:
    tape.watch(images)
    logits = at_least_float32(discriminator(images))
    total = tf.reduce_sum(logits)  # examples are independent: row i's gradient is its own
  gradients = at_least_float32(tape.gradient(total, images))
  return tf.reduce_sum(tf.square(gradients), axis=list(range(1, gradients.shape.rank)))


@gin.register(module="gan.penalties")
def wasserstein_gradient_penalty(ctx: ctl.StepContext, discriminator: Discriminator,
                                 real: tf.Tensor, fake: tf.Tensor, *,
                                 weight: float = 10.0) -> tf.Tensor:
  """`weight * (|grad D(x_hat)| - 1)^2` at `x_hat = e*real + (1-e)*fake`, e ~ U[0, 1] per example.

  Gulrajani et al., "Improved Training of Wasserstein GANs", 2017
  (arXiv:1704.00028), Algorithm 1, with their lambda = 10. `e` comes from
  `ctx.uniform`, so example i gets the same draw under any strategy.
  """
  _require_weight("wasserstein_gradient_penalty", weight)
  real = tf.convert_to_tensor(real)
  fake = tf.cast(fake, real.dtype)
  mix = ctx.uniform([1] * (real.shape.rank - 1), dtype=real.dtype)
  interpolated = mix * real + (1.0 - mix) * fake
  squared = _squared_input_gradient_norm(discriminator, interpolated)
  # The small constant keeps the square root's gradient finite at a zero gradient.
  return weight * tf.square(tf.sqrt(squared + 1e-12) - 1.0)


@gin.register(module="gan.penalties")
def r1_penalty(ctx: ctl.StepContext, discriminator: Discriminator, real: tf.Tensor,
               fake: tf.Tensor, *, weight: float = 10.0, every: int = 1) -> tf.Tensor:
  """(weight / 2) * |grad D(x)|^2 on real data; `weight` is the paper's gamma.

  Mescheder, Geiger & Nowozin, "Which Training Methods for GANs do actually
  Converge?", 2018 (arXiv:1801.04406), equation 9. With `every=k > 1`, lazy
  regularization (Karras et al., "Analyzing and Improving the Image Quality
  of StyleGAN", 2020, arXiv:1912.04958, section 3.1): the penalty is computed
  only on steps divisible by k, times k, and is zero on the others; a compiled
  step skips the gradient computation there.
  """
  del fake  # R1 looks at real data only; the argument keeps the shared signature
  _require_weight("r1_penalty", weight)
  arguments.integer("r1_penalty: every", every, minimum=1, meaning="1: every step")
  real = tf.convert_to_tensor(real)

  def penalty():
    return (0.5 * weight * every) * _squared_input_gradient_norm(discriminator, real)

  if every == 1:
    return penalty()
  zeros = lambda: tf.zeros([tf.shape(real)[0]], at_least_float32(real).dtype)  # noqa: E731
  due = tf.equal(tf.math.floormod(tf.cast(ctx.step, tf.int64), every), 0)
  if tf.executing_eagerly():
    return penalty() if bool(due) else zeros()
  try:
    return tf.cond(due, penalty, zeros)
  except ValueError as error:
    if not str(error).startswith(ctl.DRAW_IN_CONTROL_FLOW):
      raise
    raise ValueError(
        f"r1_penalty(every={every}) computes the penalty in a tf.cond on the step, and "
        "the discriminator given to it draws (an augmentation such as "
        "gan.augment.diff_augment inside it?): a draw there would not be the eager "
        "step's. Draw before the penalty and pass a discriminator that only applies "
        "the draws: augment = gan.augment.augmentation(ctx, real); critic = lambda x: "
        "discriminator(augment(x), training=True); use critic(real) in the loss too, "
        "so the penalty sees the reals as the loss did. Or every=1.") from error


@gin.register(module="gan.penalties")
def no_penalty(ctx: ctl.StepContext, discriminator: Discriminator, real: tf.Tensor,
               fake: tf.Tensor, *, weight: float = 0.0) -> tf.Tensor:
  """Zeros: switches penalties off with the same signature."""
  del ctx, discriminator, fake, weight
  return tf.zeros([tf.shape(real)[0]], at_least_float32(real).dtype)
