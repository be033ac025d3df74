"""Differentiable augmentation for GANs on little data (DiffAugment).

    critic = lambda x: discriminator(gan.augment.diff_augment(ctx, x), training=True)
    d_loss = loss.discriminator(critic(real), critic(fake))   # both augmented
    g_loss = loss.generator(critic(fake))                     # gradients flow through

Zhao, Liu, Lin, Zhu & Han, "Differentiable Augmentation for Data-Efficient GAN
Training", NeurIPS 2020 (arXiv:2006.10738): with few training images the
discriminator memorises them and stops teaching the generator. Augmenting every
image the discriminator sees, real and generated alike and in the generator's
update too, with transformations it can differentiate through, keeps it from
memorising without teaching the generator to make augmented images. The GAN
kit's MNIST is 5,000 digits: that regime.

Every draw is per example and comes from `ctx` (`ctx.uniform`), so example i of
the global batch gets the same transformation on any number of replicas or
workers, eagerly or compiled: a run with augmentation keeps its parity. Each
call draws anew (real and generated batches get independent transformations,
as in the paper). `augmentation(ctx, images)` draws once and returns the
transformation, to apply again to what stands in for those images: a
penalty's discriminator on the reals sees them as the loss did, without
drawing inside the penalty (whose lazy form is a `tf.cond`).
Ratios are bound on `gan.augment.augmentation`, which `gan.Experiment` calls.

Policies, applied in the order given, on images [B, H, W, C] in [-1, 1]:
  "color":       brightness + U(-0.5, 0.5), then contrast about each image's mean
                 by U(0.5, 1.5) (and saturation by U(0, 2) for C = 3);
  "translation": a shift by up to `translation` of the side in each axis, in
                 whole pixels, the border filled with the background (-1);
  "cutout":      a square of `cutout` of the side, anywhere (partly outside
                 too), set to 0 (the middle of [-1, 1]), as in the paper.
"""

from collections.abc import Callable
from collections.abc import Sequence

import gin
import tensorflow as tf

import ctl
from ctl import arguments

POLICIES = ("color", "translation", "cutout")
# The paper's choice for its low-data experiments (all three).
DEFAULT_POLICY = POLICIES


def _per_image(ctx, minval, maxval):
  """One draw per image of this replica, [rows, 1, 1, 1]."""
  return tf.reshape(ctx.uniform([1], minval, maxval), [-1, 1, 1, 1])


# Each transformation in two halves: `_draw_NAME(ctx, shape, ...)` makes this
# replica's per-image draws and returns the function that applies them, the same
# way, to any images of that shape (the batch, or a penalty's input in its place).


def _draw_color(ctx, shape):
  brightness = _per_image(ctx, -0.5, 0.5)
  saturation = _per_image(ctx, 0.0, 2.0) if shape[-1] == 3 else None
  contrast = _per_image(ctx, 0.5, 1.5)

  def apply(images):
    dtype = images.dtype
    images = images + tf.cast(brightness, dtype)
    if saturation is not None:
      mean = tf.reduce_mean(images, axis=3, keepdims=True)
      images = (images - mean) * tf.cast(saturation, dtype) + mean
    mean = tf.reduce_mean(images, axis=[1, 2, 3], keepdims=True)
    return (images - mean) * tf.cast(contrast, dtype) + mean

  return apply


def _draw_translation(ctx, shape, ratio=0.125):
  height, width = shape[1], shape[2]
  pad_h, pad_w = int(height * ratio + 0.5), int(width * ratio + 0.5)
  draws = ctx.uniform([2])  # [rows, 2]: the vertical and horizontal shift
  shift_h = tf.cast(tf.floor(draws[:, 0] * (2 * pad_h + 1)), tf.int32)  # 0 .. 2 pad_h
  shift_w = tf.cast(tf.floor(draws[:, 1] * (2 * pad_w + 1)), tf.int32)
  rows = shift_h[:, None] + tf.range(height)[None]  # [rows, H]: the rows each image keeps
  cols = shift_w[:, None] + tf.range(width)[None]

  def apply(images):
    padded = tf.pad(images, [[0, 0], [pad_h, pad_h], [pad_w, pad_w], [0, 0]],
                    constant_values=tf.cast(-1, images.dtype))
    out = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(out, cols, axis=2, batch_dims=1)

  return apply


