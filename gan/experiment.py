"""A GAN experiment from parts: the step, the models, the outer loop; driven by gin.

    gan.train("runs/wgan_gp", num_steps=5000,
              generator_loss=gan.wasserstein_generator_loss,
              discriminator_loss=gan.wasserstein_discriminator_loss,
              penalty=gan.wasserstein_gradient_penalty, discriminator_steps=5)

    ctl train examples/configs/wgan_gp.gin   # the same, from a .gin file

`make_step` is an ordinary ctl step (read it to see how a GAN step is written);
`train` wires it to a `ctl.Runner` and `fit` with checkpoints, summaries,
sample grids, classifier FID and export; `mode="eval"`, `"export"` or `"build"`
restores and evaluates, restores and exports, or only builds the same runner
(what `ctl eval`, `ctl export` and `ctl check` run). With `encoder` it trains a
BiGAN/ALI (three models, three optimizers); with `num_classes` a
class-conditional GAN; with `ema_decay` an EMA copy of the generator that
samples, FID and export use.
"""

import functools
import inspect
import logging
import os
import warnings

import gin
import keras
import numpy as np
import tensorflow as tf

import ctl
from gan import data as data_lib
from gan import ema as ema_lib
from gan import losses
from gan import models as models_lib
from gan import penalties

_log = logging.getLogger("ctl.gan")  # shown by ctl's handler

# Adam(2e-4, beta_1=0.5): the DCGAN paper's settings (Radford et al. 2016, section 4).
default_optimizer = functools.partial(keras.optimizers.Adam, 2e-4, beta_1=0.5)
gin.external_configurable(keras.optimizers.Adam, module="keras.optimizers")
gin.external_configurable(keras.optimizers.RMSprop, module="keras.optimizers")


def _is(fn, target):
  """Whether `fn` is `target`, also when gin handed over its configured wrapper."""
  return inspect.unwrap(fn) is target


def make_step(*, generator_loss, discriminator_loss, penalty=penalties.no_penalty,
              noise_dim=64, discriminator_steps=1, conditional=False, encoder=False,
              ema_decay=None, ema_start_step=0):
  """A ctl step: `discriminator_steps` discriminator updates, then one generator update.

  Each discriminator update takes its own batch (the runner's
  `batches_per_step`). A batch is images, or `(images, labels)` when
  `conditional`; fakes are then drawn for the real batch's labels. With
  `encoder`, the discriminator scores pairs `(x, E(x))` against `(G(z), z)`,
  and the generator and encoder both minimise the discriminator loss with the
  labels swapped (Donahue et al. 2017, section 3).
  """
  penalized = not _is(penalty, penalties.no_penalty)
  if encoder and penalized:
    raise ValueError("penalty: a BiGAN/ALI discriminator scores (image, code) pairs, "
                     f"and {getattr(penalty, '__name__', penalty)} penalises image "
                     "gradients only; use gan.no_penalty with an encoder.")

  def pair_logits(ctx, real, fake, z):
    """BiGAN/ALI: the discriminator's logits on (x, E(x)) and on (G(z), z)."""
    codes = ctx.models["encoder"](real, training=True)
    discriminator = ctx.models["discriminator"]
    return (discriminator([real, codes], training=True),
            discriminator([fake, z], training=True))

  def critic_update(ctx, real, labels):
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
    z = ctx.normal([noise_dim])
    with tf.GradientTape() as tape:
      fake = generator([z, labels] if conditional else z, training=True)
      if encoder:
        real_logits, fake_logits = pair_logits(ctx, real, fake, z)
        extra = tf.zeros([tf.shape(real)[0]])
      else:
        critic = (lambda x: discriminator([x, labels], training=True)) if conditional else (
            lambda x: discriminator(x, training=True))
        real_logits, fake_logits = critic(real), critic(fake)
        extra = penalty(ctx, critic, real, fake)
      loss = ctx.average(discriminator_loss(real_logits, fake_logits))
      extra = ctx.average(extra)
      total = loss + extra
    ctx.minimize(total, "discriminator", tape=tape)
    return loss, extra

  def generator_update(ctx, real, labels):
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
    z = ctx.normal([noise_dim])
    with tf.GradientTape(persistent=encoder) as tape:
      fake = generator([z, labels] if conditional else z, training=True)
      if encoder:
        real_logits, fake_logits = pair_logits(ctx, real, fake, z)
        # Swapped labels: fakes should look real, real pairs fake.
        loss = ctx.average(discriminator_loss(fake_logits, real_logits))
      else:
        fake_logits = discriminator([fake, labels] if conditional else fake, training=True)
        loss = ctx.average(generator_loss(fake_logits))
    ctx.minimize(loss, "generator", tape=tape)
    if encoder:
      ctx.minimize(loss, "encoder", tape=tape)
    return loss

  def step(ctx, batches):
    batches = batches if discriminator_steps > 1 else (batches,)
    for batch in batches:
      real, labels = batch if conditional else (batch, None)
      d_loss, extra = critic_update(ctx, real, labels)
    g_loss = generator_update(ctx, real, labels)
    if ema_decay is not None:
      ema_lib.update_ema(ctx, ctx.models["generator_ema"], ctx.models["generator"],
                         decay=ema_decay, start_step=ema_start_step)
    results = {"discriminator_loss": d_loss, "generator_loss": g_loss}
    if penalized:
      results["penalty"] = extra
    return results

  return step


