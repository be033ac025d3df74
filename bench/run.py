"""Runner overhead against a hand-written `tf.function` + `strategy.run` loop.

    python bench/run.py --quick      # the targets' variants: under 3 minutes here
    python bench/run.py              # every variant, more repetitions (about 25 minutes)
    python bench/run.py --workloads tiny --steps 20 --repetitions 2   # a smoke run

Every side trains the same networks on the same in-memory data in the same
process. Variants of one workload and strategy are measured together, their
repetitions interleaved (A, B, C, A, B, C, ...) so that drifts in machine load
hit every variant alike; medians are reported, and each ratio is against the
hand-written loop of the same group. Prints a table, then one JSON object per
line. docs/performance.md holds a full run and reads it.

Variants: `handwritten` (the floor: what a careful user writes, the TF DCGAN
tutorial's loop under `strategy.run`); `ctl steps_per_loop=N` (`runner.train`,
N steps in one compiled call); `ctl fit steps_per_loop=N`: `runner.fit` with
TensorBoard scalars after every compiled call and its checkpoint handling
(each timed call also restores the newest checkpoint at its start and saves
one at its end, which a real run does once: an upper bound on the outer
loop's cost); `ctl synthetic input`: ctl fed one batch held in memory, whose
time against `ctl steps_per_loop=1` gives the share of the step spent waiting
for input (`input_wait_share`); `ctl steps_per_loop=10 row-batched input`:
the same loop fed batches assembled from single rows (see `real_data`);
`ctl jit_compile` and `ctl mixed_bfloat16`:
the Runner's switches (the bfloat16 row carries `loss_gap`, each loss's mean
absolute difference from the float32 run, same seed and data, step by step);
`keras fit spe=N`: the same update as a `keras.Model` with an overridden
`train_step`, run by `Model.fit` with `steps_per_execution` N, one `fit` call
per timed repetition (a new epoch iterator and callbacks included), which is
how Keras users loop. The `mirrored` strategy runs over 2 logical CPUs.

Efficiency: `gflop_per_step` counts the FLOPs of the hand-written step's
graph (TensorFlow's profiler, ops the results and variable updates depend on);
`share_of_ceiling` sets each variant's GFLOP/s against the DCGAN step's
dominant convolution timed alone in the same run (the kernel ceiling), which
is also timed in bfloat16. `traces_after_first_call` counts the traces of the
compiled step after the warm-up call: anything but 0 means a variant retraces.

Workloads: `tiny`, a 2-D MLP GAN (two hidden layers of 64) on a ring of
Gaussians, batch 256, where per-step dispatch dominates; `dcgan`, the TensorFlow
DCGAN tutorial's networks, batch 256, 28x28x1, where the convolutions dominate;
`bigan`, the gan kit's BiGAN (`gan.experiment.make_step(encoder=True)`: generator, encoder
and pair discriminator, three Adam optimizers), batch 256, noise 64, against a
hand-written copy of the same step.
"""

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import ctl

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
      # float32 logits (a no-op in float32): the loss stays float32 under
      # mixed precision, as Keras' mixed-precision guide asks.
      layers.Flatten(), layers.Dense(1, dtype="float32"),
  ])
  return generator, discriminator, 100


def real_data(workload, row_batching=False):
  """The workload's examples as a repeated dataset of batches of 256.

  Whole batches are sliced from the array, one element each, as Keras' array
  adapter does. `row_batching`: the common `from_tensor_slices(x).batch(256)`,
  which assembles every batch from 256 single-row elements; on this CPU that
  takes longer than a `tiny` step (see docs/performance.md).
  """
  import numpy as np
  import tensorflow as tf
  rng = np.random.default_rng(0)
  if workload == "tiny":
    angle = rng.integers(0, 8, 8192) * (2 * np.pi / 8)
    x = np.stack([np.cos(angle), np.sin(angle)], 1) * 2 + rng.normal(0, 0.05, (8192, 2))
  else:
    import gan
    x = (gan.data.load_mnist()[0][..., None] - 127.5) / 127.5
  x = x.astype("float32")
  if row_batching:
    dataset = tf.data.Dataset.from_tensor_slices(x).repeat().batch(BATCH, drop_remainder=True)
  else:
    batches = len(x) // BATCH
    dataset = tf.data.Dataset.from_tensor_slices(
        x[:batches * BATCH].reshape(batches, BATCH, *x.shape[1:])).repeat()
  return dataset.prefetch(tf.data.AUTOTUNE)


