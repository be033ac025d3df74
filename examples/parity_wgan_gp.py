"""A WGAN-GP with an encoder (BiGAN/ALI style), as a module for `ctl parity`.

    ctl parity examples/parity_wgan_gp.py --against compiled,mirrored:2 --steps 10

Three models on a ring of 8 Gaussians in 2-D (the usual mode-collapse study):
a generator, an encoder and a critic of (x, z) pairs, each with Adam. Each step
makes 5 critic updates, one batch each, with the gradient penalty of
Gulrajani et al. (2017) on the pairs, then one update of the generator and of
the encoder. `ctl parity` imports this file in a process per configuration,
after making the strategy, and calls `build`, `train_step` and `data`.
"""

import keras
import numpy as np
import tensorflow as tf

import gan

NOISE = 2  # latent size
GLOBAL_BATCH = 64
batches_per_step = 5  # critic updates per generator update, one batch each
seed = 0


def data() -> tf.data.Dataset:
  """Global batches from a ring of 8 Gaussians (radius 2, std 0.05), fixed by a seed."""
  rng = np.random.default_rng(1)
  angles = rng.integers(0, 8, 100 * GLOBAL_BATCH) * (2 * np.pi / 8)
  points = np.stack([2 * np.cos(angles), 2 * np.sin(angles)], -1)
  points += rng.normal(scale=0.05, size=points.shape)
  return tf.data.Dataset.from_tensor_slices(points.astype("float32")).repeat().batch(
      GLOBAL_BATCH, drop_remainder=True)


def mlp(name: str, inputs: int, outputs: int) -> keras.Model:
  return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(64, activation="relu"),
                           keras.layers.Dense(64, activation="relu"),
                           keras.layers.Dense(outputs)], name=name)


def build():
  models = {"generator": mlp("generator", NOISE, 2), "encoder": mlp("encoder", 2, NOISE),
            "discriminator": mlp("discriminator", 2 + NOISE, 1)}
  optimizers = {name: keras.optimizers.Adam(1e-3, beta_1=0.5, beta_2=0.9) for name in models}
  return models, optimizers


def train_step(ctx, batches):
  generator, encoder = ctx.models["generator"], ctx.models["encoder"]

  def critic(pairs):
    return ctx.models["discriminator"](pairs, training=True)[:, 0]

  def pairs(real, z):
    return tf.concat([real, encoder(real, training=True)], -1), tf.concat(
        [generator(z, training=True), z], -1)

  for real in batches:  # the critic's updates, each on its own batch
    z = ctx.normal([NOISE])

    def critic_loss(real=real, z=z):
      real_pairs, fake_pairs = pairs(real, z)
      per_example = gan.losses.wasserstein.discriminator(critic(real_pairs), critic(fake_pairs))
      per_example += gan.penalties.wasserstein_gradient_penalty(ctx, critic, real_pairs,
                                                                fake_pairs)
      return ctx.average(per_example)

    critic_value = ctx.minimize(critic_loss, "discriminator")

  z = ctx.normal([NOISE])
  with tf.GradientTape(persistent=True) as tape:
    real_pairs, fake_pairs = pairs(batches[-1], z)
    generator_loss = ctx.average(gan.losses.wasserstein.generator(critic(fake_pairs)))
    encoder_loss = ctx.average(critic(real_pairs))  # the encoder's pairs should look fake
  ctx.minimize(generator_loss, "generator", tape=tape)
  ctx.minimize(encoder_loss, "encoder", tape=tape)
  return {"discriminator_loss": critic_value, "generator_loss": generator_loss,
          "encoder_loss": encoder_loss}
