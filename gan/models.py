"""Reference GAN models (Keras 3), DCGAN-style, sized by arguments.

    generator = gan.dcgan_generator(noise_dim=64, width=32)      # z -> [28, 28, 1] in [-1, 1]
    discriminator = gan.dcgan_discriminator(width=32)            # image -> one logit
    generator = gan.dcgan_generator(image_shape=(32, 32, 3), num_classes=10)  # [z, y] -> image
    discriminator = gan.dcgan_discriminator(spectral_norm=True, num_classes=10)  # [x, y] -> logit
    encoder = gan.models.dcgan_encoder(latent_dim=64)            # image -> z (BiGAN/ALI)
    joint = gan.models.bigan_discriminator(latent_dim=64)        # [x, z] -> logit

Radford et al., "Unsupervised Representation Learning with Deep Convolutional
GANs", 2016 (arXiv:1511.06434): strided (transposed) convolutions, batch norm in
the generator, LeakyReLU(0.2) in the discriminator, tanh output. Images of side
28 start from 7x7 (two upsamplings), of side 32 from 4x4 (three); any side
divisible by 4 works. Class-conditional models take `[inputs, labels]` with
integer labels `[B]`. The two DCGAN models are everyday names, `gan.dcgan_generator`
and `gan.dcgan_discriminator` in Python and gin; the BiGAN parts are
`gan.models.dcgan_encoder` and `gan.models.bigan_discriminator`.
"""

from collections.abc import Sequence

import gin
import keras
import tensorflow as tf
from keras import layers

from ctl import arguments

CONDITIONINGS = ("projection", "concat")


def _upsamplings(image_shape):
  """How many stride-2 layers lead from a small square to `image_shape`."""
  if (not isinstance(image_shape, (tuple, list)) or len(image_shape) != 3
      or any(not isinstance(d, int) or d < 1 for d in image_shape)):
    raise ValueError(f"image_shape must be (height, width, channels) of positive ints, "
                     f"got {image_shape!r}.")
  height, width, _ = image_shape
  if height % 4 or width % 4:
    raise ValueError(f"image_shape {tuple(image_shape)}: height and width must be "
                     "divisible by 4 (e.g. (28, 28, 1) or (32, 32, 3)).")
  # Sides divisible by 8 start from side/8 (32 -> 4x4), others from side/4 (28 -> 7x7).
  return 3 if height % 8 == 0 and width % 8 == 0 else 2


def _output_dtype():
  """The dtype of a model's last layers: float32 under mixed precision, as Keras
  advises for outputs, else the policy's own (None), so that a float64 run
  (`ctl parity`'s replay) computes its outputs in float64."""
  policy = keras.mixed_precision.global_policy()
  return "float32" if policy.compute_dtype in ("float16", "bfloat16") else None


def _check_conditioning(num_classes, conditioning):
  if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 2):
    raise ValueError(f"num_classes must be None (unconditional) or an int >= 2, "
                     f"got {num_classes!r}.")
  if conditioning not in CONDITIONINGS:
    raise ValueError(f"conditioning must be one of {CONDITIONINGS}, got {conditioning!r}.")


@keras.saving.register_keras_serializable(package="gan")
class LeakyReLU(layers.Layer):
  """`keras.layers.LeakyReLU` whose gradient reads the output, not the input: same numbers.

  Why: on x86 TensorFlow's graph optimizer (Grappler's remapper, with oneDNN,
  the default) rewrites Conv2D or MatMul + BiasAdd + LeakyRelu as one op even
  though LeakyRelu's gradient still reads the BiasAdd's output. The rewrite is
  then refused, and every compiled training step of a discriminator built with
  keras' LeakyReLU logs `E... remapper failed: INVALID_ARGUMENT: Mutation::Apply
  error: fanout '.../LeakyReluGrad' exist for missing node '.../BiasAdd'`. For
  a slope >= 0 the output has the input's sign, so the gradient (one
  LeakyReluGrad op, as before) can read the output, as ReLU's does; the BiasAdd
  then has one consumer and the remapper succeeds. Same values and gradients
  (second derivatives too); measured on the DCGAN step: no slower (docs/strategies.md,
  "Quiet by default").
  """

  def __init__(self, negative_slope: float = 0.3, **kwargs):  # keras' default
    super().__init__(**kwargs)
    if not negative_slope >= 0:
      raise ValueError(f"negative_slope must be >= 0, got {negative_slope!r}.")
    self.negative_slope = float(negative_slope)

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    slope = self.negative_slope

    @tf.custom_gradient
    def leaky_relu(x):
      y = tf.nn.leaky_relu(x, slope)
      # stop_gradient: a second derivative (a gradient penalty) must not reach the
      # LeakyRelu op through `y` either (LeakyReluGrad's gradient in `features` is 0).
      sign = tf.stop_gradient(y)
      return y, lambda dy: tf.raw_ops.LeakyReluGrad(gradients=dy, features=sign, alpha=slope)

    return leaky_relu(inputs)

  def compute_output_shape(self, input_shape: tuple) -> tuple:
    return input_shape

  def get_config(self) -> dict:
    return {**super().get_config(), "negative_slope": self.negative_slope}


