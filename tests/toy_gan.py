"""The toy GAN that the test scripts and tests train: models, losses, step, data.

tests/parity_task.py, tests/resume_task.py, tests/ps_task.py and
tests/test_outer_loop.py train small GANs on a few features; the pieces they
share live here, with what differs between them (sizes, seeds, learning rates)
as arguments, so each keeps its own numbers:

    import ctl
    import toy_gan

    x = toy_gan.normal_features(80, seed=1234)
    runner = ctl.Runner(toy_gan.make_step(), toy_gan.mlp_gan(toy_gan.FEATURES),
                        toy_gan.batches(x), seed=7)
    results = toy_gan.results(runner.train(10), runner.models)

TensorFlow and Keras are imported inside the functions, as in the scripts: a
script imports `ctl` first and makes its strategy (which may split the CPU into
logical devices) before anything else touches TensorFlow. `tests/` is on
sys.path both under pytest and for a script run as `python tests/x.py`.
"""

import numpy as np

GLOBAL_BATCH = 8  # examples per global batch
NOISE = 4  # the generator's input size
FEATURES = 6  # the size of one example


def mlp(name, inputs, outputs, *, hidden=16, activation="tanh", seed=None):
  """A `keras.Sequential`: `Dense(hidden, activation)`, then a linear `Dense(outputs)`.

  Args:
    name: the model's name.
    inputs: the size of one input.
    outputs: the size of one output.
    hidden: the width of the hidden layer; None or 0 for the linear layer alone.
    activation: the hidden layer's activation.
    seed: None for Keras' unseeded default initializer; else each kernel is
      `GlorotUniform(seed + i)` for the model's i-th Dense layer.
  """
  import keras

  def kernel_initializer(i):
    if seed is None:
      return "glorot_uniform"  # Dense's default
    return keras.initializers.GlorotUniform(seed=seed + i)

  layers = [keras.Input((inputs,))]
  if hidden:
    layers.append(keras.layers.Dense(hidden, activation=activation,
                                     kernel_initializer=kernel_initializer(0)))
  layers.append(keras.layers.Dense(outputs, kernel_initializer=kernel_initializer(len(layers) - 1)))
  return keras.Sequential(layers, name=name)


def mlp_gan(features, *, noise=NOISE, hidden=16, activation="tanh", seeds=(None, None),
            learning_rate=1e-2):
  """A build function: an `mlp` generator and discriminator, with an Adam each.

  Args:
    features: the size of one example (the generator's output).
    noise: the generator's input size.
    hidden: the width of both models' hidden layer (see `mlp`).
    activation: the hidden layers' activation.
    seeds: the (generator, discriminator) seeds of `mlp`.
    learning_rate: both optimizers' learning rate.

  Returns:
    `build()`, returning `(models, optimizers)` as `ctl.Runner` wants them.
  """

  def build():
    import keras
    models = {"generator": mlp("generator", noise, features, hidden=hidden,
                               activation=activation, seed=seeds[0]),
              "discriminator": mlp("discriminator", features, 1, hidden=hidden,
                                   activation=activation, seed=seeds[1])}
    return models, {name: keras.optimizers.Adam(learning_rate) for name in models}

  return build


def discriminator_loss(real_logits, fake_logits):
  """The non-saturating GAN's discriminator loss, per example."""
  import tensorflow as tf
  return tf.nn.softplus(-real_logits) + tf.nn.softplus(fake_logits)


def generator_loss(fake_logits):
  """The non-saturating GAN's generator loss, per example."""
  import tensorflow as tf
  return tf.nn.softplus(-fake_logits)


def make_step(noise=NOISE, prepare=None):
  """The GAN step: both losses under one persistent tape, then D and G updates.

  Args:
    noise: the generator's input size.
    prepare: None, or `prepare(ctx, real)` returning the batch to train on,
      called first inside the step (tests/resume_task.py uses it to pause or to
      poison a batch at a given step).

  Returns:
    `step(ctx, real)` for `ctl.Runner`, returning both losses.
  """
  import tensorflow as tf

  def step(ctx, real):
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
    if prepare is not None:
      real = prepare(ctx, real)
    with tf.GradientTape(persistent=True) as tape:
      fake = generator(ctx.normal([noise]), training=True)
      real_logits = discriminator(real, training=True)[:, 0]
      fake_logits = discriminator(fake, training=True)[:, 0]
      d_loss = ctx.average(discriminator_loss(real_logits, fake_logits))
      g_loss = ctx.average(generator_loss(fake_logits))
    ctx.minimize(d_loss, "discriminator", tape=tape)
    ctx.minimize(g_loss, "generator", tape=tape)
    return {"discriminator_loss": d_loss, "generator_loss": g_loss}

  return step


def normal_features(num_examples, seed, features=FEATURES):
  """`num_examples` draws of `features` standard normals (float32), seeded."""
  return np.random.default_rng(seed).normal(size=(num_examples, features)).astype("float32")


def batches(x, batch_size=GLOBAL_BATCH, *, shuffle_seed=None, repeat=False):
  """A dataset of global batches of the rows of `x` (a remainder is dropped).

  Args:
    x: an array whose rows are the examples.
    batch_size: the global batch size.
    shuffle_seed: None to keep the rows in order; else the rows are shuffled
      (over all of them, anew each epoch) with this seed.
    repeat: repeat forever (before batching, so batches span epochs).
  """
  import tensorflow as tf
  dataset = tf.data.Dataset.from_tensor_slices(x)
  if shuffle_seed is not None:
    dataset = dataset.shuffle(len(x), seed=shuffle_seed, reshuffle_each_iteration=True)
  if repeat:
    dataset = dataset.repeat()
  return dataset.batch(batch_size, drop_remainder=True)


def results(history, models=None, prefix=""):
  """What a task script saves: each step's results and, given `models`, the weights.

  Args:
    history: what `ctl.Runner.train` or `fit` returned: name -> one value per step.
    models: None, or the runner's models, whose weights are added.
    prefix: put before every key.

  Returns:
    `{prefix + "loss/" + name: values}`, and `{prefix + model + "/" + i: weight}`
    for every model's i-th weight, as numpy arrays for `np.savez`.
  """
  saved = {f"{prefix}loss/{k}": v for k, v in history.items()}
  for name, model in (models or {}).items():
    for i, w in enumerate(model.weights):
      saved[f"{prefix}{name}/{i}"] = np.asarray(w.numpy())
  return saved
