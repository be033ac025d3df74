"""Ordinary GAN steps, none tuned for parity, as a module for `ctl parity`.

    PARITY_GAN=hinge_sn ctl parity tests/parity_gans.py --seeds 0-4

tests/test_parity_suite.py checks that `ctl parity` calls each of them rounding
under every seed. $PARITY_GAN picks the step:

  wgan_gp_encoder     WGAN-GP with an encoder (BiGAN/ALI style): 2 critic updates
                      per step, each on its own batch, with the gradient penalty
  wgan_gp_encoder_bn  the same with one critic update per step, accumulated over
                      micro_batches=2, and a synchronized BatchNormalization in
                      the generator
  hinge_sn            hinge loss, spectral normalization in the discriminator
  conditional         class-conditional: labels into both models (one-hot into
                      the generator, a projection in the discriminator)
  bigan_lion          BiGAN: generator, encoder and a joint discriminator, with Lion

Each step's optimizers hold a different mix of the options docs/step.md's table lists
(`OPTIMIZERS`), six or more per step: each option (clipnorm, global_clipnorm,
clipvalue, weight_decay, use_ema, a LossScaleOptimizer, ExponentialDecay and
CosineDecay schedules) in at least two steps, each optimizer (Adam, AdamW,
RMSprop with momentum and centered, SGD with momentum and Nesterov, Lion) in at
least one.
"""

import os

import keras
import numpy as np
import tensorflow as tf

import gan

GAN = os.environ.get("PARITY_GAN", "wgan_gp_encoder")
GANS = ("wgan_gp_encoder", "wgan_gp_encoder_bn", "hinge_sn", "conditional", "bigan_lion")
if GAN not in GANS:
  raise ValueError(f"PARITY_GAN={GAN!r}: give one of {GANS}.")

FEATURES, NOISE, CLASSES, GLOBAL_BATCH, WIDTH = 2, 4, 8, 32, 32
batches_per_step = 2 if GAN == "wgan_gp_encoder" else 1
seed = 0


def data():
  """A ring of 8 Gaussians in 2-D (the mode-collapse study's data), with each
  point's mode as its label for the conditional GAN."""
  rng = np.random.default_rng(1)
  labels = rng.integers(0, CLASSES, 64 * GLOBAL_BATCH)
  angles = labels * (2 * np.pi / CLASSES)
  points = np.stack([2 * np.cos(angles), 2 * np.sin(angles)], -1)
  points = (points + rng.normal(scale=0.05, size=points.shape)).astype("float32")
  elements = (points, labels.astype("int32")) if GAN == "conditional" else points
  return tf.data.Dataset.from_tensor_slices(elements).repeat().batch(
      GLOBAL_BATCH, drop_remainder=True)


def mlp(name, inputs, outputs, *, batch_norm=False, spectral=False):
  def dense(units, **kwargs):
    layer = keras.layers.Dense(units, **kwargs)
    return keras.layers.SpectralNormalization(layer) if spectral else layer

  x = source = keras.Input((inputs,))
  x = dense(WIDTH)(x)
  if batch_norm:
    x = keras.layers.BatchNormalization(synchronized=True)(x)
  x = keras.layers.LeakyReLU(0.2)(x)
  x = dense(WIDTH, activation="tanh")(x)
  return keras.Model(source, dense(outputs)(x), name=name)


def conditional_generator():
  z = keras.Input((NOISE,))
  y = keras.Input((), dtype="int32")
  x = keras.layers.Concatenate()([z, keras.layers.CategoryEncoding(CLASSES, "one_hot")(y)])
  x = keras.layers.Dense(WIDTH, activation="relu")(x)
  return keras.Model([z, y], keras.layers.Dense(FEATURES)(x), name="generator")


def conditional_discriminator():
  """Projection discriminator (Miyato & Koyama 2018): logit + <embed(y), features>.

  (Not under RMSprop(centered=True), which in Keras 3.15 fails on an Embedding's
  sparse gradient from its second update, "indices[0] = 332 is not in [0, 65)",
  with or without ctl.)
  """
  points = keras.Input((FEATURES,))
  y = keras.Input((), dtype="int32")
  features = keras.layers.Dense(WIDTH, activation="relu")(points)
  logit = keras.layers.Dense(1)(features)
  embedded = keras.layers.Embedding(CLASSES, WIDTH)(y)
  logit = keras.layers.Add()([logit, keras.layers.Dot(axes=1)([embedded, features])])
  return keras.Model([points, y], logit, name="discriminator")


def exponential(rate):
  return keras.optimizers.schedules.ExponentialDecay(rate, 5, 0.9)


def cosine(rate):
  return keras.optimizers.schedules.CosineDecay(rate, 20)


# GAN -> model -> its optimizer: a different mix of the options per step.
OPTIMIZERS = {
    "wgan_gp_encoder": {
        "generator": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW(
            exponential(1e-3), weight_decay=1e-3, global_clipnorm=1.0)),
        "discriminator": lambda: keras.optimizers.RMSprop(1e-3, momentum=0.9, centered=True,
                                                          clipvalue=0.5),
        "encoder": lambda: keras.optimizers.SGD(cosine(1e-2), momentum=0.9, nesterov=True,
                                                clipnorm=1.0)},
    "wgan_gp_encoder_bn": {
        "generator": lambda: keras.optimizers.Adam(exponential(1e-3), clipnorm=1.0,
                                                   weight_decay=1e-4, use_ema=True),
        "discriminator": lambda: keras.optimizers.AdamW(1e-3, beta_1=0.5, beta_2=0.9,
                                                        weight_decay=1e-3, global_clipnorm=1.0),
        "encoder": lambda: keras.optimizers.RMSprop(1e-3, momentum=0.9, clipvalue=0.5,
                                                    use_ema=True)},
    "hinge_sn": {
        "generator": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(
            exponential(1e-3), clipnorm=1.0, use_ema=True)),
        "discriminator": lambda: keras.optimizers.SGD(1e-2, momentum=0.9, nesterov=True,
                                                      weight_decay=1e-4, global_clipnorm=1.0)},
    "conditional": {
        "generator": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(
            cosine(1e-3), global_clipnorm=1.0)),
        "discriminator": lambda: keras.optimizers.Adam(1e-3, weight_decay=1e-4, clipvalue=0.5,
                                                       use_ema=True)},
    "bigan_lion": {
        "generator": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Lion(
            exponential(1e-4), global_clipnorm=1.0)),
        "discriminator": lambda: keras.optimizers.Lion(1e-4, clipvalue=0.5, use_ema=True),
        "encoder": lambda: keras.optimizers.Lion(cosine(1e-4), weight_decay=1e-3,
                                                 clipnorm=1.0)},
}


