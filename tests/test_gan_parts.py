"""The GAN kit's models, EMA and steps: shapes, errors, and default == mirrored.

Each kind of step (plain with EMA, k critic updates with a gradient penalty,
class-conditional, BiGAN with an encoder, hinge with spectral norm) trains a
few steps under `default` and under `mirrored` with 2 replicas; the per-step
results and every final weight must agree.
"""

import functools
import json
import os
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
import gan
from gan import experiment

import helpers

BATCH = 8
NOISE = 8
SHAPE = (28, 28, 1)


@pytest.mark.parametrize("image_shape", [(28, 28, 1), (32, 32, 3)])
@pytest.mark.parametrize("num_classes", [None, 10])
def test_models_shapes(image_shape, num_classes):
  labels = tf.range(2) if num_classes else None
  g = gan.dcgan_generator(NOISE, 4, image_shape=image_shape, num_classes=num_classes)
  z = tf.zeros((2, NOISE))
  images = g([z, labels] if num_classes else z)
  assert images.shape == (2,) + image_shape
  for conditioning in ("projection", "concat"):
    d = gan.dcgan_discriminator(4, image_shape=image_shape, num_classes=num_classes,
                                conditioning=conditioning, spectral_norm=True)
    assert d([images, labels] if num_classes else images).shape == (2, 1)
  assert gan.models.dcgan_encoder(NOISE, 4, image_shape=image_shape)(images).shape == (2, NOISE)
  pair = gan.models.bigan_discriminator(NOISE, 4, image_shape=image_shape)
  assert pair([images, z]).shape == (2, 1)
  unary = gan.models.bigan_discriminator(NOISE, 4, image_shape=image_shape, unary=True)
  assert unary([images, z]).shape == (2, 3)


def test_tfgan_mnist_models_shapes_and_shape_error():
  g = gan.models.tfgan_mnist_generator(NOISE)
  images = g(tf.zeros((2, NOISE)))
  assert images.shape == (2,) + SHAPE
  assert gan.models.tfgan_mnist_discriminator()(images).shape == (2, 1)
  with pytest.raises(ValueError, match="28x28x1 digits only"):
    gan.models.tfgan_mnist_generator(image_shape=(32, 32, 3))
  with pytest.raises(ValueError, match="28x28x1 digits only"):
    gan.models.tfgan_mnist_discriminator(image_shape=(32, 32, 3))


def test_spectral_norm_bounds_the_layer():
  d = gan.dcgan_discriminator(4, spectral_norm=True)
  wrapped = [layer for layer in d.layers if isinstance(layer, keras.layers.SpectralNormalization)]
  assert len(wrapped) == 3  # two convolutions and the output layer
  x = tf.random.normal((4,) + SHAPE)
  for _ in range(30):  # power iterations converge on the top singular value
    d(x, training=True)
  dense = wrapped[-1]
  sigma = np.linalg.svd(np.asarray(dense.layer.kernel), compute_uv=False)[0]
  assert sigma == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("kwargs, message", [
    (dict(image_shape=(30, 30, 1)), "divisible by 4"),
    (dict(image_shape=(28, 28)), "image_shape must be"),
    (dict(num_classes=1), "num_classes must be"),
])
def test_model_argument_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    gan.dcgan_generator(**kwargs)


@pytest.mark.parametrize("kernel_size", [4, 3])
def test_kernel_size_keeps_the_shapes(kernel_size):
  g = gan.dcgan_generator(NOISE, 4, kernel_size=kernel_size)
  images = g(tf.zeros((2, NOISE)))
  assert images.shape == (2,) + SHAPE
  d = gan.dcgan_discriminator(4, kernel_size=kernel_size)
  assert d(images).shape == (2, 1)
  kernels = [layer.kernel.shape[:2] for model in (g, d) for layer in model.layers
             if isinstance(layer, keras.layers.Conv2D)]  # Conv2DTranspose is one too
  assert kernels and all(shape == (kernel_size, kernel_size) for shape in kernels)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (4.0, TypeError), (True, TypeError),
                                        ("4", TypeError)])
