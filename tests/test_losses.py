"""Losses: golden values. Penalties: analytic cases, eager, compiled and mirrored.

Golden logits: real = [2, -1], fake = [-1, 0.5]. softplus(x) = log(1 + e^x):
softplus(-2) = 0.12692801, softplus(1) = 1.31326169, softplus(-1) = 0.31326169,
softplus(0.5) = 0.97407698, softplus(-0.5) = 0.47407698.

Penalties use a linear discriminator D(x) = sum(w * x), whose input gradient is
w everywhere: the gradient penalty is weight * (|w| - 1)^2 and R1 is
weight / 2 * |w|^2 for every example, and their derivatives with respect to w
are known in closed form (which checks the second-order path).
"""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
import gan

REAL = [2.0, -1.0]
FAKE = [-1.0, 0.5]
GOLDEN = {
    # name: (value of generator loss on FAKE, of discriminator loss on REAL, FAKE)
    "minimax": ([-0.31326169, -0.97407698],          # -softplus(fake)
                [0.12692801 + 0.31326169,            # softplus(-real) + softplus(fake)
                 1.31326169 + 0.97407698]),
    "non_saturating": ([1.31326169, 0.47407698],     # softplus(-fake)
                       [0.12692801 + 0.31326169, 1.31326169 + 0.97407698]),
    "wasserstein": ([1.0, -0.5],                     # -fake
                    [-1.0 - 2.0, 0.5 + 1.0]),        # fake - real
    "hinge": ([1.0, -0.5],                           # -fake
              [0.0 + 0.0, 2.0 + 1.5]),               # relu(1 - real) + relu(1 + fake)
    "least_squares": ([0.5 * 4.0, 0.5 * 0.25],       # (fake - 1)^2 / 2
                      [0.5 * 1 + 0.5 * 1, 0.5 * 4 + 0.5 * 0.25]),  # (real-1)^2/2 + fake^2/2
}


@pytest.mark.parametrize("family", sorted(GOLDEN))
def test_loss_golden_values(family):
  generator_loss = getattr(gan.losses, f"{family}_generator_loss")
  discriminator_loss = getattr(gan.losses, f"{family}_discriminator_loss")
  # The family holds exactly its own two functions.
  assert getattr(gan.losses, family) == gan.losses.LossFamily(generator_loss,
                                                              discriminator_loss)
  expected_g, expected_d = GOLDEN[family]
  for shape in ([2], [2, 1]):  # [B] and [B, 1] logits both give [B]
    real, fake = tf.reshape(REAL, shape), tf.reshape(FAKE, shape)
    g, d = generator_loss(fake), discriminator_loss(real, fake)
    assert g.shape == (2,) and d.shape == (2,) and g.dtype == tf.float32
    np.testing.assert_allclose(g, expected_g, rtol=1e-6)
    np.testing.assert_allclose(d, expected_d, rtol=1e-6)


def test_loss_rejects_bad_shape():
  with pytest.raises(ValueError, match=r"\[batch\] or \[batch, 1\], got \(2, 3\)"):
    gan.losses.hinge_generator_loss(tf.zeros([2, 3]))


def test_a_loss_family_and_a_penalty_are_gin_references():
  @gin.configurable
  def chosen(loss=None, penalty=None):
    return loss, penalty

  try:
    gin.parse_config("""
        chosen.loss = %gan.losses.least_squares
        chosen.penalty = @gan.penalties.r1_penalty
        gan.penalties.r1_penalty.weight = 3.0
    """)
    loss, penalty = chosen()
    assert loss is gan.losses.least_squares  # one value: both losses, never mismatched
    np.testing.assert_allclose(loss.generator(tf.constant(FAKE)), GOLDEN["least_squares"][0],
                               rtol=1e-6)
    np.testing.assert_allclose(loss.discriminator(tf.constant(REAL), tf.constant(FAKE)),
                               GOLDEN["least_squares"][1], rtol=1e-6)
    assert penalty.__name__ == "r1_penalty"
    # Plain calls are exactly as written, whatever gin was told: weight 10, not 3.
    plain = gan.penalties.r1_penalty(_Ctx(), linear_discriminator(), _images(1), None)
    np.testing.assert_allclose(plain, [10.0 / 2 * NORM ** 2] * 3, rtol=1e-5)
  finally:
    gin.clear_config()