def losses(real_logits, fake_logits):
  import tensorflow as tf
  d = tf.nn.softplus(-real_logits[:, 0]) + tf.nn.softplus(fake_logits[:, 0])
  return d, tf.nn.softplus(-fake_logits[:, 0])


BIGAN_NOISE = 64


def bigan_build():
  """The BiGAN's `build`, shared by the runner and the hand-written copy."""
  import gan
  return gan.experiment.make_build(
      generator=gan.dcgan_generator, discriminator=gan.models.bigan_discriminator,
      encoder=gan.models.dcgan_encoder, image_shape=(28, 28, 1), noise_dim=BIGAN_NOISE)


class Variant:
  """`run(steps)` trains `steps` steps; `traces()` counts its compiled step's traces.

  `results` keeps what each run returned (the runner's per-step losses), and
  `concrete()`, where given, is the compiled step's concrete function (for its FLOPs).
  """

  def __init__(self, run, traces, concrete=None):
    self._run, self.traces, self.concrete = run, traces, concrete
    self.results = []

  def run(self, steps):
    out = self._run(steps)
    if out is not None:
      self.results.append(out)


def handwritten(workload, strategy, steps_per_call=1):
  """The floor: what a careful user writes by hand (TF DCGAN tutorial style).

  `steps_per_call` > 1: the same step in an in-graph loop of that many steps
  per call (the floor of `ctl steps_per_loop=N`).
  """
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

  return compiled_loop(strategy, replica_step, iterator, steps_per_call)


def compiled_loop(strategy, replica_step, iterator, steps_per_call=1):
  """A hand-written loop: `replica_step` under `strategy.run` in a tf.function.

  One step per call, the next batch from Python, the results read only after
  the last call; or (`steps_per_call` > 1) an in-graph loop of that many
  steps per call, which returns the last step's results.
  """
  import tensorflow as tf

  def one_step(real):
    d, g = strategy.run(replica_step, args=(real,))
    return strategy.reduce("SUM", d, axis=None), strategy.reduce("SUM", g, axis=None)

  train_step = tf.function(one_step)

  @tf.function
  def train_loop(n):
    d = g = tf.constant(0.0)
    for _ in tf.range(n):
      d, g = one_step(next(iterator))
    return d, g

  def run(steps):
    if steps_per_call == 1:
      for _ in range(steps):
        out = train_step(next(iterator))
    else:
      while steps > 0:
        out = train_loop(tf.constant(min(steps, steps_per_call)))
        steps -= steps_per_call
    out[0].numpy()  # wait for the last step

  def concrete():
    return train_step.get_concrete_function(next(iterator))
  function = train_step if steps_per_call == 1 else train_loop
  return Variant(run, function.experimental_get_tracing_count, concrete)


def handwritten_bigan(strategy):
  """gan.experiment.make_step(encoder=True) written out by hand: no ctx, no runner."""
  import tensorflow as tf

  import gan
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
      d_loss = average(gan.losses.non_saturating_discriminator_loss(
          *pair_logits(real, generator(z, training=True), z)))
    minimize(d_loss, "discriminator", tape)
    z = tf.random.normal([tf.shape(real)[0], BIGAN_NOISE])
    with tf.GradientTape(persistent=True) as tape:
      real_logits, fake_logits = pair_logits(real, generator(z, training=True), z)
      # Swapped labels (Donahue et al. 2017): fakes should look real, real pairs fake.
      g_loss = average(gan.losses.non_saturating_discriminator_loss(fake_logits, real_logits))
    minimize(g_loss, "generator", tape)
    minimize(g_loss, "encoder", tape)
    return d_loss, g_loss

  return compiled_loop(strategy, replica_step, iterator)