def test_kernel_size_errors_name_the_value(bad, error):
  for make in (gan.dcgan_generator, gan.dcgan_discriminator):
    with pytest.raises(error, match=f"kernel_size must be an int >= 1.*got {bad!r}"):
      make(kernel_size=bad)


def test_discriminator_conditioning_error():
  with pytest.raises(ValueError, match="conditioning must be one of"):
    gan.dcgan_discriminator(num_classes=10, conditioning="sum")


def test_update_ema_follows_then_averages():
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
  model.layers[0].kernel.assign([[1.0]])
  copy = gan.ema.ema_copy(model)
  assert copy.name == f"{model.name}_ema" and not copy.trainable
  model.layers[0].kernel.assign([[2.0]])
  gan.ema.update_ema(types.SimpleNamespace(step=tf.constant(1)), copy, model,
                 decay=0.9, start_step=2)
  assert float(copy.layers[0].kernel[0, 0]) == pytest.approx(2.0)  # before start: follows
  model.layers[0].kernel.assign([[3.0]])
  gan.ema.update_ema(types.SimpleNamespace(step=tf.constant(2)), copy, model,
                 decay=0.9, start_step=2)
  assert float(copy.layers[0].kernel[0, 0]) == pytest.approx(0.9 * 2.0 + 0.1 * 3.0)


def test_update_ema_errors():
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  other = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
  ctx = types.SimpleNamespace(step=tf.constant(0))
  with pytest.raises(ValueError, match=r"decay must be in \[0, 1\)"):
    gan.ema.update_ema(ctx, gan.ema.ema_copy(model), model, decay=1.0)
  with pytest.raises(ValueError, match="make the copy with gan.ema.ema_copy"):
    gan.ema.update_ema(ctx, other, model)


def _data(conditional, steps_per_update=1):
  images, labels = gan.data.load_mnist()
  x = (images[:64, ..., None].astype("float32") - 127.5) / 127.5
  y = labels[:64].astype("int32")
  data = tf.data.Dataset.from_tensor_slices((x, y) if conditional else x)
  return data.repeat().batch(BATCH, drop_remainder=True)


KINDS = {
    "ema": dict(ema_decay=0.5, ema_start_step=1),
    "wgan_gp_k2": dict(loss=gan.losses.wasserstein,
                       penalty=gan.penalties.wasserstein_gradient_penalty,
                       discriminator_steps=2),
    # A lazy R1 on the projection discriminator: its class embedding's gradient
    # after the penalty's tf.cond (an Embedding's sparse one failed here).
    "conditional_lazy_r1": dict(num_classes=10, penalty=functools.partial(
        gan.penalties.r1_penalty, weight=1.0, every=2)),
    "bigan": dict(encoder=True),
    "bigan_unary_hinge": dict(encoder=True, unary=True, loss=gan.losses.hinge),
    "bigan_cycles": dict(encoder=True, reconstruction_weight=1.0, latent_weight=0.5),
    "hinge_sn_r1": dict(loss=gan.losses.hinge, penalty=gan.penalties.r1_penalty,
                        spectral_norm=True),
}


def _train(kind, strategy, steps=3):
  options = dict(KINDS[kind])
  num_classes = options.pop("num_classes", None)
  encoder = options.pop("encoder", False)
  unary = options.pop("unary", False)
  spectral_norm = options.pop("spectral_norm", False)
  ema_decay = options.get("ema_decay")
  step = experiment.make_step(noise_dim=NOISE, conditional=bool(num_classes),
                              encoder=encoder, **options)

  def discriminator(**kwargs):
    if encoder:
      return gan.models.bigan_discriminator(width=4, unary=unary, **kwargs)
    return gan.dcgan_discriminator(4, spectral_norm=spectral_norm, **kwargs)

  build = experiment.make_build(
      generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
      discriminator=discriminator,
      encoder=(lambda **kw: gan.models.dcgan_encoder(width=4, **kw)) if encoder else None,
      image_shape=SHAPE, noise_dim=NOISE, num_classes=num_classes, ema_decay=ema_decay)
  runner = ctl.Runner(step, build, _data(bool(num_classes)),
                      strategy=ctl.make_strategy(strategy), steps_per_loop=steps,
                      batches_per_step=options.get("discriminator_steps", 1))
  results = runner.train(steps)
  weights = {name: [np.asarray(v) for v in model.variables]
             for name, model in runner.models.items()}
  return results, weights


