"""gan's datasets: the embedded digits' held-out split, TFDS by name, image folders.

No network: a TFDS dataset that is not prepared must fail at once and name the
folder to fill; a locally prepared one (a tiny builder defined here) loads.
"""

import os
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import ctl
import gan
from gan import data as data_lib


def first(dataset, count=1):
  return [tf.nest.map_structure(np.asarray, b) for b in dataset.take(count)]


def test_mnist_held_out_split_differs_from_train():
  train = first(gan.mnist_dataset(16))[0]
  test = first(gan.mnist_dataset(16, split="test"))[0]
  assert train.shape == test.shape == (16, 28, 28, 1)
  train_set = {x.tobytes() for x in gan.data.load_mnist("train")[0]}
  assert not any(x.tobytes() in train_set for x in gan.data.load_mnist("test")[0])
  assert not np.array_equal(train, test)
  with pytest.raises(ValueError, match="split must be one of"):
    gan.mnist_dataset(16, split="validation")


def test_tfds_not_prepared_fails_at_once_naming_the_folder(tmp_path):
  start = time.monotonic()
  with pytest.raises(gan.data.DatasetNotFoundError) as error:
    gan.data.tfds_dataset("mnist", 16, data_dir=str(tmp_path))
  # TFDS's own retries take ~200 s offline; the local check takes well under a
  # second. 60 s parts the two whatever the machine's load.
  assert time.monotonic() - start < 60
  message = str(error.value)
  assert os.path.join(str(tmp_path), "mnist") in message
  assert "tfds build mnist" in message and "gan.mnist_dataset" in message


def test_tfds_download_without_internet_fails_at_once(tmp_path, monkeypatch):
  monkeypatch.setattr(data_lib, "_reachable", lambda address, timeout=3.0: False)
  with pytest.raises(gan.data.DatasetNotFoundError, match="cannot be reached"):
    gan.data.tfds_dataset("mnist", 16, data_dir=str(tmp_path), download=True)