def build():
  if GAN == "conditional":
    models = {"generator": conditional_generator(),
              "discriminator": conditional_discriminator()}
  elif GAN == "hinge_sn":
    models = {"generator": mlp("generator", NOISE, FEATURES),
              "discriminator": mlp("discriminator", FEATURES, 1, spectral=True)}
  else:  # generator, encoder and a discriminator of (x, z) pairs
    models = {"generator": mlp("generator", NOISE, FEATURES,
                               batch_norm=GAN == "wgan_gp_encoder_bn"),
              "encoder": mlp("encoder", FEATURES, NOISE),
              "discriminator": mlp("discriminator", FEATURES + NOISE, 1)}
  return models, {name: OPTIMIZERS[GAN][name]() for name in models}


def train_step(ctx, batch):
  return STEPS[GAN](ctx, batch)


def wgan_gp_encoder_step(ctx, batches):
  generator, encoder = ctx.models["generator"], ctx.models["encoder"]
  micro_batches = 2 if GAN == "wgan_gp_encoder_bn" else 1
  if batches_per_step == 1:
    batches = (batches,)

  def critic(pairs):
    return ctx.models["discriminator"](pairs, training=True)[:, 0]

  def pairs(real, z):
    return (tf.concat([real, encoder(real, training=True)], -1),
            tf.concat([generator(z, training=True), z], -1))

  for real in batches:  # the critic's updates, each on its own batch
    def critic_loss(real):
      real_pairs, fake_pairs = pairs(real, ctx.normal([NOISE]))
      per_example = gan.losses.wasserstein.discriminator(critic(real_pairs),
                                                         critic(fake_pairs))
      per_example += gan.penalties.wasserstein_gradient_penalty(ctx, critic, real_pairs,
                                                                fake_pairs)
      return ctx.average(per_example)

    critic_value = ctx.minimize(critic_loss, "discriminator", batch=real,
                                micro_batches=micro_batches)
  with tf.GradientTape(persistent=True) as tape:
    real_pairs, fake_pairs = pairs(batches[-1], ctx.normal([NOISE]))
    generator_loss = ctx.average(gan.losses.wasserstein.generator(critic(fake_pairs)))
    encoder_loss = ctx.average(critic(real_pairs))  # the encoder's pairs should look fake
  ctx.minimize(generator_loss, "generator", tape=tape)
  ctx.minimize(encoder_loss, "encoder", tape=tape)
  return {"discriminator_loss": critic_value, "generator_loss": generator_loss,
          "encoder_loss": encoder_loss}


def hinge_sn_step(ctx, real):
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  with tf.GradientTape(persistent=True) as tape:
    fake = generator(ctx.normal([NOISE]), training=True)
    real_logits = discriminator(real, training=True)
    fake_logits = discriminator(fake, training=True)
    d_loss = ctx.average(gan.losses.hinge.discriminator(real_logits, fake_logits))
    g_loss = ctx.average(gan.losses.hinge.generator(fake_logits))
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss,
          "real_score": tf.reduce_mean(tf.sigmoid(real_logits))}  # a per-replica mean


def conditional_step(ctx, batch):
  real, labels = batch
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  with tf.GradientTape(persistent=True) as tape:
    fake = generator([ctx.normal([NOISE]), labels], training=True)
    real_logits = discriminator([real, labels], training=True)
    fake_logits = discriminator([fake, labels], training=True)
    d_loss = ctx.average(gan.losses.non_saturating.discriminator(real_logits, fake_logits))
    g_loss = ctx.average(gan.losses.non_saturating.generator(fake_logits))
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


def bigan_lion_step(ctx, real):
  generator, encoder = ctx.models["generator"], ctx.models["encoder"]
  discriminator = ctx.models["discriminator"]
  z = ctx.normal([NOISE])
  with tf.GradientTape(persistent=True) as tape:
    real_logits = discriminator(tf.concat([real, encoder(real, training=True)], -1),
                                training=True)
    fake_logits = discriminator(tf.concat([generator(z, training=True), z], -1),
                                training=True)
    d_loss = ctx.average(gan.losses.non_saturating.discriminator(real_logits, fake_logits))
    # The generator and the encoder each try to pass for the other side.
    g_loss = ctx.average(gan.losses.non_saturating.generator(fake_logits))
    e_loss = ctx.average(gan.losses.non_saturating.generator(-real_logits))
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  ctx.minimize(e_loss, "encoder", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss, "encoder_loss": e_loss}


STEPS = {"wgan_gp_encoder": wgan_gp_encoder_step, "wgan_gp_encoder_bn": wgan_gp_encoder_step,
         "hinge_sn": hinge_sn_step, "conditional": conditional_step,
         "bigan_lion": bigan_lion_step}