# The fast tier trains one kind (EMA: the GAN kit's step and build through the
# runner under both strategies); the others take 10-17 s each.
@pytest.mark.parametrize("kind", [
    pytest.param(kind, marks=() if kind == "ema" else pytest.mark.slow) for kind in sorted(KINDS)])
def test_steps_agree_default_and_mirrored(kind):
  results, weights = _train(kind, "default")
  mirrored_results, mirrored_weights = _train(kind, "mirrored")
  assert sorted(results) == sorted(mirrored_results)
  for key in results:
    assert np.all(np.isfinite(results[key]))
    np.testing.assert_allclose(mirrored_results[key], results[key], atol=1e-5, err_msg=key)
  expected = ({"generator", "discriminator"} | ({"generator_ema"} if kind == "ema" else set())
              | ({"encoder"} if KINDS[kind].get("encoder") else set()))
  assert set(weights) == expected
  for name in weights:
    for a, b in zip(mirrored_weights[name], weights[name]):
      np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
  if kind == "ema":  # the copy moved, and differs from the generator it averages
    assert any(np.abs(a - b).max() > 1e-6
               for a, b in zip(weights["generator_ema"], weights["generator"]))


_EMBEDDING_UNDER_A_LAZY_PENALTY = """
import keras, numpy as np, tensorflow as tf
import ctl, gan

strategy = ctl.make_strategy("mirrored", logical_cpus=2)

def build():
  images, labels = keras.Input((4,)), keras.Input((), dtype="int32")
  features = keras.layers.Dense(8, activation="relu")(images)
  embedded = keras.layers.Embedding(10, 8)(labels)
  logits = keras.layers.Add()([keras.layers.Dense(1)(features),
                               keras.layers.Dot(axes=1)([embedded, features])])
  return ({"discriminator": keras.Model([images, labels], logits)},
          {"discriminator": keras.optimizers.Adam()})

def step(ctx, batch):
  real, labels = batch
  critic = ctx.models["discriminator"]
  def loss():
    penalty = gan.penalties.r1_penalty(ctx, lambda x: critic([x, labels]), real, None,
                                       weight=1.0, every=2)
    return ctx.average(tf.nn.relu(1 - critic([real, labels]))[:, 0] + penalty)
  return {"loss": ctx.minimize(loss, "discriminator")}

x = np.random.RandomState(0).normal(size=(64, 4)).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, np.arange(64, dtype="int32") % 10))
ctl.Runner(step, build, data.repeat().batch(16, drop_remainder=True), strategy=strategy,
           steps_per_loop=2).train(2)
"""


@pytest.mark.slow
def test_an_embedding_under_a_lazy_penalty_fails_under_mirrored_and_the_error_names_the_fix(
    tmp_path):
  """What gan.dcgan_discriminator's Dense projection avoids (docs/step.md,
  Optimizer options): TF sums an Embedding's sparse gradient over replicas with all-gathers,
  which a lazy penalty's tf.cond before them makes mismatch (TF 2.21). In a process
  of its own: the failed collective leaves every later one in that process aborted.
  If TF fixes it, this fails: drop the note (ctl/parts/steps.py) and docs/step.md's row."""
  script = tmp_path / "embedding_under_a_lazy_penalty.py"
  script.write_text(_EMBEDDING_UNDER_A_LAZY_PENALTY)
  proc = helpers.python([str(script)], check=False)
  assert proc.returncode != 0, proc.stdout[-2000:]
  assert "TF's all-gather across replicas failed" in proc.stderr, proc.stderr[-3000:]
  assert "Give the embedding as a Dense layer (use_bias=False) on one-hot labels" in proc.stderr
  assert "check that the data fits" not in proc.stderr  # the data is not the cause


def test_bigan_refuses_a_penalty():
  with pytest.raises(ValueError, match="use gan.penalties.no_penalty with an encoder"):
    experiment.make_step(penalty=gan.penalties.r1_penalty, encoder=True)


