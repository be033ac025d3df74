"""A resumable training run for the resume tests, run in its own process.

    python tests/resume_task.py --workdir w --steps 12 --out r.npz [--pause-at 7]

Trains a small GAN whose state is everything a checkpoint must hold: batch
norm statistics (generator), dropout seed state (discriminator), Adam slots,
a shuffled repeating dataset, and `ctx.normal` noise. Keras' Dropout draws
per replica, so runs under different strategies match only with
`--dropout 0`. `--pause-at k` prints
"PAUSED k" at step k and waits for the file `<workdir>/go`, so a test can
signal the process at a known step; `--pause-in` says where it waits: in an
action between compiled calls (`action`, the default), inside the compiled
call of step k (`call`), in the first batch of an evaluation at step k
(`eval`), inside the save of ckpt-k (`save`) or inside an export at step k
(`export`); it then prints "PAUSED <where> k". `eval-python` does not wait:
the evaluation at step k reads its data through Python (a
`tf.numpy_function` taking 20 ms an element, as a PIL decoding would), prints
"PAUSED eval-python k" at its first element and goes on reading. `--delete-workdir-at k` deletes
the work directory after step k. `--crash-in-save-at k` kills the process
(SIGKILL) inside the save of the step-k checkpoint, after the checkpoint's files are
written but before the file naming the newest checkpoint is updated.
`--resume-from k` goes back to ckpt-k (`ctl.Checkpoint(resume_from=k)`).
`--fail-export-at k` exports the generator at step k under a file-size limit,
so the export's first file fails to be written with EFBIG.
`--float64` trains in float64 (`mixed_precision="float64"`, as ctl parity's replay
does), where two layouts agree to ~1e-15 rather than float32's rounding.
`--fail-save-after-step k` limits, after the step-k checkpoint, the size of
any file the process writes, so the next checkpoint's data file fails to be
written with EFBIG ("File too large"), as on a full disk. Writes
the steps this process ran, the final weights and optimizer variables to `--out` (chief only), or
with `--out-every-worker` to `<out>.<task index>.npz` on every worker.
"""

import argparse
import glob
import json
import os
import resource
import signal
import sys
import time

import numpy as np

import ctl
from ctl import cli
from ctl.base import _tf_internal

import toy_gan
from toy_gan import FEATURES
from toy_gan import GLOBAL_BATCH
from toy_gan import NOISE


def parse_args():
  p = argparse.ArgumentParser()
  p.add_argument("--strategy", default="default")
  p.add_argument("--logical-cpus", type=int)
  p.add_argument("--workdir", required=True)
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--checkpoint-every", type=int, default=4)
  p.add_argument("--steps-per-loop", type=int, default=3)
  p.add_argument("--pause-at", type=int)
  p.add_argument("--pause-in", choices=["action", "call", "eval", "eval-python", "save", "merge",
                                        "export"], default="action")
  p.add_argument("--delete-workdir-at", type=int)
  p.add_argument("--crash-in-save-at", type=int)
  p.add_argument("--fail-save-after-step", type=int)
  p.add_argument("--fail-export-at", type=int)
  p.add_argument("--nan-at", type=int)
  p.add_argument("--resume-from", type=int)
  p.add_argument("--dropout", type=float, default=0.25)
  p.add_argument("--float64", action="store_true")
  p.add_argument("--asynchronous", action="store_true")  # ctl.Checkpoint(asynchronous=True)
  p.add_argument("--ballast-mb", type=int, default=0)  # a large untrained model: slow saves
  p.add_argument("--out", required=True)
  p.add_argument("--out-every-worker", action="store_true")
  return p.parse_args()


def dataset():
  return toy_gan.batches(toy_gan.normal_features(40, seed=5), shuffle_seed=3, repeat=True)


def make_build(dropout, ballast_mb=0):
  def build():
    models, optimizers = _build(dropout)
    if ballast_mb:  # no optimizer: saved, never trained, so the losses do not change
      import keras
      models["ballast"] = keras.Sequential(
          [keras.Input((1,)), keras.layers.Dense(ballast_mb * 2**18, use_bias=False)])
    return models, optimizers
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


def wait_for_go(workdir, label):
  """Prints PAUSED `label` and waits (at most 120 s) for `<workdir>/go`."""
  print(f"PAUSED {label}", flush=True)
  go = os.path.join(workdir, "go")
  deadline = time.monotonic() + 120
  while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)


def pause_in_graph(step, at, workdir, where):
  """Inside a compiled call: waits at step `at` (a py_function: Python in a TF thread)."""
  import tensorflow as tf

  def wait(value):
    if int(value) == at:
      wait_for_go(workdir, f"{where} {at}")
    return value

  waited = tf.py_function(wait, [step], tf.int64)
  waited.set_shape([])
  return waited


