"""Ordinary GAN steps, none tuned for parity, as a module for `ctl parity`.

    PARITY_GAN=hinge_sn ctl parity tests/parity_gans.py --seeds 0-4
    PARITY_GAN=lazy_r1 PARITY_DTYPE=explicit ctl parity tests/parity_gans.py --seeds 0-1

tests/test_parity_suite.py checks that `ctl parity` calls each of them rounding
under every seed, in both dtype variants. $PARITY_GAN picks the step:

  wgan_gp_encoder     WGAN-GP with an encoder (BiGAN/ALI style): 2 critic updates
                      per step, each on its own batch, with the gradient penalty
  wgan_gp_encoder_bn  the same with one critic update per step, accumulated over
                      micro_batches=2, and a synchronized BatchNormalization in
                      the generator
  hinge_sn            hinge loss, spectral normalization in the discriminator
  conditional         class-conditional: labels into both models (one-hot into
                      the generator, a projection in the discriminator)
  bigan_lion          BiGAN: generator, encoder and a joint discriminator, with Lion
  lazy_r1             non-saturating loss with lazy R1 (StyleGAN2): the penalty on
                      real data every 4th step, weighted by 4, in a tf.cond
  sgd_momentum        the plain GAN of the TF tutorials (sigmoid cross-entropy
                      against 1 and 0 labels), SGD with momentum for both models
  lso_clip            least-squares GAN, both optimizers Adam clipped by norm
                      under a LossScaleOptimizer (clipping under loss scaling)
  augment             hinge loss on augmented points (DiffAugment style): a
                      "brightness", a "contrast" and a translation per example,
                      drawn once and applied to the real and the generated
                      example alike, in both updates

$PARITY_DTYPE picks how the steps name their floats, as researchers write both:
"following" (the default) names none, each float follows the data and Keras'
default; "explicit" names float32 where ordinary TF code does: the real data cast
with tf.cast(batch, tf.float32), draws with dtype=tf.float32, constants in the
losses as tf.constant(..., tf.float32), tf.zeros or tf.ones(..., tf.float32) (in
every step but bigan_lion, whose losses have no constant), every Dense and
Embedding layer and every float keras.Input given dtype="float32". The float64
replay must run both without an edit (it promotes every requested float32 to
float64). Both compute the same numbers in float32.

The first five steps' optimizers hold a different mix of the options docs/step.md's
table lists (`OPTIMIZERS`), six or more per step: each option (clipnorm, global_clipnorm,
clipvalue, weight_decay, use_ema, a LossScaleOptimizer, ExponentialDecay and
CosineDecay schedules) in at least two steps, each optimizer (Adam, AdamW,
RMSprop with momentum and centered, SGD with momentum and Nesterov, Lion) in at
least one. The last four each test one thing on plain optimizers.
"""

import os

import keras
import numpy as np
import tensorflow as tf

import gan

GAN = os.environ.get("PARITY_GAN", "wgan_gp_encoder")
GANS = ("wgan_gp_encoder", "wgan_gp_encoder_bn", "hinge_sn", "conditional", "bigan_lion",
        "lazy_r1", "sgd_momentum", "lso_clip", "augment")
if GAN not in GANS:
  raise ValueError(f"PARITY_GAN={GAN!r}: give one of {GANS}.")
DTYPE = os.environ.get("PARITY_DTYPE", "following")
DTYPES = ("following", "explicit")
if DTYPE not in DTYPES:
  raise ValueError(f"PARITY_DTYPE={DTYPE!r}: give one of {DTYPES}.")
# What the steps name as their float: tf.float32 ("explicit"), or nothing, so
# that each float follows its inputs ("following"). LAYER_DTYPE likewise for Keras.
FLOAT = tf.float32 if DTYPE == "explicit" else None
LAYER_DTYPE = "float32" if DTYPE == "explicit" else None

