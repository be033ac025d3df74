"""The classifier metrics are validated, not assumed.

Classifier FID of real vs real digits stays below 1 and of noise vs real is
above 100; every corruption sequence (additive noise, blur, dropped classes)
scores strictly worse step by step; shuffling changes nothing; KID and the
classifier score behave likewise; the Frechet distance matches closed forms.
"Real" is the 5,000 training digits (what GANs train on), the reference the
5,000 held-out test digits; their features are computed once per module.
"""

import hashlib
import os
import shutil

import numpy as np
import pytest

import gan
from ctl.base import _tf_internal
from gan import classifier as classifier_lib
from gan import evaluation

NOISE_LEVELS = (0.1, 0.2, 0.4, 0.8)  # std of additive Gaussian noise, images in [-1, 1]
BLUR_SIGMAS = (0.5, 1.0, 1.5, 2.0, 3.0)  # Gaussian kernels of 5, 7, 11, 13, 19 pixels
KEPT_CLASSES = (10, 8, 6, 4, 2)


def to_unit(images):
  return (images[..., None].astype(np.float32) - 127.5) / 127.5


def add_noise(images, std, seed):
  noise = np.random.default_rng(seed).normal(scale=std, size=images.shape)
  return np.clip(images + noise, -1, 1).astype(np.float32)


