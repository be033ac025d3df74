"""Runner overhead against a hand-written `tf.function` + `strategy.run` loop.

    python bench/run.py --quick      # all workloads: 28 min measured on a loaded 2-core CPU
    python bench/run.py              # more repetitions
    python bench/run.py --workloads tiny --steps 20 --repetitions 2   # a smoke run

Both sides train the same networks on the same in-memory data in the same
process. Repetitions are interleaved (A, B, C, A, B, C, ...) so that drifts in
machine load hit every variant alike; medians are reported. Prints a table, then
one JSON object per line.

Variants: `handwritten` (the floor), `ctl steps_per_loop=1/10` (`runner.train`),
and `ctl fit steps_per_loop=10`: `runner.fit` with TensorBoard scalars written
after every compiled call (every 10 steps) and its checkpoint handling. Each
timed `fit` call also restores the newest checkpoint at its start and saves one
at its end, which a real run does once, so this is an upper bound on what the
outer loop costs. `keras fit spe=1/10` (tiny and dcgan): the same update as a
`keras.Model` with an overridden `train_step`, run by `Model.fit` with
`steps_per_execution` 1 or 10; each timed call is one `fit` (a new epoch
iterator and callbacks included), which is how Keras users loop.

`traces_after_first_call` counts the traces of the compiled step after the
warm-up call (the runner's `_loop`, the hand-written `train_step`, the Keras
`train_step`): anything but 0 means a variant retraces as it runs.

Workloads: `tiny`, a 2-D MLP GAN (two hidden layers of 64) on a ring of
Gaussians, batch 256, where per-step dispatch dominates; `dcgan`, the TensorFlow
DCGAN tutorial's networks, batch 256, 28x28x1, where the convolutions dominate;
`bigan`, the gan kit's BiGAN (`gan.make_step(encoder=True)`: generator, encoder
and pair discriminator, three Adam optimizers), batch 256, noise 64, against a
hand-written copy of the same step.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ctl  # noqa: E402

BATCH = 256


def tiny_models():
  import keras
  from keras import layers
  generator = keras.Sequential([keras.Input((2,)), layers.Dense(64, activation="relu"),
                                layers.Dense(64, activation="relu"), layers.Dense(2)])
  discriminator = keras.Sequential([keras.Input((2,)), layers.Dense(64, activation="relu"),
                                    layers.Dense(64, activation="relu"), layers.Dense(1)])
  return generator, discriminator, 2


def dcgan_models():
  """The networks of the TensorFlow DCGAN tutorial, dropout included."""
  import keras
  from keras import layers
  generator = keras.Sequential([
      keras.Input((100,)),
      layers.Dense(7 * 7 * 256, use_bias=False), layers.BatchNormalization(), layers.LeakyReLU(),
      layers.Reshape((7, 7, 256)),
      layers.Conv2DTranspose(128, 5, strides=1, padding="same", use_bias=False),
      layers.BatchNormalization(), layers.LeakyReLU(),
      layers.Conv2DTranspose(64, 5, strides=2, padding="same", use_bias=False),
      layers.BatchNormalization(), layers.LeakyReLU(),
      layers.Conv2DTranspose(1, 5, strides=2, padding="same", use_bias=False, activation="tanh"),
  ])
  discriminator = keras.Sequential([
      keras.Input((28, 28, 1)),
      layers.Conv2D(64, 5, strides=2, padding="same"), layers.LeakyReLU(), layers.Dropout(0.3),
      layers.Conv2D(128, 5, strides=2, padding="same"), layers.LeakyReLU(), layers.Dropout(0.3),
      layers.Flatten(), layers.Dense(1),
  ])
  return generator, discriminator, 100


def real_data(workload):
  import numpy as np
  import tensorflow as tf
  rng = np.random.default_rng(0)
  if workload == "tiny":
    angle = rng.integers(0, 8, 8192) * (2 * np.pi / 8)
    x = np.stack([np.cos(angle), np.sin(angle)], 1) * 2 + rng.normal(0, 0.05, (8192, 2))
  else:
    import gan
    x = (gan.load_mnist()[0][..., None] - 127.5) / 127.5
  return tf.data.Dataset.from_tensor_slices(x.astype("float32")).repeat().batch(
      BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def losses(real_logits, fake_logits):
  import tensorflow as tf
  d = tf.nn.softplus(-real_logits[:, 0]) + tf.nn.softplus(fake_logits[:, 0])
  return d, tf.nn.softplus(-fake_logits[:, 0])


BIGAN_NOISE = 64


def bigan_build():
  """The BiGAN's `build`, shared by the runner and the hand-written copy."""
  import gan
  return gan.make_build(generator=gan.dcgan_generator, discriminator=gan.bigan_discriminator,
                        encoder=gan.dcgan_encoder, image_shape=(28, 28, 1),
                        noise_dim=BIGAN_NOISE)


