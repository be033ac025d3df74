"""A toy GAN step for `ctl parity`, with the bug named by $PLANTED_BUG planted in it.

    PLANTED_BUG=noise_per_replica ctl parity tests/parity_planted.py --against mirrored:2

Bugs (tests/test_parity_planted.py checks that `ctl parity` names each, on 5 seeds):
  replica_scaled      the losses multiplied by ctx.num_replicas
  noise_per_replica   noise from tf.random with the replica's batch size
  layers              Keras Dropout in the discriminator, BatchNormalization in the generator
  batch_norm          an unsynchronized BatchNormalization in the generator alone
  python_random       an unseeded np.random draw in the step
  python_counter      a Python counter in the step, scaling the loss: it counts
                      eagerly, and is frozen at the value it had when compiled
  penalty_over_batch  a gradient penalty whose norm is taken over the replica's whole
                      batch (tf.norm of the gradient tensor) instead of per example
  own_micro_batches   the step cuts the batch into contiguous halves itself, one
                      discriminator update each, through a synchronized BatchNormalization:
                      a half is other global examples on 2 replicas than on one device
  random_sync_bn      noise from tf.random.normal with the replica's batch size, into a
                      generator with a synchronized BatchNormalization (which is correct:
                      not to be blamed)
  tf_random           tf.random.normal noise with the global batch size: compiled, it
                      draws other numbers than eagerly
  regulariser_batch_mean  the generator's loss regularises the batch mean of its
                      samples (tf.reduce_mean(fake, 0)) inside ctx.average: each
                      replica takes the mean of its own rows
  casts_to_float32    no bug, but the logits are cast to float32 (as mixed-precision
                      code does): the float64 replay widens the casts and decides
  resizes             no bug, but the step passes the real points through
                      tf.image.resize, whose output is float32 whatever its input: a
                      float64 replay cannot run it (tests/test_parity_tool.py)
  (unset)             none: every configuration is within rounding
"""

import os

import keras
import numpy as np
import tensorflow as tf

import toy_gan

BUG = os.environ.get("PLANTED_BUG", "")
seed = 7
calls = [0]  # python_counter's counter


def data():
  return toy_gan.batches(toy_gan.normal_features(64, seed=1234), repeat=True)


def build():
  generator = toy_gan.mlp("generator", toy_gan.NOISE, toy_gan.FEATURES, seed=10)
  discriminator = toy_gan.mlp("discriminator", toy_gan.FEATURES, 1, seed=20)
  if BUG in ("batch_norm", "own_micro_batches", "random_sync_bn"):
    normalized = keras.Sequential([
        keras.Input((toy_gan.FEATURES if BUG == "own_micro_batches" else toy_gan.NOISE,)),
        keras.layers.Dense(16),
        keras.layers.BatchNormalization(synchronized=BUG != "batch_norm"),
        keras.layers.Activation("tanh"),
        keras.layers.Dense(1 if BUG == "own_micro_batches" else toy_gan.FEATURES)])
    if BUG != "own_micro_batches":
      generator = normalized
    else:
      discriminator = normalized
  if BUG == "layers":
    generator = keras.Sequential([keras.Input((toy_gan.NOISE,)), keras.layers.Dense(16),
                                  keras.layers.BatchNormalization(),
                                  keras.layers.Dense(toy_gan.FEATURES)], name="generator")
    discriminator = keras.Sequential([keras.Input((toy_gan.FEATURES,)), keras.layers.Dense(16),
                                      keras.layers.Dropout(0.5), keras.layers.Dense(1)],
                                     name="discriminator")
  models = {"generator": generator, "discriminator": discriminator}
  return models, {name: keras.optimizers.Adam(1e-2) for name in models}


def train_step(ctx, real):
  if BUG == "own_micro_batches":
    return halves_step(ctx, real)
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  if BUG == "noise_per_replica":
    z = tf.random.stateless_normal([ctx.per_replica_batch_size, toy_gan.NOISE], seed=ctx.seed())
  elif BUG == "random_sync_bn":
    z = tf.random.normal([ctx.per_replica_batch_size, toy_gan.NOISE], seed=1)
  elif BUG == "tf_random":
    z = tf.random.normal([ctx.global_batch_size, toy_gan.NOISE], seed=1)
    z = z[:ctx.per_replica_batch_size]
  else:
    z = ctx.normal([toy_gan.NOISE])
  if BUG == "python_random":
    real = real + float(np.random.normal())
  if BUG == "resizes":
    real = real + tf.image.resize(real[:, :, None, None], [toy_gan.FEATURES, 1])[:, :, 0, 0]
  scale = ctx.num_replicas if BUG == "replica_scaled" else 1
  if BUG == "python_counter":
    calls[0] += 1
    scale = 1 + 0.1 * calls[0]
  with tf.GradientTape(persistent=True) as tape:
    fake = generator(z, training=True)
    real_logits = discriminator(real, training=True)[:, 0]
    fake_logits = discriminator(fake, training=True)[:, 0]
    if BUG == "casts_to_float32":
      real_logits, fake_logits = tf.cast(real_logits, tf.float32), tf.cast(fake_logits,
                                                                            tf.float32)
    per_example = toy_gan.discriminator_loss(real_logits, fake_logits)
    if BUG == "penalty_over_batch":
      per_example += 10.0 * batch_gradient_penalty(discriminator, real)
    d_loss = ctx.average(per_example) * scale
    g_per_example = toy_gan.generator_loss(fake_logits)
    if BUG == "regulariser_batch_mean":
      g_per_example += tf.reduce_sum(tf.square(tf.reduce_mean(fake, 0)))
    g_loss = ctx.average(g_per_example) * scale
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


def batch_gradient_penalty(discriminator, real):
  """(|grad D(x)| - 1)^2, the norm taken over the whole batch's gradient: one value
  for the batch (the bug), where WGAN-GP takes one per example."""
  with tf.GradientTape() as tape:
    tape.watch(real)
    total = tf.reduce_sum(discriminator(real, training=True))
  return tf.square(tf.norm(tape.gradient(total, real)) - 1.0)


def halves_step(ctx, real):
  """One discriminator update per contiguous half of the replica's rows (the bug:
  ctx.minimize(..., micro_batches=2) slices so that each slice is the same global
  examples on any replica count), then the generator's update."""
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  z = ctx.normal([toy_gan.NOISE])
  half = ctx.per_replica_batch_size // 2
  for rows in (slice(0, half), slice(half, None)):
    def d_loss(rows=rows):
      real_logits = discriminator(real[rows], training=True)[:, 0]
      fake_logits = discriminator(generator(z[rows], training=True), training=True)[:, 0]
      return 2 * ctx.average(toy_gan.discriminator_loss(real_logits, fake_logits))
    discriminator_loss = ctx.minimize(d_loss, "discriminator")
  with tf.GradientTape() as tape:
    fake_logits = discriminator(generator(z, training=True), training=True)[:, 0]
    g_loss = ctx.average(toy_gan.generator_loss(fake_logits))
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": discriminator_loss, "generator_loss": g_loss}