def test_the_experiment_takes_a_family_not_one_loss():
  with pytest.raises(TypeError, match="loss must be a loss family such as gan.losses.hinge"):
    gan.Experiment(loss=gan.losses.hinge_generator_loss)
  with pytest.raises(TypeError, match="LossFamily: discriminator must be a loss function"):
    gan.losses.LossFamily(gan.losses.hinge_generator_loss, None)


W = np.array([0.3, -0.4, 1.2, 0.5], np.float32)  # |w| = 1.4
NORM = float(np.linalg.norm(W))
SHAPE = (2, 2, 1)


def linear_discriminator():
  model = keras.Sequential([keras.Input(SHAPE), keras.layers.Flatten(),
                            keras.layers.Dense(1, use_bias=False)], name="discriminator")
  model.layers[-1].kernel.assign(W[:, None])
  return model


class _Ctx:
  """The parts of a StepContext a penalty uses, for calls outside a runner."""

  def __init__(self, step=0, batch=3):
    self.step = tf.constant(step, tf.int64)
    self._batch = batch

  def uniform(self, shape, dtype=tf.float32):
    return tf.random.stateless_uniform([self._batch] + list(shape), seed=[1, 2], dtype=dtype)


def _images(seed, batch=3):
  return tf.random.stateless_normal((batch,) + SHAPE, seed=[seed, 0])


ANALYTIC = {
    # penalty: (per-example value, d mean / d w) for the linear discriminator
    "wasserstein_gradient_penalty": (10.0 * (NORM - 1) ** 2, 2 * 10.0 * (NORM - 1) * W / NORM),
    "r1_penalty": (10.0 / 2 * NORM ** 2, 10.0 * W),
}


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", sorted(ANALYTIC))
def test_penalty_analytic(name, compiled):
  penalty, discriminator = getattr(gan.penalties, name), linear_discriminator()
  value, gradient = ANALYTIC[name]

  def run():
    with tf.GradientTape() as tape:
      per_example = penalty(_Ctx(), discriminator, _images(1), _images(2))
      mean = tf.reduce_mean(per_example)
    return per_example, tape.gradient(mean, discriminator.trainable_variables[0])

  per_example, grad = tf.function(run)() if compiled else run()
  np.testing.assert_allclose(per_example, [value] * 3, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad)[:, 0], gradient, rtol=1e-5)


def _penalty_runner(strategy, penalty, steps=4, eager=False, **kwargs):
  """A runner that minimises the averaged penalty with SGD(0.1); every step's value."""
  def build():
    return {"discriminator": linear_discriminator()}, {
        "discriminator": keras.optimizers.SGD(0.1)}

  def step(ctx, real):
    with tf.GradientTape() as tape:
      critic = ctx.models["discriminator"]
      loss = ctx.average(penalty(ctx, critic, real, 0.5 * real, **kwargs))
    ctx.minimize(loss, "discriminator", tape=tape)
    return {"penalty": loss}

  data = tf.data.Dataset.from_tensors(_images(3, batch=4)).repeat()
  runner = ctl.Runner(step, build, data, strategy=ctl.make_strategy(strategy),
                      steps_per_loop=1 if eager else steps, eager=eager)
  return runner.train(steps)["penalty"], np.asarray(runner.models["discriminator"].variables[0])


@pytest.mark.parametrize("name", sorted(ANALYTIC))
def test_penalty_under_mirrored_equals_default_and_analytic(name):
  penalty = getattr(gan.penalties, name)
  default_values, default_w = _penalty_runner("default", penalty, steps=1)
  mirrored_values, mirrored_w = _penalty_runner("mirrored", penalty, steps=1)
  value, gradient = ANALYTIC[name]
  np.testing.assert_allclose(default_values, [value], rtol=1e-5)
  np.testing.assert_allclose(mirrored_values, [value], rtol=1e-5)
  np.testing.assert_allclose(default_w[:, 0], W - 0.1 * gradient, rtol=1e-5)
  np.testing.assert_allclose(mirrored_w[:, 0], W - 0.1 * gradient, rtol=1e-5)