class Variant:
  """`run(steps)` trains `steps` steps; `traces()` counts its compiled step's traces."""

  def __init__(self, run, traces):
    self.run, self.traces = run, traces


def handwritten(workload, strategy):
  """The floor: what a careful user writes by hand (TF DCGAN tutorial style)."""
  if workload == "bigan":
    return handwritten_bigan(strategy)
  import keras
  import tensorflow as tf
  with strategy.scope():
    generator, discriminator, noise_dim = MODELS[workload]()
    g_opt, d_opt = keras.optimizers.Adam(1e-4), keras.optimizers.Adam(1e-4)
    g_opt.build(generator.trainable_variables)
    d_opt.build(discriminator.trainable_variables)
  iterator = iter(strategy.experimental_distribute_dataset(real_data(workload)))

  def replica_step(real):
    noise = tf.random.normal([tf.shape(real)[0], noise_dim])
    with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
      fake = generator(noise, training=True)
      d, g = losses(discriminator(real, training=True), discriminator(fake, training=True))
      d_loss = tf.nn.compute_average_loss(d, global_batch_size=BATCH)
      g_loss = tf.nn.compute_average_loss(g, global_batch_size=BATCH)
    d_opt.apply_gradients(zip(d_tape.gradient(d_loss, discriminator.trainable_variables),
                              discriminator.trainable_variables))
    g_opt.apply_gradients(zip(g_tape.gradient(g_loss, generator.trainable_variables),
                              generator.trainable_variables))
    return d_loss, g_loss

  return compiled_loop(strategy, replica_step, iterator)


def compiled_loop(strategy, replica_step, iterator):
  """A hand-written loop: `replica_step` under `strategy.run` in a tf.function."""
  import tensorflow as tf

  @tf.function
  def train_step(real):
    d, g = strategy.run(replica_step, args=(real,))
    return strategy.reduce("SUM", d, axis=None), strategy.reduce("SUM", g, axis=None)

  def run(steps):
    for _ in range(steps):
      out = train_step(next(iterator))
    out[0].numpy()  # wait for the last step
  return Variant(run, train_step.experimental_get_tracing_count)


def handwritten_bigan(strategy):
  """gan.make_step(encoder=True) written out by hand: no ctx, no runner."""
  import gan
  import tensorflow as tf
  with strategy.scope():
    models, optimizers = bigan_build()()
    for name, opt in optimizers.items():
      opt.build(models[name].trainable_variables)
  generator, encoder, discriminator = (models[k] for k in ("generator", "encoder",
                                                           "discriminator"))
  iterator = iter(strategy.experimental_distribute_dataset(real_data("bigan")))

  def average(per_example):
    return tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)

  def pair_logits(real, fake, z):
    return (discriminator([real, encoder(real, training=True)], training=True),
            discriminator([fake, z], training=True))

  def minimize(loss, name, tape):
    variables = models[name].trainable_variables
    optimizers[name].apply_gradients(zip(tape.gradient(loss, variables), variables))

  def replica_step(real):
    z = tf.random.normal([tf.shape(real)[0], BIGAN_NOISE])
    with tf.GradientTape() as tape:
      d_loss = average(gan.non_saturating_discriminator_loss(
          *pair_logits(real, generator(z, training=True), z)))
    minimize(d_loss, "discriminator", tape)
    z = tf.random.normal([tf.shape(real)[0], BIGAN_NOISE])
    with tf.GradientTape(persistent=True) as tape:
      real_logits, fake_logits = pair_logits(real, generator(z, training=True), z)
      # Swapped labels (Donahue et al. 2017): fakes should look real, real pairs fake.
      g_loss = average(gan.non_saturating_discriminator_loss(fake_logits, real_logits))
    minimize(g_loss, "generator", tape)
    minimize(g_loss, "encoder", tape)
    return d_loss, g_loss

  return compiled_loop(strategy, replica_step, iterator)