def _draw_cutout(ctx, shape, ratio=0.5):
  height, width = shape[1], shape[2]
  size_h, size_w = int(height * ratio + 0.5), int(width * ratio + 0.5)
  draws = ctx.uniform([2])
  # The square's first row and column, so that it may reach past the border.
  top = tf.floor(draws[:, 0] * (height + (1 - size_h % 2))) - size_h // 2
  left = tf.floor(draws[:, 1] * (width + (1 - size_w % 2))) - size_w // 2
  rows = tf.range(height, dtype=top.dtype)[None]
  cols = tf.range(width, dtype=left.dtype)[None]
  inside_h = (rows >= top[:, None]) & (rows < top[:, None] + size_h)  # [rows, H]
  inside_w = (cols >= left[:, None]) & (cols < left[:, None] + size_w)
  kept = ~(inside_h[:, :, None] & inside_w[:, None, :])  # [rows, H, W]

  def apply(images):
    return images * tf.cast(kept, images.dtype)[..., None]

  return apply


def color(ctx: ctl.StepContext, images: tf.Tensor) -> tf.Tensor:
  """Brightness and contrast (and saturation for RGB), per image."""
  return _draw_color(ctx, images.shape)(images)


def translation(ctx: ctl.StepContext, images: tf.Tensor, ratio: float = 0.125) -> tf.Tensor:
  """A shift by up to `ratio` of the side, per image, filled with -1."""
  return _draw_translation(ctx, images.shape, ratio)(images)


def cutout(ctx: ctl.StepContext, images: tf.Tensor, ratio: float = 0.5) -> tf.Tensor:
  """A square of `ratio` of the side set to 0, centred anywhere, per image."""
  return _draw_cutout(ctx, images.shape, ratio)(images)


_DRAWS = {"color": _draw_color, "translation": _draw_translation, "cutout": _draw_cutout}


@gin.register(module="gan.augment")
def augmentation(ctx: ctl.StepContext, images: tf.Tensor, policy: Sequence[str] = DEFAULT_POLICY,
                 *, translation_ratio: float = 0.125,
                 cutout_ratio: float = 0.5) -> Callable[[tf.Tensor], tf.Tensor]:
  """Draws one augmentation per image of `images`; returns the function applying it.

  The function applies the same transformations to any tensor shaped like
  `images`, with no draws of its own: a discriminator penalty on the real
  images (`gan.penalties`) sees them as the loss did, and its draws may sit in
  a `tf.cond` (the lazy R1) or under an inner tape.

  Args:
    ctx: the step's `ctl.StepContext` (the draws are per example).
    images: this replica's images [rows, H, W, C] in [-1, 1] (real or generated).
    policy: names from `POLICIES`, applied in this order.
    translation_ratio: the largest shift, as a fraction of the side.
    cutout_ratio: the cut square's side, as a fraction of the image's.

  Returns:
    images -> augmented images, same shape and dtype.
  """
  check_policy(policy)
  check_ratio("translation_ratio", translation_ratio)
  check_ratio("cutout_ratio", cutout_ratio)
  ratios = {"translation": (translation_ratio,), "cutout": (cutout_ratio,), "color": ()}
  steps = [_DRAWS[name](ctx, images.shape, *ratios[name]) for name in policy]

  def apply(images):
    for transform in steps:
      images = transform(images)
    return images

  return apply


def diff_augment(ctx: ctl.StepContext, images: tf.Tensor, policy: Sequence[str] = DEFAULT_POLICY, *,
                 translation_ratio: float = 0.125, cutout_ratio: float = 0.5) -> tf.Tensor:
  """`images` [rows, H, W, C] in [-1, 1], augmented by `policy`, per image:
  `augmentation(...)(images)`, whose arguments it takes."""
  return augmentation(ctx, images, policy, translation_ratio=translation_ratio,
                      cutout_ratio=cutout_ratio)(images)


def check_policy(policy: Sequence[str]) -> tuple[str, ...]:
  """`policy` as a tuple of names; raises naming an unknown one."""
  if isinstance(policy, str):
    raise TypeError(f"augment policy must be a sequence of names, got the string "
                    f"{policy!r}; write ({policy!r},) or a list such as "
                    f"{list(POLICIES)}.")
  unknown = [name for name in policy if name not in POLICIES]
  if unknown:
    raise ValueError(f"augment policy names {unknown}, not augmentations; use any of "
                     f"{list(POLICIES)}.")
  return tuple(policy)


def check_ratio(name: str, value: float) -> float:
  """A fraction of the side in (0, 1)."""
  value = arguments.number(name, value, above=0)
  if value >= 1:
    raise ValueError(f"{name} must be a fraction of the side in (0, 1), got {value!r}.")
  return value
