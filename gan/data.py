"""Datasets for GAN training; the default is embedded, so no download is needed.

    images, labels = gan.load_mnist()             # 5,000 training digits, uint8
    held_out, _ = gan.load_mnist("test")          # 5,000 test digits, never trained on
    dataset = gan.mnist_dataset(global_batch_size=64, seed=0)  # floats in [-1, 1]

The embedded digits and their license are described in `gan/data/README.md`.
"""

import os

import numpy as np
import tensorflow as tf

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
_MNIST = {"train": "mnist_train_5k.npz", "test": "mnist_test_5k.npz"}


def load_mnist(split="train"):
  """Returns `(images, labels)`: 5,000 MNIST digits, uint8 [5000, 28, 28] and [5000].

  Args:
    split: "train", the digits GANs train on, or "test", digits of the official
      test split held out for evaluation (500 per class in both).
  """
  if split not in _MNIST:
    raise ValueError(f"split must be one of {sorted(_MNIST)}, got {split!r}.")
  with np.load(os.path.join(_DATA, _MNIST[split])) as archive:
    return archive["images"], archive["labels"]


def mnist_dataset(global_batch_size, *, seed=0, with_labels=False):
  """Endless, shuffled global batches of MNIST images scaled to [-1, 1], [B, 28, 28, 1].

  Epoch `e` visits the digits in an order drawn from the stateless seed
  `(seed, e)`, so the batches depend on `seed` alone, not on TensorFlow's global
  seed or on when the dataset is made: every run, and every worker of a
  multi-worker run, sees the same batches. Batches have a static size
  (`drop_remainder`), as splitting across replicas and XLA need. With
  `with_labels`, elements are `(images, labels)`.
  """
  if not isinstance(global_batch_size, int) or global_batch_size < 1:
    raise ValueError(f"global_batch_size must be a positive int, got {global_batch_size!r}.")
  images, labels = load_mnist()
  images, labels = tf.constant(images), tf.constant(labels.astype(np.int32))
  count = int(images.shape[0])

  def epoch_order(epoch):
    keys = tf.random.stateless_uniform([count], seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
    return tf.data.Dataset.from_tensor_slices(tf.argsort(keys))

  def gather(indices):
    batch = (tf.cast(tf.gather(images, indices), tf.float32)[..., None] - 127.5) / 127.5
    return (batch, tf.gather(labels, indices)) if with_labels else batch

  indices = tf.data.Dataset.counter().flat_map(epoch_order)
  return (indices.batch(global_batch_size, drop_remainder=True)
          .map(gather, num_parallel_calls=tf.data.AUTOTUNE))