FEATURES, NOISE, CLASSES, GLOBAL_BATCH, WIDTH = 2, 4, 8, 32, 32
GP_WEIGHT = 10.0  # Gulrajani et al. 2017's lambda
# R1's gamma (Mescheder et al. 2018's 10) and StyleGAN2's lazy interval for the
# discriminator (Karras et al. 2020, section 3.1: every 16 minibatches; 4 here,
# so that a run of 5 steps has the penalty twice).
R1_GAMMA, R1_EVERY = 10.0, 4
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


def as_float(x):
  """The real data as the step takes it: cast to float32 ("explicit"), or as it comes."""
  return tf.cast(x, FLOAT) if FLOAT else x


def constant(value):
  """A number in a loss: tf.constant(value, tf.float32) ("explicit"), or the
  Python float, which takes the dtype of the tensor it meets."""
  return tf.constant(value, FLOAT) if FLOAT else value


def zeros(shape, like):
  """tf.zeros in float32 ("explicit"), or in the dtype of `like`."""
  return tf.zeros(shape, FLOAT or like.dtype)


def ones(shape, like):
  """tf.ones in float32 ("explicit"), or in the dtype of `like`."""
  return tf.ones(shape, FLOAT or like.dtype)


def mlp(name, inputs, outputs, *, batch_norm=False, spectral=False):
  def dense(units, **kwargs):
    layer = keras.layers.Dense(units, dtype=LAYER_DTYPE, **kwargs)
    return keras.layers.SpectralNormalization(layer) if spectral else layer

  x = source = keras.Input((inputs,), dtype=LAYER_DTYPE)
  x = dense(WIDTH)(x)
  if batch_norm:
    x = keras.layers.BatchNormalization(synchronized=True)(x)
  x = keras.layers.LeakyReLU(0.2)(x)
  x = dense(WIDTH, activation="tanh")(x)
  return keras.Model(source, dense(outputs)(x), name=name)


def conditional_generator():
  z = keras.Input((NOISE,), dtype=LAYER_DTYPE)
  y = keras.Input((), dtype="int32")
  x = keras.layers.Concatenate()([z, keras.layers.CategoryEncoding(CLASSES, "one_hot")(y)])
  x = keras.layers.Dense(WIDTH, activation="relu", dtype=LAYER_DTYPE)(x)
  return keras.Model([z, y], keras.layers.Dense(FEATURES, dtype=LAYER_DTYPE)(x),
                     name="generator")


def conditional_discriminator():
  """Projection discriminator (Miyato & Koyama 2018): logit + <embed(y), features>.

  (Not under RMSprop(centered=True), which in Keras 3.15 fails on an Embedding's
  sparse gradient from its second update, "indices[0] = 332 is not in [0, 65)",
  with or without ctl.)
  """
  points = keras.Input((FEATURES,), dtype=LAYER_DTYPE)
  y = keras.Input((), dtype="int32")
  features = keras.layers.Dense(WIDTH, activation="relu", dtype=LAYER_DTYPE)(points)
  logit = keras.layers.Dense(1, dtype=LAYER_DTYPE)(features)
  embedded = keras.layers.Embedding(CLASSES, WIDTH, dtype=LAYER_DTYPE)(y)
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
    # The last four: one thing each on plain optimizers.
    "lazy_r1": {  # StyleGAN2's Adam betas
        "generator": lambda: keras.optimizers.Adam(1e-3, beta_1=0.0, beta_2=0.99),
        "discriminator": lambda: keras.optimizers.Adam(1e-3, beta_1=0.0, beta_2=0.99)},
    "sgd_momentum": {
        "generator": lambda: keras.optimizers.SGD(1e-2, momentum=0.9),
        "discriminator": lambda: keras.optimizers.SGD(1e-2, momentum=0.9)},
    "lso_clip": {  # the gradients are unscaled before they are clipped
        "generator": lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(1e-3, clipnorm=1.0)),
        "discriminator": lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(1e-3, clipnorm=1.0))},
    "augment": {  # DCGAN's Adam
        "generator": lambda: keras.optimizers.Adam(1e-3, beta_1=0.5),
        "discriminator": lambda: keras.optimizers.Adam(1e-3, beta_1=0.5)},
}