def library(workload, strategy, steps_per_loop=1, workdir=None, *, synthetic=False,
            row_batching=False, stateful_noise=False, **runner_args):
  """The same step through ctl.Runner (`train`, or `fit` if given a workdir).

  `synthetic`: feed one batch, held in memory, again and again instead of the
  input pipeline (the input-wait baseline); `row_batching`: see `real_data`;
  `stateful_noise`: the noise from `tf.random.normal`, as the hand-written
  loop draws it, instead of `ctx.normal` (what ctl's deterministic draws cost).
  `runner_args` go to `ctl.Runner`
  (`mixed_precision`, `jit_compile`).
  """
  import keras
  import tensorflow as tf
  if workload == "bigan":
    import gan
    step = gan.experiment.make_step(loss=gan.losses.non_saturating, noise_dim=BIGAN_NOISE,
                                    encoder=True)
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
        noise = (tf.random.normal([ctx.per_replica_batch_size, noise_dim]) if stateful_noise
                 else ctx.normal([noise_dim]))
        fake = generator(noise, training=True)
        d, g = losses(discriminator(real, training=True), discriminator(fake, training=True))
        d_loss, g_loss = ctx.average(d), ctx.average(g)
      ctx.minimize(d_loss, "discriminator", tape=tape)
      ctx.minimize(g_loss, "generator", tape=tape)
      return {"discriminator_loss": d_loss, "generator_loss": g_loss}

  data = real_data(workload, row_batching)
  if synthetic:
    data = tf.data.Dataset.from_tensors(next(iter(data))).repeat()
  runner = ctl.Runner(step, build, data, strategy=strategy, steps_per_loop=steps_per_loop,
                      **runner_args)

  def run(steps):
    return runner.train(steps)

  def fit(steps):
    target = int(runner.global_step.numpy()) + steps
    runner.fit(target, workdir, progress=False,
               summaries=ctl.Summaries(ctl.Every(steps=steps_per_loop)))

  def traces():
    return runner.compiled_step.trace_count
  variant = Variant(fit if workdir else run, traces)
  variant.runner = runner
  return variant


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


def torch_rows(kind):
  """PyTorch (`kind` "torch") or Lightning rows: bench/torch_rows.py."""
  import torch_rows as rows  # bench/ is on sys.path: run.py is run as a script
  return rows.torch_variant if kind == "torch" else rows.lightning_variant


def torch_unavailable():
  """None if the PyTorch and Lightning rows can run, else why not."""
  try:
    import torch_rows as rows
  except ImportError as e:  # run.py imported as a module, without bench/ on sys.path
    return str(e)
  return rows.available()

VARIANTS = {
    "handwritten": lambda w, s, d: handwritten(w, s),
    "handwritten in-graph loop of 10": lambda w, s, d: handwritten(w, s, 10),
    "handwritten in-graph loop of 100": lambda w, s, d: handwritten(w, s, 100),
    "ctl steps_per_loop=1": lambda w, s, d: library(w, s, 1),
    "ctl steps_per_loop=10": lambda w, s, d: library(w, s, 10),
    "ctl steps_per_loop=100": lambda w, s, d: library(w, s, 100),
    "ctl fit steps_per_loop=1": lambda w, s, d: library(w, s, 1, d),
    "ctl fit steps_per_loop=10": lambda w, s, d: library(w, s, 10, d),
    "ctl synthetic input": lambda w, s, d: library(w, s, 1, synthetic=True),
    "ctl steps_per_loop=10 stateful noise":
        lambda w, s, d: library(w, s, 10, stateful_noise=True),
    "ctl steps_per_loop=10 row-batched input":
        lambda w, s, d: library(w, s, 10, row_batching=True),
    "ctl jit_compile": lambda w, s, d: library(w, s, 1, jit_compile=True),
    "ctl mixed_bfloat16": lambda w, s, d: library(w, s, 1, mixed_precision="mixed_bfloat16"),
    "pytorch": lambda w, s, d: torch_rows("torch")(w),
    "lightning": lambda w, s, d: torch_rows("lightning")(w),
    "keras fit spe=1": lambda w, s, d: keras_fit(w, s, 1),
    "keras fit spe=10": lambda w, s, d: keras_fit(w, s, 10),
}

_TINY = ["handwritten", "handwritten in-graph loop of 10", "handwritten in-graph loop of 100",
         "ctl steps_per_loop=1", "ctl steps_per_loop=10", "ctl steps_per_loop=100",
         "keras fit spe=1", "keras fit spe=10"]
_MIRRORED = ["handwritten", "handwritten in-graph loop of 10", "ctl steps_per_loop=1",
             "ctl steps_per_loop=10"]
# Each variant's floor, the hand-written loop that does the same work per call.
FLOORS = {"ctl steps_per_loop=10": "handwritten in-graph loop of 10",
          "ctl steps_per_loop=100": "handwritten in-graph loop of 100",
          "ctl fit steps_per_loop=10": "handwritten in-graph loop of 10",
          "ctl steps_per_loop=10 row-batched input": "handwritten in-graph loop of 10",
          "ctl steps_per_loop=10 stateful noise": "handwritten in-graph loop of 10",
          "keras fit spe=10": "handwritten in-graph loop of 10"}
