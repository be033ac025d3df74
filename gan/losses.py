"""GAN losses: per-example values, to be averaged with `ctx.average`.

    d_loss = ctx.average(gan.hinge_discriminator_loss(real_logits, fake_logits))
    g_loss = ctx.average(gan.hinge_generator_loss(fake_logits))

Every family has the same two functions: `<family>_generator_loss(fake_logits)`
and `<family>_discriminator_loss(real_logits, fake_logits)`, so that a config
swaps families by reference (`gan.train.generator_loss = @gan.hinge_generator_loss`).
Logits are the discriminator's raw outputs, `[B]` or `[B, 1]`; the result is
`[B]` float32. Families: minimax, non_saturating, wasserstein, hinge,
least_squares.
"""

import gin
import tensorflow as tf


def _per_example(logits):
  logits = tf.convert_to_tensor(logits)
  if logits.shape.rank == 2 and logits.shape[-1] == 1:
    logits = logits[:, 0]
  if logits.shape.rank != 1:
    raise ValueError(f"logits must have shape [batch] or [batch, 1], got {logits.shape}.")
  return tf.cast(logits, tf.float32)


@gin.register(module="gan")
def minimax_generator_loss(fake_logits):
  """log(1 - D(G(z))), minimised: Goodfellow et al., "Generative Adversarial Nets", 2014 (arXiv:1406.2661), equation 1.

  Saturates when the discriminator wins (its gradient vanishes), which is why
  the same paper proposes the non-saturating form.
  """
  return -tf.nn.softplus(_per_example(fake_logits))  # log(1 - sigmoid(l)) = -softplus(l)


@gin.register(module="gan")
def minimax_discriminator_loss(real_logits, fake_logits):
  """-log D(x) - log(1 - D(G(z))): Goodfellow et al. 2014, equation 1."""
  return (tf.nn.softplus(-_per_example(real_logits)) +
          tf.nn.softplus(_per_example(fake_logits)))


@gin.register(module="gan")
def non_saturating_generator_loss(fake_logits):
  """-log D(G(z)): Goodfellow et al., "Generative Adversarial Nets", 2014 (arXiv:1406.2661), section 3."""
  return tf.nn.softplus(-_per_example(fake_logits))


@gin.register(module="gan")
def non_saturating_discriminator_loss(real_logits, fake_logits):
  """-log D(x) - log(1 - D(G(z))): Goodfellow et al. 2014, equation 1 (as for minimax)."""
  return minimax_discriminator_loss(real_logits, fake_logits)


@gin.register(module="gan")
def wasserstein_generator_loss(fake_logits):
  """-D(G(z)): Arjovsky, Chintala & Bottou, "Wasserstein GAN", 2017 (arXiv:1701.07875).

  The critic must be kept Lipschitz, e.g. with `gan.wasserstein_gradient_penalty`.
  """
  return -_per_example(fake_logits)


@gin.register(module="gan")
def wasserstein_discriminator_loss(real_logits, fake_logits):
  """D(G(z)) - D(x): the critic's loss of Arjovsky et al. 2017."""
  return _per_example(fake_logits) - _per_example(real_logits)


@gin.register(module="gan")
def hinge_generator_loss(fake_logits):
  """-D(G(z)): Lim & Ye, "Geometric GAN", 2017 (arXiv:1705.02894); Miyato et al. 2018 (arXiv:1802.05957), equation 17."""
  return -_per_example(fake_logits)


@gin.register(module="gan")
def hinge_discriminator_loss(real_logits, fake_logits):
  """max(0, 1 - D(x)) + max(0, 1 + D(G(z))): Lim & Ye 2017; Miyato et al. 2018, equation 16."""
  return (tf.nn.relu(1.0 - _per_example(real_logits)) +
          tf.nn.relu(1.0 + _per_example(fake_logits)))


@gin.register(module="gan")
def least_squares_generator_loss(fake_logits):
  """(D(G(z)) - 1)^2 / 2: Mao et al., "Least Squares Generative Adversarial Networks", 2017 (arXiv:1611.04076), equation 9.

  With the 0-1 coding (a = 0 for fakes, b = c = 1) that the paper uses in its experiments.
  """
  return 0.5 * tf.square(_per_example(fake_logits) - 1.0)


@gin.register(module="gan")
def least_squares_discriminator_loss(real_logits, fake_logits):
  """(D(x) - 1)^2 / 2 + D(G(z))^2 / 2: Mao et al. 2017, equation 9 (a = 0, b = 1)."""
  return (0.5 * tf.square(_per_example(real_logits) - 1.0) +
          0.5 * tf.square(_per_example(fake_logits)))
