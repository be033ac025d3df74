"""Offline GAN evaluation on MNIST: classifier FID, classifier KID, classifier score.

    fake = generator(z)                                   # [N, 28, 28, 1] in [-1, 1]
    real = gan.data.load_mnist("test")[0]                 # held-out digits, uint8
    fid = gan.evaluation.classifier_fid(fake, real)       # real vs real: ~0.6
    kid, kid_std = gan.evaluation.classifier_kid(fake, real)
    score = gan.evaluation.classifier_score(fake)         # 1 (one class) .. 10
    fid = gan.evaluation.inception_fid(fake, real, "inception_v3_..._notop.h5")  # if you have it
    modes = gan.evaluation.stacked_modes(stacked_fake)    # [N, 28, 28, 3] -> [N] in [0, 1000)
    gan.evaluation.mode_coverage(modes)                   # {"modes": 1000, "mode_kl": 0.01, ...}

FID and KID compare feature statistics of two image sets. Here the features
are the 64-d last hidden layer of a small classifier trained on real MNIST
digits and shipped with the package (`gan.classifier`, version `VERSION`),
because Inception weights need a download and were made for photographs. The
numbers are therefore *classifier* FID/KID, comparable only with each other
(same classifier version, same reference set, same sample count: FID is biased
upwards for small sets), never with published Inception FIDs. `inception_fid`
computes the Inception version when you have its weights locally.

Images: float in [-1, 1] of shape [N, 28, 28] or [N, 28, 28, 1], or uint8 in
[0, 255] of the same shapes; anything else raises ValueError. All functions
take and return NumPy values.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from typing import TYPE_CHECKING

import gin
import numpy as np

from ctl import Moments
from ctl import arguments
from gan import classifier as classifier_lib

if TYPE_CHECKING:
  import keras
  import tensorflow as tf

VERSION = classifier_lib.VERSION
_INCEPTION_FILE = "inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5"
_INCEPTION_URL = ("https://storage.googleapis.com/tensorflow/keras-applications/"
                  f"inception_v3/{_INCEPTION_FILE}")
# Covariance eigenvalues below this fraction of the largest are taken as zero.
_ZERO_VARIANCE = 1e-10
_cache = {}  # the loaded models, so that repeated evaluations load them once


def _as_unit_images(images, name="images", *, size=(28, 28), channels=(1,)):
  """float32 [N, H, W, C] in [-1, 1] from any accepted form; the one converter.

  Args:
    images: [N, H, W] or [N, H, W, C], uint8 in [0, 255] or float in [-1, 1].
    name: the argument's name, for error messages.
    size: the required (H, W), or None for any.
    channels: the accepted C.
  """
  array = np.asarray(images)
  if array.ndim == 3:
    array = array[..., None]
  if size is None:
    wanted = f"[N, H, W] or [N, H, W, C] with C in {channels}"
  elif channels == (1,):
    wanted = f"[N, {size[0]}, {size[1]}] or [N, {size[0]}, {size[1]}, 1]"
  else:
    wanted = f"[N, {size[0]}, {size[1]}, C] with C in {channels}"
  if (array.ndim != 4 or array.shape[-1] not in channels
      or (size is not None and array.shape[1:3] != tuple(size))):
    raise ValueError(f"{name} must have shape {wanted}, got {np.shape(images)}.")
  if len(array) < 2:
    raise ValueError(f"{name}: need at least 2 images for statistics, got {len(array)}.")
  if array.dtype == np.uint8:
    return (array.astype(np.float32) - 127.5) / 127.5
  if not np.issubdtype(array.dtype, np.floating):
    raise ValueError(f"{name} must be uint8 in [0, 255] or float in [-1, 1], got dtype "
                     f"{array.dtype}; convert with x.astype(np.uint8) or x / 127.5 - 1.")
  array = array.astype(np.float32)
  low, high = float(array.min()), float(array.max())
  # 1e-3 of slack for rounding (resizing, float16); values far outside mean
  # another scale, most often floats in [0, 255], which would silently give
  # meaningless features.
  if not (np.isfinite(low) and np.isfinite(high)) or low < -1.001 or high > 1.001:
    raise ValueError(f"{name}: float images must be in [-1, 1] (a tanh output), got values "
                     f"in [{low:g}, {high:g}]; pass floats in [0, 255] as x / 127.5 - 1, "
                     "or uint8.")
  return array


def _load(second):
  """A shipped classifier, its variables float32 whatever a run's dtype policy."""
  import keras
  policy = keras.config.dtype_policy()
  keras.config.set_dtype_policy("float32")  # not a mixed-precision run's policy
  try:
    return classifier_lib.load_classifier(second=second)
  finally:
    keras.config.set_dtype_policy(policy)