# (workload, strategy, steps per repetition, repetitions, variants). A DCGAN
# step takes seconds here, so its loops of 10 or 100 steps are left out (a
# dispatch saving of well under a millisecond per step cannot show), and its
# bfloat16 step (about 9x slower than float32 on a CPU without bfloat16
# instructions) only runs in the full plan. `--quick` keeps what the targets
# need: the loop variants and the input-wait baseline on `tiny`, and the
# hand-written loop, ctl and Keras on `dcgan`.
PLANS = {
    "full": [
        ("tiny", "default", 400, 7, _TINY + [
            "ctl fit steps_per_loop=10", "ctl synthetic input",
            "ctl steps_per_loop=10 stateful noise",
            "ctl steps_per_loop=10 row-batched input", "ctl jit_compile",
            "ctl mixed_bfloat16", "pytorch", "lightning"]),
        ("tiny", "mirrored", 400, 7, _MIRRORED),
        ("dcgan", "default", 3, 5, ["handwritten", "ctl steps_per_loop=1",
                                    "ctl fit steps_per_loop=1", "keras fit spe=1",
                                    "ctl synthetic input", "ctl jit_compile",
                                    "ctl mixed_bfloat16", "pytorch", "lightning"]),
        ("dcgan", "mirrored", 3, 5, ["handwritten", "ctl steps_per_loop=1"]),
        ("bigan", "default", 3, 5, ["handwritten", "ctl steps_per_loop=1"]),
    ],
    "quick": [
        ("tiny", "default", 200, 5, _TINY + [
            "ctl synthetic input", "ctl steps_per_loop=10 stateful noise", "ctl jit_compile",
            "pytorch", "lightning"]),
        ("tiny", "mirrored", 200, 5, _MIRRORED),
        ("dcgan", "default", 1, 5, ["handwritten", "ctl steps_per_loop=1", "keras fit spe=1",
                                    "pytorch", "lightning"]),
    ],
}
WORKLOADS = ("tiny", "dcgan", "bigan")
# Steps of the untimed first run, which traces and warms up (None: a whole
# repetition). One DCGAN or BiGAN step takes seconds and traces everything.
WARMUP_STEPS = {"tiny": None, "dcgan": 1, "bigan": 1}


def measure(variants, steps, repetitions, warmup_steps=None):
  """Median seconds per step and traces after the warm-up, repetitions interleaved."""
  for variant in variants.values():
    variant.run(warmup_steps or steps)  # trace and warm up
  traced = {name: variant.traces() for name, variant in variants.items()}
  times = {name: [] for name in variants}
  for _ in range(repetitions):
    for name, variant in variants.items():
      start = time.perf_counter()
      variant.run(steps)
      times[name].append((time.perf_counter() - start) / steps)
  return {name: (statistics.median(t), variants[name].traces() - traced[name])
          for name, t in times.items()}


def live_gflop(concrete):
  """GFLOP of the ops a compiled step's results and variable updates depend on.

  TensorFlow's profiler counts every op of the traced graph, including
  gradients a tape builds but nothing reads (a conv's input gradient at the
  first layer, say), which the runtime prunes; only the ops reachable
  backwards from the outputs and the stateful ops are counted here.
  """
  import tensorflow as tf
  graph = concrete.graph
  seen, stack = set(), [t.op for t in graph.outputs]
  stack += [op for op in graph.get_operations() if op.op_def.is_stateful]
  while stack:
    op = stack.pop()
    if op.name not in seen:
      seen.add(op.name)
      stack.extend(t.op for t in op.inputs)
      stack.extend(op.control_inputs)
  options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
  options["output"] = "none"
  options["min_float_ops"] = 0
  profile = tf.compat.v1.profiler.profile(graph, options=options)
  total, nodes = 0, list(profile.children)
  while nodes:
    node = nodes.pop()
    nodes.extend(node.children)
    if node.name in seen:
      total += node.float_ops
  return total / 1e9