def make_step(nan_at, pause_at=None, workdir=None):
  """toy_gan's step, with the faults asked for on the command line."""
  import tensorflow as tf

  def prepare(ctx, real):
    if pause_at is not None:  # inside the compiled call of step pause_at
      real += 0.0 * tf.cast(pause_in_graph(ctx.step, pause_at, workdir, "call"), tf.float32)
    if nan_at is not None:  # a bad batch at step nan_at
      real *= tf.where(ctx.step == nan_at, np.float32("nan"), 1.0)
    return real

  return toy_gan.make_step(NOISE, prepare=prepare)


class AtStep(ctl.Action):
  """An action that does `fire(context)` once, at global step `step`."""

  def __init__(self, step, workdir):
    self.every = ctl.Every(steps=step)
    self.step = step
    self.workdir = workdir

  def __call__(self, context):
    if context.step == self.step:
      self.fire(context)


class Pause(AtStep):
  """Prints PAUSED at one step and waits for `<workdir>/go` (on every worker)."""
  collective = True

  def fire(self, context):
    wait_for_go(self.workdir, context.step)


class DeleteWorkdir(AtStep):
  """Deletes the work directory (as a user's `rm -r` would) at one step."""

  def fire(self, context):
    import shutil
    shutil.rmtree(self.workdir)
    print(f"DELETED the workdir after step {context.step}", flush=True)


def evaluate_pausing_at(step, workdir):
  """A ctl.Evaluate at `step` whose first batch waits inside its compiled call."""
  import tensorflow as tf

  def eval_step(ctx, real):
    real += 0.0 * tf.cast(pause_in_graph(ctx.step, step, workdir, "eval"), tf.float32)
    logits = ctx.models["discriminator"](real)[:, 0]
    return {"real_score": ctx.average(tf.sigmoid(logits))}

  x = np.zeros((3 * GLOBAL_BATCH, FEATURES), "float32")
  data = tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH)
  return ctl.Evaluate(eval_step, data, ctl.Every(steps=step))


def evaluate_through_python_at(step):
  """A ctl.Evaluate at `step` whose data come through a slow Python function,
  with more batches than it can read before a test's signal."""
  import tensorflow as tf

  def decode(index):
    if index == 0:
      print(f"PAUSED eval-python {step}", flush=True)
    time.sleep(0.02)
    return np.full([FEATURES], index % 7, "float32")

  def eval_step(ctx, real):
    logits = ctx.models["discriminator"](real)[:, 0]
    return {"real_score": ctx.average(tf.sigmoid(logits))}

  def python(index):
    row = tf.numpy_function(decode, [index], tf.float32)
    row.set_shape([FEATURES])
    return row

  data = tf.data.Dataset.range(100_000).map(python).batch(GLOBAL_BATCH).prefetch(2)
  return ctl.Evaluate(eval_step, data, ctl.Every(steps=step))


def pause_in_export(workdir):
  """Makes every export wait (in Python, between its two files) for `go`."""
  import keras
  original = keras.Model.export

  def export(self, *args, **kwargs):
    wait_for_go(workdir, "export")
    return original(self, *args, **kwargs)

  keras.Model.export = export


def limit_file_size_in_export():
  """Makes every export's `.keras` file fail to be written (EFBIG), as on a
  full disk; the limit is lifted after, so a checkpoint can still be saved."""
  import keras
  original = keras.Model.save

  def save(self, *args, **kwargs):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail with EFBIG, do not kill
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
    try:
      return original(self, *args, **kwargs)
    finally:
      resource.setrlimit(resource.RLIMIT_FSIZE, limits)

  keras.Model.save = save


def pause_in_save(step, workdir):
  """Makes the save of `ckpt-<step>` wait, once its files are written, for `go`."""
  def wrapper(original):
    def update(save_dir, model_checkpoint_path, *args, **kwargs):
      if model_checkpoint_path.endswith(f"ckpt-{step}"):
        wait_for_go(workdir, f"save {step}")
      return original(save_dir, model_checkpoint_path, *args, **kwargs)
    return update

  _tf_internal.wrap_checkpoint_state_update(wrapper)


def pause_in_merge(step, workdir):
  """Makes the save of `ckpt-<step>` wait halfway, for `go`: its data written under
  `ckpt-<step>_temp/`, not yet merged into the checkpoint's files."""
  def wrapper(original):
    def merge(sources, prefix, *args, **kwargs):
      if os.path.basename(prefix.numpy().decode()) == f"ckpt-{step}":
        wait_for_go(workdir, f"merge {step}")
      return original(sources, prefix, *args, **kwargs)
    return merge

  _tf_internal.wrap_checkpoint_merge(wrapper)


