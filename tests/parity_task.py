"""Seeded training runs for the parity tests, in a process of their own.

    python tests/parity_task.py --strategy mirrored --logical-cpus 2 --out r.npz
    python tests/parity_task.py --configs mirrored_2,jit_mirrored_2 --out r.npz

Runs each task (`gan`, and `bigan` with three models) with a fresh runner and
writes every step's reduced results and every model's final weights to `--out`,
keyed `task/...` (under multi_worker, only the chief writes). With `--configs`,
it runs each named configuration of `CONFIGS` in turn, keyed
`config/task/...`; they must share a strategy. The tests compare runs that
differ only in strategy, compilation and loop length.
"""

import argparse

import numpy as np

import ctl  # the first TF-touching import: make_strategy comes next

import toy_gan
from toy_gan import FEATURES
from toy_gan import GLOBAL_BATCH
from toy_gan import NOISE

# The configurations compared with the eager run under `default`: options of
# `train` and the strategy. Those with the same strategy and mode share a
# process (`process_key`): importing TensorFlow costs seconds, while a fresh
# runner per configuration already gives each one its own models, optimizers
# and compiled functions. Eager mirrored runs alone: a MirroredStrategy run
# eagerly after one in graph mode fails in the same process (TF field notes).
CONFIGS = {
    "compiled_default": {},
    "steps_per_loop_5": {"steps_per_loop": 5},
    "jit_default": {"jit": True, "tasks": "gan,bigan,micro_batches"},
    "one_device": {"strategy": "one_device"},
    "jit_one_device": {"strategy": "one_device", "jit": True},
    "mirrored_2": {"strategy": "mirrored", "logical_cpus": 2, "tasks": "gan,bigan,options"},
    "mirrored_2_steps_per_loop_5": {"strategy": "mirrored", "logical_cpus": 2,
                                    "steps_per_loop": 5},
    # bigan's tape form cannot be compiled under mirrored (see test_parity.py).
    "jit_mirrored_2": {"strategy": "mirrored", "logical_cpus": 2, "jit": True,
                       "tasks": "gan,micro_batches"},
    "mirrored_4": {"strategy": "mirrored", "logical_cpus": 4},
    "mirrored_2_eager": {"strategy": "mirrored", "logical_cpus": 2, "eager": True},
    "central_storage_2": {"strategy": "central_storage", "logical_cpus": 2,
                          "tasks": "gan,bigan,micro_batches"},
    "jit_central_storage_2": {"strategy": "central_storage", "logical_cpus": 2,
                              "jit": True},
}
DEFAULTS = {"strategy": "default", "logical_cpus": None, "tasks": "gan,bigan", "steps": 10,
            "steps_per_loop": 1, "eager": False, "jit": False, "perturbed": False}


def options(config):
  return dict(DEFAULTS, **CONFIGS[config])


def task_names(tasks):
  """The task names in `tasks` (comma-separated), "options" standing for OPTION_TASKS."""
  return ",".join(OPTION_TASKS if t == "options" else t for t in tasks.split(",")).split(",")


def process_key(config):
  """Configurations with the same key run in one process."""
  o = options(config)
  return o["strategy"], o["logical_cpus"], o["eager"]


def group(config):
  """The configurations that run in `config`'s process, in CONFIGS' order."""
  return [c for c in CONFIGS if process_key(c) == process_key(config)]


def parse_args():
  p = argparse.ArgumentParser()
  p.add_argument("--tasks", default="gan,bigan", help='comma-separated; "options" for '
                 "the optimizer options and micro_batches")
  p.add_argument("--strategy", default="default")
  p.add_argument("--logical-cpus", type=int)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--steps-per-loop", type=int, default=1)
  p.add_argument("--eager", action="store_true")
  p.add_argument("--jit", action="store_true")
  p.add_argument("--perturbed", action="store_true",
                 help="move every initial weight by one ulp (the rounding floor's run)")
  p.add_argument("--configs", help="names of CONFIGS, comma-separated, one strategy")
  p.add_argument("--out", required=True)
  return p.parse_args()