def conv_ceiling(timed_runs, bfloat16=True):
  """GFLOP/s of the DCGAN step's dominant convolution alone, and bfloat16's speed.

  The generator's first Conv2DTranspose (7x7, 256 -> 128 channels, 5x5, batch
  256) and its two gradients do about half of the step's FLOPs. The three run
  in one tf.function (float32, best of `timed_runs`) and give the kernel
  ceiling; its forward in bfloat16 against float32 tells whether this CPU has
  fast bfloat16 kernels (mixed_bfloat16 can only be as fast as they are);
  None without `bfloat16`.
  """
  import tensorflow as tf
  n, side, c_in, c_out, k = BATCH, 7, 256, 128, 5
  gflop = 2 * n * side * side * c_in * c_out * k * k / 1e9  # each of the 3 ops
  rng = tf.random.Generator.from_seed(0)

  def best(fn, *args):
    fn(*args).numpy()  # trace and warm up
    times = []
    for _ in range(timed_runs):
      start = time.perf_counter()
      fn(*args).numpy()
      times.append(time.perf_counter() - start)
    return min(times)

  def forward(x, w):
    return tf.nn.conv2d_transpose(x, w, [n, side, side, c_out], 1)

  @tf.function
  def forward_backward(x, w):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = forward(x, w)
    dx, dw = tape.gradient(y, [x, w], output_gradients=tf.ones_like(y))
    return tf.reduce_sum(dx[:1, 0, 0, 0]) + tf.reduce_sum(dw[0, 0, 0, :1])

  x = rng.normal([n, side, side, c_in])
  w = rng.normal([k, k, c_out, c_in])
  ceiling = 3 * gflop / best(forward_backward, x, w)
  fwd = tf.function(lambda x, w: tf.reduce_sum(forward(x, w)[:1, 0, 0, :1]))
  if not bfloat16:
    return ceiling, None
  f32 = best(fwd, x, w)
  bf16 = best(fwd, tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16))
  return ceiling, f32 / bf16


def loss_gap(reference, other):
  """Mean |difference| of each loss over the steps both runs trained, and their means."""
  import numpy as np
  gap = {}
  for key in reference.results[0]:
    a = np.concatenate([r[key] for r in reference.results]).astype(float)
    b = np.concatenate([r[key] for r in other.results]).astype(float)
    steps = min(len(a), len(b))
    a, b = a[:steps], b[:steps]
    gap[key] = {"steps": steps, "mean_abs_gap": round(float(np.mean(np.abs(a - b))), 4),
                "float32_mean": round(float(a.mean()), 4),
                "mixed_bfloat16_mean": round(float(b.mean()), 4)}
  return gap


def run_group(workload, strategy_name, strategy, variant_names, steps, repetitions,
              ceiling):
  workdir = tempfile.mkdtemp(prefix=f"ctl-bench-{workload}-")
  try:
    variants = {name: VARIANTS[name](workload, strategy, workdir) for name in variant_names}
    results = measure(variants, steps, repetitions, WARMUP_STEPS[workload])
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  gflop = live_gflop(variants["handwritten"].concrete())
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  floor = results["handwritten"][0]
  rows = []
  for name, (seconds, traces) in results.items():
    floor_name = FLOORS.get(name, "handwritten")
    if floor_name not in results:
      floor_name = "handwritten"
    row = {"workload": workload, "variant": name, "strategy": strategy_name,
           "ms_per_step": round(seconds * 1e3, 3),
           "examples_per_s": round(BATCH / seconds, 1),
           "ratio_to_handwritten": round(seconds / floor, 3),
           "floor": floor_name, "ratio_to_floor": round(seconds / results[floor_name][0], 3),
           "peak_rss_mb": round(peak, 1), "steps": steps, "repetitions": repetitions,
           "traces_after_first_call": traces, "gflop_per_step": round(gflop, 3),
           "gflop_per_s": round(gflop / seconds, 2),
           "share_of_ceiling": round(gflop / seconds / ceiling, 3) if ceiling else None}
    if name == "ctl steps_per_loop=1" and "ctl synthetic input" in results:
      # Time the same step loses to its input pipeline, against one batch in memory.
      row["input_wait_share"] = round(1 - results["ctl synthetic input"][0] / seconds, 4)
    if name == "ctl mixed_bfloat16":
      row["loss_gap"] = loss_gap(variants["ctl steps_per_loop=1"], variants[name])
    rows.append(row)
  return rows


def parse_workloads(text, parser):
  workloads = [w.strip() for w in text.split(",") if w.strip()]
  unknown = [w for w in workloads if w not in WORKLOADS]
  if unknown or not workloads:
    parser.error(f"--workloads {text!r}: unknown workload(s) {unknown}; choose a "
                 f"comma-separated subset of {', '.join(WORKLOADS)}")
  return workloads