def classifier_model() -> keras.Model:
  """The shipped classifier as a Keras model of two outputs, (logits, features),
  loaded once, with the second classifier (`second_classifier_logits`). Load it
  eagerly, outside a strategy's scope, before a function run on every replica
  calls it (`classifier_outputs`): its variables are the classifier's, not a
  model's being trained."""
  if "model" not in _cache:
    import keras
    model = _load(second=False)
    _cache["second"] = _load(second=True)
    _cache["model"] = keras.Model(model.inputs[0],
                                  [model.get_layer("logits").output,
                                   model.get_layer(classifier_lib.FEATURES).output])
  return _cache["model"]


def _classifier(second=False):
  """The shipped classifier's (logits, features), or the second's (logits,), as a
  function compiled once for each."""
  key = "compiled_second" if second else "classifier"
  if key not in _cache:
    import tensorflow as tf
    both = classifier_model()
    model = _cache["second"] if second else both
    # One trace for every batch size: about 1.6x faster than eager calls here.
    _cache[key] = tf.function(
        (lambda x: (model(x, training=False),)) if second else
        (lambda x: both(x, training=False)),
        input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32)])
  return _cache[key]


def classifier_outputs(images: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(logits [B, 10], features [B, 64]) of float32 images [B, 28, 28, 1] in [-1, 1],
  as tensors: for a function run on every replica (`ctl.Runner.over_samples`).

  Raises:
    RuntimeError: the classifier is not loaded (`classifier_model()` first).
  """
  _require_loaded("classifier_outputs")
  return _cache["model"](images, training=False)


def second_classifier_logits(images: tf.Tensor) -> tf.Tensor:
  """The second classifier's logits [B, 10] (`gan.classifier.second_classifier`:
  another network, trained on other digits) of float32 images [B, 28, 28, 1]
  in [-1, 1], as a tensor; `classifier_model()` first, as `classifier_outputs`."""
  _require_loaded("second_classifier_logits")
  return _cache["second"](images, training=False)


def _require_loaded(name):
  if "model" not in _cache:
    raise RuntimeError(f"{name}: call gan.evaluation.classifier_model() first, "
                       "eagerly: loading it inside a function run on every replica "
                       "would make its variables the strategy's.")


def stacked_outputs(images: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(logits [B, C, 10], features [B, C, 64]) of each channel of float32 images
  [B, 28, 28, C] in [-1, 1] (stacked MNIST: C = 3), as tensors, for a function
  run on every replica; `classifier_model()` first, as `classifier_outputs`."""
  import tensorflow as tf
  shape = tf.shape(images)
  digits = tf.reshape(tf.transpose(images, [0, 3, 1, 2]), [-1, 28, 28, 1])
  logits, features = classifier_outputs(digits)
  return (tf.reshape(logits, [shape[0], shape[3], -1]),
          tf.reshape(features, [shape[0], shape[3], -1]))


def modes_of_logits(logits: np.ndarray) -> np.ndarray:
  """The mode of each stacked-MNIST sample from its channels' logits [N, 3, 10]:
  100 * the first channel's digit + 10 * the second's + the third's, [N] in [0, 1000)."""
  return np.argmax(np.asarray(logits), axis=-1) @ np.array([100, 10, 1])


def stacked_modes(images: np.ndarray, batch_size: int = 500) -> np.ndarray:
  """The mode of each stacked-MNIST image [N, 28, 28, 3] (float in [-1, 1] or
  uint8), its channels' digits by the shipped classifier: [N] in [0, 1000), as
  `gan.data.stacked_mnist_dataset(..., with_labels=True)` labels real ones."""
  _check_batch_size(batch_size)
  images = _as_unit_images(images, channels=(3,))
  logits = [_outputs(images[..., c], batch_size)[0] for c in range(3)]
  return modes_of_logits(np.stack(logits, axis=1))


def mode_coverage(modes: np.ndarray, num_modes: int = 1000) -> dict[str, float]:
  """How the samples' modes (ints in [0, num_modes)) cover the uniform data's.

  Returns modes (how many of `num_modes` occur at least once), mode_kl (the
  KL divergence of the samples' mode distribution from the uniform, in nats:
  0 when every mode is equally common, log(num_modes / m) for m equally common
  modes) and mode_samples (N). PacGAN's protocol (Lin et al. 2018, Table 2)
  scores 26,000 samples: DCGAN 99 modes, KL 3.40; PacDCGAN2 1,000, KL 0.06.
  """
  arguments.integer("num_modes", num_modes, minimum=1)
  modes = np.asarray(modes)
  if modes.ndim != 1 or not len(modes) or not np.issubdtype(modes.dtype, np.integer):
    raise ValueError(f"modes must be a non-empty 1-D array of ints, got shape {modes.shape} "
                     f"and dtype {modes.dtype}; stacked_modes(images) gives them.")
  if modes.min() < 0 or modes.max() >= num_modes:
    raise ValueError(f"modes must be in [0, {num_modes}), got values in [{modes.min()}, "
                     f"{modes.max()}]; pass num_modes= for another number of modes.")
  shares = np.bincount(modes, minlength=num_modes) / len(modes)
  present = shares[shares > 0]
  return {"modes": int(len(present)),
          "mode_kl": float(np.sum(present * np.log(present * num_modes))),
          "mode_samples": int(len(modes))}


