"""GAN losses: loss families, each a generator loss and the discriminator loss it plays against.

    loss = gan.losses.hinge     # or non_saturating, minimax, wasserstein, least_squares
    d_loss = ctx.average(loss.discriminator(real_logits, fake_logits))
    g_loss = ctx.average(loss.generator(fake_logits))

    gan.Experiment.loss = %gan.losses.hinge  # in a .gin file: one binding for both losses

A family is chosen as one value, so that a generator loss is never trained
against another family's discriminator loss (a hinge generator against a
Wasserstein critic trains, but nothing a paper describes). Each family's two
functions are also here by name, `<family>_generator_loss(fake_logits)` and
`<family>_discriminator_loss(real_logits, fake_logits)`, as TF-GAN names them.
Logits are the discriminator's raw outputs, `[B]` or `[B, 1]`; every loss
returns per-example values `[B]` in float32 (float64 in a float64 run, which
`ctl parity` replays), to be averaged with `ctx.average`.
"""

import dataclasses
from collections.abc import Callable

import gin
import tensorflow as tf

GeneratorLoss = Callable[[tf.Tensor], tf.Tensor]
DiscriminatorLoss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


@dataclasses.dataclass(frozen=True)
class LossFamily:
  """A generator loss and the discriminator loss it is trained against.

      wasserstein = LossFamily(wasserstein_generator_loss, wasserstein_discriminator_loss)

  Attributes:
    generator: `generator(fake_logits) -> [B]`, what the generator minimises.
    discriminator: `discriminator(real_logits, fake_logits) -> [B]`, what the
      discriminator minimises.
  """

  generator: GeneratorLoss
  discriminator: DiscriminatorLoss

  def __post_init__(self) -> None:
    for role in ("generator", "discriminator"):
      if not callable(getattr(self, role)):
        raise TypeError(f"LossFamily: {role} must be a loss function, got "
                        f"{getattr(self, role)!r}.")

  def __repr__(self) -> str:
    names = (getattr(f, "__name__", repr(f)) for f in (self.generator, self.discriminator))
    return f"LossFamily({', '.join(names)})"


def at_least_float32(values: tf.Tensor) -> tf.Tensor:
  """`values` in float32 if they are float16 or bfloat16 (mixed precision), else
  as they are: float64 stays float64, so that a float64 run rounds nothing to float32."""
  values = tf.convert_to_tensor(values)
  if values.dtype in (tf.float16, tf.bfloat16):
    return tf.cast(values, tf.float32)
  return values


def _per_example(logits: tf.Tensor) -> tf.Tensor:
  logits = tf.convert_to_tensor(logits)
  if logits.shape.rank == 2 and logits.shape[-1] == 1:
    logits = logits[:, 0]
  if logits.shape.rank != 1:
    raise ValueError(f"logits must have shape [batch] or [batch, 1], got {logits.shape}.")
  return at_least_float32(logits)


def minimax_generator_loss(fake_logits: tf.Tensor) -> tf.Tensor:
  """log(1 - D(G(z))), minimised: Goodfellow et al., "Generative Adversarial Nets",
  2014 (arXiv:1406.2661), equation 1.

  Saturates when the discriminator wins (its gradient vanishes), which is why
  the same paper proposes the non-saturating form.
  """
  return -tf.nn.softplus(_per_example(fake_logits))  # log(1 - sigmoid(l)) = -softplus(l)