def build():
  if GAN == "conditional":
    models = {"generator": conditional_generator(),
              "discriminator": conditional_discriminator()}
  elif GAN in ("hinge_sn", "lazy_r1", "sgd_momentum", "lso_clip", "augment"):
    models = {"generator": mlp("generator", NOISE, FEATURES),
              "discriminator": mlp("discriminator", FEATURES, 1, spectral=GAN == "hinge_sn")}
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
      real_pairs, fake_pairs = pairs(as_float(real), ctx.normal([NOISE], dtype=FLOAT))
      per_example = gan.losses.wasserstein.discriminator(critic(real_pairs),
                                                         critic(fake_pairs))
      per_example += constant(GP_WEIGHT) * gan.penalties.wasserstein_gradient_penalty(
          ctx, critic, real_pairs, fake_pairs, weight=1.0)
      return ctx.average(per_example)

    critic_value = ctx.minimize(critic_loss, "discriminator", batch=real,
                                micro_batches=micro_batches)
  with tf.GradientTape(persistent=True) as tape:
    real_pairs, fake_pairs = pairs(as_float(batches[-1]), ctx.normal([NOISE], dtype=FLOAT))
    generator_loss = ctx.average(gan.losses.wasserstein.generator(critic(fake_pairs)))
    encoder_loss = ctx.average(critic(real_pairs))  # the encoder's pairs should look fake
  ctx.minimize(generator_loss, "generator", tape=tape)
  ctx.minimize(encoder_loss, "encoder", tape=tape)
  return {"discriminator_loss": critic_value, "generator_loss": generator_loss,
          "encoder_loss": encoder_loss}


def hinge_sn_step(ctx, real):
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  real = as_float(real)
  with tf.GradientTape(persistent=True) as tape:
    fake = generator(ctx.normal([NOISE], dtype=FLOAT), training=True)
    real_logits = discriminator(real, training=True)
    fake_logits = discriminator(fake, training=True)
    margin = constant(1.0)  # the hinge's (Lim & Ye 2017)
    d_loss = ctx.average(tf.nn.relu(margin - real_logits[:, 0]) +
                         tf.nn.relu(margin + fake_logits[:, 0]))
    g_loss = ctx.average(gan.losses.hinge.generator(fake_logits))
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss,
          "real_score": tf.reduce_mean(tf.sigmoid(real_logits))}  # a per-replica mean


def conditional_step(ctx, batch):
  real, labels = batch
  real = as_float(real)
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  # Each example weighted by its class's weight: all 1, the ring's classes are balanced.
  weights = tf.gather(ones([CLASSES], real), labels)
  with tf.GradientTape(persistent=True) as tape:
    fake = generator([ctx.normal([NOISE], dtype=FLOAT), labels], training=True)
    real_logits = discriminator([real, labels], training=True)
    fake_logits = discriminator([fake, labels], training=True)
    d_loss = ctx.average(gan.losses.non_saturating.discriminator(real_logits, fake_logits),
                         sample_weight=weights)
    g_loss = ctx.average(gan.losses.non_saturating.generator(fake_logits),
                         sample_weight=weights)
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


def bigan_lion_step(ctx, real):
  generator, encoder = ctx.models["generator"], ctx.models["encoder"]
  discriminator = ctx.models["discriminator"]
  real = as_float(real)
  z = ctx.normal([NOISE], dtype=FLOAT)
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


def lazy_r1_step(ctx, real):
  """Non-saturating loss with lazy R1 (Karras et al., "Analyzing and Improving the
  Image Quality of StyleGAN", 2020, section 3.1): R1 (Mescheder et al. 2018,
  equation 9) on the reals only on every R1_EVERY-th step, times R1_EVERY."""
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  real = as_float(real)
  z = ctx.normal([NOISE], dtype=FLOAT)  # before the tf.cond, which may not draw

  def r1():
    with tf.GradientTape() as inner:
      inner.watch(real)
      total = tf.reduce_sum(discriminator(real, training=True))
    gradients = inner.gradient(total, real)
    return constant(R1_GAMMA / 2 * R1_EVERY) * tf.reduce_sum(tf.square(gradients), axis=1)

  with tf.GradientTape(persistent=True) as tape:
    fake = generator(z, training=True)
    real_logits = discriminator(real, training=True)
    fake_logits = discriminator(fake, training=True)
    per_example = gan.losses.non_saturating.discriminator(real_logits, fake_logits)
    per_example += tf.cond(ctx.step % R1_EVERY == 0, r1,
                           lambda: zeros(tf.shape(real)[:1], real))
    d_loss = ctx.average(per_example)
    g_loss = ctx.average(gan.losses.non_saturating.generator(fake_logits))
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