def library(workload, strategy, steps_per_loop, workdir=None):
  """The same step through ctl.Runner (`train`, or `fit` if given a workdir)."""
  import keras
  import tensorflow as tf
  if workload == "bigan":
    import gan
    step = gan.make_step(generator_loss=gan.non_saturating_generator_loss,
                         discriminator_loss=gan.non_saturating_discriminator_loss,
                         noise_dim=BIGAN_NOISE, encoder=True)
    build = bigan_build()
  else:
    noise_dim = {"tiny": 2, "dcgan": 100}[workload]

    def build():
      generator, discriminator, _ = MODELS[workload]()
      optimizers = {"generator": keras.optimizers.Adam(1e-4),
                    "discriminator": keras.optimizers.Adam(1e-4)}
      return {"generator": generator, "discriminator": discriminator}, optimizers

    def step(ctx, real):
      generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
      with tf.GradientTape(persistent=True) as tape:
        fake = generator(ctx.normal([noise_dim]), training=True)
        d, g = losses(discriminator(real, training=True), discriminator(fake, training=True))
        d_loss, g_loss = ctx.average(d), ctx.average(g)
      ctx.minimize(d_loss, "discriminator", tape=tape)
      ctx.minimize(g_loss, "generator", tape=tape)
      return {"discriminator_loss": d_loss, "generator_loss": g_loss}

  runner = ctl.Runner(step, build, real_data(workload), strategy=strategy,
                      steps_per_loop=steps_per_loop)

  def run(steps):
    runner.train(steps)

  def fit(steps):
    target = int(runner.global_step.numpy()) + steps
    runner.fit(target, workdir, progress=False,
               actions=[ctl.Summaries(ctl.Every(steps=steps_per_loop))])

  def traces():
    # `_loop` is the runner's compiled inner loop (None until built, or if eager).
    loop = runner._loop  # pylint: disable=protected-access
    return loop.experimental_get_tracing_count()
  return Variant(fit if workdir else run, traces)


def keras_fit(workload, strategy, steps_per_execution):
  """The same update as a `keras.Model.train_step`, run by `Model.fit`.

  The pattern of the Keras DCGAN example ("GAN overriding Model.train_step"):
  the model holds both networks and both optimizers; `compile` gets only its
  default optimizer, which `train_step` never uses.
  """
  import keras
  import tensorflow as tf

  class GAN(keras.Model):
    def __init__(self):
      super().__init__()
      self.generator, self.discriminator, self.noise_dim = MODELS[workload]()
      self.g_opt, self.d_opt = keras.optimizers.Adam(1e-4), keras.optimizers.Adam(1e-4)
      self.g_opt.build(self.generator.trainable_variables)
      self.d_opt.build(self.discriminator.trainable_variables)
      self.traces = 0

    def train_step(self, real):
      # Python runs here only while tracing, so this counts the step's traces.
      self.traces += 1
      noise = tf.random.normal([tf.shape(real)[0], self.noise_dim])
      with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
        fake = self.generator(noise, training=True)
        d, g = losses(self.discriminator(real, training=True),
                      self.discriminator(fake, training=True))
        d_loss = tf.nn.compute_average_loss(d, global_batch_size=BATCH)
        g_loss = tf.nn.compute_average_loss(g, global_batch_size=BATCH)
      d_vars, g_vars = (self.discriminator.trainable_variables,
                        self.generator.trainable_variables)
      self.d_opt.apply_gradients(zip(d_tape.gradient(d_loss, d_vars), d_vars))
      self.g_opt.apply_gradients(zip(g_tape.gradient(g_loss, g_vars), g_vars))
      return {"discriminator_loss": d_loss, "generator_loss": g_loss}

  with strategy.scope():
    model = GAN()
    model.compile(steps_per_execution=steps_per_execution)
  dataset = real_data(workload)

  def run(steps):
    # shuffle=False: a tf.data input is never shuffled by fit (it warns otherwise).
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
  return Variant(run, lambda: model.traces)