def _maybe_spectral(layer, spectral_norm):
  # Miyato et al., "Spectral Normalization for GANs", 2018 (arXiv:1802.05957):
  # one power iteration per call, as in the paper.
  return layers.SpectralNormalization(layer) if spectral_norm else layer


@gin.register(module="gan")
def dcgan_generator(noise_dim: int = 64, width: int = 64, *,
                    image_shape: Sequence[int] = (28, 28, 1), num_classes: int | None = None,
                    synchronized_batch_norm: bool = True, kernel_size: int = 5,
                    name: str = "generator") -> keras.Model:
  """Noise `[B, noise_dim]` (and labels `[B]`) -> images `[B, *image_shape]` in [-1, 1].

  Args:
    noise_dim: size of the noise vector.
    width: channels of the last hidden layer; each earlier layer has 2x more.
    image_shape: (height, width, channels) of the output; sides divisible by 4.
    num_classes: if set, the model takes `[noise, labels]` and conditions on the
      label by concatenating its one-hot code to the noise (Mirza & Osindero,
      "Conditional Generative Adversarial Nets", 2014, arXiv:1411.1784).
    synchronized_batch_norm: compute batch-norm statistics over the global
      batch (all replicas), so that results do not depend on the strategy.
      False uses each replica's own batch, which is cheaper and what most
      published multi-GPU runs did.
    kernel_size: side of the transposed convolutions' kernels: 5 in the
      DCGAN paper, 4 in TF-GAN's and PyTorch's DCGAN examples (a multiple of
      the stride: no checkerboard from uneven overlap, and 36% fewer
      multiplications).
    name: the model's name.
  """
  _check_conditioning(num_classes, "concat")
  _check_kernel_size(kernel_size)
  count = _upsamplings(image_shape)
  height, side, channels = image_shape
  norm = lambda: layers.BatchNormalization(synchronized=synchronized_batch_norm)  # noqa: E731
  noise = keras.Input((noise_dim,), name="noise")
  inputs, x = [noise], noise
  if num_classes:
    labels = keras.Input((), dtype="int32", name="labels")
    inputs.append(labels)
    x = layers.Concatenate()([x, layers.CategoryEncoding(num_classes, "one_hot")(labels)])
  start = (height // 2 ** count, side // 2 ** count)
  top = width * 2 ** (count - 1)
  x = layers.Dense(start[0] * start[1] * top, use_bias=False)(x)
  x = layers.LeakyReLU(0.2)(norm()(x))
  x = layers.Reshape(start + (top,))(x)
  for i in range(count - 1):
    x = layers.Conv2DTranspose(top // 2 ** (i + 1), kernel_size, strides=2, padding="same",
                               use_bias=False)(x)
    x = layers.LeakyReLU(0.2)(norm()(x))
  # The output stays float32 under mixed precision (_output_dtype).
  images = layers.Conv2DTranspose(channels, kernel_size, strides=2, padding="same",
                                  activation="tanh", dtype=_output_dtype())(x)
  return keras.Model(inputs if num_classes else noise, images, name=name)


def _check_kernel_size(kernel_size):
  arguments.integer("kernel_size", kernel_size, minimum=1,
                    meaning="5 in the DCGAN paper, 4 in TF-GAN's examples")


def _convolutions(x, width, count, spectral_norm, kernel_size=5):
  """The discriminator's and encoder's trunk: `count` stride-2 convolutions."""
  for i in range(count):
    x = _maybe_spectral(layers.Conv2D(width * 2 ** i, kernel_size, strides=2, padding="same"),
                        spectral_norm)(x)
    x = LeakyReLU(0.2)(x)  # not keras' own: see LeakyReLU
  return layers.Flatten()(x)


@gin.register(module="gan")
def dcgan_discriminator(width: int = 64, *, image_shape: Sequence[int] = (28, 28, 1),
                        spectral_norm: bool = False, num_classes: int | None = None,
                        conditioning: str = "projection", kernel_size: int = 5,
                        name: str = "discriminator") -> keras.Model:
  """Images `[B, *image_shape]` (and labels `[B]`) -> logits `[B, 1]`.

  No dropout, so that runs stay deterministic; no batch norm, so that the
  gradient penalties (defined per example) stay per example.

  Args:
    width: channels of the first convolution; each later one has 2x more.
    image_shape: (height, width, channels) of the input.
    spectral_norm: wrap every convolution and dense layer in spectral
      normalization (Miyato et al. 2018).
    num_classes: if set, the model takes `[images, labels]`.
    conditioning: how labels enter. "projection": the logit gains the inner
      product of a learned label embedding with the image features (Miyato &
      Koyama, "cGANs with Projection Discriminator", 2018, arXiv:1802.05637).
      "concat": one-hot labels are appended to the image as constant channels
      (Mirza & Osindero 2014).
    kernel_size: side of the convolutions' kernels (see `dcgan_generator`).
    name: the model's name.
  """
  _check_conditioning(num_classes, conditioning)
  _check_kernel_size(kernel_size)
  count = _upsamplings(image_shape)
  images = keras.Input(tuple(image_shape), name="images")
  inputs, x = [images], images
  if num_classes:
    labels = keras.Input((), dtype="int32", name="labels")
    inputs.append(labels)
    if conditioning == "concat":
      one_hot = layers.CategoryEncoding(num_classes, "one_hot")(labels)
      planes = layers.Reshape((1, 1, num_classes))(one_hot)
      planes = layers.UpSampling2D(tuple(image_shape[:2]))(planes)
      x = layers.Concatenate()([x, planes])
  features = _convolutions(x, width, count, spectral_norm, kernel_size)
  logits = _maybe_spectral(layers.Dense(1, dtype=_output_dtype()), spectral_norm)(features)
  if num_classes and conditioning == "projection":
    # One-hot times a matrix, not an Embedding: the same function and the same
    # initial values, but a dense gradient, which every strategy all-reduces
    # alike (TF's sparse all-reduce of an Embedding's gradient fails after a
    # lazy penalty's tf.cond under MirroredStrategy).
    one_hot = layers.CategoryEncoding(num_classes, "one_hot")(labels)
    embedded = layers.Dense(features.shape[-1], use_bias=False, kernel_initializer="uniform",
                            name="class_embedding")(one_hot)
    projection = layers.Dot(axes=1, dtype=_output_dtype())([embedded, features])
    logits = layers.Add(dtype=_output_dtype())([logits, projection])
  return keras.Model(inputs if num_classes else images, logits, name=name)


@gin.register(module="gan.models")
def dcgan_encoder(latent_dim: int = 64, width: int = 64, *,
                  image_shape: Sequence[int] = (28, 28, 1), name: str = "encoder") -> keras.Model:
  """Images `[B, *image_shape]` -> codes `[B, latent_dim]` (linear output).

  The encoder of BiGAN (Donahue et al., "Adversarial Feature Learning", 2017,
  arXiv:1605.09782) and ALI (Dumoulin et al., "Adversarially Learned
  Inference", 2017, arXiv:1606.00704): it learns to invert the generator.
  """
  images = keras.Input(tuple(image_shape), name="images")
  features = _convolutions(images, width, _upsamplings(image_shape), False)
  codes = layers.Dense(latent_dim, dtype=_output_dtype())(features)
  return keras.Model(images, codes, name=name)


@gin.register(module="gan.models")
def bigan_discriminator(latent_dim: int = 64, width: int = 64, *,
                        image_shape: Sequence[int] = (28, 28, 1), spectral_norm: bool = False,
                        unary: bool = False, name: str = "discriminator") -> keras.Model:
  """Pairs `[images, codes]` -> logits `[B, 1]` (`[B, 3]` with `unary`): real `(x, E(x))`
  vs fake `(G(z), z)`.

  Image features from the DCGAN trunk and code features from a dense layer
  are joined and scored together, as in BiGAN/ALI (Donahue et al. 2017).
  With `unary`, logits `[B, 3]`: the joint score, then a score of the image
  features alone and one of the code features alone, BigBiGAN's s_xz, s_x
  and s_z (Donahue & Simonyan 2019, section 2), each a logit the loss scores
  (`gan.experiment.make_step` sums the three).
  """
  images = keras.Input(tuple(image_shape), name="images")
  codes = keras.Input((latent_dim,), name="codes")
  dense = lambda units, **kw: _maybe_spectral(layers.Dense(units, **kw), spectral_norm)  # noqa: E731
  x = _convolutions(images, width, _upsamplings(image_shape), spectral_norm)
  z = LeakyReLU(0.2)(dense(4 * width)(codes))
  joint = LeakyReLU(0.2)(dense(4 * width)(layers.Concatenate()([x, z])))
  logits = dense(1, dtype=_output_dtype())(joint)
  if unary:
    logits = layers.Concatenate(dtype=_output_dtype())(
        [logits, dense(1, dtype=_output_dtype())(x), dense(1, dtype=_output_dtype())(z)])
  return keras.Model([images, codes], logits, name=name)


@gin.register(module="gan.models")
def tfgan_mnist_generator(noise_dim: int = 64, *, image_shape: Sequence[int] = (28, 28, 1),
                          weight_decay: float = 2.5e-5, name: str = "generator") -> keras.Model:
  """Noise `[B, noise_dim]` -> digits `[B, 28, 28, 1]`: the TF-GAN MNIST tutorial's generator.

  Dense 1024 and dense 7x7x256 (batch norm, ReLU), two 4x4 stride-2 transposed
  convolutions of 64 channels (ReLU), a 4x4 convolution to one channel, tanh;
  Glorot-uniform weights. As in the TF-GAN tutorial (tensorflow_gan/examples/
  colab_notebooks/tfgan_tutorial.ipynb, 2019), with its L2 weight decay:
  `weight_decay` * the sum of squares of every kernel and bias but the last
  convolution's, in `model.losses` (which `gan.make_step` adds to the loss).
  Batch-norm statistics are synchronized over replicas, as in `dcgan_generator`.
  """
  if tuple(image_shape) != (28, 28, 1):
    raise ValueError(f"tfgan_mnist_generator makes 28x28x1 digits only, got image_shape "
                     f"{tuple(image_shape)}; use gan.dcgan_generator for other shapes.")
  decay = _weight_decay(weight_decay)
  norm = lambda: layers.BatchNormalization(momentum=0.999, epsilon=1e-3,  # noqa: E731
                                           synchronized=True)
  noise = keras.Input((noise_dim,), name="noise")
  x = layers.ReLU()(norm()(layers.Dense(1024, **decay)(noise)))
  x = layers.ReLU()(norm()(layers.Dense(7 * 7 * 256, **decay)(x)))
  x = layers.Reshape((7, 7, 256))(x)
  for _ in range(2):
    x = layers.Conv2DTranspose(64, 4, strides=2, padding="same", activation="relu",
                               **decay)(x)
  images = layers.Conv2D(1, 4, padding="same", activation="tanh", dtype=_output_dtype())(x)
  return keras.Model(noise, images, name=name)


def _weight_decay(weight_decay):
  """A layer's arguments for the TF-GAN tutorial's L2 penalty on its kernel and bias."""
  arguments.number("weight_decay", weight_decay, minimum=0.0)
  if not weight_decay:
    return {}
  return {"kernel_regularizer": keras.regularizers.L2(weight_decay),
          "bias_regularizer": keras.regularizers.L2(weight_decay)}


@gin.register(module="gan.models")
def tfgan_mnist_discriminator(*, image_shape: Sequence[int] = (28, 28, 1),
                              weight_decay: float = 2.5e-5,
                              name: str = "discriminator") -> keras.Model:
  """Digits `[B, 28, 28, 1]` -> logits `[B, 1]`: the TF-GAN MNIST tutorial's discriminator.

  4x4 stride-2 convolutions of 64 and 128 channels, dense 1024 with batch
  norm, LeakyReLU(0.01) after each, a linear output; the tutorial's L2 weight
  decay on every kernel and bias (see `tfgan_mnist_generator`).
  """
  if tuple(image_shape) != (28, 28, 1):
    raise ValueError(f"tfgan_mnist_discriminator scores 28x28x1 digits only, got "
                     f"image_shape {tuple(image_shape)}; use gan.dcgan_discriminator.")
  decay = _weight_decay(weight_decay)
  images = keras.Input((28, 28, 1), name="images")
  x = LeakyReLU(0.01)(layers.Conv2D(64, 4, strides=2, padding="same", **decay)(images))
  x = LeakyReLU(0.01)(layers.Conv2D(128, 4, strides=2, padding="same", **decay)(x))
  x = layers.Dense(1024, **decay)(layers.Flatten()(x))
  x = LeakyReLU(0.01)(layers.BatchNormalization(momentum=0.999, epsilon=1e-3,
                                                synchronized=True)(x))
  logits = layers.Dense(1, dtype=_output_dtype(), **decay)(x)
  return keras.Model(images, logits, name=name)
