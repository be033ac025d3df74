"""A toy GAN step for `ctl parity`, with the bug named by $PLANTED_BUG planted in it.

    PLANTED_BUG=noise_per_replica ctl parity tests/parity_planted.py --against mirrored:2

Bugs (tests/test_parity_tool.py checks that `ctl parity` names each):
  replica_scaled      the losses multiplied by ctx.num_replicas
  noise_per_replica   noise from tf.random with the replica's batch size
  layers              Keras Dropout in the discriminator, BatchNormalization in the generator
  python_random       an unseeded np.random draw in the step
  (unset)             none: every configuration is within rounding
"""

import os

import keras
import numpy as np
import tensorflow as tf

import toy_gan

BUG = os.environ.get("PLANTED_BUG", "")
seed = 7


def data():
  return toy_gan.batches(toy_gan.normal_features(64, seed=1234), repeat=True)


def build():
  generator = toy_gan.mlp("generator", toy_gan.NOISE, toy_gan.FEATURES, seed=10)
  discriminator = toy_gan.mlp("discriminator", toy_gan.FEATURES, 1, seed=20)
  if BUG == "layers":
    generator = keras.Sequential([keras.Input((toy_gan.NOISE,)), keras.layers.Dense(16),
                                  keras.layers.BatchNormalization(),
                                  keras.layers.Dense(toy_gan.FEATURES)], name="generator")
    discriminator = keras.Sequential([keras.Input((toy_gan.FEATURES,)), keras.layers.Dense(16),
                                      keras.layers.Dropout(0.5), keras.layers.Dense(1)],
                                     name="discriminator")
  models = {"generator": generator, "discriminator": discriminator}
  return models, {name: keras.optimizers.Adam(1e-2) for name in models}


def step(ctx, real):
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  if BUG == "noise_per_replica":
    z = tf.random.stateless_normal([ctx.per_replica_batch_size, toy_gan.NOISE], seed=ctx.seed())
  else:
    z = ctx.normal([toy_gan.NOISE])
  if BUG == "python_random":
    real = real + float(np.random.normal())
  scale = ctx.num_replicas if BUG == "replica_scaled" else 1
  with tf.GradientTape(persistent=True) as tape:
    fake = generator(z, training=True)
    real_logits = discriminator(real, training=True)[:, 0]
    fake_logits = discriminator(fake, training=True)[:, 0]
    d_loss = ctx.average(toy_gan.discriminator_loss(real_logits, fake_logits)) * scale
    g_loss = ctx.average(toy_gan.generator_loss(fake_logits)) * scale
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}
