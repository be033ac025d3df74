"""Datasets for GAN training; the default is embedded, so no download is needed.

    images, labels = gan.data.load_mnist()        # 5,000 training digits, uint8
    held_out, _ = gan.data.load_mnist("test")     # 5,000 test digits, never trained on
    dataset = gan.mnist_dataset(global_batch_size=64, seed=0)  # floats in [-1, 1]
    dataset = gan.data.stacked_mnist_dataset(64)  # 3 digits as channels: 1,000 modes
    dataset = gan.data.tfds_dataset("cifar10", 64)  # a local TFDS copy, by name
    dataset = gan.data.image_folder_dataset("faces/", 64, image_size=(64, 64))

Every function returns an endless dataset of global batches (static size, as
replicas and XLA need) of float32 images in [-1, 1], `[B, H, W, C]`, or
`(images, int32 labels)` with `with_labels=True`, shuffled per epoch from
`seed`, so every worker of a multi-worker run sees the same batches. Each has
a held-out split for evaluation that training never sees. The embedded digits
and their license are described in `gan/data/README.md`. `mnist_dataset` is
also `gan.mnist_dataset` (in Python and gin); the others are `gan.data.*`.
"""

import hashlib
import os
import socket
from collections.abc import Sequence

import gin
import numpy as np
import tensorflow as tf

import ctl
from ctl import arguments

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
_MNIST = {"train": "mnist_train_5k.npz", "test": "mnist_test_5k.npz"}