def test_no_penalty_from_gin_counts_as_no_penalty():
  """gin hands over a configured wrapper of gan.penalties.no_penalty, not the function itself."""
  import gin

  @gin.configurable
  def chosen_penalty(penalty=None):  # a name no other test module registers
    return penalty

  try:
    gin.parse_config("chosen_penalty.penalty = @gan.penalties.no_penalty")
    wrapped = chosen_penalty()
  finally:
    gin.clear_config()
  assert wrapped is not gan.penalties.no_penalty
  experiment.make_step(penalty=wrapped, encoder=True)  # no "use ...no_penalty" error


def test_experiment_argument_errors():
  with pytest.raises(ValueError, match="gan.models.bigan_discriminator"):
    gan.Experiment(encoder=gan.models.dcgan_encoder)
  with pytest.raises(ValueError, match="with_labels=True"):
    gan.Experiment(num_classes=10).build()
  with pytest.raises(ValueError, match="mixed_precision must be None, 'mixed_bfloat16', "
                                       "'mixed_float16' or 'float64', got 'bfloat16'"):
    gan.Experiment(mixed_precision="bfloat16")


def test_schedule_names_a_bad_value():
  with pytest.raises(ValueError, match="steps_per_loop must be an int >= 1, got 0"):
    gan.Schedule(steps_per_loop=0)
  with pytest.raises(TypeError, match="schedule must be a gan.Schedule"):
    gan.Experiment(schedule={"total_steps": 10})


def test_keep_best_keeps_the_best_fid_checkpoints_for_evaluate_and_export(tmp_path):
  with pytest.raises(ValueError, match="keep_best=1, fid_every=0"):
    gan.Schedule(keep_best=1, fid_every=0)
  with pytest.raises(ValueError, match="keep_best must be an int >= 0"):
    gan.Schedule(keep_best=-1)
  tiny = gan.Experiment(
      generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
      discriminator=lambda **kw: gan.dcgan_discriminator(4, **kw), batch_size=BATCH,
      noise_dim=NOISE, fid_samples=16,
      schedule=gan.Schedule(total_steps=4, steps_per_loop=1, samples_every=4,
                            checkpoint_every=4, fid_every=2, keep_best=1))
  workdir = str(tmp_path / "run")
  tiny.train(workdir, progress=False)
  with open(os.path.join(workdir, "checkpoints", "best", "best.json")) as f:
    kept = json.load(f)["kept"]
  assert len(kept) == 1 and kept[0]["step"] in (2, 4)
  best = tiny.evaluate(workdir, checkpoint="best")
  assert best["step"] == kept[0]["step"]
  assert best["classifier_fid"] == pytest.approx(kept[0]["value"], rel=1e-5)
  out = str(tmp_path / "best_export")
  assert os.path.join(out, "generator.keras") in tiny.export(workdir, out, checkpoint="best")


def test_experiment_under_mixed_bfloat16_keeps_float32_weights_and_outputs(tmp_path):
  tiny = gan.Experiment(
      generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
      discriminator=lambda **kw: gan.dcgan_discriminator(4, **kw), batch_size=BATCH,
      noise_dim=NOISE, mixed_precision="mixed_bfloat16",
      schedule=gan.Schedule(total_steps=2, steps_per_loop=1, samples_every=2,
                            checkpoint_every=2, fid_every=0))
  runner = tiny.train(str(tmp_path / "run"), progress=False)
  generator = runner.models["generator"]
  assert any(layer.compute_dtype == "bfloat16" for layer in generator.layers)
  assert all(w.dtype == "float32" for w in generator.weights)
  assert generator(tf.zeros((2, NOISE))).dtype == tf.float32
  assert keras.mixed_precision.global_policy().name == "float32"  # restored after build


