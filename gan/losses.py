"""GAN losses: per-example values, to be averaged with `ctx.average`.

    d_loss = ctx.average(gan.non_saturating_discriminator_loss(real_logits, fake_logits))
    g_loss = ctx.average(gan.non_saturating_generator_loss(fake_logits))

Generator losses take the discriminator's logits on generated examples;
discriminator losses take its logits on real and on generated examples. Logits
may be `[B]` or `[B, 1]`; the result is `[B]`.
"""

import tensorflow as tf


def _per_example(logits):
  logits = tf.convert_to_tensor(logits)
  if logits.shape.rank == 2 and logits.shape[-1] == 1:
    logits = logits[:, 0]
  if logits.shape.rank != 1:
    raise ValueError(f"logits must have shape [batch] or [batch, 1], got {logits.shape}.")
  return tf.cast(logits, tf.float32)


def non_saturating_generator_loss(fake_logits):
  """-log D(G(z)): Goodfellow et al., "Generative Adversarial Nets", 2014, section 3."""
  return tf.nn.softplus(-_per_example(fake_logits))


def non_saturating_discriminator_loss(real_logits, fake_logits):
  """-log D(x) - log(1 - D(G(z))): Goodfellow et al., 2014, equation 1."""
  return (tf.nn.softplus(-_per_example(real_logits)) +
          tf.nn.softplus(_per_example(fake_logits)))