def _check_batch_size(batch_size):
  arguments.integer("batch_size", batch_size, minimum=1)


def _outputs(images, batch_size, name="images", *, second=False):
  """(logits [N, 10], features [N, 64]) of the classifier, or (logits,) of the
  second, float64."""
  _check_batch_size(batch_size)
  images = _as_unit_images(images, name)
  model = _classifier(second)
  batches = [model(images[i:i + batch_size]) for i in range(0, len(images), batch_size)]
  return tuple(np.concatenate([np.asarray(b[k]) for b in batches]).astype(np.float64)
               for k in range(len(batches[0])))


def classifier_logits(images: np.ndarray, batch_size: int = 500, *,
                      second: bool = False) -> np.ndarray:
  """Logits [N, 10], float64, of digits [N, 28, 28(, 1)] (uint8, or float in [-1, 1])
  under the shipped classifier, or with `second` the second one
  (`gan.classifier.second_classifier`)."""
  return _outputs(images, batch_size, second=second)[0]


@gin.register(module="gan.evaluation")
def classifier_features(images: np.ndarray, batch_size: int = 500) -> np.ndarray:
  """Features of the shipped MNIST classifier (its 64-unit last hidden layer).

  Args:
    images: digits [N, 28, 28(, 1)], uint8 in [0, 255] or float in [-1, 1].
    batch_size: images per forward pass (memory only; the result is the same).

  Returns:
    float64 [N, 64].

  Raises:
    ValueError: `images` have another shape or dtype, fewer than 2 images, or
      float values outside [-1, 1].
  """
  return _outputs(images, batch_size)[1]


def _check_features(name, features):
  array = np.asarray(features, np.float64)
  if array.ndim != 2 or len(array) < 2:
    raise ValueError(f"{name} must be features [N >= 2, dims], got shape {array.shape}.")
  if not np.all(np.isfinite(array)):
    raise ValueError(f"{name} contains NaN or infinite values.")
  return array


def _check_pair(features_a, features_b):
  a = _check_features("features_a", features_a)
  b = _check_features("features_b", features_b)
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"features_a has {a.shape[1]} dims but features_b has {b.shape[1]}; "
                     "compute both with the same feature extractor.")
  return a, b


def _trace_sqrt_product(centered_a, centered_b):
  """Tr((S_a S_b)^(1/2)) for the (n - 1) covariances of two centred feature sets.

  With A = Q_a R_a and B = Q_b R_b (QR of the centred samples), S_a S_b has
  the nonzero eigenvalues of X^T X for X = R_b R_a^T / sqrt((n_a - 1)(n_b - 1)),
  so the trace is the sum of X's singular values: no scipy `sqrtm`, no complex
  parts to discard, and no square roots of eigenvalues. The usual route,
  eigenvalues of S_a^(1/2) S_b S_a^(1/2) by `eigh` with tiny negatives clipped,
  takes square roots of eigenvalues that are zero up to rounding (~1e-14 here)
  whenever a covariance is singular, and so errs by ~1e-7 for each: with the
  shipped classifier, 15 of whose 64 ReLU features never fire on digits, it
  gives -1.6e-6 for FID(a, a) and moves by up to 1.7e-6 (relative) when a set
  is shuffled; this route is exact to ~1e-13. It also works unchanged with
  fewer samples than dimensions (R is then n x d).
  """
  r_a = np.linalg.qr(centered_a, mode="r")
  r_b = np.linalg.qr(centered_b, mode="r")
  scale = np.sqrt((len(centered_a) - 1) * (len(centered_b) - 1))
  return float(np.linalg.svd(r_b @ r_a.T, compute_uv=False).sum() / scale)


@gin.register(module="gan.evaluation")
def frechet_distance(features_a: np.ndarray, features_b: np.ndarray) -> float:
  """Frechet distance between Gaussians fitted to two feature sets (the F in FID).

  |mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)), from Heusel et al., "GANs
  Trained by a Two Time-Scale Update Rule Converge to a Local Nash Equilibrium",
  2017 (arXiv:1706.08500), with unbiased (n - 1) covariances as in their code.
  The trace of the matrix square root comes from singular values of the QR
  factors of the samples, exact to rounding even for singular covariances; see
  `_trace_sqrt_product`.

  Args:
    features_a: [N_a, d] features, N_a >= 2.
    features_b: [N_b, d] features, N_b >= 2.

  Returns:
    A float >= 0 (up to rounding); 0 only for equal means and covariances.

  Raises:
    ValueError: the features are not 2-D, have fewer than 2 rows, non-finite
      values, or different widths.
  """
  a, b = _check_pair(features_a, features_b)
  mean_a, mean_b = a.mean(0), b.mean(0)
  centered_a, centered_b = a - mean_a, b - mean_b
  trace_a = np.sum(centered_a ** 2) / (len(a) - 1)  # Tr(S_a)
  trace_b = np.sum(centered_b ** 2) / (len(b) - 1)
  return float(np.sum((mean_a - mean_b) ** 2) + trace_a + trace_b
               - 2.0 * _trace_sqrt_product(centered_a, centered_b))


