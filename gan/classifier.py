"""The small MNIST classifier whose features `gan.evaluation` measures distances in.

    python -m gan.classifier                 # retrains it, rewrites the shipped weights
    python -m gan.classifier other.weights.h5   # retrains it elsewhere, to compare
    model = load_classifier()                # frozen, version VERSION
    features = keras.Model(model.inputs, model.get_layer(FEATURES).output)
    python -m gan.classifier --second MNIST_DIR  # retrains the second classifier

The second classifier (`second_classifier`, `load_second_classifier`) is a
check on the first: another network (strided convolutions, no pooling or
dropout), trained on other digits (the 5,000 official test digits that are not
the held-out ones, read from the official files in MNIST_DIR), with other
augmentation (rotations). Its only use is the classifier score, so that a
score ratio does not rest on one network's calibration.

Inception weights cannot be assumed offline, and Inception features say little
about 28x28 digits, so FID and KID here use a classifier trained on real MNIST
digits (`gan.data.load_mnist("train")`, the GANs' own training data; the held-out
test digits are only scored). Its weights ship in `gan/data`, versioned
(`VERSION`, in the file name) and pinned by `SHA256`: numbers computed with one
version are comparable with each other only, never with Inception FIDs.
Training is seeded (weights, dropout, shifts and shuffling), and on this
machine (TF 2.21, Keras 3.15, 2-core x86 CPU) a rerun rewrites the shipped file
bit for bit; other CPUs or TensorFlow versions may round differently, and a
file that differs is a new version.
"""

import gzip
import hashlib
import os
import sys

import keras
import numpy as np
from keras import layers

VERSION = 1
WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                       f"mnist_classifier_v{VERSION}.weights.h5")
# The shipped file's digest: loading it checks that the features are version 1's.
SHA256 = "e9d5eb754d4d19e191631a190882922328aa92ddcdf8e12c5db1ace66655e5f2"
FEATURES = "features"  # name of the layer whose outputs are the features
SECOND_VERSION = 1
SECOND_WEIGHTS = os.path.join(os.path.dirname(WEIGHTS),
                              f"mnist_second_classifier_v{SECOND_VERSION}.weights.h5")
SECOND_SHA256 = "220061485985624f1da596d3718e0787e5ce02b9f72f3e8106dd2495a75afde4"
# The official test split, which the second classifier's digits come from.
TEST_FILES = {"t10k-images-idx3-ubyte.gz":
              "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
              "t10k-labels-idx1-ubyte.gz":
              "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"}


def mnist_classifier() -> keras.Model:
  """Builds the (untrained) classifier of version `VERSION`.

  Two conv/max-pool stages, then a 64-unit ReLU layer named "features" (the
  feature space of `gan.evaluation`: small enough for stable 64x64 covariances
  from a few thousand digits) and 10 logits.

  Returns:
    A `keras.Sequential`: images `[B, 28, 28, 1]` in [-1, 1] -> logits `[B, 10]`.
  """
  return keras.Sequential([
      keras.Input((28, 28, 1)),
      layers.Conv2D(32, 3, activation="relu"),
      layers.MaxPooling2D(),
      layers.Conv2D(64, 3, activation="relu"),
      layers.MaxPooling2D(),
      layers.Flatten(),
      layers.Dropout(0.3),
      layers.Dense(64, activation="relu", name=FEATURES),
      layers.Dense(10, name="logits"),
  ], name=f"mnist_classifier_v{VERSION}")


def second_classifier() -> keras.Model:
  """Builds the (untrained) second classifier, version `SECOND_VERSION`: two
  5x5 stride-2 convolutions (16 and 32 channels, ReLU), a 128-unit ReLU layer
  and 10 logits; images `[B, 28, 28, 1]` in [-1, 1] -> logits `[B, 10]`."""
  return keras.Sequential([
      keras.Input((28, 28, 1)),
      layers.Conv2D(16, 5, strides=2, padding="same", activation="relu"),
      layers.Conv2D(32, 5, strides=2, padding="same", activation="relu"),
      layers.Flatten(),
      layers.Dense(128, activation="relu"),
      layers.Dense(10, name="logits"),
  ], name=f"mnist_second_classifier_v{SECOND_VERSION}")


def _sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def load_classifier(path: str | None = None, *, second: bool = False) -> keras.Model:
  """Returns the classifier with frozen weights from `path`.

  Args:
    path: a weights file of `mnist_classifier()`; by default the shipped one
      (`WEIGHTS`), whose sha256 must then be `SHA256`.
    second: the second classifier instead (`second_classifier()`; shipped as
      `SECOND_WEIGHTS`, pinned by `SECOND_SHA256`).

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: `path` is the shipped file but its contents are not version
      `VERSION`'s (replaced, retrained, or a Git LFS pointer).
  """
  shipped, version, digest, build = ((SECOND_WEIGHTS, SECOND_VERSION, SECOND_SHA256,
                                      second_classifier) if second else
                                     (WEIGHTS, VERSION, SHA256, mnist_classifier))
  path = shipped if path is None else path
  prefix = "SECOND_" if second else ""
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"classifier weights {path} are missing; they ship with the package "
        "(gan/data). Reinstall it or restore the file from git, or recreate it with "
        f"`python -m gan.classifier{' --second MNIST_DIR' if second else ''}`.")
  if os.path.abspath(path) == shipped and _sha256(path) != digest:
    raise ValueError(
        f"classifier weights {path} have sha256 {_sha256(path)}, not version "
        f"{version}'s {digest}, so their numbers would not be comparable with version "
        f"{version}'s. Restore the file (`git checkout gan/data/{os.path.basename(path)}`), "
        f"or if you retrained on purpose, raise {prefix}VERSION and {prefix}SHA256 in "
        "gan/classifier.py.")
  model = build()
  model.load_weights(path)
  model.trainable = False
  return model