def dataset(num_batches):
  """Fixed real data: a deterministic function of the example index."""
  x = toy_gan.normal_features(num_batches * GLOBAL_BATCH, seed=1234)
  return toy_gan.batches(x + np.linspace(-1, 1, FEATURES, dtype="float32"))


build_gan = toy_gan.mlp_gan(FEATURES, seeds=(10, 20), learning_rate=1e-2)


def gan_step(ctx, real):
  """Non-saturating GAN: a discriminator update, then a generator update.

  Both losses are given as functions, the form XLA can compile under every
  strategy (bigan_step uses the tape form).
  """
  import tensorflow as tf
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]

  def discriminator_loss():
    fake = generator(ctx.normal([NOISE]), training=True)
    real_logits = discriminator(real, training=True)[:, 0]
    fake_logits = discriminator(fake, training=True)[:, 0]
    return ctx.average(toy_gan.discriminator_loss(real_logits, fake_logits))

  def generator_loss():
    logits = discriminator(generator(ctx.normal([NOISE]), training=True))[:, 0]
    return ctx.average(toy_gan.generator_loss(logits))

  d_loss = ctx.minimize(discriminator_loss, "discriminator")
  g_loss = ctx.minimize(generator_loss, "generator")
  real_score = tf.reduce_mean(tf.sigmoid(discriminator(real)))  # a per-replica mean
  return {"discriminator_loss": d_loss, "generator_loss": g_loss,
          "real_score": real_score}


def build_bigan():
  import keras
  models = {"generator": toy_gan.mlp("generator", NOISE, FEATURES, seed=10),
            "encoder": toy_gan.mlp("encoder", FEATURES, NOISE, seed=30),
            "discriminator": toy_gan.mlp("discriminator", FEATURES + NOISE, 1, seed=20)}
  optimizers = {name: keras.optimizers.Adam(5e-3) for name in models}
  return models, optimizers


def bigan_step(ctx, batches):
  """BiGAN/ALI: two discriminator updates (one batch each), then G and E."""
  import tensorflow as tf
  generator, encoder, discriminator = (
      ctx.models["generator"], ctx.models["encoder"], ctx.models["discriminator"])

  def logits(z):
    x_real, z_real = batches[0], encoder(batches[0], training=True)
    real = discriminator(tf.concat([x_real, z_real], -1), training=True)[:, 0]
    fake = discriminator(tf.concat([generator(z, training=True), z], -1), training=True)[:, 0]
    return real, fake

  d_losses = []
  for real_batch in batches:
    z = ctx.normal([NOISE])

    def discriminator_loss(real_batch=real_batch, z=z):
      real = discriminator(tf.concat([real_batch, encoder(real_batch)], -1))[:, 0]
      fake = discriminator(tf.concat([generator(z), z], -1))[:, 0]
      return ctx.average(toy_gan.discriminator_loss(real, fake))

    d_losses.append(ctx.minimize(discriminator_loss, "discriminator"))

  z = ctx.normal([NOISE])
  with tf.GradientTape(persistent=True) as tape:
    real, fake = logits(z)
    g_loss = ctx.average(toy_gan.generator_loss(fake))
    e_loss = ctx.average(tf.nn.softplus(real))
  ctx.minimize(g_loss, "generator", tape=tape)
  ctx.minimize(e_loss, "encoder", tape=tape)
  del tape
  return {"discriminator_loss": d_losses[-1], "generator_loss": g_loss,
          "encoder_loss": e_loss}