def _factor(covariance):
  """F with F F^T = `covariance` (PSD), dropping directions of zero variance.

  Eigenvalues below `_ZERO_VARIANCE` of the largest are rounding (features
  that never fire have exactly zero rows, whose eigenvalues come out as
  +-1e-15): kept, each would add its square root, ~3e-8, to the trace below.
  """
  values, vectors = np.linalg.eigh(covariance)
  keep = values > values.max() * _ZERO_VARIANCE
  return vectors[:, keep] * np.sqrt(values[keep])


def frechet_distance_from_moments(moments_a: Moments, moments_b: Moments) -> float:
  """`frechet_distance` of two feature sets given by their `Moments` alone.

  What the distributed evaluation computes: moments summed over replicas and
  workers are all it needs, whatever the sample count. Tr((S_a S_b)^(1/2)) is
  the sum of singular values of F_a^T F_b for symmetric factors F of the
  covariances (`_factor`); on the shipped classifier's features it agrees with
  `frechet_distance` of the features themselves to ~1e-13.

  Raises:
    ValueError: fewer than 2 rows in a set, or different widths.
  """
  for name, moments in (("moments_a", moments_a), ("moments_b", moments_b)):
    if not isinstance(moments, Moments) or moments.count < 2:
      raise ValueError(f"{name} must be the Moments of >= 2 feature rows "
                       f"(ctl.Moments.of(features)), got {moments!r:.80}.")
  if moments_a.total.shape != moments_b.total.shape:
    raise ValueError(f"moments_a has {moments_a.total.shape[0]} dims but moments_b has "
                     f"{moments_b.total.shape[0]}; compute both with the same feature "
                     "extractor.")
  cov_a, cov_b = moments_a.covariance, moments_b.covariance
  trace_sqrt = np.linalg.svd(_factor(cov_a).T @ _factor(cov_b), compute_uv=False).sum()
  return float(np.sum((moments_a.mean - moments_b.mean) ** 2) + np.trace(cov_a)
               + np.trace(cov_b) - 2.0 * trace_sqrt)


@gin.register(module="gan.evaluation")
def kernel_distance(features_a: np.ndarray, features_b: np.ndarray, *, num_subsets: int = 10,
                    subset_size: int = 1000, seed: int = 0) -> tuple[float, float]:
  """KID: unbiased MMD^2 with the kernel k(x, y) = (x.y / d + 1)^3, over subsets.

  Binkowski et al., "Demystifying MMD GANs", 2018 (arXiv:1801.01401): unlike FID
  it is unbiased in the sample count, so sets of different sizes compare, and
  it can be slightly negative when the two distributions match. Subsets of
  1,000 as in the authors' code, which averages 100 of them; 10 keep this fast,
  and the returned std shows how much they scatter. Values are in the squared
  scale of the features (uniform noise vs digits: ~360 here), not multiplied
  by 1,000 as some papers print them.

  Args:
    features_a: [N_a, d] features.
    features_b: [N_b, d] features.
    num_subsets: random subset pairs to average over.
    subset_size: rows per subset, drawn without replacement (capped at N_a and
      N_b).
    seed: seed of the subset draws.

  Returns:
    (mean, std) of the MMD^2 estimates over the subsets.

  Raises:
    ValueError: bad features (see `frechet_distance`) or a non-positive
      `num_subsets` or `subset_size` < 2.
  """
  a, b = _check_pair(features_a, features_b)
  if num_subsets < 1:
    raise ValueError(f"num_subsets must be >= 1, got {num_subsets}.")
  if subset_size < 2:
    raise ValueError(f"subset_size must be >= 2 (pairs of distinct rows), got {subset_size}.")
  size = min(subset_size, len(a), len(b))
  rng = np.random.default_rng(seed)
  dims = a.shape[1]
  values = []
  for _ in range(num_subsets):
    x = a[rng.choice(len(a), size, replace=False)]
    y = b[rng.choice(len(b), size, replace=False)]
    k_xx = (x @ x.T / dims + 1) ** 3
    k_yy = (y @ y.T / dims + 1) ** 3
    k_xy = (x @ y.T / dims + 1) ** 3
    # Unbiased: within a set, only pairs of distinct rows (no diagonal).
    within = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy)) / (size * (size - 1))
    values.append(within - 2 * k_xy.mean())
  return float(np.mean(values)), float(np.std(values))


