"""The small MNIST classifier whose features `gan.evaluation` measures distances in.

    python -m gan.classifier        # retrains it and rewrites the shipped weights

Inception weights cannot be assumed offline, and Inception features say little
about 28x28 digits, so FID and KID here use a classifier trained on real MNIST
digits (`gan.load_mnist("train")`, the GANs' own training data; the held-out
test digits are only scored). Its weights ship in `gan/data`, versioned
(`VERSION`): numbers computed with one version are comparable with each other
only. Training is seeded, but TensorFlow's CPU kernels are not all
deterministic, so a rerun gives a classifier of about the same accuracy, not
necessarily the same bits: that would be a new version.
"""

import os

import keras
import numpy as np
from keras import layers

VERSION = 1
WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                       f"mnist_classifier_v{VERSION}.weights.h5")
FEATURES = "features"  # name of the layer whose outputs are the features


def mnist_classifier():
  """Images `[B, 28, 28, 1]` in [-1, 1] -> logits `[B, 10]`; layer "features" is 64-d."""
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


def load_classifier(path=WEIGHTS):
  """The shipped classifier with its frozen weights."""
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"classifier weights {path} are missing; they ship with the package "
        "(gan/data). Reinstall it, or recreate them with `python -m gan.classifier`.")
  model = mnist_classifier()
  model.load_weights(path)
  model.trainable = False
  return model


def train_classifier(epochs=8, seed=0, path=WEIGHTS):
  """Trains on the 5,000 training digits (small random shifts), saves, returns test accuracy."""
  from gan import data
  keras.utils.set_random_seed(seed)
  images, labels = data.load_mnist("train")
  x = (images[..., None].astype("float32") - 127.5) / 127.5
  # Shifts of up to 2 pixels: the generated digits are not centred as exactly
  # as MNIST's, and the features should not care.
  shifted = keras.Sequential([layers.RandomTranslation(2 / 28, 2 / 28, seed=seed)])
  model = mnist_classifier()
  inputs = keras.Input((28, 28, 1))
  trainer = keras.Model(inputs, model(shifted(inputs)))
  trainer.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  trainer.fit(x, labels.astype("int32"), batch_size=64, epochs=epochs, shuffle=True,
              verbose=2)
  model.save_weights(path)
  test_images, test_labels = data.load_mnist("test")
  logits = model.predict((test_images[..., None].astype("float32") - 127.5) / 127.5,
                         batch_size=500, verbose=0)
  return float(np.mean(np.argmax(logits, -1) == test_labels))


if __name__ == "__main__":
  accuracy = train_classifier()
  print(f"wrote {WEIGHTS}; accuracy on the 5,000 held-out test digits: {accuracy:.4f}")