def uniform_noise(shape, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def blur(images, sigma):
  """Separable Gaussian blur of [N, 28, 28, 1]; edges padded with background."""
  radius = int(np.ceil(3 * sigma))
  kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
  kernel /= kernel.sum()
  padded = np.pad(images, ((0, 0), (radius, radius), (radius, radius), (0, 0)), mode="edge")
  rows = sum(w * padded[:, i:i + 28] for i, w in enumerate(kernel))
  return sum(w * rows[:, :, i:i + 28] for i, w in enumerate(kernel)).astype(np.float32)


def keep_classes(images, labels, kept, seed):
  """As many digits as `images`, drawn (with replacement) from classes < kept only."""
  pool = np.flatnonzero(labels < kept)
  return images[np.random.default_rng(seed).choice(pool, len(images))]


def strictly_increasing(values):
  return all(b > a for a, b in zip(values, values[1:]))


@pytest.fixture(scope="module")
def digits():
  train, train_labels = gan.data.load_mnist("train")
  test, test_labels = gan.data.load_mnist("test")
  return {"train": to_unit(train), "train_labels": train_labels, "test": test,
          "test_labels": test_labels, "real": gan.evaluation.classifier_features(train),
          "reference": gan.evaluation.classifier_features(test)}


@pytest.fixture(scope="module")
def noisy(digits):
  """Features of the training digits under each noise level, and of uniform noise."""
  return {"levels": [gan.evaluation.classifier_features(add_noise(digits["train"], std, seed))
                     for seed, std in enumerate(NOISE_LEVELS)],
          "uniform": gan.evaluation.classifier_features(uniform_noise(digits["train"].shape))}


def fid(features, digits):
  return gan.evaluation.frechet_distance(features, digits["reference"])


def test_real_vs_real_below_one(digits):
  real, reference = digits["real"], digits["reference"]
  # Digits are sorted by label, so even/odd rows are disjoint class-balanced halves.
  values = {"train vs test": fid(real, digits),
            "test halves": gan.evaluation.frechet_distance(reference[::2], reference[1::2]),
            "train halves": gan.evaluation.frechet_distance(real[::2], real[1::2])}
  assert max(values.values()) < 1.0, values


def test_noise_vs_real_above_100(digits, noisy):
  assert fid(noisy["uniform"], digits) > 100


def test_increases_with_additive_noise(digits, noisy):
  values = [fid(f, digits) for f in [digits["real"]] + noisy["levels"]]
  assert strictly_increasing(values), values


@pytest.fixture(scope="module")
def blurred(digits):
  """Features of the training digits under each blur."""
  return [gan.evaluation.classifier_features(blur(digits["train"], s)) for s in BLUR_SIGMAS]


@pytest.fixture(scope="module")
def dropped(digits):
  """Features of digits drawn from fewer and fewer classes."""
  return [gan.evaluation.classifier_features(
      keep_classes(digits["train"], digits["train_labels"], kept, seed=kept))
          for kept in KEPT_CLASSES]


@pytest.mark.slow  # seconds of feature extraction
def test_increases_with_blur(digits, blurred):
  values = [fid(digits["real"], digits)] + [fid(f, digits) for f in blurred]
  assert strictly_increasing(values), values


def test_increases_as_classes_are_dropped(digits, dropped):
  values = [fid(f, digits) for f in dropped]
  assert strictly_increasing(values), values


def test_unchanged_by_shuffling(digits):
  real, reference = digits["real"], digits["reference"]
  base = fid(real, digits)
  for seed in range(3):
    rng = np.random.default_rng(seed)
    assert gan.evaluation.frechet_distance(real[rng.permutation(5000)], reference) == pytest.approx(
        base, rel=1e-9)
    assert gan.evaluation.frechet_distance(real, reference[rng.permutation(5000)]) == pytest.approx(
        base, rel=1e-9)
    # The same set reordered: 0, although 15 of the 64 ReLU features are dead
    # (always 0), which makes the covariances singular.
    assert abs(gan.evaluation.frechet_distance(real, real[rng.permutation(5000)])) < 1e-9
  # Through the network too, although float32 convolutions round an image's
  # features by up to 3e-6 depending on its place in its batch (FID: ~3e-9).
  rng = np.random.default_rng(3)
  images_a, images_b = digits["train"][rng.permutation(5000)], digits["test"][rng.permutation(5000)]
  assert gan.evaluation.classifier_fid(images_a, images_b) == pytest.approx(base, rel=1e-6)


@pytest.mark.slow  # seconds of feature extraction
def test_kid_real_near_zero_noise_large_and_monotone(digits, noisy):
  kid = lambda a, b=digits["reference"]: gan.evaluation.kernel_distance(a, b)[0]  # noqa: E731
  real, reference = digits["real"], digits["reference"]
  noise = kid(noisy["uniform"])
  # Unbiased, so real vs real scatters around 0 (either sign), far below noise.
  for real_vs_real in (kid(real), kid(reference[::2], reference[1::2]), kid(real[::2], real[1::2])):
    assert abs(real_vs_real) < 0.01 * noise, (real_vs_real, noise)
  means = [kid(real)] + [kid(f) for f in noisy["levels"]] + [noise]
  assert strictly_increasing(means), means


def test_kid_of_identical_distributions_is_unbiased():
  # Two samples of one Gaussian: the unbiased estimate averages to ~0, not > 0.
  rng = np.random.default_rng(6)
  means = [gan.evaluation.kernel_distance(rng.normal(size=(200, 8)), rng.normal(size=(200, 8)),
                               num_subsets=1, seed=s)[0] for s in range(50)]
  assert abs(np.mean(means)) < 3 * np.std(means) / np.sqrt(len(means))


def test_classifier_score(digits):
  test, labels = digits["test"], digits["test_labels"]
  assert gan.evaluation.classifier_score(test) > 9.0
  assert gan.evaluation.classifier_score(test[labels == 3]) < 2.0


def prdc(features, digits):
  if "radii" not in digits:  # the reference's, once
    digits["radii"] = gan.evaluation.kth_neighbour_radii(digits["reference"], 5)
  return gan.evaluation.precision_recall_density_coverage(
      digits["reference"], features, real_radii=digits["radii"])


def strictly_decreasing(values):
  """Each value below the one before, or both 0 (a share of none cannot fall)."""
  return all(b < a or a == b == 0 for a, b in zip(values, values[1:]))


@pytest.mark.slow  # seconds of features and of 5,000 x 5,000 distances
def test_precision_recall_density_coverage(digits, noisy, blurred, dropped):
  """Real vs real near 1 each; diversity (recall, coverage) falls strictly
  under every corruption; fidelity (precision, density) falls under more blur
  and strong noise, and stays where it was when classes are dropped (what splits
  the two); shuffling changes nothing."""
  real = prdc(digits["real"], digits)
  assert min(real.values()) > 0.9 and real["density"] < 1.1, real
  noise = [real] + [prdc(f, digits) for f in noisy["levels"]]
  blurred = [real] + [prdc(f, digits) for f in blurred]
  dropped = [prdc(f, digits) for f in dropped]
  for name, series in (("noise", noise), ("blur", blurred), ("dropped classes", dropped)):
    for metric in ("recall", "coverage"):
      assert strictly_decreasing([m[metric] for m in series]), (name, metric, series)
  for metric in ("precision", "density"):
    # Slight blur or noise can raise them (digits drawn toward dense regions
    # of the real set: 0.95 -> 0.97); more lowers them, step by step.
    assert strictly_decreasing([m[metric] for m in blurred[1:]]), (metric, blurred)
    assert noise[-1][metric] < real[metric] - 0.05, (metric, noise)
    assert min(m[metric] for m in dropped) > real[metric] - 0.05, (metric, dropped)
  uniform = prdc(noisy["uniform"], digits)
  assert uniform["precision"] < 0.5 and uniform["recall"] < 0.01, uniform
  shuffled = gan.evaluation.precision_recall_density_coverage(
      digits["reference"][np.random.default_rng(1).permutation(5000)],
      digits["real"][np.random.default_rng(2).permutation(5000)])
  assert shuffled == real
  with pytest.raises(ValueError, match="k=5 needs more than k rows"):
    gan.evaluation.precision_recall_density_coverage(digits["reference"], digits["real"][:5])


def test_nearest_neighbour_accuracy_and_intra_class_fid(digits):
  real, reference = digits["real"], digits["reference"]
  train_labels, test_labels = digits["train_labels"], digits["test_labels"]
  in_features = gan.evaluation.nearest_neighbour_accuracy(real, train_labels, reference,
                                                          test_labels)
  pixels = gan.evaluation.nearest_neighbour_accuracy(
      digits["train"].reshape(5000, -1), train_labels,
      to_unit(digits["test"]).reshape(5000, -1), test_labels)
  assert 0.9 < pixels < in_features < 1.0, (pixels, in_features)
  shuffled = np.random.default_rng(0).permutation(train_labels)
  assert gan.evaluation.nearest_neighbour_accuracy(real, shuffled, reference, test_labels) < 0.2
  # Intra-class FID: the classes' own FIDs (500 digits each: more bias than
  # 5,000's 0.61), and far larger when each class is drawn as another.
  matched = gan.evaluation.intra_class_fid(real, train_labels, reference, test_labels)
  swapped = gan.evaluation.intra_class_fid(real, (train_labels + 1) % 10, reference, test_labels)
  assert matched < 5 < 100 < swapped, (matched, swapped)
  with pytest.raises(ValueError, match=r"classes \[9\] have fewer than 2"):
    gan.evaluation.intra_class_fid(real[train_labels < 9], train_labels[train_labels < 9],
                                   reference, test_labels)


def exact_samples(mean, covariance, n, seed):
  """n points whose sample mean and (n - 1) covariance are exactly these."""
  z = np.random.default_rng(seed).standard_normal((n, len(mean)))
  z -= z.mean(0)
  z = z @ np.linalg.inv(np.linalg.cholesky(np.cov(z, rowvar=False))).T  # sample cov = I
  return mean + z @ np.linalg.cholesky(covariance).T


def test_frechet_distance_of_diagonal_gaussians():
  mean_a, mean_b = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
  var_a, var_b = np.array([1.0, 4.0, 0.25]), np.array([2.0, 1.0, 1.0])
  a = exact_samples(mean_a, np.diag(var_a), 100, seed=0)
  b = exact_samples(mean_b, np.diag(var_b), 50, seed=1)
  expected = np.sum((mean_a - mean_b) ** 2) + np.sum(var_a + var_b - 2 * np.sqrt(var_a * var_b))
  assert gan.evaluation.frechet_distance(a, b) == pytest.approx(expected, rel=1e-9)
  assert gan.evaluation.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9)