def minimax_discriminator_loss(real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
  """-log D(x) - log(1 - D(G(z))): Goodfellow et al. 2014, equation 1."""
  return (tf.nn.softplus(-_per_example(real_logits)) +
          tf.nn.softplus(_per_example(fake_logits)))


def non_saturating_generator_loss(fake_logits: tf.Tensor) -> tf.Tensor:
  """-log D(G(z)): Goodfellow et al., "Generative Adversarial Nets", 2014
  (arXiv:1406.2661), section 3."""
  return tf.nn.softplus(-_per_example(fake_logits))


def non_saturating_discriminator_loss(real_logits: tf.Tensor,
                                      fake_logits: tf.Tensor) -> tf.Tensor:
  """-log D(x) - log(1 - D(G(z))): Goodfellow et al. 2014, equation 1 (as for minimax)."""
  return minimax_discriminator_loss(real_logits, fake_logits)


def wasserstein_generator_loss(fake_logits: tf.Tensor) -> tf.Tensor:
  """-D(G(z)): Arjovsky, Chintala & Bottou, "Wasserstein GAN", 2017 (arXiv:1701.07875).

  The critic must be kept Lipschitz, e.g. with
  `gan.penalties.wasserstein_gradient_penalty`.
  """
  return -_per_example(fake_logits)


def wasserstein_discriminator_loss(real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
  """D(G(z)) - D(x): the critic's loss of Arjovsky et al. 2017."""
  return _per_example(fake_logits) - _per_example(real_logits)


def hinge_generator_loss(fake_logits: tf.Tensor) -> tf.Tensor:
  """-D(G(z)): Lim & Ye, "Geometric GAN", 2017 (arXiv:1705.02894); Miyato et al.
  2018 (arXiv:1802.05957), equation 17."""
  return -_per_example(fake_logits)


def hinge_discriminator_loss(real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
  """max(0, 1 - D(x)) + max(0, 1 + D(G(z))): Lim & Ye 2017; Miyato et al. 2018, equation 16."""
  return (tf.nn.relu(1.0 - _per_example(real_logits)) +
          tf.nn.relu(1.0 + _per_example(fake_logits)))


def least_squares_generator_loss(fake_logits: tf.Tensor) -> tf.Tensor:
  """(D(G(z)) - 1)^2 / 2: Mao et al., "Least Squares Generative Adversarial
  Networks", 2017 (arXiv:1611.04076), equation 9.

  With the 0-1 coding (a = 0 for fakes, b = c = 1) that the paper uses in its experiments.
  """
  return 0.5 * tf.square(_per_example(fake_logits) - 1.0)


def least_squares_discriminator_loss(real_logits: tf.Tensor,
                                     fake_logits: tf.Tensor) -> tf.Tensor:
  """(D(x) - 1)^2 / 2 + D(G(z))^2 / 2: Mao et al. 2017, equation 9 (a = 0, b = 1)."""
  return (0.5 * tf.square(_per_example(real_logits) - 1.0) +
          0.5 * tf.square(_per_example(fake_logits)))


# The families. Each is also a gin constant of the same name (`%gan.losses.hinge`):
# a family is a value, not a function to call, and gin references values by `%`.

# Goodfellow et al. 2014, equation 1: the original game; the generator's
# gradient vanishes when the discriminator wins.
minimax = LossFamily(minimax_generator_loss, minimax_discriminator_loss)
# Goodfellow et al. 2014, section 3: the generator maximises log D(G(z)) instead;
# the usual default (DCGAN, Radford et al. 2016).
non_saturating = LossFamily(non_saturating_generator_loss, non_saturating_discriminator_loss)
# Arjovsky et al. 2017; train with a gradient penalty (Gulrajani et al. 2017).
wasserstein = LossFamily(wasserstein_generator_loss, wasserstein_discriminator_loss)
# Lim & Ye 2017; with spectral normalization, Miyato et al. 2018.
hinge = LossFamily(hinge_generator_loss, hinge_discriminator_loss)
# Mao et al. 2017, 0-1 coding.
least_squares = LossFamily(least_squares_generator_loss, least_squares_discriminator_loss)

gin.constant("gan.losses.minimax", minimax)
gin.constant("gan.losses.non_saturating", non_saturating)
gin.constant("gan.losses.wasserstein", wasserstein)
gin.constant("gan.losses.hinge", hinge)
gin.constant("gan.losses.least_squares", least_squares)
