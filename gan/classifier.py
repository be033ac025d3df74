"""The small MNIST classifier whose features `gan.evaluation` measures distances in.

    python -m gan.classifier                 # retrains it, rewrites the shipped weights
    python -m gan.classifier other.weights.h5   # retrains it elsewhere, to compare
    model = load_classifier()                # frozen, version VERSION
    features = keras.Model(model.inputs, model.get_layer(FEATURES).output)

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


def _sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def load_classifier(path: str = WEIGHTS) -> keras.Model:
  """Returns the classifier with frozen weights from `path`.

  Args:
    path: a weights file of `mnist_classifier()`; by default the shipped one,
      whose sha256 must then be `SHA256`.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: `path` is the shipped file but its contents are not version
      `VERSION`'s (replaced, retrained, or a Git LFS pointer).
  """
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"classifier weights {path} are missing; they ship with the package "
        "(gan/data). Reinstall it or restore the file from git, or recreate it with "
        "`python -m gan.classifier`.")
  if os.path.abspath(path) == WEIGHTS and _sha256(path) != SHA256:
    raise ValueError(
        f"classifier weights {path} have sha256 {_sha256(path)}, not version "
        f"{VERSION}'s {SHA256}, so their FIDs would not be comparable with version "
        f"{VERSION}'s. Restore the file (`git checkout gan/data/{os.path.basename(path)}`), or "
        "if you retrained on purpose, raise VERSION and SHA256 in gan/classifier.py.")
  model = mnist_classifier()
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
  model = mnist_classifier()
  inputs = keras.Input((28, 28, 1))
  trainer = keras.Model(inputs, model(shifted(inputs)))
  trainer.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  trainer.fit(_to_unit(images), labels.astype("int32"), batch_size=64, epochs=epochs,
              shuffle=True, verbose=2)
  model.save_weights(path)
  test_images, test_labels = data.load_mnist("test")
  logits = model.predict(_to_unit(test_images), batch_size=500, verbose=0)
  return float(np.mean(np.argmax(logits, -1) == test_labels))


def main(argv: list[str]) -> None:
  path = argv[1] if len(argv) > 1 else WEIGHTS
  accuracy = train_classifier(path)
  digest = _sha256(path)
  print(f"wrote {path} ({os.path.getsize(path)} bytes, sha256 {digest})")
  print(f"accuracy on the 5,000 held-out test digits: {accuracy:.4f}")
  if digest != SHA256:
    print(f"not bit-identical to version {VERSION} ({SHA256}): a new version; raise "
          "VERSION and SHA256 before shipping it.")


if __name__ == "__main__":
  main(sys.argv)
