"""Datasets for GAN training; the default is embedded, so no download is needed.

    images, labels = gan.load_mnist()             # 5,000 digits, uint8
    dataset = gan.mnist_dataset(global_batch_size=64, seed=0)  # floats in [-1, 1]

The embedded digits and their license are described in `gan/data/README.md`.
"""

import os

import numpy as np
import tensorflow as tf

_MNIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                      "mnist_train_5k.npz")


def load_mnist():
  """Returns `(images, labels)`: 5,000 MNIST training digits, uint8 [N, 28, 28]."""
  with np.load(_MNIST) as archive:
    return archive["images"], archive["labels"]


def mnist_dataset(global_batch_size, *, seed=0, with_labels=False):
  """Endless, shuffled global batches of MNIST images scaled to [-1, 1], [B, 28, 28, 1].

  Batches are static in size (`drop_remainder`), as splitting across replicas
  and XLA need. With `with_labels`, elements are `(images, labels)`.
  """
  if global_batch_size < 1:
    raise ValueError(f"global_batch_size must be at least 1, got {global_batch_size}.")
  images, labels = load_mnist()
  images = (images.astype(np.float32)[..., None] - 127.5) / 127.5
  data = (images, labels.astype(np.int32)) if with_labels else images
  dataset = tf.data.Dataset.from_tensor_slices(data)
  dataset = dataset.shuffle(len(images), seed=seed, reshuffle_each_iteration=True)
  return dataset.repeat().batch(global_batch_size, drop_remainder=True)
