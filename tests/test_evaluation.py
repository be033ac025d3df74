"""The classifier metrics are validated, not assumed: the checks the issue asks for.

Real vs real stays below 1, noise scores above 100, every corruption sequence
(additive noise, blur, dropped classes) scores strictly worse step by step, and
shuffling changes nothing. The reference set is the 5,000 held-out test digits;
"real" is the 5,000 training digits.
"""

import numpy as np
import pytest
import tensorflow as tf

import gan
from gan import evaluation


@pytest.fixture(scope="module")
def digits():
  train, _ = gan.load_mnist("train")
  test, test_labels = gan.load_mnist("test")
  unit = (train[..., None].astype(np.float32) - 127.5) / 127.5
  return {"train": unit, "test_labels": test_labels, "test": test,
          "reference": gan.classifier_features(test)}


def fid(images, digits):
  return gan.frechet_distance(gan.classifier_features(images), digits["reference"])


def blur(images, sigma):
  radius = int(3 * sigma)
  g = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
  kernel = np.outer(g, g) / np.outer(g, g).sum()
  return tf.nn.depthwise_conv2d(images, kernel[:, :, None, None].astype(np.float32),
                                [1, 1, 1, 1], "SAME").numpy()


def test_real_vs_real_below_one(digits):
  assert fid(digits["train"], digits) < 1.0
  reference = digits["reference"]
  assert gan.frechet_distance(reference[::2], reference[1::2]) < 1.0


def test_noise_vs_real_above_100(digits):
  noise = np.random.default_rng(0).uniform(-1, 1, digits["train"].shape).astype(np.float32)
  assert fid(noise, digits) > 100


def _strictly_increasing(values):
  return all(b > a for a, b in zip(values, values[1:]))


def test_increases_with_additive_noise(digits):
  rng = np.random.default_rng(1)
  x = digits["train"]
  values = [fid(np.clip(x + s * rng.normal(size=x.shape), -1, 1).astype(np.float32), digits)
            for s in (0.0, 0.1, 0.2, 0.4, 0.8)]
  assert _strictly_increasing(values), values


def test_increases_with_blur(digits):
  values = [fid(digits["train"], digits)]
  values += [fid(blur(digits["train"], sigma), digits) for sigma in (0.5, 1.0, 1.5, 2.5)]
  assert _strictly_increasing(values), values


def test_increases_as_classes_are_dropped(digits):
  rng = np.random.default_rng(2)
  test, labels = digits["test"], digits["test_labels"]
  values = []
  for kept in (10, 8, 6, 4, 2):  # resampled to the same size, from the kept classes
    pool = np.flatnonzero(labels < kept)
    values.append(fid(test[rng.choice(pool, len(test))], digits))
  assert _strictly_increasing(values), values


def test_unchanged_by_shuffling(digits):
  rng = np.random.default_rng(3)
  features = gan.classifier_features(digits["train"])
  base = gan.frechet_distance(features, digits["reference"])
  shuffled = gan.frechet_distance(features[rng.permutation(len(features))],
                                  digits["reference"][rng.permutation(5000)])
  assert shuffled == pytest.approx(base, rel=1e-6)
  assert gan.classifier_fid(digits["train"][::-1], digits["test"]) == pytest.approx(base, rel=1e-6)


def test_frechet_distance_of_known_gaussians():
  rng = np.random.default_rng(4)
  mean_a, mean_b = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
  var_a, var_b = np.array([1.0, 4.0, 0.25]), np.array([2.0, 1.0, 1.0])
  a = mean_a + np.sqrt(var_a) * rng.standard_normal((200_000, 3))
  b = mean_b + np.sqrt(var_b) * rng.standard_normal((200_000, 3))
  expected = np.sum((mean_a - mean_b) ** 2) + np.sum(var_a + var_b - 2 * np.sqrt(var_a * var_b))
  assert gan.frechet_distance(a, b) == pytest.approx(expected, abs=0.03)
  assert gan.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)


def test_kid_real_near_zero_noise_large_and_monotone(digits):
  rng = np.random.default_rng(5)
  x = digits["train"]
  kid = lambda images: gan.kernel_distance(  # noqa: E731
      gan.classifier_features(images), digits["reference"], num_subsets=5)
  real_mean, real_std = kid(x)
  noisy = [kid(np.clip(x + s * rng.normal(size=x.shape), -1, 1).astype(np.float32))[0]
           for s in (0.2, 0.4, 0.8)]
  noise_mean, _ = kid(rng.uniform(-1, 1, x.shape).astype(np.float32))
  assert abs(real_mean) < 0.01 * noise_mean and real_std < 0.01 * noise_mean
  assert _strictly_increasing([real_mean] + noisy + [noise_mean])


def test_classifier_score(digits):
  test, labels = digits["test"], digits["test_labels"]
  assert gan.classifier_score(test) > 9.0
  assert gan.classifier_score(test[labels == 3]) < 2.0


@pytest.mark.parametrize("images, message", [
    (np.zeros((10, 32, 32, 3), np.float32), r"\[N, 28, 28\] or \[N, 28, 28, 1\]"),
    (np.zeros((1, 28, 28), np.float32), "at least 2 images"),
    (np.zeros((4, 28, 28), np.int32), "uint8 in \\[0, 255\\] or float"),
])
def test_bad_images(images, message):
  with pytest.raises(ValueError, match=message):
    gan.classifier_features(images)


def test_bad_features():
  with pytest.raises(ValueError, match="features_a has 4 dims but features_b has 3"):
    gan.frechet_distance(np.zeros((5, 4)), np.zeros((5, 3)))
  with pytest.raises(ValueError, match=r"features_a must be features \[N >= 2"):
    gan.kernel_distance(np.zeros(5), np.zeros((5, 3)))


def test_inception_fid_without_weights_names_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5"):
    gan.inception_fid(np.zeros((2, 28, 28)), np.zeros((2, 28, 28)), str(tmp_path / "none.h5"))


def test_classifier_is_the_shipped_version():
  model = evaluation.classifier_lib.load_classifier()
  assert model.name == f"mnist_classifier_v{evaluation.VERSION}"
  assert not model.trainable