def sgd_momentum_step(ctx, real):
  """The GAN of the TF tutorials: sigmoid cross-entropy against label 1 for the
  real points and 0 for the generated (the generator's loss: 1 for its own)."""
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  real = as_float(real)
  cross_entropy = tf.nn.sigmoid_cross_entropy_with_logits
  with tf.GradientTape(persistent=True) as tape:
    fake = generator(ctx.normal([NOISE], dtype=FLOAT), training=True)
    real_logits = discriminator(real, training=True)[:, 0]
    fake_logits = discriminator(fake, training=True)[:, 0]
    rows = tf.shape(real_logits)
    d_loss = ctx.average(
        cross_entropy(labels=ones(rows, real_logits), logits=real_logits) +
        cross_entropy(labels=zeros(rows, fake_logits), logits=fake_logits))
    g_loss = ctx.average(cross_entropy(labels=ones(rows, fake_logits), logits=fake_logits))
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


def lso_clip_step(ctx, real):
  """Least squares (Mao et al. 2017, equation 9, 0-1 coding) under
  LossScaleOptimizer(Adam(clipnorm=1.0)): clipping the unscaled gradients."""
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  real = as_float(real)
  real_label, half = constant(1.0), constant(0.5)
  with tf.GradientTape(persistent=True) as tape:
    fake = generator(ctx.normal([NOISE], dtype=FLOAT), training=True)
    real_logits = discriminator(real, training=True)[:, 0]
    fake_logits = discriminator(fake, training=True)[:, 0]
    d_loss = ctx.average(half * tf.square(real_logits - real_label) +
                         half * tf.square(fake_logits))
    g_loss = ctx.average(half * tf.square(fake_logits - real_label))
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


def augment_step(ctx, real):
  """Hinge loss on augmented points, DiffAugment style (Zhao et al. 2020): a
  "brightness" (one offset for both coordinates), a "contrast" (a scale about
  the point's mean coordinate) and a translation, drawn per example, applied
  the same to real example i and generated example i, in both updates, so the
  generator's gradient flows through them."""
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  real = as_float(real)
  z = ctx.normal([NOISE], dtype=FLOAT)
  brightness = ctx.uniform([1], -0.5, 0.5, dtype=FLOAT)
  contrast = ctx.uniform([1], 0.5, 1.5, dtype=FLOAT)
  translation = ctx.uniform([FEATURES], -0.25, 0.25, dtype=FLOAT)

  def augment(points):
    points = points + brightness
    mean = tf.reduce_mean(points, axis=1, keepdims=True)
    return (points - mean) * contrast + mean + translation

  with tf.GradientTape(persistent=True) as tape:
    fake = generator(z, training=True)
    real_logits = discriminator(augment(real), training=True)[:, 0]
    fake_logits = discriminator(augment(fake), training=True)[:, 0]
    margin = constant(1.0)
    d_loss = ctx.average(tf.nn.relu(margin - real_logits) + tf.nn.relu(margin + fake_logits))
    g_loss = ctx.average(-fake_logits)
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


STEPS = {"wgan_gp_encoder": wgan_gp_encoder_step, "wgan_gp_encoder_bn": wgan_gp_encoder_step,
         "hinge_sn": hinge_sn_step, "conditional": conditional_step,
         "bigan_lion": bigan_lion_step, "lazy_r1": lazy_r1_step,
         "sgd_momentum": sgd_momentum_step, "lso_clip": lso_clip_step,
         "augment": augment_step}