def _to_unit(images):
  return (images[..., None].astype("float32") - 127.5) / 127.5


def train_classifier(path: str = WEIGHTS, *, epochs: int = 8, seed: int = 0) -> float:
  """Trains the classifier on the 5,000 training digits and saves its weights.

  Adam(1e-3), batch 64, 8 epochs, dropout 0.3 and random shifts of up to 2
  pixels; everything random (initial weights, dropout, shifts, the order of
  each epoch) is drawn from `seed` via `keras.utils.set_random_seed`.

  Args:
    path: where to write the weights (by default the shipped file).
    epochs: passes over the 5,000 digits.
    seed: the seed of everything random.

  Returns:
    Accuracy on the 5,000 held-out test digits, which training never sees.
  """
  from gan import data
  keras.utils.set_random_seed(seed)
  images, labels = data.load_mnist("train")
  # Shifts of up to 2 pixels: generated digits are not centred as exactly as
  # MNIST's, and the features should not care.
  shifted = keras.Sequential([layers.RandomTranslation(2 / 28, 2 / 28, seed=seed)])
  return _fit_and_save(mnist_classifier(), shifted, images, labels, path, epochs)


def _fit_and_save(model, augment, images, labels, path, epochs):
  """Trains `model` on `augment`ed uint8 `images` (Adam(1e-3), batch 64), saves its
  weights to `path`; its accuracy on the held-out digits."""
  from gan import data
  inputs = keras.Input((28, 28, 1))
  trainer = keras.Model(inputs, model(augment(inputs)))
  trainer.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  trainer.fit(_to_unit(images), labels.astype("int32"), batch_size=64, epochs=epochs,
              shuffle=True, verbose=2)
  model.save_weights(path)
  test_images, test_labels = data.load_mnist("test")
  logits = model.predict(_to_unit(test_images), batch_size=500, verbose=0)
  return float(np.mean(np.argmax(logits, -1) == test_labels))


def other_test_digits(mnist_dir: str) -> tuple[np.ndarray, np.ndarray]:
  """The official test split's digits that are not the held-out ones
  (`gan.data.load_mnist("test")`), from its official files in `mnist_dir`
  (`TEST_FILES`, checked by sha256): uint8 [5000, 28, 28] and labels [5000]."""
  arrays = []
  for name, digest in TEST_FILES.items():
    path = os.path.join(mnist_dir, name)
    if not os.path.exists(path):
      raise FileNotFoundError(f"mnist_dir={mnist_dir!r} has no {name}; pass the directory "
                              "of MNIST's official test files (t10k-images-idx3-ubyte.gz and "
                              "t10k-labels-idx1-ubyte.gz).")
    if _sha256(path) != digest:
      raise ValueError(f"{path} has sha256 {_sha256(path)}, not the official file's "
                       f"{digest}; download MNIST's official test files again.")
    with gzip.open(path, "rb") as f:
      raw = np.frombuffer(f.read(), np.uint8)
    arrays.append(raw[16:].reshape(-1, 28, 28) if "images" in name else raw[8:])
  images, labels = arrays
  with np.load(os.path.join(os.path.dirname(WEIGHTS), "mnist_test_5k.npz")) as archive:
    held_out = archive["test_index"]
  other = np.setdiff1d(np.arange(len(labels)), held_out)
  return images[other], labels[other]


def train_second_classifier(mnist_dir: str, path: str = SECOND_WEIGHTS, *, epochs: int = 10,
                            seed: int = 0) -> float:
  """Trains the second classifier on `other_test_digits(mnist_dir)`, saves its weights.

  Adam(1e-3), batch 64, `epochs` epochs, random rotations of up to 0.04 of a
  turn (14 degrees); everything random drawn from `seed` via
  `keras.utils.set_random_seed`. Returns its accuracy on the held-out digits.
  """
  keras.utils.set_random_seed(seed)
  images, labels = other_test_digits(mnist_dir)
  model = second_classifier()
  rotated = layers.RandomRotation(0.04, fill_value=-1.0, fill_mode="constant", seed=seed)
  return _fit_and_save(model, rotated, images, labels, path, epochs)


def main(argv: list[str]) -> None:
  second = len(argv) > 2 and argv[1] == "--second"
  if len(argv) > 1 and argv[1] == "--second" and not second:
    sys.exit("usage: python -m gan.classifier --second MNIST_DIR [weights path]")
  if second:
    path = argv[3] if len(argv) > 3 else SECOND_WEIGHTS
    accuracy = train_second_classifier(argv[2], path)
    version, shipped = SECOND_VERSION, SECOND_SHA256
  else:
    path = argv[1] if len(argv) > 1 else WEIGHTS
    accuracy = train_classifier(path)
    version, shipped = VERSION, SHA256
  digest = _sha256(path)
  print(f"wrote {path} ({os.path.getsize(path)} bytes, sha256 {digest})")
  print(f"accuracy on the 5,000 held-out test digits: {accuracy:.4f}")
  if digest != shipped:
    prefix = "SECOND_" if second else ""
    print(f"not bit-identical to version {version} ({shipped}): a new version; raise "
          f"{prefix}VERSION and {prefix}SHA256 before shipping it.")


if __name__ == "__main__":
  main(sys.argv)