def test_frechet_distance_of_non_commuting_covariances():
  # For 2x2 S_a S_b with positive eigenvalues, Tr sqrt = sqrt(Tr + 2 sqrt(det)).
  cov_a, cov_b = np.array([[2.0, 0.9], [0.9, 1.0]]), np.array([[1.0, -0.3], [-0.3, 3.0]])
  product = cov_a @ cov_b
  trace_root = np.sqrt(np.trace(product) + 2 * np.sqrt(np.linalg.det(product)))
  expected = 1.0 + np.trace(cov_a) + np.trace(cov_b) - 2 * trace_root
  a = exact_samples(np.zeros(2), cov_a, 40, seed=2)
  b = exact_samples(np.array([1.0, 0.0]), cov_b, 30, seed=3)
  assert gan.evaluation.frechet_distance(a, b) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("n_a, n_b, dims", [(300, 200, 16), (10, 25, 64), (25, 10, 64)])
def test_frechet_distance_matches_a_direct_computation(n_a, n_b, dims):
  # Including fewer samples than dimensions (singular covariances, the n x n path).
  rng = np.random.default_rng(n_a)
  a = rng.normal(size=(n_a, dims)) @ rng.normal(size=(dims, dims))
  b = rng.normal(size=(n_b, dims)) + 0.5
  cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
  eigenvalues = np.linalg.eigvals(cov_a @ cov_b).real
  direct = (np.sum((a.mean(0) - b.mean(0)) ** 2) + np.trace(cov_a) + np.trace(cov_b)
            - 2 * np.sqrt(np.clip(eigenvalues, 0, None)).sum())
  assert gan.evaluation.frechet_distance(a, b) == pytest.approx(direct, rel=1e-7)
  assert gan.evaluation.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9 * np.trace(cov_a))