def cpu_features():
  """The CPU and the instructions the variants' kernels can use (Linux's /proc/cpuinfo).

  `bfloat16_instructions`: AVX512_BF16 or AMX-BF16 on x86 (BF16 on ARM):
  without them oneDNN converts bfloat16 to float32 and back around float32
  arithmetic, and mixed_bfloat16 cannot pay off.
  """
  model, flags = platform.machine(), set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and model == platform.machine():
          model = value
        elif key in ("flags", "Features") and not flags:
          flags = set(value.split())
  except OSError:
    pass
  names = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "bf16")
  features = {name: name in flags for name in names}
  x86 = platform.machine() in ("x86_64", "AMD64")
  # TF turns oneDNN on by default on x86 Linux; TF_ENABLE_ONEDNN_OPTS=0 turns it off.
  onednn = x86 and os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") not in ("0", "false")
  return {"cpu": model, "cores": os.cpu_count(), "features": features, "onednn": onednn,
          "bfloat16_instructions": bool(features["avx512_bf16"] or features["amx_bf16"]
                                        or features["bf16"])}


# What the first-step rows compare: the time from "models built" to the first
# step's result, in a fresh process (tracing and graph optimization included).
FIRST_STEP_VARIANTS = ("handwritten", "ctl steps_per_loop=1", "keras fit spe=1")


def first_step_child(workload, variant):
  """In a fresh process: builds `variant`, then times its first step."""
  import tensorflow as tf
  built = VARIANTS[variant](workload, tf.distribute.get_strategy(), None)
  start = time.perf_counter()
  built.run(1)
  print(json.dumps({"first_step_s": time.perf_counter() - start}))