_CHUNK = 1000  # rows of a distance matrix at a time: memory O(_CHUNK x N), not O(N^2)


def _distances(a, b):
  """Euclidean distances [len(a), len(b)], float64 (for a chunk of rows `a`)."""
  squared = np.sum(a ** 2, 1)[:, None] + np.sum(b ** 2, 1)[None] - 2 * a @ b.T
  return np.sqrt(np.maximum(squared, 0))


def _chunks(rows):
  return range(0, rows, _CHUNK)


def kth_neighbour_radii(features: np.ndarray, k: int) -> np.ndarray:
  """Each row's distance to its k-th nearest other row: [N]."""
  radii = np.empty(len(features))
  for start in _chunks(len(features)):
    distances = _distances(features[start:start + _CHUNK], features)
    rows = np.arange(len(distances))
    distances[rows, start + rows] = np.inf  # not its own neighbour
    radii[start:start + _CHUNK] = np.partition(distances, k - 1, axis=1)[:, k - 1]
  return radii


@gin.register(module="gan.evaluation")
def precision_recall_density_coverage(real_features: np.ndarray, fake_features: np.ndarray,
                                      *, k: int = 5,
                                      real_radii: np.ndarray | None = None) -> dict[str, float]:
  """Precision, recall (Kynkaanniemi et al. 2019), density and coverage (Naeem
  et al. 2020) of generated features against real ones, by k-nearest-neighbour balls.

  Each real row's ball reaches its k-th nearest real neighbour (each fake
  row's, for recall, its k-th nearest fake one). Precision: the share of fake
  rows inside some real ball (fidelity); recall: the share of real rows inside
  some fake ball (diversity); density: real balls containing each fake row,
  over k, averaged (about 1 when the sets match; above 1 where fakes crowd
  dense real regions); coverage: the share of real balls holding at least one
  fake row. k = 5 as both papers recommend; all four depend on N and k, so
  compare values of equal N and k only.

  Args:
    real_features: [N_r, d].
    fake_features: [N_f, d].
    k: the neighbour that sets each ball's radius.
    real_radii: the real rows' radii for this k, if known (`kth_neighbour_radii`;
      `classifier_metrics` keeps the reference's).

  Returns:
    {"precision", "recall", "density", "coverage"}: floats, each in [0, 1]
    except density (>= 0).
  """
  real, fake = _check_pair(real_features, fake_features)
  arguments.integer("k", k, minimum=1)
  if k >= min(len(real), len(fake)):
    raise ValueError(f"k={k} needs more than k rows on each side, got {len(real)} real "
                     f"and {len(fake)} generated.")
  if real_radii is None:
    real_radii = kth_neighbour_radii(real, k)
  fake_radii = kth_neighbour_radii(fake, k)
  in_a_real_ball = np.zeros(len(fake), bool)
  real_balls_holding = np.zeros(len(fake))  # how many real balls hold each fake row
  recalled, covered = 0, 0
  for start in _chunks(len(real)):  # [real chunk, fake] at a time
    between = _distances(real[start:start + _CHUNK], fake)
    inside = between <= real_radii[start:start + _CHUNK, None]
    in_a_real_ball |= inside.any(0)
    real_balls_holding += inside.sum(0)
    recalled += int((between <= fake_radii[None, :]).any(1).sum())
    covered += int(inside.any(1).sum())
  return {
      "precision": float(in_a_real_ball.mean()),
      "recall": recalled / len(real),
      "density": float(real_balls_holding.mean() / k),
      "coverage": covered / len(real),
  }


@gin.register(module="gan.evaluation")
def nearest_neighbour_accuracy(reference_features: np.ndarray, reference_labels: np.ndarray,
                               features: np.ndarray, labels: np.ndarray) -> float:
  """The share of `features` whose nearest reference row has the same label.

  How an encoder's features are judged (BiGAN, Donahue et al. 2017): the
  held-out digits classified by their nearest training digit in feature space.
  """
  reference, queries = _check_pair(reference_features, features)
  reference_labels, labels = np.asarray(reference_labels), np.asarray(labels)
  if len(reference_labels) != len(reference) or len(labels) != len(queries):
    raise ValueError(f"labels must match the features' rows: {len(reference_labels)} "
                     f"labels for {len(reference)} reference rows, {len(labels)} for "
                     f"{len(queries)}.")
  nearest = np.concatenate([np.argmin(_distances(queries[i:i + _CHUNK], reference), 1)
                            for i in _chunks(len(queries))])
  return float(np.mean(reference_labels[nearest] == labels))


