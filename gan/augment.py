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
as in the paper).

Policies, applied in the order given, on images [B, H, W, C] in [-1, 1]:
  "color":       brightness + U(-0.5, 0.5), then contrast about each image's mean
                 by U(0.5, 1.5) (and saturation by U(0, 2) for C = 3);
  "translation": a shift by up to `translation` of the side in each axis, in
                 whole pixels, the border filled with the background (-1);
  "cutout":      a square of `cutout` of the side, anywhere (partly outside
                 too), set to 0 (the middle of [-1, 1]), as in the paper.
"""

from collections.abc import Sequence

import gin
import tensorflow as tf

import ctl
from ctl.base import arguments

POLICIES = ("color", "translation", "cutout")
# The paper's choice for its low-data experiments (all three).
DEFAULT_POLICY = POLICIES


def _per_image(ctx, minval, maxval):
  """One draw per image of this replica, [rows, 1, 1, 1]."""
  return tf.reshape(ctx.uniform([1], minval, maxval), [-1, 1, 1, 1])


def color(ctx: ctl.StepContext, images: tf.Tensor) -> tf.Tensor:
  """Brightness and contrast (and saturation for RGB), per image."""
  dtype = images.dtype
  images = images + tf.cast(_per_image(ctx, -0.5, 0.5), dtype)
  if images.shape[-1] == 3:
    mean = tf.reduce_mean(images, axis=3, keepdims=True)
    images = (images - mean) * tf.cast(_per_image(ctx, 0.0, 2.0), dtype) + mean
  mean = tf.reduce_mean(images, axis=[1, 2, 3], keepdims=True)
  return (images - mean) * tf.cast(_per_image(ctx, 0.5, 1.5), dtype) + mean


def translation(ctx: ctl.StepContext, images: tf.Tensor, ratio: float = 0.125) -> tf.Tensor:
  """A shift by up to `ratio` of the side, per image, filled with -1."""
  height, width = images.shape[1], images.shape[2]
  pad_h, pad_w = int(height * ratio + 0.5), int(width * ratio + 0.5)
  draws = ctx.uniform([2])  # [rows, 2]: the vertical and horizontal shift
  shift_h = tf.cast(tf.floor(draws[:, 0] * (2 * pad_h + 1)), tf.int32)  # 0 .. 2 pad_h
  shift_w = tf.cast(tf.floor(draws[:, 1] * (2 * pad_w + 1)), tf.int32)
  padded = tf.pad(images, [[0, 0], [pad_h, pad_h], [pad_w, pad_w], [0, 0]],
                  constant_values=tf.cast(-1, images.dtype))
  rows = shift_h[:, None] + tf.range(height)[None]  # [rows, H]: the rows each image keeps
  cols = shift_w[:, None] + tf.range(width)[None]
  out = tf.gather(padded, rows, axis=1, batch_dims=1)
  return tf.gather(out, cols, axis=2, batch_dims=1)


def cutout(ctx: ctl.StepContext, images: tf.Tensor, ratio: float = 0.5) -> tf.Tensor:
  """A square of `ratio` of the side set to 0, centred anywhere, per image."""
  height, width = images.shape[1], images.shape[2]
  size_h, size_w = int(height * ratio + 0.5), int(width * ratio + 0.5)
  draws = ctx.uniform([2])
  # The square's first row and column, so that it may reach past the border.
  top = tf.floor(draws[:, 0] * (height + (1 - size_h % 2))) - size_h // 2
  left = tf.floor(draws[:, 1] * (width + (1 - size_w % 2))) - size_w // 2
  rows = tf.range(height, dtype=top.dtype)[None]
  cols = tf.range(width, dtype=left.dtype)[None]
  inside_h = (rows >= top[:, None]) & (rows < top[:, None] + size_h)  # [rows, H]
  inside_w = (cols >= left[:, None]) & (cols < left[:, None] + size_w)
  cut = inside_h[:, :, None] & inside_w[:, None, :]  # [rows, H, W]
  return images * tf.cast(~cut, images.dtype)[..., None]


_OPS = {"color": color, "translation": translation, "cutout": cutout}


@gin.register(module="gan.augment")
def diff_augment(ctx: ctl.StepContext, images: tf.Tensor, policy: Sequence[str] = DEFAULT_POLICY, *,
                 translation_ratio: float = 0.125, cutout_ratio: float = 0.5) -> tf.Tensor:
  """`images` [rows, H, W, C] in [-1, 1], augmented by `policy`, per image.

  Args:
    ctx: the step's `ctl.StepContext` (the draws are per example).
    images: this replica's images (real or generated).
    policy: names from `POLICIES`, applied in this order.
    translation_ratio: the largest shift, as a fraction of the side.
    cutout_ratio: the cut square's side, as a fraction of the image's.

  Returns:
    The augmented images, same shape and dtype.
  """
  check_policy(policy)
  check_ratio("translation_ratio", translation_ratio)
  check_ratio("cutout_ratio", cutout_ratio)
  ratios = {"translation": (translation_ratio,), "cutout": (cutout_ratio,), "color": ()}
  for name in policy:
    images = _OPS[name](ctx, images, *ratios[name])
  return images


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
