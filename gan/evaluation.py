"""Offline GAN evaluation on MNIST: classifier FID, classifier KID, classifier score.

    fake = generator(z)                                   # [N, 28, 28, 1] in [-1, 1]
    fid = gan.classifier_fid(fake, gan.load_mnist("test")[0])
    kid, kid_std = gan.classifier_kid(fake, gan.load_mnist("test")[0])
    score = gan.classifier_score(fake)                    # 1 (one class) .. 10

FID and KID compare feature statistics of two image sets. Here the features
are those of a small classifier trained on real MNIST digits and shipped with
the package (`gan.classifier`, version `VERSION`), because Inception weights
need a download and were made for photographs. The numbers are therefore
*classifier* FID/KID, comparable only with each other (same classifier
version), never with published Inception FIDs. `inception_fid` computes the
Inception version when you have its weights locally.

Images: float in [-1, 1] of shape [N, 28, 28] or [N, 28, 28, 1], or uint8 in
[0, 255] of the same shapes.
"""

import os

import gin
import numpy as np

from gan import classifier as classifier_lib

VERSION = classifier_lib.VERSION
_INCEPTION_FILE = "inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5"
_cache = {}


def _as_unit_images(images):
  """float32 [N, 28, 28, 1] in [-1, 1] from any accepted form."""
  array = np.asarray(images)
  if array.ndim == 3:
    array = array[..., None]
  if array.ndim != 4 or array.shape[1:] != (28, 28, 1):
    raise ValueError(f"images must have shape [N, 28, 28] or [N, 28, 28, 1] (MNIST "
                     f"digits), got {np.asarray(images).shape}.")
  if len(array) < 2:
    raise ValueError(f"images: need at least 2 images for statistics, got {len(array)}.")
  if array.dtype == np.uint8:
    return (array.astype(np.float32) - 127.5) / 127.5
  if not np.issubdtype(array.dtype, np.floating):
    raise ValueError(f"images must be uint8 in [0, 255] or float in [-1, 1], got "
                     f"dtype {array.dtype}.")
  return array.astype(np.float32)


def _classifier():
  if "model" not in _cache:
    import keras
    model = classifier_lib.load_classifier()
    _cache["model"] = model
    _cache["features"] = keras.Model(model.inputs[0], model.get_layer(
        classifier_lib.FEATURES).output)
  return _cache["model"], _cache["features"]


def _predict(model, images, batch_size):
  return np.concatenate([np.asarray(model(images[i:i + batch_size], training=False))
                         for i in range(0, len(images), batch_size)]).astype(np.float64)


@gin.register(module="gan")
def classifier_features(images, batch_size=500):
  """[N, 64] features of the shipped MNIST classifier (its last hidden layer)."""
  return _predict(_classifier()[1], _as_unit_images(images), batch_size)


def _check_features(name, features):
  features = np.asarray(features, np.float64)
  if features.ndim != 2 or len(features) < 2:
    raise ValueError(f"{name} must be features [N >= 2, dims], got shape {features.shape}.")
  return features


def _sqrt_psd(matrix):
  values, vectors = np.linalg.eigh(matrix)
  return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


@gin.register(module="gan")
def frechet_distance(features_a, features_b):
  """|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)) between Gaussian fits.

  Heusel et al., "GANs Trained by a Two Time-Scale Update Rule Converge to a
  Local Nash Equilibrium", 2017 (arXiv:1706.08500). Tr((S_a S_b)^(1/2)) is
  computed as the trace of (S_a^(1/2) S_b S_a^(1/2))^(1/2), a symmetric matrix,
  so only symmetric eigendecompositions are needed (no scipy).
  """
  a = _check_features("features_a", features_a)
  b = _check_features("features_b", features_b)
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"features_a has {a.shape[1]} dims but features_b has {b.shape[1]}.")
  mean_a, mean_b = a.mean(0), b.mean(0)
  cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
  root_a = _sqrt_psd(cov_a)
  middle = np.linalg.eigvalsh(root_a @ cov_b @ root_a)
  trace_root = np.sqrt(np.clip(middle, 0.0, None)).sum()
  return float(np.sum((mean_a - mean_b) ** 2) + np.trace(cov_a) + np.trace(cov_b)
               - 2.0 * trace_root)