def test_experiment_trains_evaluates_and_exports(tmp_path):
  """One method per job, on the same runner: train, then evaluate and export its run."""
  tiny = gan.Experiment(
      generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
      discriminator=lambda **kw: gan.dcgan_discriminator(4, **kw), batch_size=BATCH,
      noise_dim=NOISE, fid_samples=16,
      schedule=gan.Schedule(total_steps=2, steps_per_loop=1, samples_every=2,
                            checkpoint_every=2, fid_every=0))
  workdir = str(tmp_path / "run")
  runner = tiny.train(workdir, progress=False)
  assert int(runner.global_step.numpy()) == 2
  assert os.listdir(os.path.join(workdir, "samples")) == ["samples_00000002.png"]
  metrics = tiny.evaluate(workdir)
  assert metrics["step"] == 2 and metrics["classifier_fid"] > 0
  out = str(tmp_path / "exported")
  assert os.path.join(out, "generator.keras") in tiny.export(workdir, out)
  assert os.path.exists(os.path.join(out, "generator.keras"))


def test_a_discriminator_schedule_that_ends_early_is_warned_about_once_set_right_it_is_not(caplog):
  import keras

  from gan import experiment

  def optimizers(generator_steps, discriminator_steps):
    cosine = keras.optimizers.schedules.CosineDecay
    return {"generator": keras.optimizers.Adam(cosine(1e-3, generator_steps)),
            "discriminator": keras.optimizers.Adam(cosine(1e-3, discriminator_steps))}

  with caplog.at_level("WARNING", logger="ctl"):
    experiment.check_decay_steps(optimizers(4000, 4000), 5, 4000)
  assert ("decay_steps=4000, as the generator's, but a schedule counts its optimizer's "
          "updates and discriminator_steps=5: its decay ends at generator step 800 of "
          "4000") in caplog.text
  assert "discriminator/keras.optimizers.schedules.CosineDecay.decay_steps = 20000" in caplog.text
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):
    experiment.check_decay_steps(optimizers(4000, 20000), 5, 4000)  # wgan_gp.gin's
    experiment.check_decay_steps(optimizers(3000, 3000), 1, 3000)   # one update a step
    experiment.check_decay_steps({"generator": keras.optimizers.Adam(1e-3),
                                   "discriminator": keras.optimizers.Adam(1e-3)}, 5, 4000)
  assert caplog.text == ""
  # Other schedules and mixed_float16's wrapper, one shared schedule each.
  schedules = keras.optimizers.schedules
  for shared, expected in [
      (lambda: schedules.PiecewiseConstantDecay([1000, 3000], [1e-3, 1e-4, 1e-5]),
       "boundaries = [5000, 15000]"),
      (lambda: schedules.ExponentialDecay(1e-3, 1000, 0.9), "decays 5 times as fast"),
      (lambda: schedules.PolynomialDecay(1e-3, 4000), "its decay ends at generator step 800")]:
    caplog.clear()
    with caplog.at_level("WARNING", logger="ctl"):
      experiment.check_decay_steps(
          {name: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(shared()))
           for name in ("generator", "discriminator")}, 5, 4000)
    assert expected in caplog.text


def test_bigans_encoder_keeps_its_gradient_under_hinge():
  """The swapped hinge is flat once real pairs score below -1, so the encoder
  (which moves only the real pairs' logits) would stop learning; the linear
  form keeps a gradient of 1 per pair. Other families: the swapped loss."""
  real = tf.constant([-3.0, -0.5, 2.0])
  fake = tf.constant([2.0, 0.5, -1.5])
  with tf.GradientTape() as tape:
    tape.watch(real)
    loss = experiment.bigan_loss(gan.losses.hinge, real, fake)
  np.testing.assert_allclose(loss.numpy(), (real - fake).numpy())
  np.testing.assert_allclose(tape.gradient(loss, real).numpy(), [1.0, 1.0, 1.0])
  for family in (gan.losses.non_saturating, gan.losses.least_squares, gan.losses.minimax,
                 gan.losses.wasserstein):
    np.testing.assert_allclose(experiment.bigan_loss(family, real, fake).numpy(),
                               family.discriminator(fake, real).numpy())