def test_gradient_penalty_draw_is_strategy_invariant():
  """A nonlinear critic: the penalty depends on each example's interpolation weight."""
  def penalty(ctx, critic, real, fake):
    return gan.penalties.wasserstein_gradient_penalty(
        ctx, lambda x: tf.reduce_sum(tf.square(critic(x)), axis=-1), real, fake)

  default_values, _ = _penalty_runner("default", penalty)
  mirrored_values, _ = _penalty_runner("mirrored", penalty)
  np.testing.assert_allclose(mirrored_values, default_values, rtol=1e-6)
  assert len(set(np.round(default_values, 6))) > 1  # draws change with the step


def test_r1_lazy_regularization():
  values, _ = _penalty_runner("default", gan.penalties.r1_penalty, steps=7, every=3)
  w = W.copy()
  expected = []
  for step in range(7):  # 3x the penalty on steps 0, 3, 6; nothing (no update) elsewhere
    due = step % 3 == 0
    expected.append(3 * 5.0 * np.sum(w ** 2) if due else 0.0)
    if due:
      w = w - 0.1 * 3 * 10.0 * w
  np.testing.assert_allclose(values, expected, rtol=1e-5)
  eager = [gan.penalties.r1_penalty(_Ctx(step=s), linear_discriminator(), _images(1), None, every=3)
           for s in (0, 1)]
  np.testing.assert_allclose(eager[0], [3 * 5.0 * NORM ** 2] * 3, rtol=1e-5)
  np.testing.assert_allclose(eager[1], [0.0] * 3)


def test_a_lazy_r1_whose_discriminator_draws_names_the_fix_and_the_fix_trains():
  """A step of one's own: diff_augment inside the critic given to a lazy R1
  draws inside its tf.cond; the error names gan.augment.augmentation, and the
  step written as it says trains compiled like eagerly."""
  def drawing(ctx, critic, real, fake):
    augmenting = lambda x: critic(gan.augment.diff_augment(ctx, x, ("color",)))  # noqa: E731
    return gan.penalties.r1_penalty(ctx, augmenting, real, fake, every=2)

  with pytest.raises(ValueError, match=r"r1_penalty\(every=2\) computes the penalty in a "
                                       r"tf.cond.*gan.augment.augmentation\(ctx, real\)"):
    _penalty_runner("default", drawing)

  def drawn_before(ctx, critic, real, fake):
    augment = gan.augment.augmentation(ctx, real, ("color",))
    augmented = lambda x: critic(augment(x))  # noqa: E731
    r1 = gan.penalties.r1_penalty(ctx, augmented, real, fake, every=2)
    # A loss term every step, as a GAN's has: eagerly, a step without it has no gradient.
    return r1 + 0.0 * tf.reshape(augmented(real), [-1])

  compiled, compiled_w = _penalty_runner("default", drawn_before)
  eager, eager_w = _penalty_runner("default", drawn_before, eager=True)
  np.testing.assert_allclose(compiled, eager, rtol=1e-5)
  np.testing.assert_allclose(compiled_w, eager_w, rtol=1e-5)
  assert compiled[0] > 0 and compiled[1] == 0 and compiled[2] > 0, compiled


def test_no_penalty_is_zero():
  np.testing.assert_array_equal(
      gan.penalties.no_penalty(_Ctx(), linear_discriminator(), _images(1), _images(2)), [0.0] * 3)


@pytest.mark.parametrize("call, error, message", [
    (lambda: gan.penalties.r1_penalty(_Ctx(), linear_discriminator(), _images(1), None, every=0),
     ValueError, "r1_penalty: every must be an int >= 1"),
    (lambda: gan.penalties.r1_penalty(_Ctx(), linear_discriminator(), _images(1), None,
                                      weight=-1.0),
     ValueError, "r1_penalty: weight must be a number >= 0"),
    (lambda: gan.penalties.wasserstein_gradient_penalty(_Ctx(), linear_discriminator(), _images(1),
                                              _images(2), weight="10"),
     TypeError, "wasserstein_gradient_penalty: weight must be a number >= 0"),
])
def test_penalty_argument_errors(call, error, message):
  with pytest.raises(error, match=message):
    call()