def test_images_in_every_accepted_form_agree(digits):
  test = digits["test"][:20]
  features = gan.evaluation.classifier_features(test)
  for form in (test[..., None], to_unit(test), to_unit(test)[..., 0].astype(np.float64)):
    np.testing.assert_allclose(gan.evaluation.classifier_features(form, batch_size=7), features,
                               rtol=1e-5, atol=1e-5)
  assert features.shape == (20, 64) and features.dtype == np.float64


@pytest.mark.parametrize("images, message", [
    (np.zeros((10, 32, 32, 3), np.float32), r"images must have shape \[N, 28, 28\] or"),
    (np.zeros((10, 28, 28, 3), np.float32), r"images must have shape \[N, 28, 28\] or"),
    (np.zeros((28, 28), np.float32), r"images must have shape"),
    (np.zeros((1, 28, 28), np.float32), "at least 2 images"),
    (np.zeros((4, 28, 28), np.int32),
     r"uint8 in \[0, 255\] or float in \[-1, 1\], got dtype int32"),
    (np.full((4, 28, 28), 255.0), r"must be in \[-1, 1\].*got values in \[255, 255\]"),
    (np.full((4, 28, 28), np.nan, np.float32), r"must be in \[-1, 1\].*nan"),
])
def test_bad_images(images, message):
  with pytest.raises(ValueError, match=message):
    gan.evaluation.classifier_features(images)


def test_bad_images_are_named_by_argument():
  good = np.zeros((4, 28, 28), np.uint8)
  with pytest.raises(ValueError, match=r"^images_b must have shape"):
    gan.evaluation.classifier_fid(good, np.zeros((4, 32, 32), np.uint8))
  with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
    gan.evaluation.classifier_features(good, batch_size=0)
  with pytest.raises(ValueError, match=r"^images_a must have shape \[N, H, W\] or"):
    gan.evaluation.inception_fid(np.zeros((4, 28, 28, 2)), good, __file__)  # checked before loading


def test_bad_features():
  with pytest.raises(ValueError, match="features_a has 4 dims but features_b has 3"):
    gan.evaluation.frechet_distance(np.zeros((5, 4)), np.zeros((5, 3)))
  with pytest.raises(ValueError, match="features_a has 4 dims but features_b has 3"):
    gan.evaluation.kernel_distance(np.zeros((5, 4)), np.zeros((5, 3)))
  with pytest.raises(ValueError, match=r"features_a must be features \[N >= 2, dims\], got shape"):
    gan.evaluation.kernel_distance(np.zeros(5), np.zeros((5, 3)))
  with pytest.raises(ValueError, match="features_b contains NaN"):
    gan.evaluation.frechet_distance(np.zeros((5, 3)), np.full((5, 3), np.nan))
  with pytest.raises(ValueError, match="subset_size must be >= 2"):
    gan.evaluation.kernel_distance(np.zeros((5, 3)), np.zeros((5, 3)), subset_size=1)


def test_classifier_is_the_shipped_version():
  model = classifier_lib.load_classifier()
  assert model.name == f"mnist_classifier_v{evaluation.VERSION}"
  assert not model.trainable
  with open(classifier_lib.WEIGHTS, "rb") as f:
    assert hashlib.sha256(f.read()).hexdigest() == classifier_lib.SHA256


def test_missing_or_changed_classifier_weights(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError, match="python -m gan.classifier"):
    classifier_lib.load_classifier(str(tmp_path / "none.weights.h5"))
  changed = tmp_path / "mnist_classifier_v1.weights.h5"
  shutil.copy(classifier_lib.WEIGHTS, changed)
  with open(changed, "ab") as f:
    f.write(b"\0")
  monkeypatch.setattr(classifier_lib, "WEIGHTS", str(changed))  # as if it were shipped
  with pytest.raises(ValueError, match="not version 1's .* raise VERSION and SHA256"):
    classifier_lib.load_classifier(str(changed))