@gin.register(module="gan.evaluation")
def intra_class_fid(features: np.ndarray, labels: np.ndarray, reference_features: np.ndarray,
                    reference_labels: np.ndarray) -> float:
  """The Frechet distance within each class, averaged over the classes
  (Miyato & Koyama 2018): what a class-conditional generator is judged by,
  since an overall FID cannot see a class drawn as another."""
  labels, reference_labels = np.asarray(labels), np.asarray(reference_labels)
  classes = np.unique(reference_labels)
  missing = [int(c) for c in classes if np.sum(labels == c) < 2]
  if missing:
    raise ValueError(f"intra_class_fid: classes {missing} have fewer than 2 generated "
                     "samples; generate more (labels i % num_classes).")
  return float(np.mean([frechet_distance(features[labels == c],
                                         reference_features[reference_labels == c])
                        for c in classes]))


@gin.register(module="gan.evaluation")
def classifier_score(images: np.ndarray, batch_size: int = 500) -> float:
  """exp(E_x KL(p(y|x) || p(y))) with the shipped classifier's softmax: 1 to 10.

  The Inception Score formula (Salimans et al., "Improved Techniques for
  Training GANs", 2016, arXiv:1606.03498) with the MNIST classifier in place of
  Inception: high when each digit is recognisable (confident p(y|x)) and the
  ten classes occur equally (uniform p(y)); 10 at most, 1 for a single class.
  Held-out real digits score 9.27, uniform noise 1.01.

  Args:
    images: digits [N, 28, 28(, 1)], uint8 in [0, 255] or float in [-1, 1].
    batch_size: images per forward pass.

  Returns:
    A float in [1, 10].
  """
  return score_of_logits(_outputs(images, batch_size)[0])


def score_of_logits(logits: np.ndarray) -> float:
  """`classifier_score` of samples given by their classifier logits [N, classes]."""
  logits = np.asarray(logits, np.float64)
  logits = logits - logits.max(1, keepdims=True)
  log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))  # log-softmax, stable
  p = np.exp(log_p)
  log_marginal = np.log(p.mean(0) + 1e-30)
  return float(np.exp(np.mean(np.sum(p * (log_p - log_marginal), axis=1))))


def score_in_batches(logits: np.ndarray, batch_size: int = 32) -> float:
  """The classifier score of each batch of `batch_size` consecutive samples,
  averaged over the batches (a last, smaller batch is dropped).

  How TF-GAN's MNIST tutorial reports its score: a streaming mean over its
  evaluation batches of 32. The class marginal p(y) of 32 images is noisy, so
  this is below `score_of_logits` of the same samples (real held-out digits:
  see `reference_outputs`); compare a generated/real ratio, not the values.
  """
  arguments.integer("batch_size", batch_size, minimum=2)
  logits = np.asarray(logits, np.float64)
  batches = len(logits) // batch_size
  if not batches:
    raise ValueError(f"score_in_batches: {len(logits)} samples make no batch of "
                     f"{batch_size}; pass at least {batch_size}.")
  return float(np.mean([score_of_logits(logits[i * batch_size:(i + 1) * batch_size])
                        for i in range(batches)]))


@gin.register(module="gan.evaluation")
def classifier_fid(images_a: np.ndarray, images_b: np.ndarray, batch_size: int = 500) -> float:
  """Frechet distance of two digit sets in the shipped classifier's feature space.

  Not Inception FID: see the module docstring. Held-out vs training digits
  (5,000 each) give 0.61, uniform noise vs digits 265.

  Args:
    images_a: digits [N, 28, 28(, 1)], uint8 or float in [-1, 1].
    images_b: digits, the same way (usually `gan.data.load_mnist("test")[0]`).
    batch_size: images per forward pass.

  Returns:
    A float >= 0.
  """
  return frechet_distance(_outputs(images_a, batch_size, "images_a")[1],
                          _outputs(images_b, batch_size, "images_b")[1])


@gin.register(module="gan.evaluation")
def classifier_kid(images_a: np.ndarray, images_b: np.ndarray, *, num_subsets: int = 10,
                   subset_size: int = 1000, seed: int = 0,
                   batch_size: int = 500) -> tuple[float, float]:
  """Kernel distance (KID) of two digit sets in the shipped classifier's features.

  Args:
    images_a: digits [N, 28, 28(, 1)], uint8 or float in [-1, 1].
    images_b: digits, the same way.
    num_subsets, subset_size, seed: as in `kernel_distance`.
    batch_size: images per forward pass.

  Returns:
    (mean, std) as `kernel_distance`.
  """
  return kernel_distance(_outputs(images_a, batch_size, "images_a")[1],
                         _outputs(images_b, batch_size, "images_b")[1],
                         num_subsets=num_subsets, subset_size=subset_size, seed=seed)