def test_bigbigans_joint_and_unary_scores_are_each_a_loss_and_summed():
  """BigBiGAN's three scores (joint, image, code): each column is scored by the
  family's loss and the three summed, per example; one column is the loss itself."""
  real = tf.constant([[1.0, -0.5, 2.0], [-2.0, 0.5, 0.0]])
  fake = tf.constant([[0.5, 1.5, -1.0], [-0.5, -3.0, 0.2]])
  for family in (gan.losses.hinge, gan.losses.non_saturating):
    columns = [family.discriminator(real[:, k], fake[:, k]).numpy() for k in range(3)]
    np.testing.assert_allclose(
        experiment.summed_over_scores(family.discriminator, real, fake).numpy(),
        np.sum(columns, axis=0), rtol=1e-6)
    np.testing.assert_allclose(
        experiment.summed_over_scores(family.discriminator, real[:, :1], fake[:, :1]).numpy(),
        columns[0], rtol=1e-6)
  eg = functools.partial(experiment.bigan_loss, gan.losses.hinge)
  np.testing.assert_allclose(experiment.summed_over_scores(eg, real, fake).numpy(),
                             np.sum((real - fake).numpy(), axis=1), rtol=1e-6)


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_models_weight_penalties_reach_its_update_once_over_the_replicas(strategy):
  """The TF-GAN discriminator's L2 weight decay (Keras regularizers, `model.losses`)
  joins its loss: after one SGD update its kernels differ from those of the same
  update without decay by -lr * 2 * decay * the initial kernel, on one replica
  and on two (each adds half), and its biases (zero at first) not at all."""
  lr, decay = 0.1, 0.01

  def first_update(weight_decay):
    build = experiment.make_build(
        generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
        discriminator=lambda **kw: gan.models.tfgan_mnist_discriminator(
            weight_decay=weight_decay, **kw),
        image_shape=SHAPE, noise_dim=NOISE,
        discriminator_optimizer=lambda: keras.optimizers.SGD(lr))
    runner = ctl.Runner(experiment.make_step(noise_dim=NOISE), build, _data(False),
                        strategy=ctl.make_strategy(strategy), seed=3)
    variables = runner.models["discriminator"].trainable_variables
    penalties = runner.models["discriminator"].losses
    before = [np.asarray(v) for v in variables]
    runner.train(1)
    return [v.path.endswith(("kernel", "bias")) for v in variables], before, [
        np.asarray(v) for v in variables], penalties

  decayed_ones, before, decayed, penalties = first_update(decay)
  _, same_before, plain, no_penalties = first_update(0.0)
  assert len(penalties) == 8 and not no_penalties  # 2 convolutions, 2 dense: kernel, bias
  assert sum(decayed_ones) == 8
  for is_decayed, initial, same, a, b in zip(decayed_ones, before, same_before, decayed, plain):
    np.testing.assert_array_equal(same, initial)
    expected = -lr * 2 * decay * initial if is_decayed else 0 * initial
    np.testing.assert_allclose(a - b, expected, atol=2e-7)
  assert max(np.abs(a - b).max() for a, b in zip(decayed, plain)) > 1e-5


def _bigan_runner(**step_options):
  build = experiment.make_build(
      generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
      discriminator=lambda **kw: gan.models.bigan_discriminator(width=4, **kw),
      encoder=lambda **kw: gan.models.dcgan_encoder(width=4, **kw),
      image_shape=SHAPE, noise_dim=NOISE)
  return ctl.Runner(experiment.make_step(noise_dim=NOISE, encoder=True, **step_options),
                    build, _data(False))


def test_alices_reconstruction_cycle_is_the_weighted_mean_squared_error_of_g_of_e_of_x():
  """Reported as cycle_loss: weight * the mean over the batch of each digit's
  mean squared error against G(E(x)), the models as the step found them."""
  runner = _bigan_runner(reconstruction_weight=2.5)
  x = next(iter(_data(False)))
  codes = runner.models["encoder"](x, training=True)
  rebuilt = np.asarray(runner.models["generator"](codes, training=True))
  expected = 2.5 * np.mean(np.square(rebuilt - np.asarray(x)))
  np.testing.assert_allclose(runner.train(1)["cycle_loss"], expected, rtol=1e-5)
  assert "cycle_loss" not in _bigan_runner().train(1)  # off by default


@pytest.mark.parametrize("options, error, message", [
    (dict(reconstruction_weight=1.0), ValueError,
     r"reconstruction_weight is 1.0, the weight of a cycle through the encoder, and there "
     r"is no encoder"),
    (dict(latent_weight=-1.0, encoder=gan.models.dcgan_encoder,
          discriminator=gan.models.bigan_discriminator), ValueError, "latent_weight"),
    (dict(latent_weight="1"), TypeError, "latent_weight")])