@gin.register(module="gan")
def kernel_distance(features_a, features_b, *, num_subsets=10, subset_size=1000, seed=0):
  """KID: unbiased MMD^2 with the kernel (x.y / d + 1)^3, mean and std over subsets.

  Binkowski et al., "Demystifying MMD GANs", 2018 (arXiv:1801.01401). Unbiased,
  so it can be slightly negative when the sets match.
  """
  a = _check_features("features_a", features_a)
  b = _check_features("features_b", features_b)
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
    off_diagonal = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy))
    values.append(off_diagonal / (size * (size - 1)) - 2 * k_xy.mean())
  return float(np.mean(values)), float(np.std(values))


@gin.register(module="gan")
def classifier_score(images, batch_size=500):
  """exp(E_x KL(p(y|x) || p(y))) with the classifier's softmax: 1 (one class) to 10.

  The Inception Score formula (Salimans et al., "Improved Techniques for
  Training GANs", 2016, arXiv:1606.03498) with the shipped MNIST classifier:
  high when each digit is recognisable and all ten classes occur.
  """
  logits = _predict(_classifier()[0], _as_unit_images(images), batch_size)
  logits -= logits.max(1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(1, keepdims=True)
  marginal = p.mean(0)
  kl = np.sum(p * (np.log(p + 1e-12) - np.log(marginal + 1e-12)), axis=1)
  return float(np.exp(kl.mean()))


@gin.register(module="gan")
def classifier_fid(images_a, images_b):
  """Frechet distance of two digit sets in the shipped classifier's feature space."""
  return frechet_distance(classifier_features(images_a), classifier_features(images_b))


@gin.register(module="gan")
def classifier_kid(images_a, images_b, **kwargs):
  """(mean, std) kernel distance of two digit sets in the classifier's feature space."""
  return kernel_distance(classifier_features(images_a), classifier_features(images_b),
                         **kwargs)


@gin.register(module="gan")
def inception_fid(images_a, images_b, weights, batch_size=50):
  """FID with InceptionV3 pool features, from weights you have locally.

  Args:
    images_a, images_b: images in [-1, 1] (float) or uint8, [N, H, W, 1 or 3]
      or [N, H, W]; resized to 299x299, grey repeated to RGB.
    weights: path of Keras' `inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5`.
    batch_size: images per forward pass.
  """
  if not os.path.exists(weights):
    raise FileNotFoundError(
        f"inception_fid: no Inception weights at {weights}. Download Keras' "
        f"{_INCEPTION_FILE} on a machine with internet (keras.applications."
        "InceptionV3(include_top=False) fetches it into ~/.keras/models) and pass its "
        "path. gan.classifier_fid needs no download.")
  import keras
  import tensorflow as tf
  key = ("inception", os.path.abspath(weights))
  if key not in _cache:
    _cache[key] = keras.applications.InceptionV3(include_top=False, pooling="avg",
                                                 weights=weights)

  def features(images):
    array = np.asarray(images)
    array = array[..., None] if array.ndim == 3 else array
    if array.ndim != 4 or array.shape[-1] not in (1, 3):
      raise ValueError(f"images must be [N, H, W], [N, H, W, 1] or [N, H, W, 3], got "
                       f"{array.shape}.")
    unit = (array.astype(np.float32) - 127.5) / 127.5 if array.dtype == np.uint8 else (
        array.astype(np.float32))
    out = []
    for i in range(0, len(unit), batch_size):
      batch = tf.image.resize(unit[i:i + batch_size], (299, 299))
      if batch.shape[-1] == 1:
        batch = tf.repeat(batch, 3, axis=-1)
      out.append(np.asarray(_cache[key](batch, training=False)))  # expects [-1, 1]
    return np.concatenate(out)

  return frechet_distance(features(images_a), features(images_b))
