"""A GAN experiment as an object: its parts, and one method per job.

    experiment = gan.Experiment(loss=gan.losses.wasserstein,
                                penalty=gan.penalties.wasserstein_gradient_penalty,
                                discriminator_steps=5, schedule=gan.Schedule(total_steps=1000))
    experiment.train("runs/wgan_gp")         # rerun to resume
    experiment.evaluate("runs/wgan_gp")      # {"step": 1000, "classifier_fid": ...}
    experiment.export("runs/wgan_gp")        # the generator: .keras and a SavedModel

    ctl train wgan_gp                        # the same, from gan/configs/wgan_gp.gin

`Experiment` says what the experiment is (data, models, loss family, penalty,
optimizers, EMA, `Schedule`); its methods build, train, evaluate and export
the same runner, and are what the `ctl` command calls (the contract is
`ctl.tools.experiments.Experiment`). `make_step` is the ordinary ctl step it trains
(read it to see how a GAN step is written) and `make_build` the runner's
`build`; `fixed_samples` and `ClassifierFID` are the outer loop's sample grids
and FID, usable in a hand-written `fit`.
"""

import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable
from collections.abc import Sequence

import gin
import keras
import numpy as np
import tensorflow as tf

import ctl
from ctl import arguments
from gan import augment as augment_lib
from gan import data as data_lib
from gan import ema as ema_lib
from gan import losses
from gan import models as models_lib
from gan import penalties

_log = logging.getLogger("ctl.gan")  # shown wherever the "ctl" logger is

# Adam(2e-4, beta_1=0.5): the DCGAN paper's settings (Radford et al. 2016, section 4).
default_optimizer = functools.partial(keras.optimizers.Adam, 2e-4, beta_1=0.5)
for _optimizer in (keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.RMSprop,
                   keras.optimizers.SGD, keras.optimizers.Lion):
  gin.external_configurable(_optimizer, module="keras.optimizers")
for _schedule in (keras.optimizers.schedules.PiecewiseConstantDecay,
                  keras.optimizers.schedules.CosineDecay):
  gin.external_configurable(_schedule, module="keras.optimizers.schedules")

Strategy = str | tf.distribute.Strategy  # a ctl.make_strategy name, or a strategy
Optimizer = Callable[[], keras.optimizers.Optimizer]  # called in the strategy's scope


def _is(fn: Callable, target: Callable) -> bool:
  """Whether `fn` is `target`, also when gin handed over its configured wrapper."""
  return inspect.unwrap(fn) is target


def bigan_loss(loss: losses.LossFamily, real_logits: tf.Tensor,
               fake_logits: tf.Tensor) -> tf.Tensor:
  """BiGAN's generator-and-encoder loss: fake pairs should pass for real, real
  pairs for fake. The discriminator loss with the labels swapped, except for
  hinge, where that stops the encoder's gradient once real pairs score below
  -1: there, BigBiGAN's linear l_EG (Donahue & Simonyan 2019, "Large Scale
  Adversarial Representation Learning", section 2)."""
  if loss == losses.hinge:
    return loss.generator(fake_logits) - loss.generator(real_logits)
  return loss.discriminator(fake_logits, real_logits)