def make_build(*, generator, discriminator, encoder=None, image_shape, noise_dim,
               num_classes=None, generator_optimizer=default_optimizer,
               discriminator_optimizer=default_optimizer,
               encoder_optimizer=default_optimizer, ema_decay=None):
  """The runner's `build`: models from the factories, sized for the data; optimizers."""
  conditional = {"num_classes": num_classes} if num_classes else {}

  def build():
    models = {"generator": generator(noise_dim=noise_dim, image_shape=image_shape,
                                     **conditional)}
    if encoder is not None:
      models["encoder"] = encoder(latent_dim=noise_dim, image_shape=image_shape)
      models["discriminator"] = discriminator(latent_dim=noise_dim, image_shape=image_shape)
    else:
      models["discriminator"] = discriminator(image_shape=image_shape, **conditional)
    optimizers = {"generator": generator_optimizer(),
                  "discriminator": discriminator_optimizer()}
    if encoder is not None:
      optimizers["encoder"] = encoder_optimizer()
    if ema_decay is not None:
      models["generator_ema"] = ema_lib.ema_copy(models["generator"], "generator_ema")
    return models, optimizers

  return build


def fixed_samples(noise_dim, *, num_classes=None, rows=8, model="generator", seed=0):
  """A function of the models giving a rows x rows grid from the same noise each time.

  Class-conditional: a 10 x 10 grid (for 10 classes), one class per column.
  """
  count = (num_classes or rows) ** 2
  z = np.random.default_rng(seed).normal(size=(count, noise_dim)).astype("float32")
  labels = (np.arange(count) % num_classes).astype("int32") if num_classes else None
  return lambda models: models[model]([z, labels] if num_classes else z, training=False)


class ClassifierFID(ctl.Action):
  """Action: classifier FID of generated digits against the held-out MNIST digits.

  Computed in the feature space of the small MNIST classifier shipped with
  `gan.evaluation` (not Inception), against `gan.load_mnist("test")`, which no
  model trains on. Written as `classifier_fid` to `events/eval`; the latest
  value is `self.history[-1]`.
  """

  collective = False  # generated and scored on the chief alone

  def __init__(self, noise_dim, every=None, *, num_samples=5000, num_classes=None,
               model="generator", seed=1):
    self.every = every
    self.history = []
    self._model = model
    rng = np.random.default_rng(seed)
    self._z = rng.normal(size=(num_samples, noise_dim)).astype("float32")
    self._labels = (np.arange(num_samples) % num_classes).astype("int32") if num_classes else None
    self._reference = None

  def generate(self, models, batch_size=500):
    out = []
    for start in range(0, len(self._z), batch_size):
      z = self._z[start:start + batch_size]
      inputs = [z, self._labels[start:start + batch_size]] if self._labels is not None else z
      out.append(np.asarray(models[self._model](inputs, training=False)))
    return np.concatenate(out)

  def compute(self, models):
    """The classifier FID of `models[model]`'s samples against the held-out digits."""
    from gan import evaluation  # loads the classifier only when FID is asked for
    if self._reference is None:
      self._reference = evaluation.classifier_features(data_lib.load_mnist("test")[0])
    fake = evaluation.classifier_features(self.generate(models))
    return float(evaluation.frechet_distance(fake, self._reference))

  def __call__(self, context):
    value = self.compute(context.runner.models)
    self.history.append((context.step, value))
    with context.writer("eval").as_default(step=context.step):
      tf.summary.scalar("classifier_fid", value)
    _log.info("classifier FID at step %d: %.3f", context.step, value)