class TinyDigits(tfds.core.GeneratorBasedBuilder):
  """40 random 8x8x1 images with labels; prepared locally without a network."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(8, 8, 1)),
        "label": tfds.features.ClassLabel(num_classes=4)}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(0), "test": self._generate_examples(1)}

  def _generate_examples(self, seed):
    rng = np.random.default_rng(seed)
    for i in range(40):
      yield i, {"image": rng.integers(0, 256, (8, 8, 1), dtype=np.uint8), "label": i % 4}


def test_tfds_prepared_locally_loads_by_name(tmp_path):
  TinyDigits(data_dir=str(tmp_path)).download_and_prepare()
  images, labels = first(gan.data.tfds_dataset("tiny_digits", 8, data_dir=str(tmp_path),
                                          with_labels=True))[0]
  assert images.shape == (8, 8, 8, 1) and images.dtype == np.float32
  assert images.min() >= -1 and images.max() <= 1 and labels.dtype == np.int32
  same = first(gan.data.tfds_dataset("tiny_digits", 8, data_dir=str(tmp_path)), 6)
  again = first(gan.data.tfds_dataset("tiny_digits", 8, data_dir=str(tmp_path)), 6)
  for a, b in zip(same, again):
    np.testing.assert_array_equal(a, b)  # the same batches for the same seed
  epochs = np.concatenate(same)  # 48 images: all of epoch 1 and the start of epoch 2
  assert not np.array_equal(epochs[:8], epochs[40:48])
  held_out = first(gan.data.tfds_dataset("tiny_digits", 8, split="test", data_dir=str(tmp_path),
                                    image_size=(16, 16)))[0]
  assert held_out.shape == (8, 16, 16, 1)


def write_folder(root, classes=("cat", "dog", "owl"), per_class=10, size=(12, 10)):
  for c, name in enumerate(classes):
    os.makedirs(root / name, exist_ok=True)
    for i in range(per_class):
      grey = (i % 2 == 0)
      pixels = np.full(size + ((1,) if grey else (3,)), 40 * c + i, np.uint8)
      tf.io.write_file(str(root / name / f"{i}.{'png' if i % 3 else 'PNG'}"),
                       tf.io.encode_png(pixels))
  (root / "notes.txt").write_text("not an image")


def test_image_folder(tmp_path):
  write_folder(tmp_path)
  train = gan.data.image_folder_dataset(str(tmp_path), 4, image_size=(8, 8), with_labels=True,
                                   held_out_fraction=0.3)
  images, labels = first(train)[0]
  assert images.shape == (4, 8, 8, 3) and images.min() >= -1 and images.max() <= 1
  assert set(labels) <= {0, 1, 2}
  grey = first(gan.data.image_folder_dataset(str(tmp_path), 4, image_size=(8, 8), channels=1))[0]
  assert grey.shape == (4, 8, 8, 1)


def _files(subset, root, fraction=0.3):
  paths = []
  for dirpath, _, files in os.walk(root):
    for f in files:
      relative = os.path.relpath(os.path.join(dirpath, f), root)
      if f.lower().endswith(data_lib.IMAGE_EXTENSIONS) and (
          data_lib.is_held_out(relative, fraction) == (subset == "held_out")):
        paths.append(relative)
  return set(paths)


def test_image_folder_held_out_split_is_disjoint_and_stable(tmp_path):
  write_folder(tmp_path)
  train, held_out = _files("train", tmp_path), _files("held_out", tmp_path)
  assert train and held_out and not train & held_out and len(train | held_out) == 30
  write_folder(tmp_path, classes=("cat", "dog", "owl", "yak"))  # files added
  assert _files("held_out", tmp_path) >= held_out and _files("train", tmp_path) >= train
  count = len(_files("held_out", tmp_path))
  batch = first(gan.data.image_folder_dataset(str(tmp_path), count, image_size=(8, 8),
                                         subset="held_out", held_out_fraction=0.3))[0]
  assert len(batch) == count


@pytest.mark.parametrize("kwargs, message", [
    (dict(directory="missing"), "does not exist"),
    (dict(image_size=(8,)), "image_size must be"),
    (dict(channels=2), "channels must be 1"),
    (dict(subset="validation"), "subset must be one of"),
    (dict(global_batch_size=1000), "fewer than global_batch_size"),
    (dict(empty=True), "has no images"),
])
def test_image_folder_errors(tmp_path, kwargs, message):
  write_folder(tmp_path / "images")
  os.makedirs(tmp_path / "empty")
  args = dict(directory=str(tmp_path / "images"), global_batch_size=4, image_size=(8, 8))
  if kwargs.pop("empty", False):
    args["directory"] = str(tmp_path / "empty")
  if kwargs.get("directory") == "missing":
    kwargs["directory"] = str(tmp_path / "missing")
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    gan.data.image_folder_dataset(**args)


@pytest.mark.parametrize("make", ["mnist", "tfds", "image_folder"])
def test_every_dataset_is_endless_by_its_cardinality_so_evaluate_refuses_it(tmp_path, make):
  # A forgotten `.take(n)` must be refused up front, not evaluate forever: that
  # needs tf.data to know the dataset never ends (INFINITE, not UNKNOWN).
  if make == "mnist":
    dataset = gan.mnist_dataset(8)
  elif make == "tfds":
    TinyDigits(data_dir=str(tmp_path)).download_and_prepare()
    dataset = gan.data.tfds_dataset("tiny_digits", 8, data_dir=str(tmp_path))
  else:
    write_folder(tmp_path)
    dataset = gan.data.image_folder_dataset(str(tmp_path), 4, image_size=(8, 8))
  assert int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
  with pytest.raises(ValueError, match="evaluation data is endless"):
    ctl.Evaluate(lambda ctx, x: {"mean": ctx.average(x[:, 0, 0, 0])}, dataset,
                 ctl.Every(steps=10))
  ctl.Evaluate(lambda ctx, x: {"mean": ctx.average(x[:, 0, 0, 0])}, dataset.take(2),
               ctl.Every(steps=10))