# Optimizer options a GAN recipe sets, each on the gan task (both models): the
# update must mean under every strategy what it means on one device.
OPTIMIZERS = {
    "clipnorm": lambda: keras_optimizers().Adam(1e-2, clipnorm=0.05),
    "global_clipnorm": lambda: keras_optimizers().Adam(1e-2, global_clipnorm=0.05),
    "clipvalue": lambda: keras_optimizers().Adam(1e-2, clipvalue=0.01),
    "adamw": lambda: keras_optimizers().AdamW(1e-2, weight_decay=0.1),
    "ema": lambda: keras_optimizers().Adam(1e-2, use_ema=True, ema_momentum=0.9),
    "loss_scale": lambda: keras_optimizers().LossScaleOptimizer(
        keras_optimizers().Adam(1e-2), initial_scale=2.0 ** 10),
    "schedule": lambda: keras_optimizers().Adam(
        keras_optimizers().schedules.ExponentialDecay(1e-2, 3, 0.5)),
    "rmsprop": lambda: keras_optimizers().RMSprop(1e-2, momentum=0.5, centered=True),
    "sgd_momentum": lambda: keras_optimizers().SGD(1e-2, momentum=0.9, nesterov=True),
    "lion": lambda: keras_optimizers().Lion(1e-3),
}


def keras_optimizers():
  import keras
  return keras.optimizers


def build_with(option):
  """The gan task's build, both optimizers made by OPTIMIZERS[option]."""
  def build():
    models, _ = build_gan()
    return models, {name: OPTIMIZERS[option]() for name in models}
  return build


def accumulating_step(ctx, real):
  """gan_step with each update's gradient accumulated over 2 slices of the batch."""
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]

  def discriminator_loss(real):
    fake = generator(ctx.normal([NOISE]), training=True)
    return ctx.average(toy_gan.discriminator_loss(discriminator(real)[:, 0],
                                                  discriminator(fake)[:, 0]))

  def generator_loss(real):
    del real  # the slice sets how many rows ctx.normal draws
    return ctx.average(toy_gan.generator_loss(discriminator(generator(ctx.normal([NOISE])))[:, 0]))

  return {"discriminator_loss": ctx.minimize(discriminator_loss, "discriminator", batch=real,
                                             micro_batches=2),
          "generator_loss": ctx.minimize(generator_loss, "generator", batch=real,
                                         micro_batches=2)}


TASKS = {"gan": (build_gan, gan_step, 1), "bigan": (build_bigan, bigan_step, 2),
         "micro_batches": (build_gan, accumulating_step, 1)}
TASKS.update({f"optimizer_{o}": (build_with(o), gan_step, 1) for o in OPTIMIZERS})
OPTION_TASKS = ",".join(["micro_batches"] + [f"optimizer_{o}" for o in OPTIMIZERS])


def train(task, strategy, o):
  build, step, batches_per_step = TASKS[task]
  runner = ctl.Runner(step, build, dataset(o["steps"] * batches_per_step),
                      strategy=strategy, seed=7, steps_per_loop=o["steps_per_loop"],
                      eager=o["eager"], jit_compile=o["jit"],
                      batches_per_step=batches_per_step)
  if o["perturbed"]:  # the rounding floor's run (ctl.tools.parity)
    from ctl.tools import parity
    with strategy.scope():
      parity.perturb(runner.models)
  return toy_gan.results(runner.train(o["steps"]), runner.models, prefix=f"{task}/")


def main():
  args = parse_args()
  if args.configs:
    runs = {c: options(c) for c in args.configs.split(",")}
    if len({process_key(c) for c in runs}) != 1:
      raise SystemExit(f"--configs {args.configs}: give configurations that share a "
                       "strategy and mode (parity_task.group)")
  else:
    runs = {None: {k: getattr(args, k) for k in DEFAULTS}}
  first = next(iter(runs.values()))
  strategy = ctl.make_strategy(first["strategy"], logical_cpus=first["logical_cpus"])
  results = {}
  for config, o in runs.items():
    prefix = f"{config}/" if config else ""
    for task in task_names(o["tasks"]):
      results.update({prefix + k: v for k, v in train(task, strategy, o).items()})
  if strategy.extended.should_checkpoint:  # the chief, under multi_worker
    np.savez(args.out, **results)


if __name__ == "__main__":
  main()