def test_alices_cycle_weights_are_checked_when_the_experiment_is_made(options, error, message):
  with pytest.raises(error, match=message):
    gan.Experiment(**options)


def test_tfgan_weight_decay_is_checked():
  with pytest.raises(ValueError, match="weight_decay"):
    gan.models.tfgan_mnist_generator(weight_decay=-1.0)


@pytest.mark.parametrize("config", ["dcgan", "conditional_dcgan", "wgan_gp", "hinge_sn", "bigan",
                                    "tfgan_mnist", "stacked_mnist"])
def test_no_shipped_config_sets_off_the_schedule_warning_and_a_planted_mistake_does(config,
                                                                                   caplog):
  import gin

  def warned(*bindings):
    gin.clear_config()
    gin.parse_config_files_and_bindings(
        [os.path.join(helpers.ROOT, "gan", "configs", f"{config}.gin")], list(bindings))
    exp = gan.Experiment()
    caplog.clear()
    with caplog.at_level("WARNING", logger="ctl"):
      experiment.check_decay_steps({"generator": exp.generator_optimizer(),
                                    "discriminator": exp.discriminator_optimizer()},
                                   exp.discriminator_steps, exp.schedule.total_steps)
    return caplog.text

  try:
    assert warned() == ""
    if config == "wgan_gp":  # gin's scope reaches the schedule: the critic's is k x as long
      gin.clear_config()
      gin.parse_config_files_and_bindings(
          [os.path.join(helpers.ROOT, "gan", "configs", "wgan_gp.gin")], [])
      exp = gan.Experiment()
      assert exp.discriminator_steps > 1
      assert (exp.discriminator_optimizer().get_config()["learning_rate"]["config"]
              ["decay_steps"] == exp.discriminator_steps * exp.generator_optimizer()
              .get_config()["learning_rate"]["config"]["decay_steps"])
      planted = warned(
          "discriminator/keras.optimizers.schedules.CosineDecay.decay_steps = %STEPS")
    else:  # one schedule for both players, now with several discriminator updates a step
      planted = warned("gan.Experiment.discriminator_steps = 3")
    if config == "tfgan_mnist":  # a constant rate for its discriminator: nothing to warn of
      assert planted == ""
    else:
      assert "counts its optimizer's updates" in planted
  finally:
    gin.clear_config()


def test_bindings_reach_the_experiments_default_models_and_not_its_default_optimizers():
  """docs/gan.md: the default generator and discriminator are called through gin,
  so their bindings apply as through `@gan.dcgan_generator`; the default
  optimizers pass their rate themselves, so a rate bound on `keras.optimizers.Adam`
  changes nothing and ctl lists it, until the optimizers are bound by reference."""
  import gin

  from ctl.tools import experiments as experiments_lib

  def build(*bindings):
    gin.clear_config()
    gin.parse_config(list(bindings) + ["gan.dcgan_generator.width = 8",
                                       "gan.dcgan_discriminator.width = 8",
                                       "keras.optimizers.Adam.learning_rate = 1e-3",
                                       "gan.Experiment.batch_size = 8"])
    runner = gan.Experiment().build()
    return runner, experiments_lib.unused_bindings()

  try:
    runner, unused = build()
    assert unused == ["keras.optimizers.Adam.learning_rate"]
    narrow = gan.models.dcgan_generator(noise_dim=64, image_shape=(28, 28, 1), width=8)
    assert runner.models["generator"].count_params() == narrow.count_params()
    narrow = gan.models.dcgan_discriminator(image_shape=(28, 28, 1), width=8)
    assert runner.models["discriminator"].count_params() == narrow.count_params()
    assert float(runner.optimizers["generator"].learning_rate) == pytest.approx(2e-4)
    runner, unused = build("gan.Experiment.generator_optimizer = @keras.optimizers.Adam",
                           "gan.Experiment.discriminator_optimizer = @keras.optimizers.Adam")
    assert unused == []
    assert float(runner.optimizers["generator"].learning_rate) == pytest.approx(1e-3)
  finally:
    gin.clear_config()
