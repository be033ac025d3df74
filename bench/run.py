"""Runner overhead against a hand-written `tf.function` + `strategy.run` loop.

    python bench/run.py --quick      # about a minute on a 2-core CPU
    python bench/run.py              # more repetitions

Both sides train the same networks on the same in-memory data in the same
process. Repetitions are interleaved (A, B, C, A, B, C, ...) so that drifts in
machine load hit every variant alike; medians are reported. Prints a table, then
one JSON object per line.

Variants: `handwritten` (the floor), `ctl steps_per_loop=1/10` (`runner.train`),
and `ctl fit steps_per_loop=10`: `runner.fit` with TensorBoard scalars written
after every compiled call (every 10 steps) and its checkpoint handling. Each
timed `fit` call also restores the newest checkpoint at its start and saves one
at its end, which a real run does once, so this is an upper bound on what the
outer loop costs.

Workloads: `tiny`, a 2-D MLP GAN (two hidden layers of 64) on a ring of
Gaussians, batch 256, where per-step dispatch dominates; `dcgan`, the TensorFlow
DCGAN tutorial's networks, batch 256, 28x28x1, where the convolutions dominate.
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


def handwritten(workload, strategy):
  """The floor: what a careful user writes by hand (TF DCGAN tutorial style)."""
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

  @tf.function
  def train_step(real):
    d, g = strategy.run(replica_step, args=(real,))
    return strategy.reduce("SUM", d, axis=None), strategy.reduce("SUM", g, axis=None)

  def run(steps):
    for _ in range(steps):
      out = train_step(next(iterator))
    out[0].numpy()  # wait for the last step
  return run


def library(workload, strategy, steps_per_loop, workdir=None):
  """The same step through ctl.Runner (`train`, or `fit` if given a workdir)."""
  import keras
  import tensorflow as tf
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
  return fit if workdir else run


MODELS = {"tiny": tiny_models, "dcgan": dcgan_models}


def measure(variants, steps, repetitions):
  """Median seconds per step of each variant, repetitions interleaved."""
  for run in variants.values():
    run(steps)  # trace and warm up
  times = {name: [] for name in variants}
  for _ in range(repetitions):
    for name, run in variants.items():
      start = time.perf_counter()
      run(steps)
      times[name].append((time.perf_counter() - start) / steps)
  return {name: statistics.median(t) for name, t in times.items()}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
  p.add_argument("--workloads", default="tiny,dcgan")
  args = p.parse_args()
  strategy = ctl.make_strategy("default")
  rows = []
  for workload in args.workloads.split(","):
    steps = {"tiny": 200, "dcgan": 10}[workload] * (1 if args.quick else 2)
    repetitions = 5 if args.quick else 11
    workdir = tempfile.mkdtemp(prefix=f"ctl-bench-{workload}-")
    variants = {"handwritten": handwritten(workload, strategy),
                "ctl steps_per_loop=1": library(workload, strategy, 1),
                "ctl steps_per_loop=10": library(workload, strategy, 10),
                "ctl fit steps_per_loop=10": library(workload, strategy, 10, workdir)}
    medians = measure(variants, steps, repetitions)
    shutil.rmtree(workdir, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for name, seconds in medians.items():
      rows.append({"workload": workload, "variant": name, "strategy": "default",
                   "ms_per_step": round(seconds * 1e3, 3),
                   "examples_per_s": round(BATCH / seconds, 1),
                   "ratio_to_handwritten": round(seconds / medians["handwritten"], 3),
                   "peak_rss_mb": round(peak, 1), "steps": steps,
                   "repetitions": repetitions})
  print(f"{'workload':8s} {'variant':28s} {'ms/step':>9s} {'ex/s':>10s} {'ratio':>6s}")
  for r in rows:
    print(f"{r['workload']:8s} {r['variant']:28s} {r['ms_per_step']:9.3f} "
          f"{r['examples_per_s']:10.1f} {r['ratio_to_handwritten']:6.3f}")
  for r in rows:
    print(json.dumps(r))


if __name__ == "__main__":
  main()