def test_second_classifier_is_its_shipped_version_and_another_network():
  """The check on the first classifier: its own pinned file, another architecture,
  and confident on the held-out digits (which it never trained on)."""
  second = classifier_lib.load_classifier(second=True)
  assert second.name == f"mnist_second_classifier_v{classifier_lib.SECOND_VERSION}"
  assert not second.trainable
  with open(classifier_lib.SECOND_WEIGHTS, "rb") as f:
    assert hashlib.sha256(f.read()).hexdigest() == classifier_lib.SECOND_SHA256
  first = classifier_lib.load_classifier()
  assert ([type(layer).__name__ for layer in second.layers]
          != [type(layer).__name__ for layer in first.layers])
  images, labels = gan.data.load_mnist("test")
  logits = second.predict((images[..., None] - 127.5) / 127.5, batch_size=500, verbose=0)
  assert np.mean(np.argmax(logits, -1) == labels) > 0.95


def test_a_changed_second_classifier_is_refused_and_the_error_names_its_constants(
    tmp_path, monkeypatch):
  changed = tmp_path / os.path.basename(classifier_lib.SECOND_WEIGHTS)
  shutil.copy(classifier_lib.SECOND_WEIGHTS, changed)
  with open(changed, "ab") as f:
    f.write(b"\0")
  monkeypatch.setattr(classifier_lib, "SECOND_WEIGHTS", str(changed))  # as if shipped
  with pytest.raises(ValueError, match="raise SECOND_VERSION and SECOND_SHA256"):
    classifier_lib.load_classifier(second=True)
  with pytest.raises(FileNotFoundError, match="--second MNIST_DIR"):
    classifier_lib.load_classifier(str(tmp_path / "none.weights.h5"), second=True)


def test_the_second_classifiers_digits_are_the_test_splits_others(tmp_path):
  """Its training digits come from the official test files, checked by sha256,
  and are the 5,000 that are not the held-out ones."""
  with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte.gz"):
    classifier_lib.other_test_digits(str(tmp_path))
  for name in classifier_lib.TEST_FILES:
    (tmp_path / name).write_bytes(b"not MNIST")
  with pytest.raises(ValueError, match="not the official file's"):
    classifier_lib.other_test_digits(str(tmp_path))


def test_inception_fid_without_weights_says_where_to_get_them(tmp_path):
  message = ("no Inception weights at .*none.h5.*inception_v3_weights_tf_dim_ordering_tf_"
             "kernels_notop.h5.*gan.evaluation.classifier_fid needs no download")
  with pytest.raises(FileNotFoundError, match=message):
    gan.evaluation.inception_fid(np.zeros((2, 28, 28)), np.zeros((2, 28, 28)),
                                 str(tmp_path / "none.h5"))


@pytest.mark.slow  # seconds of feature extraction
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from Keras' legacy h5 writer
def test_inception_fid_plumbing(tmp_path, digits):
  """Random (untrained) InceptionV3 weights in the downloaded file's legacy format."""
  import h5py
  import keras
  save_weights = _tf_internal.legacy_h5_weights_writer()
  if save_weights is None:
    pytest.skip("this Keras has no legacy HDF5 weights writer")
  path = tmp_path / "inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5"
  with h5py.File(path, "w") as f:
    save_weights(
        f, keras.applications.InceptionV3(weights=None, include_top=False, pooling="avg"))
  grey = digits["test"][::1250]  # 4 digits, uint8 [4, 28, 28]
  rgb = np.repeat(to_unit(grey), 3, axis=-1)  # the same digits as float RGB
  same = gan.evaluation.inception_fid(grey, rgb, str(path), batch_size=3)
  different = gan.evaluation.inception_fid(grey, uniform_noise((4, 28, 28, 1)), str(path))
  assert abs(same) < 1e-6 * different and different > 0


def test_registered_with_gin_without_wrapping():
  import gin
  names = ["classifier_features", "frechet_distance", "kernel_distance", "classifier_score",
           "classifier_fid", "classifier_kid", "inception_fid"]
  for name in names:
    function = getattr(evaluation, name)
    assert not hasattr(function, "__wrapped__")
    with gin.unlock_config():
      gin.parse_config(f"test_evaluation_metric = @gan.evaluation.{name}")
    assert gin.query_parameter("%test_evaluation_metric").configurable.wrapped is function
