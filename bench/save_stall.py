"""What a checkpoint save costs the training loop: synchronous against
`ctl.Checkpoint(asynchronous=True)`, in one run.

    python bench/save_stall.py                 # the kit's dcgan and a 112M-parameter one
    python bench/save_stall.py --threads 1     # TF on one core: one left for the write
    python bench/save_stall.py --models dcgan-wide --device-step 3.7   # the host idle
    python bench/save_stall.py --models dcgan --steps 6 --tail 2 --repetitions 1   # a smoke run

Each model trains under `runner.fit` three ways, their repetitions interleaved
(A, B, C, A, B, C, ...) so that drifts in machine load hit each alike: with no
scheduled save (`none`), saving every `--every` steps written at once
(`synchronous`), and the same saves written in the background (`asynchronous`).
The saves stop `--tail` steps before the fit's end, so that the last background
write has steps to overlap. An action stamps the time after each step's work (a
save at that step comes first). A fit's time runs from the stamp of its first
step to that of the step before its end; that last stamp waits until the
`checkpoint` pointer names the last scheduled save, so a write still in flight
counts. The end's own save (written at once in every way) is outside the window:
its time varies with the page cache by seconds, and it is not a scheduled save.
The stall per save is (fit time - the `none` fit's time of the same repetition)
/ the scheduled saves; the ratio is asynchronous / synchronous, from the medians
over repetitions.

Models: `dcgan`, the kit's (`gan.dcgan_generator(64, 64)` and
`gan.dcgan_discriminator(64)`, batch 64, 28x28x1, Adam); `dcgan-wide`, the same
networks at width 1024 (112M parameters, 335M values with Adam's two slots:
1.3 GB a checkpoint), batch 8.

Where the write runs matters: on a CPU the background write needs the cores the
step uses (its thread runs at a lower priority on Linux, so training goes first
and the write finishes later). `--threads 1` runs TF's ops on one thread, which
leaves a core to the write. `--device-step SECONDS` goes further: the step's work
is replaced by that long a wait with the host idle, as an accelerator's host waits
while the device steps (the models, their optimizers' slots and so each
checkpoint stay the same), so the stall measured is what the save itself takes
from the loop: its snapshot and the write's share of Python's lock, without the
step's own compute competing with the write for the CPU. (A device's copy of the
values to the host is not in it.) Prints a table, then one JSON object per line.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import ctl

MODELS = {"dcgan": dict(width=64, batch=64), "dcgan-wide": dict(width=1024, batch=8)}
WAYS = ("none", "synchronous", "asynchronous")


class Stamps(ctl.Action):
  """The time after each step's work (a save at that step comes first). At
  `last_step`, first waits until `<workdir>/checkpoints` names `ckpt-<saved>` newest."""

  def __init__(self, workdir, last_step, saved):
    self.every = ctl.Every(steps=1)
    self.times = []
    self._checkpoints = os.path.join(workdir, "checkpoints")
    self._last_step, self._saved = last_step, saved

  def __call__(self, context):
    if context.step == self._last_step and self._saved:
      import tensorflow as tf  # pylint: disable=import-outside-toplevel
      name = f"ckpt-{self._saved}"
      deadline = time.monotonic() + 600
      while not (tf.train.latest_checkpoint(self._checkpoints) or "").endswith(name):
        if time.monotonic() > deadline:
          raise RuntimeError(f"{self._checkpoints}: {name} not the newest after 600 s")
        time.sleep(0.005)
    self.times.append(time.perf_counter())


class SavesUntil(ctl.Every):
  """Every `steps` steps up to `last_step`, then no more."""

  def __init__(self, steps, last_step):
    super().__init__(steps=steps)
    self.last_step = last_step

  def due(self, step):
    return step <= self.last_step and super().due(step)


def make_runner(width, batch, device_step=0.0):
  """The model's runner; with `device_step` seconds, its step only waits that long
  (the host idle, as while an accelerator steps) and the optimizers' slots are
  made at build, so that a checkpoint holds the same values."""
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import gan  # pylint: disable=import-outside-toplevel

  def build():
    models = {"generator": gan.dcgan_generator(64, width),
              "discriminator": gan.dcgan_discriminator(width)}
    optimizers = {name: keras.optimizers.Adam(2e-4, beta_1=0.5) for name in models}
    if device_step:
      for name, model in models.items():
        optimizers[name].build(model.trainable_variables)
    return models, optimizers

  def wait():
    time.sleep(device_step)  # Python's lock is let go: the writer's thread runs
    return np.float32(device_step)

  def waiting_step(ctx, real):
    del ctx, real
    return {"waited": tf.reshape(tf.numpy_function(wait, [], tf.float32, stateful=True), [])}

  def step(ctx, real):
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
    with tf.GradientTape(persistent=True) as tape:
      fake = generator(ctx.normal([64]), training=True)
      real_logits, fake_logits = discriminator(real), discriminator(fake)
      d_loss = ctx.average(gan.losses.non_saturating.discriminator(real_logits, fake_logits))
      g_loss = ctx.average(gan.losses.non_saturating.generator(fake_logits))
    ctx.minimize(d_loss, "discriminator", tape=tape)
    ctx.minimize(g_loss, "generator", tape=tape)
    return {"d_loss": d_loss, "g_loss": g_loss}

  images = tf.random.stateless_uniform([batch * 4, 28, 28, 1], [1, 2], -1.0, 1.0)
  data = tf.data.Dataset.from_tensor_slices(images).repeat().batch(batch, drop_remainder=True)
  return ctl.Runner(waiting_step if device_step else step, build, data, steps_per_loop=1)


def parameters(runner):
  models = sum(int(v.shape.num_elements()) for m in runner.models.values() for v in m.weights)
  state = models + sum(int(v.shape.num_elements()) for o in runner.optimizers.values()
                       for v in o.variables)
  return models, state


def fit_time(runner, way, steps, every, tail, scratch):
  """Seconds from the first step's stamp to that of the step before the end, for
  `steps` more steps; and the scheduled saves in between."""
  workdir = tempfile.mkdtemp(dir=scratch)
  start = int(runner.state.global_step.numpy())
  last_save = start + steps - tail
  saves = last_save // every - start // every if way != "none" else 0
  stamps = Stamps(workdir, start + steps - 1, saved=saves and last_save // every * every)
  runner.fit(start + steps, workdir, actions=[stamps], progress=False, summaries=False,
             checkpoint=ctl.Checkpoint(SavesUntil(every, last_save if saves else start),
                                       keep=2, asynchronous=way == "asynchronous"))
  shutil.rmtree(workdir)
  return stamps.times[-2] - stamps.times[0], saves


def measure(name, steps, every, tail, repetitions, scratch, device_step=0.0):
  spec = MODELS[name]
  runner = make_runner(**spec, device_step=device_step)
  runner.train(2)  # traced and warm
  models, state = parameters(runner)
  times = {way: [] for way in WAYS}
  stalls = {way: [] for way in WAYS[1:]}
  for _ in range(repetitions):
    for way in WAYS:
      seconds, saves = fit_time(runner, way, steps, every, tail, scratch)
      times[way].append(seconds)
      if way != "none":
        stalls[way].append((seconds - times["none"][-1]) / saves)
  median = {way: statistics.median(values) for way, values in stalls.items()}
  step_seconds = statistics.median(times["none"]) / (steps - 2)
  return {"model": name, "parameters": models, "saved_values": state,
          "checkpoint_mb": round(state * 4 / 2**20), "batch": spec["batch"], "steps": steps,
          "save_every": every, "tail": tail, "scheduled_saves": saves,
          "repetitions": repetitions, "device_step": device_step or None,
          "step_seconds": round(step_seconds, 4),
          "stall_seconds": {way: round(v, 4) for way, v in median.items()},
          "stall_each": {way: [round(s, 4) for s in v] for way, v in stalls.items()},
          "asynchronous_over_synchronous": (round(median["asynchronous"] / median["synchronous"], 3)
                                            if median["synchronous"] > 0 else None)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default=",".join(MODELS),
                      help=f"comma-separated subset of {', '.join(MODELS)}")
  parser.add_argument("--steps", type=int, default=20, help="steps per timed fit")
  parser.add_argument("--every", type=int, default=2, help="steps between scheduled saves")
  parser.add_argument("--tail", type=int, default=3,
                      help="steps after the last scheduled save, before the end")
  parser.add_argument("--threads", type=int, default=0,
                      help="TF's intra- and inter-op threads; 0: TF's default (every core)")
  parser.add_argument("--repetitions", type=int, default=3)
  parser.add_argument("--device-step", type=float, default=0.0, metavar="SECONDS",
                      help="replace the step's work by SECONDS of waiting, the host idle "
                      "(an accelerator's host while the device steps); 0: the real step")
  args = parser.parse_args()
  names = [n for n in args.models.split(",") if n]
  unknown = [n for n in names if n not in MODELS]
  if unknown or not names:
    parser.error(f"--models {args.models!r}: unknown {unknown}; choose from {', '.join(MODELS)}")
  if not 0 < args.tail < args.steps - 1:
    parser.error(f"--tail {args.tail} with --steps {args.steps}: use --tail between 1 "
                 "and --steps - 2")
  if not 0 < args.every <= args.steps - args.tail - 1:
    parser.error(f"--every {args.every} with --steps {args.steps} and --tail {args.tail}: "
                 "a scheduled save must fall before the tail; use --every between 1 and "
                 "--steps - --tail - 1")
  if args.device_step < 0:
    parser.error(f"--device-step {args.device_step}: use seconds >= 0 (0: the real step)")
  if args.threads:  # before TF's first op
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
  sys.path.insert(0, os.path.dirname(__file__))
  from run import cpu_features  # pylint: disable=import-outside-toplevel
  scratch = tempfile.mkdtemp(prefix="ctl-save-stall-")
  try:
    rows = [dict(measure(n, args.steps, args.every, args.tail, args.repetitions, scratch,
                         args.device_step), tf_threads=args.threads or "all") for n in names]
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  cpu = cpu_features()
  print(f"# {cpu['cpu']}, {cpu['cores']} cores, Python {platform.python_version()}; TF's "
        f"threads: {args.threads or 'its default'}; the write's speed depends on the disk "
        "and its page cache" + (f"; each step waits {args.device_step} s, the host idle, "
                                "in place of its work" if args.device_step else ""))
  print("| model | parameters | checkpoint | step | stall per save, synchronous | "
        "asynchronous | ratio |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    stall = r["stall_seconds"]
    print(f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {r['checkpoint_mb']} MB | "
          f"{r['step_seconds']:.3f} s | {stall['synchronous']:.3f} s | "
          f"{stall['asynchronous']:.3f} s | {r['asynchronous_over_synchronous']} |")
  for r in rows:
    print(json.dumps(dict(r, cpu=cpu)))


if __name__ == "__main__":
  main()