def _cache_name(split, num_samples):
  """The reference's cache file: what it depends on, in its name."""
  return (f"mnist_{split}_{num_samples}_classifier_v{VERSION}_"
          f"{classifier_lib.SHA256[:12]}_second_{classifier_lib.SECOND_SHA256[:8]}.npz")


_REFERENCE_KEYS = ("features", "logits", "second_logits")


def reference_outputs(split: str = "test", num_samples: int | None = None, *,
                      cache_dir: str | None = None, write: bool = True) -> dict:
  """The classifier's outputs for the real digits generated ones are compared with.

  Computed once per (dataset, split, sample count, classifier version and
  digest) and kept in `cache_dir` (a run's `<workdir>/eval_cache`) under a
  name that says all four, so a change of any of them computes them anew; a
  cache file that does not hold what its name says is ignored and rewritten.

  Args:
    split: the `gan.data.load_mnist` split ("test": the held-out digits).
    num_samples: its first N digits (None: all 5,000).
    cache_dir: where to keep them (None: not kept).
    write: write the cache file (False off the chief of a multi-worker run).

  Returns:
    {"features": float64 [N, 64], "logits": float64 [N, 10], "labels": [N],
      "moments": their features' `Moments`, "num_samples": N, "split": split}.
  """
  from gan import data as data_lib
  images, labels = data_lib.load_mnist(split)
  if num_samples is not None:
    arguments.integer("num_samples", num_samples, minimum=2)
    if num_samples > len(images):
      raise ValueError(f"num_samples={num_samples}, but the {split!r} split has "
                       f"{len(images)} digits; pass at most {len(images)} (None: all).")
    images = images[:num_samples]
  count = len(images)
  path = os.path.join(cache_dir, _cache_name(split, count)) if cache_dir else None
  outputs = _read_reference(path, count) if path else None
  if outputs is None:
    logits, features = _outputs(images, 500)
    outputs = {"features": features, "logits": logits,
               "second_logits": classifier_logits(images, second=True)}
    if path and write:
      _write_reference(path, outputs)
  return {**outputs, "moments": Moments.of(outputs["features"]), "num_samples": count,
          "labels": labels[:count], "split": split}


def _digest(outputs):
  """What the cached arrays must hash to: a file changed after it was written
  (or half-copied) is computed again."""
  digest = hashlib.sha256()
  for key in _REFERENCE_KEYS:
    digest.update(np.ascontiguousarray(outputs[key], np.float64).tobytes())
  return digest.hexdigest()


def _read_reference(path, count):
  """The cached outputs at `path`, or None if absent, unreadable or not what
  its name and digest say (it is then computed again, and rewritten)."""
  try:
    with np.load(path) as archive:
      outputs = {k: archive[k].astype(np.float64) for k in _REFERENCE_KEYS}
      name, digest = str(archive["name"]), str(archive["digest"])
  except Exception:  # noqa: BLE001  (empty, cut short, not an archive, a directory...)
    return None
  if (name != os.path.basename(path) or outputs["features"].shape != (count, 64)
      or outputs["logits"].shape != (count, 10)
      or outputs["second_logits"].shape != (count, 10) or digest != _digest(outputs)):
    return None
  return outputs


def _write_reference(path, outputs):
  """Writes the cache file whole or not at all; a cache that cannot be
  written (a full disk, a directory in the way) is skipped with a warning."""
  partial = f"{path}.partial-{os.getpid()}"
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(partial, "wb") as f:
      np.savez(f, name=os.path.basename(path), digest=_digest(outputs), **outputs)
    os.replace(partial, path)
  except OSError as e:
    logging.getLogger("ctl").warning(
        "gan.evaluation: could not cache the real digits' outputs at %s (%s); they "
        "are computed again next time.", path, e)
    with contextlib.suppress(OSError):
      os.remove(partial)