def summed_over_scores(fn: Callable, real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
  """`fn(real_logits, fake_logits)` per example; for logits `[B, K]`, K > 1 (the
  joint and unary scores of `gan.models.bigan_discriminator(unary=True)`),
  `fn` of each score's column, summed: BigBiGAN's losses (Donahue & Simonyan
  2019, section 2)."""
  if real_logits.shape.rank == 2 and real_logits.shape[-1] > 1:
    return tf.add_n([fn(real_logits[:, k], fake_logits[:, k])
                     for k in range(real_logits.shape[-1])])
  return fn(real_logits, fake_logits)


def make_step(*, loss: losses.LossFamily = losses.non_saturating,
              penalty: Callable = penalties.no_penalty, noise_dim: int = 64,
              discriminator_steps: int = 1, conditional: bool = False, encoder: bool = False,
              ema_decay: float | None = None, ema_start_step: int = 0,
              augment: Sequence[str] = (), reconstruction_weight: float = 0.0,
              latent_weight: float = 0.0) -> Callable:
  """A ctl step: `discriminator_steps` discriminator updates, then one generator update.

  Each discriminator update takes its own batch (the runner's
  `batches_per_step`). A batch is images, or `(images, labels)` when
  `conditional`; fakes are then drawn for the real batch's labels. With
  `encoder`, the discriminator scores pairs `(x, E(x))` against `(G(z), z)`,
  and the generator and encoder both minimise the discriminator loss with the
  labels swapped (Donahue et al. 2017, section 3), for hinge in its linear
  form (`bigan_loss`); a discriminator of several scores per pair (BigBiGAN's
  joint and unary ones) has each scored and summed (`summed_over_scores`).
  ALICE's explicit cycles (Li et al. 2017) join the generator's and encoder's
  loss: `reconstruction_weight` * the mean squared error of G(E(x)) against x,
  and `latent_weight` * that of E(G(z)) against z, per example. A model's Keras
  weight penalties (`kernel_regularizer` and the like: `model.losses`) join the
  loss of its update. With `augment` (names of
  `gan.augment.POLICIES`), every image the discriminator sees, real or
  generated, in both updates, is augmented first (`gan.augment.augmentation`);
  the penalty's discriminator sees the reals through the same draws as the
  loss's, as DiffAugment's StyleGAN2 code does (R1's gradient is taken
  through the augmentation).
  """
  penalized = not _is(penalty, penalties.no_penalty)
  _check_penalty(penalty, encoder)
  cycles = _check_cycles(encoder, reconstruction_weight=reconstruction_weight,
                         latent_weight=latent_weight)
  # Only a pair discriminator may give several scores (BigBiGAN's); a plain one's
  # logits other than [B] or [B, 1] stay an error of the loss.
  d_loss_of = (functools.partial(summed_over_scores, loss.discriminator) if encoder
               else loss.discriminator)
  policy = augment_lib.check_policy(augment)

  def augmentation(ctx, images):
    """What the discriminator sees of `images`, or of a tensor in their place:
    one augmentation drawn per image, with a policy."""
    return augment_lib.augmentation(ctx, images, policy) if policy else (lambda x: x)

  def seen(ctx, images):
    return augmentation(ctx, images)(images)

  def critic(ctx, labels, augment):
    """The discriminator on images, through `augment` (and on `labels`)."""
    discriminator = ctx.models["discriminator"]
    if conditional:
      return lambda x: discriminator([augment(x), labels], training=True)
    return lambda x: discriminator(augment(x), training=True)

  def pair_logits(ctx, real, fake, z):
    """BiGAN/ALI: the discriminator's logits on (x, E(x)) and on (G(z), z); E(x)."""
    codes = ctx.models["encoder"](real, training=True)
    discriminator = ctx.models["discriminator"]
    return (discriminator([seen(ctx, real), codes], training=True),
            discriminator([seen(ctx, fake), z], training=True), codes)

  def critic_update(ctx, real, labels):
    generator = ctx.models["generator"]
    z = ctx.normal([noise_dim])
    with tf.GradientTape() as tape:
      fake = generator([z, labels] if conditional else z, training=True)
      if encoder:
        real_logits, fake_logits, _ = pair_logits(ctx, real, fake, z)
        extra = tf.zeros([tf.shape(real)[0]])
      else:
        # The penalty's discriminator sees the reals (or what it puts in their
        # place) as the loss did, so it draws nothing: a lazy penalty's
        # tf.cond may not draw (`ctx.uniform`).
        real_critic = critic(ctx, labels, augmentation(ctx, real))
        real_logits = real_critic(real)
        fake_logits = critic(ctx, labels, augmentation(ctx, fake))(fake)
        extra = penalty(ctx, real_critic, real, fake)
      d_loss = ctx.average(d_loss_of(real_logits, fake_logits))
      extra = ctx.average(extra)
      total = with_weight_penalty(ctx, d_loss + extra, "discriminator")
    ctx.minimize(total, "discriminator", tape=tape)
    return d_loss, extra

  def generator_update(ctx, real, labels):
    generator = ctx.models["generator"]
    z = ctx.normal([noise_dim])
    with tf.GradientTape(persistent=encoder) as tape:
      fake = generator([z, labels] if conditional else z, training=True)
      if encoder:
        real_logits, fake_logits, codes = pair_logits(ctx, real, fake, z)
        g_loss = ctx.average(summed_over_scores(functools.partial(bigan_loss, loss),
                                                real_logits, fake_logits))
        cycle = cycle_loss(ctx, real, codes, fake, z) if cycles else None
      else:
        fake_logits = critic(ctx, labels, augmentation(ctx, fake))(fake)
        g_loss = ctx.average(loss.generator(fake_logits))
        cycle = None
      total = g_loss if cycle is None else g_loss + cycle
      totals = {name: with_weight_penalty(ctx, total, name)
                for name in (("generator", "encoder") if encoder else ("generator",))}
    for name, total in totals.items():
      ctx.minimize(total, name, tape=tape)
    return g_loss, cycle

  def cycle_loss(ctx, real, codes, fake, z):
    """ALICE's cycles: G(E(x)) (x's `codes`) against x, E(G(z)) against z, weighted.
    (Each term is an average over the global batch, so no constant is added.)"""
    terms = []
    if reconstruction_weight:
      rebuilt = tf.cast(ctx.models["generator"](codes, training=True), real.dtype)
      error = tf.reduce_mean(tf.reshape(tf.square(rebuilt - real), [tf.shape(real)[0], -1]), 1)
      terms.append(reconstruction_weight * ctx.average(error))
    if latent_weight:
      recovered = tf.cast(ctx.models["encoder"](fake, training=True), z.dtype)
      terms.append(latent_weight * ctx.average(tf.reduce_mean(tf.square(recovered - z), 1)))
    return tf.add_n(terms)

  def with_weight_penalty(ctx, loss, name):
    """`loss` plus the model's Keras weight penalties (its layers' regularizers),
    once over the replicas, if it has any."""
    penalties = ctx.models[name].losses
    return loss + ctx.average_regularization(penalties) if penalties else loss

  def step(ctx, batches):
    batches = batches if discriminator_steps > 1 else (batches,)
    for batch in batches:
      real, labels = batch if conditional else (batch, None)
      d_loss, extra = critic_update(ctx, real, labels)
    g_loss, cycle = generator_update(ctx, real, labels)
    if ema_decay is not None:
      ema_lib.update_ema(ctx, ctx.models["generator_ema"], ctx.models["generator"],
                         decay=ema_decay, start_step=ema_start_step)
    results = {"discriminator_loss": d_loss, "generator_loss": g_loss}
    if penalized:
      results["penalty"] = extra
    if cycles:
      results["cycle_loss"] = cycle
    return results

  return step


def _through_gin(factory: Callable | None) -> Callable | None:
  """gin's configured version of `factory` if gin registered it, else `factory`."""
  if factory is None or hasattr(factory, "__wrapped__"):  # gin's wrapper: bindings applied
    return factory
  try:
    return gin.get_configurable(factory)
  except ValueError:  # not registered with gin
    return factory


def make_build(*, generator: Callable[..., keras.Model],
               discriminator: Callable[..., keras.Model],
               encoder: Callable[..., keras.Model] | None = None,
               image_shape: tuple[int, ...], noise_dim: int, num_classes: int | None = None,
               generator_optimizer: Optimizer = default_optimizer,
               discriminator_optimizer: Optimizer = default_optimizer,
               encoder_optimizer: Optimizer = default_optimizer,
               ema_decay: float | None = None) -> Callable:
  """The runner's `build`: models from the factories, sized for the data; optimizers.

  A factory gin knows, passed as itself (`Experiment`'s default generator, or
  `gan.dcgan_generator` from Python), is called through gin, so bindings such
  as `gan.dcgan_generator.width = 16` reach it as they would through
  `@gan.dcgan_generator`.
  """
  conditional = {"num_classes": num_classes} if num_classes else {}
  generator, discriminator, encoder = map(_through_gin, (generator, discriminator, encoder))

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


def fixed_samples(noise_dim: int, *, num_classes: int | None = None, rows: int = 8,
                  model: str = "generator", seed: int = 0) -> Callable:
  """A function of the models giving a rows x rows grid from the same noise each time.

  Class-conditional: a 10 x 10 grid (for 10 classes), one class per column.
  """
  count = (num_classes or rows) ** 2
  z = np.random.default_rng(seed).normal(size=(count, noise_dim)).astype("float32")
  labels = (np.arange(count) % num_classes).astype("int32") if num_classes else None
  return lambda models: models[model]([z, labels] if num_classes else z, training=False)


class ClassifierFID(ctl.Action):
  """Action: classifier FID, KID and score of generated digits, on every replica.

  In the feature space of the small MNIST classifier shipped with
  `gan.evaluation` (not Inception), against `gan.data.load_mnist("test")`,
  which no model trains on. Every replica and worker generates and scores its
  share of the `num_samples` samples (`ctl.Runner.over_samples`); sample i's
  noise is keyed by (seed, i), so the values are the same on any number of
  replicas and workers, and the features' moments are summed exactly over
  them. The real digits' outputs are kept in `<workdir>/eval_cache`.
  `num_samples` is N, 5,000 by default (`gan.Experiment.fid_samples` sets it
  for an experiment); the real side is always the 5,000 held-out digits.

  Written to `events/eval` and reported to `context.metrics` (so
  `ctl.BestCheckpoints("classifier_fid", ...)` listed after it keeps the best
  checkpoints): `gan.evaluation.classifier_metrics`' keys. `self.history`
  holds (step, classifier FID) and `self.results` the last metrics.
  """

  collective = True  # every replica and worker generates and scores its share

  def __init__(self, noise_dim: int, every: ctl.Every | None = None, *,
               num_samples: int = 5000, num_classes: int | None = None,
               model: str = "generator", seed: int = 1, batch_size: int = 500):
    arguments.integer("num_samples", num_samples, minimum=2)
    arguments.integer("batch_size", batch_size, minimum=1)
    self.every = every
    self.num_samples = num_samples
    self.batch_size = batch_size
    self.history: list[tuple[int, float]] = []
    self.results: dict[str, float] = {}
    self._model = model
    self._noise_dim = noise_dim
    self._num_classes = num_classes
    self._seed = seed
    self._reference = None  # (cache directory, the real digits' outputs), once loaded
    self._sample_fn = self._make_sample_fn()  # one function: compiled once per runner

  def _make_sample_fn(self):
    from gan import evaluation

    def samples(models, indices):
      images = self._images(models, indices, ctl.normal_by_index(self._seed, indices,
                                                                 self._noise_dim))
      logits, features = evaluation.classifier_outputs(images)
      out = {"features": features, "feature_moments": features, "logits": logits,
             "second_logits": evaluation.second_classifier_logits(images)}
      if self._num_classes:
        out["labels"] = indices % self._num_classes  # the classes asked for
      return out

    return samples

  def _images(self, models, indices, z):
    """Float32 images of sample `indices` from noise `z` (and labels i % classes)."""
    inputs = z
    if self._num_classes:
      inputs = [z, tf.cast(indices % self._num_classes, tf.int32)]
    return tf.cast(models[self._model](inputs, training=False), tf.float32)

  def generate(self, models: dict[str, keras.Model], batch_size: int = 500) -> np.ndarray:
    """The `num_samples` images `models[model]` makes, sample i from its noise
    (and label i % num_classes), here in this process."""
    out = []
    for start in range(0, self.num_samples, batch_size):
      indices = tf.range(start, min(start + batch_size, self.num_samples), dtype=tf.int64)
      z = ctl.normal_by_index(self._seed, indices, self._noise_dim)
      out.append(np.asarray(self._images(models, indices, z)))
    return np.concatenate(out)

  def outputs(self, over_samples: Callable) -> dict:
    """The classifier's outputs for the samples, from `over_samples` (a runner's
    or a `ctl.FitContext`'s): features, their moments, and logits."""
    from gan import evaluation
    evaluation.classifier_model()  # here, eagerly: not inside the replicas' function
    return over_samples(self._sample_fn, self.num_samples, batch_size=self.batch_size,
                        moments=("feature_moments",))

  def measure(self, over_samples: Callable, workdir: str | None = None, *,
              is_chief: bool = True) -> dict[str, float]:
    """Every metric of `gan.evaluation.classifier_metrics`, the samples run by
    `over_samples`; the real digits' outputs cached in `<workdir>/eval_cache`."""
    from gan import evaluation  # loads the classifier only when it is asked for
    return evaluation.classifier_metrics(self.outputs(over_samples),
                                         self._held_out(workdir, is_chief))

  def _held_out(self, workdir, is_chief):
    """The held-out digits' outputs, cached in `<workdir>/eval_cache`."""
    from gan import evaluation
    cache_dir = os.path.join(workdir, "eval_cache") if workdir else None
    if self._reference is None or self._reference[0] != cache_dir:  # once per workdir
      self._reference = (cache_dir, evaluation.reference_outputs("test", cache_dir=cache_dir,
                                                                  write=is_chief))
    return self._reference[1]

  def __call__(self, context: ctl.FitContext) -> None:
    self.results = self.measure(context.over_samples, context.workdir,
                                is_chief=context.is_chief)
    value = self.results["classifier_fid"]
    self.history.append((context.step, value))
    context.report(self.results)
    _log.info("classifier FID at step %d: %.3f (KID %.4f, score %.3f; %d samples)",
              context.step, value, self.results["classifier_kid"],
              self.results["classifier_score"],
              self.results.get("num_samples", self.num_samples))


class ModeCoverage(ClassifierFID):
  """Action: the modes a stacked-MNIST generator covers (`gan.data.stacked_mnist_dataset`),
  on every replica.

  Each of the `num_samples` samples (PacGAN's protocol scores 26,000;
  gan/configs/stacked_mnist.gin sets `gan.Experiment.fid_samples` so) is
  classified channel by channel with the shipped classifier; its mode is the
  digit triple. Reports `gan.evaluation.mode_coverage`'s modes (of 1,000),
  mode_kl and mode_samples, and classifier_fid: the FID of the samples' 3N
  channel digits against the 5,000 held-out digits (their quality, whatever
  the triples), with num_samples. Sample i's noise is keyed by (seed, i), so
  every value is the same on any number of replicas and workers. No
  `num_classes`: the generator is unconditional.
  """

  def __init__(self, noise_dim: int, every: ctl.Every | None = None, *,
               num_samples: int = 26000, model: str = "generator", seed: int = 1,
               batch_size: int = 500):
    super().__init__(noise_dim, every, num_samples=num_samples, model=model, seed=seed,
                     batch_size=batch_size)

  def _make_sample_fn(self):
    from gan import evaluation

    def samples(models, indices):
      z = ctl.normal_by_index(self._seed, indices, self._noise_dim)
      logits, features = evaluation.stacked_outputs(self._images(models, indices, z))
      return {"logits": logits, **{f"channel_{c}": features[:, c] for c in range(3)}}

    return samples

  def outputs(self, over_samples: Callable) -> dict:
    from gan import evaluation
    evaluation.classifier_model()  # here, eagerly: not inside the replicas' function
    return over_samples(self._sample_fn, self.num_samples, batch_size=self.batch_size,
                        moments=tuple(f"channel_{c}" for c in range(3)))

  def measure(self, over_samples: Callable, workdir: str | None = None, *,
              is_chief: bool = True) -> dict[str, float]:
    """modes, mode_kl, mode_samples, classifier_fid and num_samples, the samples
    run by `over_samples`; the held-out digits' outputs cached in `<workdir>/eval_cache`."""
    from gan import evaluation
    out = self.outputs(over_samples)
    digits = out["channel_0"] + out["channel_1"] + out["channel_2"]
    return {**evaluation.mode_coverage(evaluation.modes_of_logits(out["logits"])),
            "classifier_fid": evaluation.frechet_distance_from_moments(
                digits, self._held_out(workdir, is_chief)["moments"]),
            "num_samples": self.num_samples}

  def __call__(self, context: ctl.FitContext) -> None:
    self.results = self.measure(context.over_samples, context.workdir,
                                is_chief=context.is_chief)
    self.history.append((context.step, self.results["classifier_fid"]))
    context.report(self.results)
    _log.info("stacked MNIST at step %d: %d of 1000 modes, KL %.3f, channels' "
              "classifier FID %.3f (%d samples)", context.step, self.results["modes"],
              self.results["mode_kl"], self.results["classifier_fid"], self.num_samples)


class EncoderQuality(ctl.Action):
  """Action: how well a BiGAN/ALI encoder represents and inverts real digits.

  Reports, on every replica's share of the 5,000 training and 5,000 held-out
  digits (`ctl.Runner.over_samples`):

  - encoder_1nn_accuracy: the held-out digits classified by their nearest
    training digit in the encoder's codes (Donahue et al. 2017's measure of
    the features), beside pixels_1nn_accuracy (the same in raw pixels: 0.933)
    and random_encoder_1nn_accuracy (a copy of the encoder with fresh
    random weights, seeded): features worth learning beat both;
  - reconstruction_ratio: the mean distance ||x - G(E(x))|| of held-out
    digits over the mean distance of random pairs of them (1: no better
    than another digit; 0: exact).

  Written to `events/eval` and reported to `context.metrics`.
  """

  collective = True  # every replica and worker encodes its share

  def __init__(self, every: ctl.Every | None = None, *, encoder: str = "encoder",
               generator: str = "generator", seed: int = 1, batch_size: int = 500):
    arguments.integer("batch_size", batch_size, minimum=1)
    self.every = every
    self.batch_size = batch_size
    self.results: dict[str, float] = {}
    self._encoder, self._generator, self._seed = encoder, generator, seed
    self._fixed = None  # what does not change as the encoder trains: computed once
    self._random_encoder = None
    self._codes_fn = self._make_codes_fn()

  def _make_codes_fn(self):
    def codes(models, indices):
      images = tf.gather(self._images, tf.minimum(indices, len(self._labels) - 1))
      encoded = models[self._encoder](images, training=False)
      rebuilt = tf.cast(models[self._generator](encoded, training=False), tf.float32)
      return {"codes": tf.cast(encoded, tf.float32),
              "random_codes": tf.cast(self._random_encoder(images, training=False),
                                      tf.float32),
              "reconstruction": tf.norm(tf.reshape(rebuilt - images, [tf.size(indices), -1]),
                                        axis=1)}

    return codes

  def _prepare(self, models):
    """The digits (training, then held-out) and the fixed figures, once."""
    if self._fixed is not None:
      return
    from gan import evaluation
    train, train_labels = data_lib.load_mnist("train")
    test, test_labels = data_lib.load_mnist("test")
    pixels = np.concatenate([train, test]).astype(np.float32)[..., None] / 127.5 - 1
    self._images = tf.constant(pixels)
    self._labels = np.concatenate([train_labels, test_labels])
    self._random_encoder = _random_copy(models[self._encoder], self._seed)
    flat = pixels.reshape(len(pixels), -1)
    held_out = flat[len(train):]
    pairs = np.random.default_rng(self._seed).permutation(len(held_out))
    self._fixed = {
        "pixels_1nn_accuracy": evaluation.nearest_neighbour_accuracy(
            flat[:len(train)], train_labels, held_out, test_labels),
        "pair_distance": float(np.mean(np.linalg.norm(held_out - held_out[pairs], axis=1))),
        "train": len(train)}

  def measure(self, over_samples: Callable, models: dict[str, keras.Model]) -> dict[str, float]:
    """The metrics, the digits run by `over_samples` (a runner's or a context's)."""
    from gan import evaluation
    self._prepare(models)
    out = over_samples(self._codes_fn, len(self._labels), batch_size=self.batch_size)
    train = self._fixed["train"]
    labels = self._labels

    def accuracy(codes):
      return evaluation.nearest_neighbour_accuracy(codes[:train], labels[:train],
                                                   codes[train:], labels[train:])

    return {"encoder_1nn_accuracy": accuracy(out["codes"]),
            "random_encoder_1nn_accuracy": accuracy(out["random_codes"]),
            "pixels_1nn_accuracy": self._fixed["pixels_1nn_accuracy"],
            "reconstruction_ratio": float(np.mean(out["reconstruction"][train:])
                                          / self._fixed["pair_distance"]),
            "encoder_samples": len(labels) - train}

  def __call__(self, context: ctl.FitContext) -> None:
    self.results = self.measure(context.over_samples, context.models)
    context.report(self.results)
    _log.info("encoder at step %d: 1-NN accuracy %.3f (pixels %.3f, random encoder %.3f), "
              "reconstruction ratio %.3f", context.step, self.results["encoder_1nn_accuracy"],
              self.results["pixels_1nn_accuracy"], self.results["random_encoder_1nn_accuracy"],
              self.results["reconstruction_ratio"])


def _random_copy(model: keras.Model, seed: int) -> keras.Model:
  """`model`'s architecture with fresh weights, each initializer seeded from
  `seed` (the same copy every time); made here, eagerly."""
  seeds = iter(range(seed * 1000, seed * 1000 + 10**6))

  def clone(layer):
    config = layer.get_config()
    for key, value in config.items():
      if (key.endswith("_initializer") and isinstance(value, dict)
          and "seed" in value.get("config", {})):  # random ones (Zeros takes no seed)
        value["config"]["seed"] = next(seeds)
    return layer.__class__.from_config(config)

  try:
    return keras.models.clone_model(model, clone_function=clone)
  except (TypeError, ValueError) as e:  # a layer whose config does not rebuild it
    _log.warning("EncoderQuality: could not seed a copy of %s (%s); its random copy is "
                 "unseeded, so random_encoder_1nn_accuracy varies between runs.",
                 model.name, e)
    return keras.models.clone_model(model)


@gin.configurable(module="gan")
@dataclasses.dataclass(frozen=True)
class Schedule:
  """When an experiment trains, saves, draws samples and measures FID, in steps.

  Attributes:
    total_steps: the generator step to train up to (the run's length, not a
      number of new steps: a resumed run trains the rest).
    steps_per_loop: steps per compiled call (the outer loop acts between calls).
    samples_every: steps between PNG sample grids.
    checkpoint_every: steps between checkpoints (and one at the end).
    fid_every: steps between classifier FIDs (28x28x1 images only); None: at
      the end only; 0: never.
    keep_best: keep the checkpoints of this many best classifier FIDs in
      `<workdir>/checkpoints/best/` (`ctl.BestCheckpoints`), for `evaluate`,
      `export`, `ctl eval` and `ctl export` with checkpoint "best"; 0: none.
    asynchronous_checkpoints: write the scheduled checkpoints in the background
      while training goes on (`ctl.Checkpoint(asynchronous=True)`).
  """

  total_steps: int = 5000
  steps_per_loop: int = 50
  samples_every: int = 500
  checkpoint_every: int = 1000
  fid_every: int | None = None
  keep_best: int = 0
  asynchronous_checkpoints: bool = False

  def __post_init__(self) -> None:
    arguments.integer("total_steps", self.total_steps, minimum=0)
    for name in ("steps_per_loop", "samples_every", "checkpoint_every"):
      arguments.integer(name, getattr(self, name), minimum=1)
    if self.fid_every is not None:
      arguments.integer("fid_every", self.fid_every, minimum=0,
                        meaning="0: never; None: at the end only")
    arguments.integer("keep_best", self.keep_best, minimum=0,
                      meaning="best checkpoints by classifier FID to keep; 0: none")
    if self.keep_best and self.fid_every == 0:
      raise ValueError(f"gan.Schedule(keep_best={self.keep_best}, fid_every=0): the best "
                       "checkpoints are chosen by classifier FID, which fid_every=0 never "
                       "measures; set fid_every (None: at the end only) or keep_best=0.")


@gin.configurable(module="gan")
@dataclasses.dataclass(frozen=True)
class Experiment:
  """A GAN experiment: what it trains, on what, with which losses, and when.

  One method per job, each building the same runner:

      experiment = gan.Experiment(loss=gan.losses.hinge, schedule=gan.Schedule(total_steps=3000))
      experiment.train("runs/hinge")       # trains to step 3000, resuming; returns the runner
      experiment.evaluate("runs/hinge")    # {"step": 3000, "classifier_fid": 35.3}
      experiment.export("runs/hinge")      # [".../generator.keras", ".../generator"]
      experiment.build()                   # the runner, untrained (what `ctl check` checks)

  Making one checks the arguments and runs no TensorFlow op: a multi-worker
  strategy must exist before the first op, so the data and the models are
  made by each method under the strategy it is given. With `encoder` it is a
  BiGAN/ALI (three models, three optimizers); with `num_classes` a
  class-conditional GAN; with `ema_decay` an EMA copy of the generator
  (`generator_ema`) gives the samples, the FID and the export.

  Attributes:
    dataset: a function `(global_batch_size) -> tf.data.Dataset` of images in
      [-1, 1] (or `(images, labels)` with `num_classes`).
    batch_size: global batch size.
    generator, discriminator, encoder: model factories. The generator is called
      with `noise_dim`, `image_shape` (and `num_classes`); the discriminator
      with `image_shape` (and `num_classes`), or with `latent_dim` when there
      is an encoder (a BiGAN pair discriminator such as
      `gan.models.bigan_discriminator`); the encoder with `latent_dim`,
      `image_shape`.
    loss: the loss family, e.g. `gan.losses.hinge`: the generator's and the
      discriminator's loss, chosen together.
    penalty: a discriminator penalty from `gan.penalties`.
    discriminator_steps: discriminator updates per generator update, each on
      its own batch (the WGAN-GP paper uses 5; gan/configs/wgan_gp.gin, 2). A
      learning-rate schedule counts its optimizer's updates: the
      discriminator's makes this many per step, so a
      decay over the run needs `discriminator_steps` times the generator's
      `decay_steps` (gan/configs/wgan_gp.gin scopes it to `discriminator/`).
    noise_dim: size of the generator's noise (and the encoder's code).
    num_classes: train a class-conditional GAN on `(images, labels)` batches.
    generator_optimizer, discriminator_optimizer, encoder_optimizer: functions
      returning a Keras optimizer (called in the strategy's scope).
    ema_decay: keep an EMA copy of the generator with this decay, from step
      `ema_start_step`.
    schedule: when to stop, save, draw samples and measure FID.
    fid_samples: N, the generated images every classifier metric is measured
      on (FID, KID, the scores, precision/recall/density/coverage; label
      accuracy and intra-class FID), at each `schedule.fid_every` and in
      `evaluate`; at least 2. Default 5,000, as many as the held-out digits
      they are compared with. FID's upward bias falls as N grows, so compare
      values of the same N (reported as `num_samples`). From a .gin file or
      `--gin`: `gan.Experiment.fid_samples = 10000`; see docs/evaluation.md.
    seed: the runner's seed (initial weights, noise).
    augment: differentiable augmentations of every image the discriminator
      sees (`gan.augment`, DiffAugment), e.g. ("color", "translation",
      "cutout"); () for none.
    mixed_precision: None (float32), "mixed_bfloat16" or "mixed_float16": the
      runner's Keras policy (`ctl.Runner(mixed_precision=...)`); the models'
      outputs stay float32. Measured on a 2-core CPU with AVX512_BF16, the
      main job's models: 1.11x the float32 speed with the non-saturating step,
      1.30x with the hinge step (seed 0 timed in two separate runs), at the
      same quality over 3 seeds (docs/quality/tuning.md);
      not measured on a CPU without bfloat16 instructions, where it is
      expected to be slower. "float64" runs everything in float64 (what
      `ctl parity` replays), to check a run against rounding: two float64
      runs that should agree do to about 1e-15, where float32 training
      amplifies rounding past any fixed tolerance.
    reconstruction_weight, latent_weight: with an encoder, ALICE's explicit
      cycles in the generator's and encoder's loss (`make_step`); 0: off.
  """

  dataset: Callable[[int], tf.data.Dataset] = data_lib.mnist_dataset
  batch_size: int = 64
  generator: Callable[..., keras.Model] = models_lib.dcgan_generator
  discriminator: Callable[..., keras.Model] = models_lib.dcgan_discriminator
  encoder: Callable[..., keras.Model] | None = None
  loss: losses.LossFamily = losses.non_saturating
  penalty: Callable = penalties.no_penalty
  discriminator_steps: int = 1
  noise_dim: int = 64
  num_classes: int | None = None
  generator_optimizer: Optimizer = default_optimizer
  discriminator_optimizer: Optimizer = default_optimizer
  encoder_optimizer: Optimizer = default_optimizer
  ema_decay: float | None = None
  ema_start_step: int = 0
  schedule: Schedule = dataclasses.field(default_factory=Schedule)
  fid_samples: int = 5000
  seed: int = 0
  augment: tuple[str, ...] = ()
  mixed_precision: str | None = None
  reconstruction_weight: float = 0.0
  latent_weight: float = 0.0

  def __post_init__(self) -> None:
    _check(self)

  def build(self, strategy: Strategy = "default") -> ctl.Runner:
    """The runner under `strategy`, untrained: data, models, optimizers and step."""
    return self._runner(strategy)[0]

  def train(self, workdir: str, strategy: Strategy = "default", *,
            progress: bool = True, profile: tuple[int, int] | None = None,
            loggers: Sequence[ctl.Logger] = (), dry_run: bool = False,
            resume_from: int | None = None, restore_data: bool = True) -> ctl.Runner:
    """Trains to `schedule.total_steps`, resuming from `<workdir>/checkpoints`; the runner.

    Writes checkpoints (and the operative gin config beside them), TensorBoard
    events, sample grids from fixed noise (`samples/`), the classifier FID of
    28x28x1 images (`events/eval`) and the export (`export/`) to `workdir`.
    `profile=(start, steps)` adds a profiler trace of those steps (`ctl.Profile`);
    `loggers` and `dry_run` are `Runner.fit`'s, `resume_from` and `restore_data`
    `ctl.Checkpoint`'s.
    """
    runner, image_shape = self._runner(strategy)
    schedule = self.schedule
    check_decay_steps(runner.optimizers, self.discriminator_steps, schedule.total_steps)
    actions = [ctl.Samples(fixed_samples(self.noise_dim, num_classes=self.num_classes,
                                         model=self.sampled_model),
                           ctl.Every(steps=schedule.samples_every)),
               ctl.Export(self.sampled_model)]
    fid = self._fid(image_shape)
    if fid is not None and schedule.fid_every != 0:
      actions.append(fid)
      if self.encoder is not None:
        actions.append(EncoderQuality(fid.every))
      if schedule.keep_best:  # after the FID it ranks by, on the same schedule
        actions.append(ctl.BestCheckpoints("classifier_fid", fid.every,
                                           keep=schedule.keep_best, mode="min"))
    elif schedule.keep_best:
      raise ValueError(f"gan.Schedule.keep_best = {schedule.keep_best}: the best "
                       "checkpoints are chosen by classifier FID, measured on 28x28x1 "
                       f"images only, and these are {image_shape}; set keep_best = 0.")
    if profile is not None:
      actions.append(ctl.Profile(*profile))
    runner.fit(schedule.total_steps, workdir,
               checkpoint=ctl.Checkpoint(ctl.Every(steps=schedule.checkpoint_every),
                                         resume_from=resume_from,
                                         restore_data=restore_data,
                                         asynchronous=schedule.asynchronous_checkpoints),
               actions=actions, loggers=list(loggers), progress=progress,
               dry_run=dry_run)
    return runner

  def evaluate(self, workdir: str, strategy: Strategy = "default", *,
               checkpoint: str | int = "newest") -> dict[str, float]:
    """Restores a checkpoint and measures it: `{"step": ..., "classifier_fid": ...}`.

    Under `strategy` every replica and worker takes part, and the numbers are
    the same under any (`ctl eval --across`). On 28x28x1 images:
    `gan.evaluation.classifier_metrics` of `fid_samples` samples of
    `sampled_model` (FID, KID, scores, precision/recall/density/coverage,
    with their N; with `num_classes`, label accuracy and intra-class FID) and,
    with an encoder, `EncoderQuality`'s. On stacked MNIST
    (`gan.data.stacked_mnist_dataset`): `ModeCoverage`'s. Other images: the step only.
    `checkpoint`: "newest", "best" (the best kept by `schedule.keep_best`), or
    a step (the checkpoint saved at that step: `ctl.Runner.restore`).

    Raises:
      FileNotFoundError: no such checkpoint in `<workdir>/checkpoints`.
    """
    workdir = os.path.expanduser(workdir)  # as Runner.restore reads it
    runner, image_shape = self._runner(strategy)
    step = runner.restore(workdir, checkpoint)
    fid = self._fid(image_shape)
    if fid is None:
      return {"step": step}
    metrics = {"step": step, **fid.measure(runner.over_samples, workdir,
                                           is_chief=runner.placement.is_chief)}
    if self.encoder is not None:
      metrics.update(EncoderQuality().measure(runner.over_samples, runner.models))
    return metrics

  def export(self, workdir: str, directory: str | None = None,
             strategy: Strategy = "default", *,
             checkpoint: str | int = "newest") -> list[str]:
    """Restores a checkpoint ("newest", "best" or a step: see `evaluate`) and exports
    `sampled_model`; the paths written.

    Writes `<name>.keras` and a SavedModel `<name>/` to `directory` (default
    `<workdir>/export`).

    Raises:
      FileNotFoundError: no such checkpoint in `<workdir>/checkpoints`.
    """
    workdir = os.path.expanduser(workdir)
    runner, _ = self._runner(strategy)
    runner.restore(workdir, checkpoint)
    return list(runner.export(self.sampled_model,
                              directory or os.path.join(workdir, "export")))

  @property
  def sampled_model(self) -> str:
    """The model that samples, FID and export use: the EMA copy if there is one."""
    return "generator_ema" if self.ema_decay is not None else "generator"

  def _runner(self, strategy: Strategy) -> tuple[ctl.Runner, tuple[int, ...]]:
    """The runner and the data's image shape."""
    # The strategy first: a multi-worker one must exist before any TF op (the dataset's).
    strategy = ctl.make_strategy(strategy) if isinstance(strategy, str) else strategy
    data, image_shape = _data(self.dataset, self.batch_size, self.num_classes)
    step = make_step(loss=self.loss, penalty=self.penalty, noise_dim=self.noise_dim,
                     discriminator_steps=self.discriminator_steps,
                     conditional=bool(self.num_classes), encoder=self.encoder is not None,
                     ema_decay=self.ema_decay, ema_start_step=self.ema_start_step,
                     augment=self.augment, reconstruction_weight=self.reconstruction_weight,
                     latent_weight=self.latent_weight)
    build = make_build(generator=self.generator, discriminator=self.discriminator,
                       encoder=self.encoder, image_shape=image_shape, noise_dim=self.noise_dim,
                       num_classes=self.num_classes,
                       generator_optimizer=self.generator_optimizer,
                       discriminator_optimizer=self.discriminator_optimizer,
                       encoder_optimizer=self.encoder_optimizer, ema_decay=self.ema_decay)
    runner = ctl.Runner(step, build, data, strategy=strategy, seed=self.seed,
                        steps_per_loop=self.schedule.steps_per_loop,
                        batches_per_step=self.discriminator_steps,
                        mixed_precision=self.mixed_precision)
    return runner, image_shape

  def _fid(self, image_shape: tuple[int, ...]) -> ClassifierFID | None:
    """The classifier FID action, for the classifier's 28x28x1 digits only, or
    `ModeCoverage` for stacked MNIST."""
    fid_every = self.schedule.fid_every
    every = ctl.Every(steps=fid_every) if fid_every else None
    if (image_shape == (28, 28, 3) and not self.num_classes
        and _is(self.dataset, data_lib.stacked_mnist_dataset)):
      return ModeCoverage(self.noise_dim, every, num_samples=self.fid_samples,
                          model=self.sampled_model)
    if image_shape != (28, 28, 1):
      return None
    return ClassifierFID(self.noise_dim, every, num_samples=self.fid_samples,
                         num_classes=self.num_classes, model=self.sampled_model)


def _check(experiment: Experiment) -> None:
  """Raises, naming the argument, if `experiment`'s parts cannot work together."""
  if not isinstance(experiment.loss, losses.LossFamily):
    raise TypeError(f"loss must be a loss family such as gan.losses.hinge (a "
                    f"gan.losses.LossFamily), got {experiment.loss!r}.")
  if not isinstance(experiment.schedule, Schedule):
    raise TypeError(f"schedule must be a gan.Schedule, got {experiment.schedule!r}.")
  if experiment.encoder is not None and _is(experiment.discriminator,
                                            models_lib.dcgan_discriminator):
    raise ValueError("encoder is set, so the discriminator must score (image, code) "
                     "pairs; pass discriminator=gan.models.bigan_discriminator.")
  _check_cycles(experiment.encoder is not None,
                reconstruction_weight=experiment.reconstruction_weight,
                latent_weight=experiment.latent_weight)
  arguments.integer("batch_size", experiment.batch_size, minimum=1)
  arguments.integer("discriminator_steps", experiment.discriminator_steps, minimum=1)
  arguments.integer("noise_dim", experiment.noise_dim, minimum=1)
  if experiment.num_classes is not None:
    arguments.integer("num_classes", experiment.num_classes, minimum=2,
                      meaning="None: unconditional")
  if experiment.ema_decay is not None:
    arguments.number("ema_decay", experiment.ema_decay, minimum=0)
    if experiment.ema_decay >= 1:
      raise ValueError(f"ema_decay must be in [0, 1), got {experiment.ema_decay!r}; "
                       "0.999 is usual.")
  arguments.integer("ema_start_step", experiment.ema_start_step, minimum=0)
  arguments.integer("fid_samples", experiment.fid_samples, minimum=2)
  augment_lib.check_policy(experiment.augment)
  if experiment.mixed_precision not in (None, *ctl.MIXED_PRECISIONS, "float64"):
    raise ValueError("mixed_precision must be None, 'mixed_bfloat16', 'mixed_float16' or "
                     f"'float64', got {experiment.mixed_precision!r}.")
  _check_penalty(experiment.penalty, experiment.encoder is not None)


def check_decay_steps(optimizers: dict, discriminator_steps: int, total_steps: int) -> None:
  """Warns when the discriminator's schedule runs `discriminator_steps` times as fast
  as the generator's: the same length (`decay_steps`, or `boundaries`), set in
  generator steps, while its optimizer makes `discriminator_steps` updates a step."""
  def schedule(name):
    """(class name, config) of the optimizer's schedule, or (None, {})."""
    optimizer = optimizers.get(name)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # mixed_float16's wrapper
    rate = optimizer.get_config().get("learning_rate") if optimizer is not None else None
    if not isinstance(rate, dict):  # a number, not a schedule's serialized form
      return None, {}
    return rate.get("class_name"), rate.get("config", {})

  (kind, config), (generator_kind, generator_config) = (schedule("discriminator"),
                                                        schedule("generator"))
  key = "decay_steps" if "decay_steps" in config else "boundaries"
  length = config.get(key)
  if (discriminator_steps < 2 or length is None or kind != generator_kind
      or length != generator_config.get(key)):
    return
  k = discriminator_steps
  binding = f"discriminator/keras.optimizers.schedules.{kind}.{key} = "
  if key == "boundaries":
    if max(length) < total_steps:
      _log.warning(
          "The discriminator's learning-rate schedule has boundaries=%s, as the "
          "generator's, but a schedule counts its optimizer's updates and "
          "discriminator_steps=%d: they come at generator steps %s. For the same steps "
          "bind %s%s.", length, k, [b // k for b in length], binding, [b * k for b in length])
  elif kind in ("ExponentialDecay", "InverseTimeDecay"):  # decay_steps: a period
    _log.warning(
        "The discriminator's learning-rate schedule (%s, decay_steps=%d as the "
        "generator's) counts its optimizer's updates, discriminator_steps=%d a step: "
        "per generator step it decays %d times as fast. For the same decay bind %s%d.",
        kind, length, k, k, binding, length * k)
  elif length < total_steps * k:
    _log.warning(
        "The discriminator's learning-rate schedule has decay_steps=%d, as the "
        "generator's, but a schedule counts its optimizer's updates and "
        "discriminator_steps=%d: its decay ends at generator step %d of %d. For a "
        "decay over the run bind %s%d.", length, k, length // k, total_steps, binding,
        length * k)


def _check_cycles(encoder: bool, **weights: float) -> bool:
  """Whether ALICE's cycles are on; raises, naming the weight, unless each is a
  number >= 0 and an encoder is there for any that is not 0."""
  for name, weight in weights.items():
    arguments.number(name, weight, minimum=0.0, meaning="0: off")
    if weight and not encoder:
      raise ValueError(f"{name} is {weight!r}, the weight of a cycle through the encoder, "
                       f"and there is no encoder; set one (a BiGAN), or {name} = 0.")
  return any(weights.values())


def _check_penalty(penalty: Callable, encoder: bool) -> None:
  if encoder and not _is(penalty, penalties.no_penalty):
    raise ValueError("penalty: a BiGAN/ALI discriminator scores (image, code) pairs, "
                     f"and {getattr(penalty, '__name__', penalty)} penalises image "
                     "gradients only; use gan.penalties.no_penalty with an encoder.")


def _data(dataset: Callable[[int], tf.data.Dataset], batch_size: int,
          num_classes: int | None) -> tuple[tf.data.Dataset, tuple[int, ...]]:
  """The dataset of global batches and its image shape, checked against num_classes."""
  data = dataset(batch_size)
  if num_classes and not isinstance(data.element_spec, tuple):
    raise ValueError(f"num_classes={num_classes} needs a dataset of (images, labels); "
                     "pass with_labels=True to the dataset function.")
  spec = data.element_spec[0] if num_classes else data.element_spec
  return data, tuple(int(d) for d in spec.shape[1:])


