"""Differentiable augmentation (`gan.augment`): each transformation does what it
says, gradients flow through it, and its draws are per example, so a step with
augmentation gives the same numbers on any replica count."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import ctl
import gan
from gan import augment

ROWS = 6


def _ctx(step=0, seed=1):
  return ctl.StepContext(models={}, optimizers={}, step=tf.constant(step, tf.int64),
                         seed=tf.constant([seed, 0], tf.int64), global_batch_size=ROWS,
                         num_replicas=1, replica_id=0)


def test_translation_moves_each_image_by_at_most_an_eighth_filling_with_background():
  images = -np.ones((ROWS, 16, 16, 1), np.float32)
  images[:, 8, 8] = 1.0  # one bright pixel per image
  out = augment.translation(_ctx(), tf.constant(images)).numpy()
  assert out.shape == images.shape
  for image in out:
    ys, xs = np.nonzero(image[..., 0] > 0)
    assert len(ys) == 1 and abs(ys[0] - 8) <= 2 and abs(xs[0] - 8) <= 2
    assert np.all(image[image <= 0] == -1)  # the border brought in is background
  moved = [tuple(np.argwhere(image[..., 0] > 0)[0]) for image in out]
  assert len(set(moved)) > 1  # per image, not one shift for the batch


def test_cutout_sets_a_square_of_half_the_side_to_zero():
  out = augment.cutout(_ctx(), tf.ones((ROWS, 16, 16, 1))).numpy()
  for image in out:
    cut = image[..., 0] == 0
    rows, cols = np.nonzero(cut.any(1))[0], np.nonzero(cut.any(0))[0]
    assert 0 < cut.sum() <= 64 and len(rows) <= 8 and len(cols) <= 8
    assert cut.sum() == len(rows) * len(cols)  # a rectangle: the square, clipped at the border
    assert np.all(image[~cut] == 1)


def test_color_shifts_brightness_and_scales_contrast_per_image():
  images = tf.constant(np.random.default_rng(0).uniform(-1, 1, (ROWS, 8, 8, 1)), tf.float32)
  out = augment.color(_ctx(), images).numpy()
  shift = out.mean((1, 2, 3)) - images.numpy().mean((1, 2, 3))
  assert np.all(np.abs(shift) <= 0.5) and np.std(shift) > 0
  scale = out.std((1, 2, 3)) / images.numpy().std((1, 2, 3))
  assert np.all((scale >= 0.5 - 1e-5) & (scale <= 1.5 + 1e-5)) and np.std(scale) > 0
  rgb = augment.color(_ctx(), tf.tile(images, [1, 1, 1, 3]))
  assert rgb.shape == (ROWS, 8, 8, 3)


def test_gradients_flow_through_every_policy():
  images = tf.Variable(np.random.default_rng(1).uniform(-1, 1, (ROWS, 16, 16, 1)), dtype=tf.float32)
  for policy in [("color",), ("translation",), ("cutout",), augment.POLICIES]:
    with tf.GradientTape() as tape:
      out = augment.diff_augment(_ctx(), images, policy)
      loss = tf.reduce_sum(out ** 2)
    grad = tape.gradient(loss, images)
    assert grad is not None and float(tf.reduce_sum(tf.abs(grad))) > 0, policy


def test_draws_follow_the_step_and_the_seed():
  images = tf.ones((ROWS, 16, 16, 1))
  first = augment.diff_augment(_ctx(step=0), images).numpy()
  np.testing.assert_array_equal(first, augment.diff_augment(_ctx(step=0), images).numpy())
  assert not np.array_equal(first, augment.diff_augment(_ctx(step=1), images).numpy())
  assert not np.array_equal(first, augment.diff_augment(_ctx(seed=2), images).numpy())


@pytest.mark.parametrize("policy, error, message", [
    ("color", TypeError, "sequence of names, got the string 'color'"),
    (("colour",), ValueError, r"names \['colour'\], not augmentations"),
])
def test_a_bad_policy_is_named(policy, error, message):
  with pytest.raises(error, match=message):
    augment.check_policy(policy)
  with pytest.raises(error, match=message):
    gan.Experiment(augment=policy)


def test_a_bad_ratio_is_named():
  with pytest.raises(ValueError, match="cutout_ratio must be a fraction of the side"):
    augment.diff_augment(_ctx(), tf.ones((ROWS, 8, 8, 1)), cutout_ratio=1.5)


def test_an_augmentation_is_drawn_once_and_applied_alike_to_any_images_in_its_place():
  """`augmentation` draws when called, not when applied: the function gives
  `diff_augment`'s images, the same on every call, also inside a tf.cond (a
  lazy penalty's), where a draw is refused."""
  images = tf.constant(np.random.default_rng(2).uniform(-1, 1, (ROWS, 16, 16, 1)), tf.float32)
  expected = augment.diff_augment(_ctx(), images).numpy()
  apply = augment.augmentation(_ctx(), images)
  np.testing.assert_array_equal(apply(images).numpy(), expected)
  np.testing.assert_array_equal(apply(images).numpy(), expected)

  @tf.function
  def in_a_branch(due):
    ctx = _ctx()
    apply = augment.augmentation(ctx, images)
    return tf.cond(due, lambda: apply(images), lambda: tf.zeros_like(images))

  np.testing.assert_array_equal(in_a_branch(tf.constant(True)).numpy(), expected)
  with pytest.raises(ValueError, match="inside a Python `if` or `for` on a tensor"):
    tf.function(lambda due: tf.cond(due, lambda: augment.diff_augment(_ctx(), images),
                                     lambda: images))(tf.constant(True))


def test_a_step_with_augmentation_gives_the_same_numbers_on_two_replicas():
  """Example i is augmented alike under default and mirrored: the step's
  results and the trained weights agree to rounding; with a lazy R1 penalty
  (a tf.cond), whose discriminator sees the reals as the loss did."""
  results = {}
  for strategy in ("default", "mirrored"):
    experiment = gan.Experiment(
        generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
        discriminator=lambda **kw: gan.dcgan_discriminator(4, **kw), batch_size=8,
        noise_dim=8, augment=augment.POLICIES,
        penalty=functools.partial(gan.penalties.r1_penalty, weight=1.0, every=2),
        schedule=gan.Schedule(total_steps=3, steps_per_loop=1))
    runner = experiment.build(strategy)
    history = runner.train(3)
    results[strategy] = (np.asarray(history["discriminator_loss"]),
                         runner.models["generator"].get_weights()[0])
  np.testing.assert_allclose(results["mirrored"][0], results["default"][0], rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(results["mirrored"][1], results["default"][1], rtol=1e-3,
                             atol=1e-5)