class LimitFileSize(AtStep):
  """After the step-k checkpoint, caps this process's files at half its data file.

  A real fault, not a mock: the kernel fails the next checkpoint's write past
  the limit with EFBIG, the way a full disk fails it with ENOSPC (tests run as
  root, so a read-only directory would not stop them).
  """

  def fire(self, context):
    # Runs after fit's save at this step (a save comes first), so ckpt-k exists:
    # once written, if that is in the background.
    index = os.path.join(self.workdir, "checkpoints", f"ckpt-{self.step}.index")
    deadline = time.monotonic() + 60
    while not os.path.exists(index) and time.monotonic() < deadline:
      time.sleep(0.02)
    data = glob.glob(os.path.join(self.workdir, "checkpoints", f"ckpt-{self.step}.data-*"))
    limit = min(os.path.getsize(path) for path in data) // 2
    # A write past the limit raises SIGXFSZ, which kills; ignored, it fails with EFBIG.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE,
                       (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    print(f"FILE SIZE LIMIT {limit} bytes after step {context.step}", flush=True)


def crash_in_save(step):
  """Kills this process inside the save of `ckpt-<step>`, once its files are
  written and before the `checkpoint` file is pointed at it."""
  def wrapper(original):
    def update(save_dir, model_checkpoint_path, *args, **kwargs):
      if model_checkpoint_path.endswith(f"ckpt-{step}"):
        print("CRASHING", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
      return original(save_dir, model_checkpoint_path, *args, **kwargs)
    return update

  _tf_internal.wrap_checkpoint_state_update(wrapper)


def main():
  args = parse_args()
  signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
  strategy = ctl.make_strategy(args.strategy, logical_cpus=args.logical_cpus)
  if args.crash_in_save_at:
    crash_in_save(args.crash_in_save_at)
  pause, where = args.pause_at, args.pause_in
  runner = ctl.Runner(make_step(args.nan_at, pause if where == "call" else None, args.workdir),
                      make_build(args.dropout, args.ballast_mb), dataset(), strategy=strategy,
                      seed=7, steps_per_loop=args.steps_per_loop,
                      mixed_precision="float64" if args.float64 else None)
  actions = []
  if pause and where == "action":
    actions.append(Pause(pause, args.workdir))
  if pause and where == "eval":
    actions.append(evaluate_pausing_at(pause, args.workdir))
  if pause and where == "eval-python":
    actions.append(evaluate_through_python_at(pause))
  if pause and where == "save":
    pause_in_save(pause, args.workdir)
  if pause and where == "merge":
    pause_in_merge(pause, args.workdir)
  if pause and where == "export":
    pause_in_export(args.workdir)
    actions.append(ctl.Export("generator", ctl.Every(steps=pause)))
  if args.fail_export_at:
    limit_file_size_in_export()
    actions.append(ctl.Export("generator", ctl.Every(steps=args.fail_export_at)))
  if args.fail_save_after_step:
    actions.append(LimitFileSize(args.fail_save_after_step, args.workdir))
  if args.delete_workdir_at:
    actions.append(DeleteWorkdir(args.delete_workdir_at, args.workdir))
  try:
    history = runner.fit(args.steps, args.workdir, actions=actions, progress=False,
                         checkpoint=ctl.Checkpoint(ctl.Every(steps=args.checkpoint_every),
                                                   resume_from=args.resume_from,
                                                   asynchronous=args.asynchronous))
  except ctl.Interrupted as e:  # as the `ctl` command does
    print(f"INTERRUPTED: {e}", flush=True)
    sys.exit(ctl.INTERRUPTED_EXIT_CODE)
  results = toy_gan.results(history, runner.models)
  for name, optimizer in runner.optimizers.items():  # slots and iteration count
    for i, variable in enumerate(optimizer.variables):
      results[f"{name}.optimizer/{i}"] = np.asarray(variable.numpy())
  results["first_step"] = np.array(args.steps - len(next(iter(history.values()))))
  me = ctl.worker(strategy)
  config = json.loads(os.environ.get("TF_CONFIG", "{}"))
  workers = len(config.get("cluster", {}).get("worker", []))
  if args.strategy == "multi_worker" and workers:  # ctl launch: workers only, no chief job
    index = config["task"]["index"]
    assert me == (index, workers, index == 0), (me, config["task"])
  else:
    assert me == (0, 1, True), me
  if args.out_every_worker:
    np.savez(f"{args.out}.{me.index}.npz", **results)
  elif me.is_chief:
    np.savez(args.out, **results)


if __name__ == "__main__":
  with cli.log_to_stderr():  # ctl's log lines, as the `ctl` command shows them: tests read them
    main()