def classifier_metrics(generated: dict, reference: dict, *, k: int = 5,
                       kid_subsets: int = 10, seed: int = 0) -> dict[str, float]:
  """Every classifier metric of generated samples against the reference.

  Args:
    generated: {"features": [N, 64], "feature_moments": `Moments`, "logits":
      [N, 10], "second_logits": [N, 10]}, and "labels" [N] for a class-conditional generator (the
      classes it was asked for), as `gan.experiment.ClassifierFID.outputs`
      gives them.
    reference: `reference_outputs(...)`.
    k: the neighbour of precision, recall, density and coverage.
    kid_subsets, seed: KID's subsets (`kernel_distance`).

  Returns:
    classifier_fid (from the merged moments); classifier_kid and its std over
    subsets; classifier_score (all samples at once), classifier_score_32
    (TF-GAN's way, `score_in_batches`; from 32 samples) and the real digits'
    same two scores; with "second_logits" [N, 10] in `generated`,
    second_score_32 and second_real_score_32, those under the second
    classifier (so that a score ratio does not rest on one network);
    precision, recall, density and coverage with their k
    (`precision_recall_density_coverage`); with labels, label_accuracy (the
    classifier's accuracy on the generated digits against the classes asked
    for; 0.981 on real held-out digits) and intra_class_fid; and num_samples and
    reference_samples: the N of each side, without which the values cannot be
    compared (FID is biased upwards for small sets, PRDC depends on N and k).
  """
  kid, kid_std = kernel_distance(generated["features"], reference["features"],
                                 num_subsets=kid_subsets, seed=seed)
  count = len(generated["logits"])
  metrics = {
      "classifier_fid": frechet_distance_from_moments(generated["feature_moments"],
                                                      reference["moments"]),
      "classifier_kid": kid,
      "classifier_kid_std": kid_std,
      "classifier_score": score_of_logits(generated["logits"]),
  }
  if count >= 32:
    metrics["classifier_score_32"] = score_in_batches(generated["logits"])
  metrics["real_score"] = score_of_logits(reference["logits"])
  # The split is stored class by class: batches of 32 real digits drawn in a
  # fixed random order, as an evaluation reads them shuffled.
  order = np.random.default_rng(0).permutation(reference["num_samples"])
  metrics["real_score_32"] = score_in_batches(reference["logits"][order])
  if "second_logits" in generated and count >= 32:  # the check on the one network
    metrics["second_score_32"] = score_in_batches(generated["second_logits"])
    metrics["second_real_score_32"] = score_in_batches(reference["second_logits"][order])
  if count > k:
    radii = reference.setdefault("radii", {})  # the reference's: once per k
    if k not in radii:
      radii[k] = kth_neighbour_radii(reference["features"], k)
    metrics.update(precision_recall_density_coverage(
        reference["features"], generated["features"], k=k, real_radii=radii[k]))
    metrics["prdc_k"] = k
  if "labels" in generated:
    labels = np.asarray(generated["labels"])
    metrics["label_accuracy"] = float(np.mean(np.argmax(generated["logits"], 1) == labels))
    if all(np.sum(labels == c) >= 2 for c in np.unique(reference["labels"])):
      metrics["intra_class_fid"] = intra_class_fid(generated["features"], labels,
                                                   reference["features"], reference["labels"])
  metrics["num_samples"] = int(generated["feature_moments"].count)
  metrics["reference_samples"] = int(reference["num_samples"])
  return metrics


def _inception(weights):
  key = ("inception", os.path.abspath(weights))
  if key not in _cache:
    import keras
    _cache[key] = keras.applications.InceptionV3(include_top=False, pooling="avg",
                                                 weights=weights)
  return _cache[key]


def _inception_features(model, images, batch_size):
  import tensorflow as tf
  out = []
  for i in range(0, len(images), batch_size):
    batch = tf.image.resize(images[i:i + batch_size], (299, 299))  # its training size
    if batch.shape[-1] == 1:
      batch = tf.repeat(batch, 3, axis=-1)  # grey -> RGB
    out.append(np.asarray(model(batch, training=False)))
  return np.concatenate(out)


@gin.register(module="gan.evaluation")
def inception_fid(images_a: np.ndarray, images_b: np.ndarray, weights: str,
                  batch_size: int = 50) -> float:
  """FID in InceptionV3 pool features (2048-d), from weights you have locally.

  The feature space of FID as published (Heusel et al. 2017), but through
  Keras' ImageNet InceptionV3, whose weights are not those of the original FID
  code, so its values are not interchangeable with published FIDs either.
  Images are resized bilinearly to 299x299 and grey is repeated to RGB. Slow on
  a CPU, and an estimate from fewer than 2,048 images has singular covariances
  and a large bias.

  Args:
    images_a: images [N, H, W], [N, H, W, 1] or [N, H, W, 3], uint8 in [0, 255]
      or float in [-1, 1].
    images_b: images, the same way.
    weights: path of Keras' `inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5`.
    batch_size: images per forward pass.

  Returns:
    A float >= 0.

  Raises:
    FileNotFoundError: nothing at `weights`; the message says where to get it.
  """
  if not os.path.exists(weights):
    raise FileNotFoundError(
        f"inception_fid: no Inception weights at {weights}. On a machine with internet, "
        f"download Keras' {_INCEPTION_FILE} ({_INCEPTION_URL}; "
        "keras.applications.InceptionV3(include_top=False) also fetches it into "
        "~/.keras/models) and pass its path. gan.evaluation.classifier_fid needs no download.")
  _check_batch_size(batch_size)
  # InceptionV3's own preprocessing maps [0, 255] to [-1, 1], our range already.
  images_a = _as_unit_images(images_a, "images_a", size=None, channels=(1, 3))
  images_b = _as_unit_images(images_b, "images_b", size=None, channels=(1, 3))
  model = _inception(weights)
  return frechet_distance(_inception_features(model, images_a, batch_size),
                          _inception_features(model, images_b, batch_size))