MODES = ("train", "eval", "export", "build")


# `mode` and `export_dir` say what to do with the experiment, not what it is:
# the command line passes them, and the operative config does not record them.
@gin.configurable(module="gan", denylist=["mode", "export_dir"])
def train(workdir, *, num_steps=5000, dataset=data_lib.mnist_dataset, batch_size=64,
          generator=models_lib.dcgan_generator, discriminator=models_lib.dcgan_discriminator,
          encoder=None, generator_loss=losses.non_saturating_generator_loss,
          discriminator_loss=losses.non_saturating_discriminator_loss,
          penalty=penalties.no_penalty, discriminator_steps=1, noise_dim=64,
          num_classes=None, generator_optimizer=default_optimizer,
          discriminator_optimizer=default_optimizer, encoder_optimizer=default_optimizer,
          ema_decay=None, ema_start_step=0, strategy="default", steps_per_loop=50,
          samples_every=500, fid_every=None, fid_samples=5000, checkpoint_every=1000,
          seed=0, progress=True, mode="train", export_dir=None):
  """Trains (or evaluates, exports, builds) a GAN built from parts; rerun to resume.

  `ctl train|eval|export|check CONFIG.gin` call this with the `mode` of the
  subcommand; every mode builds the same runner.

  Args:
    workdir: where checkpoints, events, samples and the export go.
    num_steps: the generator step to train up to.
    dataset: a function `(global_batch_size) -> tf.data.Dataset` of images
      in [-1, 1] (or `(images, labels)` with `num_classes`).
    batch_size: global batch size.
    generator, discriminator, encoder: model factories. The generator is called
      with `noise_dim`, `image_shape` (and `num_classes`); the discriminator
      with `image_shape` (and `num_classes`), or with `latent_dim` when there
      is an encoder (a BiGAN pair discriminator such as
      `gan.bigan_discriminator`); the encoder with `latent_dim`, `image_shape`.
    generator_loss, discriminator_loss: a loss family from `gan.losses`.
    penalty: a discriminator penalty from `gan.penalties`.
    discriminator_steps: discriminator updates per generator update, each on
      its own batch (WGAN-GP uses 5).
    noise_dim: size of the generator's noise (and the encoder's code).
    num_classes: train a class-conditional GAN on `(images, labels)` batches.
    generator_optimizer, discriminator_optimizer, encoder_optimizer: functions
      returning a Keras optimizer (called in the strategy's scope).
    ema_decay: keep an EMA copy of the generator (`generator_ema`) with this
      decay, from `ema_start_step`; samples, FID and export then use it.
    strategy: a `ctl.make_strategy` name or a `tf.distribute.Strategy`.
    steps_per_loop: steps per compiled call.
    samples_every: steps between PNG sample grids.
    fid_every: steps between classifier FIDs (28x28x1 images only); None: at
      the end only; 0: never.
    fid_samples: generated images per FID.
    checkpoint_every: steps between checkpoints (and at the end).
    seed: the runner's seed (initial weights, noise).
    progress: show progress.
    mode: "train" fits to `num_steps`, resuming from `<workdir>/checkpoints`;
      "build" returns the runner untrained; "eval" restores the newest
      checkpoint and returns `{"step": ..., "classifier_fid": ...}` (FID for
      28x28x1 images only); "export" restores it and exports the generator
      (or its EMA copy).
    export_dir: where mode "export" writes (default `<workdir>/export`).

  Returns:
    The `ctl.Runner` ("train", "build"), the metrics ("eval"), or the paths
    of the `.keras` file and the SavedModel ("export").

  Raises:
    FileNotFoundError: mode "eval" or "export" and no checkpoint in the workdir.
  """
  if mode not in MODES:
    raise ValueError(f"mode {mode!r} is not known; use one of {', '.join(MODES)}.")
  if encoder is not None and _is(discriminator, models_lib.dcgan_discriminator):
    raise ValueError("encoder is set, so the discriminator must score (image, code) "
                     "pairs; pass discriminator=gan.bigan_discriminator.")
  # The strategy first: a multi-worker one must exist before any TF op (the dataset's).
  strategy = ctl.make_strategy(strategy) if isinstance(strategy, str) else strategy
  data, image_shape = _data(dataset, batch_size, num_classes)
  runner = ctl.Runner(
      make_step(generator_loss=generator_loss, discriminator_loss=discriminator_loss,
                penalty=penalty, noise_dim=noise_dim,
                discriminator_steps=discriminator_steps, conditional=bool(num_classes),
                encoder=encoder is not None, ema_decay=ema_decay,
                ema_start_step=ema_start_step),
      make_build(generator=generator, discriminator=discriminator, encoder=encoder,
                 image_shape=image_shape, noise_dim=noise_dim, num_classes=num_classes,
                 generator_optimizer=generator_optimizer,
                 discriminator_optimizer=discriminator_optimizer,
                 encoder_optimizer=encoder_optimizer, ema_decay=ema_decay),
      data, strategy=strategy, seed=seed, steps_per_loop=steps_per_loop,
      batches_per_step=discriminator_steps)
  shown = "generator_ema" if ema_decay is not None else "generator"
  fid = None
  if image_shape == (28, 28, 1):  # the classifier's digits
    fid = ClassifierFID(noise_dim, ctl.Every(steps=fid_every) if fid_every else None,
                        num_samples=fid_samples, num_classes=num_classes, model=shown)
  if mode == "build":
    return runner
  if mode == "train":
    actions = [ctl.Samples(fixed_samples(noise_dim, num_classes=num_classes, model=shown),
                           ctl.Every(steps=samples_every)),
               ctl.Export(shown)] + ([fid] if fid and fid_every != 0 else [])
    runner.fit(num_steps, workdir, checkpoint=ctl.Checkpoint(ctl.Every(steps=checkpoint_every)),
               actions=actions, progress=progress)
    return runner
  step = runner.restore(workdir)
  if mode == "eval":
    return {"step": step, **({"classifier_fid": fid.compute(runner.models)} if fid else {})}
  return runner.export(shown, export_dir or os.path.join(workdir, "export"))