def load_mnist(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
  """Returns `(images, labels)`: 5,000 MNIST digits, uint8 [5000, 28, 28] and [5000].

  Args:
    split: "train", the digits GANs train on, or "test", digits of the official
      test split held out for evaluation (500 per class in both).
  """
  if split not in _MNIST:
    raise ValueError(f"split must be one of {sorted(_MNIST)}, got {split!r}.")
  with np.load(os.path.join(_DATA, _MNIST[split])) as archive:
    return archive["images"], archive["labels"]


def _require_batch_size(global_batch_size):
  arguments.integer("global_batch_size", global_batch_size, minimum=1)


def _epochs_of(count, global_batch_size, seed, load, *, draws=None):
  """Endless batches of `load(indices)`, epoch e in the order of stateless seed (seed, e).

  The order depends on `seed` alone, not on TensorFlow's global seed or on when
  the dataset is made, so every run and every worker sees the same batches.
  With `draws`, each example is that many indices `[draws]`, each from an
  order of its own: independent draws of `count` examples.
  """
  def epoch_order(epoch):
    shape = [count] if draws is None else [draws, count]
    keys = tf.random.stateless_uniform(shape, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
    order = tf.argsort(keys)  # along the last axis
    return tf.data.Dataset.from_tensor_slices(order if draws is None else tf.transpose(order))

  indices = tf.data.Dataset.counter().flat_map(epoch_order)
  # tf.data cannot see through `flat_map` that this never ends (its cardinality
  # would be unknown); saying so lets `evaluate` refuse it without a `.take(n)`.
  endless = tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
  return (indices.batch(global_batch_size, drop_remainder=True)
          .map(load, num_parallel_calls=tf.data.AUTOTUNE)
          .apply(endless)
          .prefetch(tf.data.AUTOTUNE))


def _to_unit_range(images):
  return (tf.cast(images, tf.float32) - 127.5) / 127.5


@gin.register(module="gan")
def mnist_dataset(global_batch_size: int, *, split: str = "train", seed: int = 0,
                  with_labels: bool = False) -> tf.data.Dataset:
  """Endless, shuffled global batches of the embedded MNIST digits, [B, 28, 28, 1].

  Args:
    global_batch_size: examples per batch over all replicas.
    split: "train" (what GANs train on) or "test" (held out for evaluation).
    seed: the shuffle seed.
    with_labels: elements are `(images, labels)`.
  """
  _require_batch_size(global_batch_size)
  images, labels = load_mnist(split)
  images, labels = tf.constant(images), tf.constant(labels.astype(np.int32))

  def gather(indices):
    batch = _to_unit_range(tf.gather(images, indices))[..., None]
    return (batch, tf.gather(labels, indices)) if with_labels else batch

  return _epochs_of(int(images.shape[0]), global_batch_size, seed, gather)


@gin.register(module="gan.data")
def stacked_mnist_dataset(global_batch_size: int, *, split: str = "train", seed: int = 0,
                          with_labels: bool = False) -> tf.data.Dataset:
  """Endless global batches of stacked MNIST, [B, 28, 28, 3]: three digits of
  the embedded split drawn independently, one per channel, so the data has
  1,000 modes (the digit triples) in equal shares: the standard test of mode
  coverage (Metz et al. 2017, "Unrolled GANs"; Lin et al. 2018, "PacGAN"),
  measured by `gan.evaluation.stacked_modes` and `mode_coverage`.

  Args:
    global_batch_size: examples per batch over all replicas.
    split: "train" or "test", as `mnist_dataset`.
    seed: the draws' seed; each epoch draws 5,000 triples, the three channels
      each a new order of the split's digits.
    with_labels: elements are `(images, modes)`, the mode 100 * the first
      channel's digit + 10 * the second's + the third's (int32 in [0, 1000)).
  """
  _require_batch_size(global_batch_size)
  images, labels = load_mnist(split)
  images, labels = tf.constant(images), tf.constant(labels.astype(np.int32))

  def gather(indices):  # [B, 3] digits -> [B, 28, 28, 3]
    batch = _to_unit_range(tf.transpose(tf.gather(images, indices), [0, 2, 3, 1]))
    return (batch, tf.reduce_sum(tf.gather(labels, indices) * [100, 10, 1], axis=1)
            ) if with_labels else batch

  return _epochs_of(int(images.shape[0]), global_batch_size, seed, gather, draws=3)


class DatasetNotFoundError(FileNotFoundError):
  """A TFDS dataset is not prepared locally and cannot be downloaded here."""


# Where TFDS fetches most datasets from; a quick probe avoids TFDS's own
# ~200 s of retries on a machine without internet.
_DOWNLOAD_HOST = ("storage.googleapis.com", 443)


def _reachable(address, timeout=3.0):
  try:
    with socket.create_connection(address, timeout=timeout):
      return True
  except OSError:
    return False


def _not_found(name, builder, reason):
  return DatasetNotFoundError(
      f"TFDS dataset {name!r} is not prepared in {builder.data_dir} and {reason}. "
      f"Fill that folder: on a machine with internet run `tfds build {name} "
      f"--data_dir <dir>` and copy <dir>/{builder.name}/{builder.version} there (or "
      "pass data_dir=... where it is); or pass download=True where there is "
      "internet; or train on the embedded digits with gan.mnist_dataset.")


@gin.register(module="gan.data")
def tfds_dataset(name: str, global_batch_size: int, *, split: str = "train",
                 data_dir: str | None = None, image_size: Sequence[int] | None = None,
                 seed: int = 0, with_labels: bool = False, download: bool = False,
                 shuffle_buffer: int = 10_000) -> tf.data.Dataset:
  """Endless, shuffled global batches of a TFDS image dataset, by name.

  Args:
    name: a TFDS name such as "mnist", "fashion_mnist", "cifar10", "celeb_a".
    global_batch_size: examples per batch over all replicas.
    split: the TFDS split; "test" (or "validation") is the held-out one.
    data_dir: where TFDS keeps prepared datasets (default: TFDS's, which
      honours TFDS_DATA_DIR).
    image_size: (height, width) to resize to; None keeps the dataset's size,
      which must then be fixed.
    seed: the shuffle seed. The order is fixed by it for a given TensorFlow
      version; files are read in order so that every worker agrees.
    with_labels: elements are `(images, labels)` from the "label" feature.
    download: download and prepare the dataset if it is not prepared locally
      (needs internet; checked at once, not after TFDS's retries).
    shuffle_buffer: examples in the shuffle buffer.

  Raises:
    DatasetNotFoundError: the dataset is not prepared in `data_dir` and
      `download` is False or the download host cannot be reached; the message
      names the folder to fill.
  """
  import tensorflow_datasets as tfds
  _require_batch_size(global_batch_size)
  if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
    raise ValueError(f"image_size must be (height, width), got {image_size!r}.")
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    if not download:
      raise _not_found(name, builder, "download=False")
    if not _reachable(_DOWNLOAD_HOST):
      raise _not_found(name, builder, f"{_DOWNLOAD_HOST[0]} cannot be reached (no internet)")
    builder.download_and_prepare()
  if with_labels and "label" not in builder.info.features:
    raise ValueError(f"with_labels: {name!r} has no 'label' feature (its features: "
                     f"{sorted(builder.info.features)}).")
  data = builder.as_dataset(split=split, shuffle_files=False)

  def convert(example):
    images = _to_unit_range(example["image"])
    if image_size is not None:
      images = tf.image.resize(images, image_size, antialias=True)
    if with_labels:
      return images, tf.cast(example["label"], tf.int32)
    return images

  data = data.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
  return (data.map(convert, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(global_batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
SUBSETS = ("train", "held_out")


@gin.register(module="gan.data")
def records_dataset(global_batch_size: int, *, path: str, seed: int = 0,
                    with_labels: bool = False,
                    input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
  """Endless, shuffled global batches from TFRecord files written by `ctl records`.

  What a TPU or a cluster reads (from local disk or `gs://`): files, each
  input pipeline its own, in parallel. Elements on file are a uint8 image
  `[H, W, C]` or `(image, label)`; batches are float32 in [-1, 1].

    ctl records --dataset mnist --out data/mnist_records
    dataset = gan.data.records_dataset(64, path="data/mnist_records")

  Args:
    global_batch_size: examples per batch over all replicas (with
      `input_context`, the batch is this pipeline's share of it).
    path: the directory `ctl records` wrote (or a glob of its shards).
    seed: the shuffle seed (files and examples).
    with_labels: elements are `(images, labels)`; the files must hold labels.
    input_context: a `tf.distribute.InputContext` when used in a dataset function.
  """
  _require_batch_size(global_batch_size)
  dataset = ctl.read_records(path, global_batch_size, input_context=input_context,
                             shuffle_seed=seed, repeat=True)
  element = dataset.element_spec
  labelled = isinstance(element, tuple) and len(element) == 2
  if with_labels and not labelled:
    raise ValueError(f"with_labels=True, but the records in {path!r} hold no labels "
                     f"(element {element}); write them with labels or drop with_labels.")

  def to_images(*element):
    images = _to_unit_range(element[0])
    return (images, tf.cast(element[1], tf.int32)) if with_labels else images

  return dataset.map(to_images, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
      tf.data.AUTOTUNE)


def is_held_out(relative_path: str, fraction: float) -> bool:
  """Whether a file is held out: from a hash of its path, so adding files moves none."""
  digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < fraction


@gin.register(module="gan.data")
def image_folder_dataset(directory: str, global_batch_size: int, *,
                         image_size: Sequence[int], channels: int = 3, subset: str = "train",
                         held_out_fraction: float = 0.1, seed: int = 0,
                         with_labels: bool = False) -> tf.data.Dataset:
  """Endless, shuffled global batches of the images in a folder (and its subfolders).

  Args:
    directory: the folder; with labels, each first-level subfolder is a class
      (label = its index in sorted order).
    global_batch_size: examples per batch over all replicas.
    image_size: (height, width) to resize every image to.
    channels: 1 (grey) or 3 (RGB); images are converted.
    subset: "train", or "held_out" for evaluation: each file belongs to one of
      them by a hash of its path, so the split is stable as files are added.
    held_out_fraction: the share of files held out.
    seed: the shuffle seed.
    with_labels: elements are `(images, labels)`.
  """
  _require_batch_size(global_batch_size)
  if not os.path.isdir(directory):
    raise ValueError(f"directory {directory!r} does not exist or is not a folder.")
  if (not isinstance(image_size, (tuple, list)) or len(image_size) != 2
      or any(not isinstance(d, int) or d < 1 for d in image_size)):
    raise ValueError(f"image_size must be (height, width) of positive ints, got {image_size!r}.")
  if channels not in (1, 3):
    raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels!r}.")
  if subset not in SUBSETS:
    raise ValueError(f"subset must be one of {SUBSETS}, got {subset!r}.")
  if not 0.0 <= held_out_fraction < 1.0:
    raise ValueError(f"held_out_fraction must be in [0, 1), got {held_out_fraction!r}.")
  paths, labels = _image_files(directory, subset, held_out_fraction, with_labels)
  if len(paths) < global_batch_size:
    raise ValueError(f"directory {directory!r} has {len(paths)} images in subset "
                     f"{subset!r}, fewer than global_batch_size ({global_batch_size}); "
                     "use a smaller batch or more images.")
  paths, labels = tf.constant(paths), tf.constant(labels, tf.int32)

  def load_one(path):
    # The decoders convert grey, RGB and RGBA to `channels` themselves.
    image = tf.io.decode_image(tf.io.read_file(path), channels=channels,
                               expand_animations=False)
    image = tf.image.resize(_to_unit_range(image), image_size, antialias=True)
    return tf.ensure_shape(image, tuple(image_size) + (channels,))

  def load(indices):
    images = tf.map_fn(load_one, tf.gather(paths, indices),
                       fn_output_signature=tf.TensorSpec(tuple(image_size) + (channels,)))
    return (images, tf.gather(labels, indices)) if with_labels else images

  return _epochs_of(int(paths.shape[0]), global_batch_size, seed, load)


def _image_files(directory, subset, held_out_fraction, with_labels):
  """The image paths of `subset` in sorted order, and their labels (0 without)."""
  classes = sorted(d for d in os.listdir(directory)
                   if os.path.isdir(os.path.join(directory, d)))
  paths, labels = [], []
  for root, dirs, files in os.walk(directory):
    dirs.sort()
    for file in sorted(files):
      if not file.lower().endswith(IMAGE_EXTENSIONS):
        continue
      relative = os.path.relpath(os.path.join(root, file), directory)
      if is_held_out(relative, held_out_fraction) != (subset == "held_out"):
        continue
      top = relative.split(os.sep)[0]
      if with_labels and top not in classes:
        raise ValueError(f"with_labels: {relative!r} is not in a class subfolder of "
                         f"{directory!r}; put every image in one.")
      paths.append(os.path.join(root, file))
      labels.append(classes.index(top) if with_labels else 0)
  if not paths:
    raise ValueError(f"directory {directory!r} has no images for subset {subset!r} "
                     f"(looked for {', '.join(IMAGE_EXTENSIONS)}, any case).")
  return paths, labels


def image_folder_examples(directory: str, *, channels: int = 3,
                          image_size: Sequence[int] | None = None, subset: str = "train",
                          held_out_fraction: float = 0.1,
                          with_labels: bool = False) -> tf.data.Dataset:
  """The images of a folder one by one, in file order: uint8 `[H, W, channels]`.

  What `ctl records --dataset folder:PATH` writes; the same files and split
  as `image_folder_dataset`, but unbatched, unshuffled, finite and not
  rescaled, so they can be stored once and read fast.

  Args:
    directory, channels, subset, held_out_fraction, with_labels: as for
      `image_folder_dataset`.
    image_size: (height, width) to resize to, or None to keep each image's size.

  Returns:
    A `tf.data.Dataset` of images, or of `(image, int32 label)`.
  """
  if not os.path.isdir(directory):
    raise ValueError(f"directory {directory!r} does not exist or is not a folder.")
  if channels not in (1, 3):
    raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels!r}.")
  if subset not in SUBSETS:
    raise ValueError(f"subset must be one of {SUBSETS}, got {subset!r}.")
  if image_size is not None and (
      not isinstance(image_size, (tuple, list)) or len(image_size) != 2
      or any(not isinstance(d, int) or d < 1 for d in image_size)):
    raise ValueError(f"image_size must be (height, width) of positive ints or None, "
                     f"got {image_size!r}.")
  paths, labels = _image_files(directory, subset, held_out_fraction, with_labels)

  def load(path, label):
    image = tf.io.decode_image(tf.io.read_file(path), channels=channels,
                               expand_animations=False)
    if image_size is not None:
      # Resizing in float then rounding back keeps the stored pixels uint8.
      image = tf.image.resize(image, image_size, antialias=True)
      image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    return (image, label) if with_labels else image

  data = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
  return data.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def record_source(name: str, split: str, *, data_dir: str | None = None, channels: int = 3,
                  with_labels: bool = False,
                  image_size: Sequence[int] | None = None) -> tf.data.Dataset | None:
  """What `ctl records --dataset NAME` writes, for the names gan knows (else None).

  Registered under the entry points `ctl.record_sources` (pyproject.toml).
  """
  kind, _, value = name.partition(":")
  if kind == "mnist" and not value:
    if split not in ("train", "test"):
      raise ValueError(f"--split for mnist must be train or test, got {split!r}.")
    images, labels = load_mnist(split)
    return tf.data.Dataset.from_tensor_slices((images[..., None], labels.astype(np.int32)))
  if kind == "tfds" and value:
    return _tfds_examples(value, split, data_dir)
  if kind == "folder" and value:
    if split not in ("train", "test"):
      raise ValueError(f"--split for a folder must be train or test (the held-out "
                       f"files), got {split!r}.")
    return image_folder_examples(value, channels=channels, with_labels=with_labels,
                                 image_size=image_size,
                                 subset="train" if split == "train" else "held_out")
  return None


record_source.usage = "mnist, tfds:NAME (e.g. tfds:cifar10) or folder:PATH"


def _tfds_examples(name, split, data_dir):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    raise _not_found(name, builder, "`ctl records` does not download")
  features = builder.info.features
  if "image" not in features:
    raise ValueError(f"TFDS dataset {name!r} has no 'image' feature (its features: "
                     f"{sorted(features)}).")
  dataset = builder.as_dataset(split=split, shuffle_files=False)
  if "label" in features:
    return dataset.map(lambda e: (e["image"], tf.cast(e["label"], tf.int32)))
  return dataset.map(lambda e: e["image"])