MODELS = {"tiny": tiny_models, "dcgan": dcgan_models}
WORKLOADS = {"tiny": 200, "dcgan": 10, "bigan": 10}  # steps per repetition (quick)


def variants_for(workload, strategy, workdir):
  variants = {"handwritten": handwritten(workload, strategy)}
  if workload != "bigan":
    variants["ctl steps_per_loop=1"] = library(workload, strategy, 1)
  variants["ctl steps_per_loop=10"] = library(workload, strategy, 10)
  if workload != "bigan":
    variants["ctl fit steps_per_loop=10"] = library(workload, strategy, 10, workdir)
    variants["keras fit spe=1"] = keras_fit(workload, strategy, 1)
    variants["keras fit spe=10"] = keras_fit(workload, strategy, 10)
  return variants


def measure(variants, steps, repetitions):
  """Median seconds per step and traces after the warm-up, repetitions interleaved."""
  for variant in variants.values():
    variant.run(steps)  # trace and warm up
  traced = {name: variant.traces() for name, variant in variants.items()}
  times = {name: [] for name in variants}
  for _ in range(repetitions):
    for name, variant in variants.items():
      start = time.perf_counter()
      variant.run(steps)
      times[name].append((time.perf_counter() - start) / steps)
  return {name: (statistics.median(t), variants[name].traces() - traced[name])
          for name, t in times.items()}


def parse_workloads(text, parser):
  workloads = [w.strip() for w in text.split(",") if w.strip()]
  unknown = [w for w in workloads if w not in WORKLOADS]
  if unknown or not workloads:
    parser.error(f"--workloads {text!r}: unknown workload(s) {unknown}; choose a "
                 f"comma-separated subset of {', '.join(WORKLOADS)}")
  return workloads


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
  p.add_argument("--workloads", default=",".join(WORKLOADS),
                 help=f"comma-separated subset of {', '.join(WORKLOADS)}")
  p.add_argument("--steps", type=int, help="steps per repetition, for every workload")
  p.add_argument("--repetitions", type=int, help="timed repetitions per variant")
  args = p.parse_args()
  workloads = parse_workloads(args.workloads, p)
  for name in ("steps", "repetitions"):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      p.error(f"--{name} ({getattr(args, name)}) must be at least 1")
  strategy = ctl.make_strategy("default")
  rows = []
  for workload in workloads:
    steps = args.steps or WORKLOADS[workload] * (1 if args.quick else 2)
    repetitions = args.repetitions or (5 if args.quick else 11)
    workdir = tempfile.mkdtemp(prefix=f"ctl-bench-{workload}-")
    try:
      results = measure(variants_for(workload, strategy, workdir), steps, repetitions)
    finally:
      shutil.rmtree(workdir, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    floor = results["handwritten"][0]
    for name, (seconds, traces) in results.items():
      rows.append({"workload": workload, "variant": name, "strategy": "default",
                   "ms_per_step": round(seconds * 1e3, 3),
                   "examples_per_s": round(BATCH / seconds, 1),
                   "ratio_to_handwritten": round(seconds / floor, 3),
                   "peak_rss_mb": round(peak, 1), "steps": steps,
                   "repetitions": repetitions, "traces_after_first_call": traces})
  print(f"{'workload':8s} {'variant':28s} {'ms/step':>9s} {'ex/s':>10s} {'ratio':>6s} "
        f"{'traces':>6s}")
  for r in rows:
    print(f"{r['workload']:8s} {r['variant']:28s} {r['ms_per_step']:9.3f} "
          f"{r['examples_per_s']:10.1f} {r['ratio_to_handwritten']:6.3f} "
          f"{r['traces_after_first_call']:6d}")
  for r in rows:
    print(json.dumps(r))


if __name__ == "__main__":
  main()