def _data(dataset, batch_size, num_classes):
  """The dataset of global batches and its image shape, checked against num_classes."""
  data = dataset(batch_size)
  if num_classes and not isinstance(data.element_spec, tuple):
    raise ValueError(f"num_classes={num_classes} needs a dataset of (images, labels); "
                     "pass with_labels=True to the dataset function.")
  spec = data.element_spec[0] if num_classes else data.element_spec
  warn_if_out_of_range(data, num_classes)
  return data, tuple(int(d) for d in spec.shape[1:])


def warn_if_out_of_range(data, num_classes):
  """Warns if the first batch's images are not in the generator's (-1, 1).

  Images in [0, 255] (or [0, 1]) let the discriminator tell real from fake by
  their range alone, and the GAN then learns nothing: the easy mistake, and a
  silent one.
  """
  first = next(iter(data.take(1)))
  images = first[0] if num_classes else first
  low, high = float(tf.reduce_min(images)), float(tf.reduce_max(images))
  if images.dtype.is_integer or low < -1.001 or high > 1.001:
    warnings.warn(
        f"gan.train: the first batch of images holds values in [{low:g}, {high:g}] "
        f"({images.dtype.name}), but the generator's tanh output is in [-1, 1]: the "
        "discriminator can tell real from fake by the range alone. Scale the images "
        "to [-1, 1] in the dataset function, e.g. tf.cast(x, tf.float32) / 127.5 - 1.",
        stacklevel=3)