def first_steps(workload, repetitions, variants=FIRST_STEP_VARIANTS):
  """Median time to the first step's result of each of `variants` (the
  hand-written loop first), one fresh process per measurement, interleaved."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  times = {name: [] for name in variants}
  for _ in range(repetitions):
    for name in variants:
      proc = subprocess.run([sys.executable, __file__, "--first-step", name,
                             "--workloads", workload], env=env, capture_output=True,
                            text=True, check=False)
      lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
      if proc.returncode or not lines:
        raise RuntimeError(f"first step of {name} on {workload} failed:\n{proc.stderr[-3000:]}")
      times[name].append(json.loads(lines[-1])["first_step_s"])
  floor = statistics.median(times["handwritten"])
  return [{"measure": "first_step", "workload": workload, "variant": name,
           "strategy": "default", "first_step_s": round(statistics.median(t), 3),
           "min_s": round(min(t), 3), "max_s": round(max(t), 3),
           "ratio_to_handwritten": round(statistics.median(t) / floor, 3),
           "repetitions": repetitions} for name, t in times.items()]


def _row(rows, workload, variant, strategy="default", measure=None):
  for r in rows:
    if (r["workload"], r["variant"], r["strategy"], r.get("measure")) == (
        workload, variant, strategy, measure):
      return r
  return None


def targets(rows, cpu):
  """Issue 18's targets against this run's rows: (target, value, met); met is
  None where a target's rows were not measured, "n/a" where it does not apply."""
  out = []

  def ratio(target, workload, variant, limit, strategy="default", key="ratio_to_floor",
            measure=None):
    row = _row(rows, workload, variant, strategy, measure)
    value = None if row is None else row[key]
    out.append({"target": target, "value": value,
                "met": None if value is None else value <= limit})

  ratio("tiny: ctl steps_per_loop=1 <= 1.2x the hand-written per-step loop", "tiny",
        "ctl steps_per_loop=1", 1.2)
  ratio("tiny: ctl steps_per_loop=10 <= 1.05x the hand-written in-graph loop of 10",
        "tiny", "ctl steps_per_loop=10", 1.05)
  ctl10, keras10 = (_row(rows, "tiny", v) for v in ("ctl steps_per_loop=10", "keras fit spe=10"))
  out.append({"target": "tiny: ctl steps_per_loop=10 ahead of Keras fit at "
              "steps_per_execution=10 (ms/step, ctl / Keras)",
              "value": ctl10 and keras10 and round(ctl10["ms_per_step"] /
                                                   keras10["ms_per_step"], 3),
              "met": None if not (ctl10 and keras10) else
              ctl10["ms_per_step"] < keras10["ms_per_step"]})
  ratio("tiny mirrored: ctl steps_per_loop=1 <= the hand-written mirrored loop", "tiny",
        "ctl steps_per_loop=1", 1.0, strategy="mirrored")
  for workload in ("dcgan", "bigan"):
    ratio(f"{workload}: ctl steps_per_loop=1 <= 1.00x hand-written (2% noise allowed)",
          workload, "ctl steps_per_loop=1", 1.02)
    ctl1, keras1 = (_row(rows, workload, v) for v in ("ctl steps_per_loop=1", "keras fit spe=1"))
    if ctl1 and keras1:
      out.append({"target": f"{workload}: ahead of Keras fit (ms/step, ctl / Keras)",
                  "value": round(ctl1["ms_per_step"] / keras1["ms_per_step"], 3),
                  "met": ctl1["ms_per_step"] < keras1["ms_per_step"]})
  for workload in ("tiny", "dcgan"):
    ratio(f"{workload}: first step <= 1.2x the hand-written loop's", workload,
          "ctl steps_per_loop=1", 1.2, key="ratio_to_handwritten", measure="first_step")
  bf16, f32 = (_row(rows, "dcgan", v) for v in ("ctl mixed_bfloat16", "ctl steps_per_loop=1"))
  if not cpu["bfloat16_instructions"]:
    out.append({"target": "dcgan: mixed_bfloat16 >= 1.3x faster than float32", "value":
                "no bfloat16 instructions on this CPU", "met": "n/a"})
  else:
    speed = bf16 and f32 and round(f32["ms_per_step"] / bf16["ms_per_step"], 3)
    out.append({"target": "dcgan: mixed_bfloat16 >= 1.3x faster than float32",
                "value": speed, "met": None if speed is None else speed >= 1.3})
  ps10 = _row(rows, "tiny", "ctl steps_per_loop=10", "parameter_server", "parameter_server")
  out.append({"target": "parameter_server: steps_per_loop=10 runs more steps/s than one "
              "step per scheduled call (ms/step ratio)",
              "value": ps10 and ps10["ratio_to_one_step_per_call"],
              "met": None if ps10 is None else ps10["ratio_to_one_step_per_call"] < 1})
  timed = [r for r in rows if "traces_after_first_call" in r]
  out.append({"target": "no retrace after the first call (rows with one)",
              "value": sum(r["traces_after_first_call"] > 0 for r in timed),
              "met": all(r["traces_after_first_call"] == 0 for r in timed)})
  waits = [r["input_wait_share"] for r in rows if "input_wait_share" in r]
  out.append({"target": "input wait < 2% of the step", "value": waits or None,
              "met": None if not waits else all(w < 0.02 for w in waits)})
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true",
                 help="fewer variants, steps and repetitions (under 3 minutes)")
  p.add_argument("--workloads", default=",".join(WORKLOADS),
                 help=f"comma-separated subset of {', '.join(WORKLOADS)}")
  p.add_argument("--steps", type=int, help="steps per repetition, for every workload")
  p.add_argument("--repetitions", type=int,
                 help="timed repetitions per variant (and fresh processes per first-step row)")
  p.add_argument("--first-step", help=argparse.SUPPRESS)  # a child of first_steps
  args = p.parse_args()
  workloads = parse_workloads(args.workloads, p)
  if args.first_step:
    first_step_child(workloads[0], args.first_step)
    return
  for name in ("steps", "repetitions"):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      p.error(f"--{name} ({getattr(args, name)}) must be at least 1")
  cpu = cpu_features()
  print(f"CPU: {cpu['cpu']}, {cpu['cores']} cores; "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["features"].items())
        + f"; oneDNN {'on' if cpu['onednn'] else 'off'}; mixed_bfloat16 "
        + ("can pay off here" if cpu["bfloat16_instructions"] else
           "cannot pay off here (no bfloat16 instructions: oneDNN converts to float32)"))
  no_torch = torch_unavailable()
  if no_torch:
    print(f"PyTorch and Lightning rows left out: {no_torch}")
  plan = []
  for workload, strategy_name, steps, repetitions, names in PLANS[
      "quick" if args.quick else "full"]:
    if workload not in workloads:
      continue
    if no_torch:
      names = [n for n in names if n not in ("pytorch", "lightning")]
    if workload == "dcgan" and strategy_name == "default":
      bf16 = "ctl mixed_bfloat16"
      # Where it cannot pay off, a bfloat16 DCGAN step is ~8x slower than float32.
      names = [n for n in names if n != bf16] + [bf16] * cpu["bfloat16_instructions"]
    plan.append((workload, strategy_name, steps, repetitions, names))
  # Two logical CPUs for the mirrored variants, before any TensorFlow op.
  strategies = {"default": ctl.make_strategy("default", logical_cpus=2)}
  if any(g[1] == "mirrored" for g in plan):
    strategies["mirrored"] = ctl.make_strategy("mirrored")
  ceiling = bf16_speed = None
  if {"dcgan", "bigan"} & set(workloads):
    ceiling, bf16_speed = conv_ceiling(1 if args.quick else 3, bfloat16=not args.quick)
  rows = []
  for workload, strategy_name, steps, repetitions, names in plan:
    rows += run_group(workload, strategy_name, strategies[strategy_name], names,
                      args.steps or steps, args.repetitions or repetitions, ceiling)
    # Free the group's models and input iterators now: left to the interpreter's
    # exit, a tf.data iterator's destructor can wait forever on its threads.
    gc.collect()
  first = []
  for workload in ("tiny", "dcgan"):
    if workload in workloads:
      first += first_steps(workload, args.repetitions or (3 if args.quick else 5),
                           FIRST_STEP_VARIANTS[:2] if args.quick else FIRST_STEP_VARIANTS)
  ps_rows = []
  if "tiny" in workloads:  # a local cluster of 2 workers and 1 parameter server
    import ps
    ps_rows = ps.measure(args.steps or (200 if args.quick else 400),
                         args.repetitions or (3 if args.quick else 5))
  print(f"{'workload':8s} {'strategy':8s} {'variant':40s} {'ms/step':>9s} {'ex/s':>9s} "
        f"{'ratio':>6s} {'floor':>6s} {'GFLOP/s':>8s} {'traces':>6s}")
  for r in rows:
    print(f"{r['workload']:8s} {r['strategy']:8s} {r['variant']:40s} "
          f"{r['ms_per_step']:9.3f} {r['examples_per_s']:9.1f} "
          f"{r['ratio_to_handwritten']:6.3f} {r['ratio_to_floor']:6.3f} "
          f"{r['gflop_per_s']:8.2f} {r['traces_after_first_call']:6d}")
  print("ratio: to the hand-written per-step loop; floor: to the hand-written loop doing "
        "the same steps per call")
  for r in first:
    print(f"first step  {r['workload']:8s} {r['variant']:24s} {r['first_step_s']:7.3f} s "
          f"(min {r['min_s']:.3f}, max {r['max_s']:.3f}; {r['repetitions']} fresh processes)"
          f"  ratio {r['ratio_to_handwritten']:.3f}")
  for r in ps_rows:
    print(f"parameter_server ({r['workers']} workers, {r['ps']} ps) {r['workload']} "
          f"{r['variant']:22s} {r['ms_per_step']:8.3f} ms/step {r['steps_per_s']:8.1f} steps/s "
          f"ratio to one step per call {r['ratio_to_one_step_per_call']:.3f}")
  if ceiling:
    print(f"conv kernel ceiling (DCGAN's dominant convolution, forward and backward, "
          f"float32): {ceiling:.1f} GFLOP/s" + ("" if bf16_speed is None else
          f"; its forward in bfloat16 runs at {bf16_speed:.2f}x float32's speed"))
  for r in rows:
    if "input_wait_share" in r:
      print(f"{r['workload']} {r['strategy']}: input wait {100 * r['input_wait_share']:.1f}% "
            f"of the step (ctl against one batch held in memory)")
    if "loss_gap" in r:
      for key, gap in r["loss_gap"].items():
        print(f"{r['workload']} mixed_bfloat16 {key}: mean |gap| {gap['mean_abs_gap']} over "
              f"{gap['steps']} steps (means {gap['float32_mean']} float32, "
              f"{gap['mixed_bfloat16_mean']} bfloat16)")
  checks = targets(rows + first + ps_rows, cpu)
  print("targets:")
  for t in checks:
    met = {True: "met", False: "NOT MET", None: "not measured"}.get(t["met"], t["met"])
    print(f"  {met:12s} {t['target']}: {t['value']}")
  print(json.dumps(cpu))
  if ceiling:
    print(json.dumps({"kernel": "dcgan dominant convolution", "ceiling_gflop_per_s":
                      round(ceiling, 2), "bfloat16_speed_vs_float32":
                      None if bf16_speed is None else round(bf16_speed, 3)}))
  for r in rows + first + ps_rows:
    print(json.dumps(r))
  for t in checks:
    print(json.dumps(t))


if __name__ == "__main__":
  main()
