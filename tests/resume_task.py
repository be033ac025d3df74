"""A resumable training run for the resume tests, run in its own process.

    python tests/resume_task.py --workdir w --steps 12 --out r.npz [--pause-at 7]

Trains a small GAN whose state is everything a checkpoint must hold: batch
norm statistics (generator), dropout seed state (discriminator), Adam slots,
a shuffled repeating dataset, and `ctx.normal` noise. Keras' Dropout draws
per replica, so runs under different strategies match only with
`--dropout 0`. `--pause-at k` prints
"PAUSED k" at step k and waits for the file `<workdir>/go`, so a test can
signal the process at a known step. `--crash-in-save-at k` kills the process
(SIGKILL) inside the save of the step-k checkpoint, after the checkpoint's files are
written but before the file naming the newest checkpoint is updated.
`--fail-save-after-step k` limits, after the step-k checkpoint, the size of
any file the process writes, so the next checkpoint's data file fails to be
written with EFBIG ("File too large"), as on a full disk. Writes
the steps this process ran and the final weights to `--out` (chief only), or
with `--out-every-worker` to `<out>.<task index>.npz` on every worker.
"""

import argparse
import glob
import os
import resource
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ctl  # noqa: E402

GLOBAL_BATCH = 8
NOISE = 4
FEATURES = 6


def parse_args():
  p = argparse.ArgumentParser()
  p.add_argument("--strategy", default="default")
  p.add_argument("--logical-cpus", type=int)
  p.add_argument("--workdir", required=True)
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--checkpoint-every", type=int, default=4)
  p.add_argument("--steps-per-loop", type=int, default=3)
  p.add_argument("--pause-at", type=int)
  p.add_argument("--crash-in-save-at", type=int)
  p.add_argument("--fail-save-after-step", type=int)
  p.add_argument("--nan-at", type=int)
  p.add_argument("--dropout", type=float, default=0.25)
  p.add_argument("--out", required=True)
  p.add_argument("--out-every-worker", action="store_true")
  return p.parse_args()


def dataset():
  import tensorflow as tf
  x = np.random.default_rng(5).normal(size=(40, FEATURES)).astype("float32")
  return (tf.data.Dataset.from_tensor_slices(x)
          .shuffle(40, seed=3, reshuffle_each_iteration=True).repeat()
          .batch(GLOBAL_BATCH, drop_remainder=True))


def make_build(dropout):
  def build():
    return _build(dropout)
  return build


def _build(dropout):
  import keras
  init = lambda s: keras.initializers.GlorotUniform(seed=s)  # noqa: E731
  generator = keras.Sequential([
      keras.Input((NOISE,)),
      keras.layers.Dense(16, use_bias=False, kernel_initializer=init(1)),  # BN adds one
      keras.layers.BatchNormalization(synchronized=True),
      keras.layers.Activation("tanh"),
      keras.layers.Dense(FEATURES, kernel_initializer=init(2)),
  ], name="generator")
  discriminator = keras.Sequential([
      keras.Input((FEATURES,)),
      keras.layers.Dense(16, activation="tanh", kernel_initializer=init(3)),
      keras.layers.Dropout(dropout, seed=4),
      keras.layers.Dense(1, kernel_initializer=init(5)),
  ], name="discriminator")
  models = {"generator": generator, "discriminator": discriminator}
  optimizers = {name: keras.optimizers.Adam(1e-2) for name in models}
  return models, optimizers


def make_step(nan_at):
  import tensorflow as tf

  def step(ctx, real):
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
    if nan_at is not None:  # a bad batch at step nan_at
      real *= tf.where(ctx.step == nan_at, np.float32("nan"), 1.0)
    with tf.GradientTape(persistent=True) as tape:
      fake = generator(ctx.normal([NOISE]), training=True)
      real_logits = discriminator(real, training=True)[:, 0]
      fake_logits = discriminator(fake, training=True)[:, 0]
      d_loss = ctx.average(tf.nn.softplus(-real_logits) + tf.nn.softplus(fake_logits))
      g_loss = ctx.average(tf.nn.softplus(-fake_logits))
    ctx.minimize(d_loss, "discriminator", tape=tape)
    ctx.minimize(g_loss, "generator", tape=tape)
    return {"discriminator_loss": d_loss, "generator_loss": g_loss}

  return step


class AtStep:
  """An action that does `fire(loop)` once, at global step `step`."""
  collective = False

  def __init__(self, step, workdir):
    self.every = ctl.Every(steps=step)
    self.step = step
    self.workdir = workdir

  def __call__(self, loop):
    if loop.step == self.step:
      self.fire(loop)


class Pause(AtStep):
  """Prints PAUSED at one step and waits for `<workdir>/go` (on every worker)."""
  collective = True

  def fire(self, loop):
    print(f"PAUSED {loop.step}", flush=True)
    go = os.path.join(self.workdir, "go")
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
      time.sleep(0.02)


class LimitFileSize(AtStep):
  """After the step-k checkpoint, caps this process's files at half its data file.

  A real fault, not a mock: the kernel fails the next checkpoint's write past
  the limit with EFBIG, the way a full disk fails it with ENOSPC (tests run as
  root, so a read-only directory would not stop them).
  """

  def fire(self, loop):
    # Runs after the Checkpoint action (listed before it), so ckpt-k exists.
    data = glob.glob(os.path.join(self.workdir, "checkpoints", f"ckpt-{self.step}.data-*"))
    limit = min(os.path.getsize(path) for path in data) // 2
    # A write past the limit raises SIGXFSZ, which kills; ignored, it fails with EFBIG.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE,
                       (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    print(f"FILE SIZE LIMIT {limit} bytes after step {loop.step}", flush=True)


def crash_in_save(step):
  """Kills this process inside the save of `ckpt-<step>`, once its files are
  written and before the `checkpoint` file is pointed at it."""
  from tensorflow.python.checkpoint import checkpoint_management
  original = checkpoint_management.update_checkpoint_state_internal

  def update(save_dir, model_checkpoint_path, *args, **kwargs):
    if model_checkpoint_path.endswith(f"ckpt-{step}"):
      print("CRASHING", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    return original(save_dir, model_checkpoint_path, *args, **kwargs)

  checkpoint_management.update_checkpoint_state_internal = update


def main():
  args = parse_args()
  strategy = ctl.make_strategy(args.strategy, logical_cpus=args.logical_cpus)
  if args.crash_in_save_at:
    crash_in_save(args.crash_in_save_at)
  runner = ctl.Runner(make_step(args.nan_at), make_build(args.dropout), dataset(), strategy=strategy,
                      seed=7, steps_per_loop=args.steps_per_loop)
  actions = [ctl.Checkpoint(ctl.Every(steps=args.checkpoint_every))]
  if args.pause_at:
    actions.append(Pause(args.pause_at, args.workdir))
  if args.fail_save_after_step:
    actions.append(LimitFileSize(args.fail_save_after_step, args.workdir))
  history = runner.fit(args.steps, args.workdir, actions=actions, progress=False)
  results = {f"loss/{k}": v for k, v in history.items()}
  results["first_step"] = np.array(args.steps - len(next(iter(history.values()))))
  for name, model in runner.models.items():
    for i, w in enumerate(model.weights):
      results[f"{name}/{i}"] = np.asarray(w.numpy())
  if args.out_every_worker:
    index = strategy.cluster_resolver.task_id if strategy.cluster_resolver else 0
    np.savez(f"{args.out}.{index}.npz", **results)
  elif strategy.extended.should_checkpoint:
    np.savez(args.out, **results)


if __name__ == "__main__":
  main()
