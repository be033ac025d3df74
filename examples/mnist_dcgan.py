"""Trains a DCGAN with the non-saturating loss on the MNIST digits embedded in `gan`.

    python examples/mnist_dcgan.py                       # 2-3 minutes on a 2-core CPU
    python examples/mnist_dcgan.py --strategy mirrored --logical-cpus 2 --steps 50
    python examples/mnist_dcgan.py --verbose             # with TensorFlow's own log lines

Paper: Radford et al. 2016 (DCGAN), loss of Goodfellow et al. 2014. Writes to
--workdir: checkpoints (rerun to resume), TensorBoard events, an 8x8 grid of
samples from fixed noise every --samples-every steps (`samples/`), and the
generator at the end (`export/`). After the default 2,500 steps (2 to 3
minutes on a 2-core CPU) most samples are recognisable, if rough, digits.
"""

import argparse
import logging
import os
import sys

import ctl
from ctl.cli import quiet

quiet.from_command_line()  # TensorFlow's own log lines only with --verbose or CTL_VERBOSE=1
import gan  # noqa: E402  (TensorFlow logs while it loads: after the line above)

NOISE_DIM = 64
LOSS = gan.losses.non_saturating  # both players' losses, one family


def build():
  import keras
  models = {"generator": gan.dcgan_generator(NOISE_DIM, width=32),
            "discriminator": gan.dcgan_discriminator(width=32)}
  # Adam(2e-4, beta_1=0.5): the DCGAN paper's settings.
  optimizers = {name: keras.optimizers.Adam(2e-4, beta_1=0.5) for name in models}
  return models, optimizers


def train_step(ctx, real):
  import tensorflow as tf
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  with tf.GradientTape(persistent=True) as tape:
    fake = generator(ctx.normal([NOISE_DIM]), training=True)
    real_logits = discriminator(real, training=True)
    fake_logits = discriminator(fake, training=True)
    d_loss = ctx.average(LOSS.discriminator(real_logits, fake_logits))
    g_loss = ctx.average(LOSS.generator(fake_logits))
  # Simultaneous updates from one forward pass, as in the TensorFlow DCGAN tutorial.
  ctx.minimize(d_loss, "discriminator", tape=tape)
  ctx.minimize(g_loss, "generator", tape=tape)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=2500, help="train up to this step")
  p.add_argument("--batch-size", type=int, default=64, help="global batch size")
  p.add_argument("--strategy", default="default", choices=ctl.STRATEGY_NAMES)
  p.add_argument("--logical-cpus", type=int, help="split the CPU for mirrored")
  p.add_argument("--steps-per-loop", type=int, default=100)
  p.add_argument("--samples-every", type=int, default=500)
  p.add_argument("--eager", action="store_true", help="run the step as Python")
  p.add_argument("--workdir", default=os.path.join("runs", "mnist_dcgan"))
  p.add_argument("--verbose", action="store_true", help="show TensorFlow's own log lines")
  args = p.parse_args(argv)
  log_to_stderr()

  strategy = ctl.make_strategy(args.strategy, logical_cpus=args.logical_cpus)
  runner = ctl.Runner(train_step, build, gan.mnist_dataset(args.batch_size),
                      strategy=strategy, steps_per_loop=args.steps_per_loop,
                      eager=args.eager)
  # Rerunning the same command resumes from the newest checkpoint in --workdir.
  try:
    runner.fit(args.steps, args.workdir, actions=[
        # An 8x8 grid from the same noise each time.
        ctl.Samples(gan.experiment.fixed_samples(NOISE_DIM),
                    ctl.Every(steps=args.samples_every)),
        ctl.Export("generator"),
    ])
  except ctl.Interrupted as e:  # Ctrl-C: saved; exit as a shell expects of it
    print(e, file=sys.stderr)
    sys.exit(ctl.INTERRUPTED_EXIT_CODE)
  print(f"wrote {args.workdir}: checkpoints, events, samples, export")


def log_to_stderr():
  """Shows ctl's log (progress when stderr is no terminal, restores, warnings) as `ctl: ...`.

  ctl logs to the "ctl" logger and, being a library, installs no handler.
  """
  handler = logging.StreamHandler()
  handler.setFormatter(logging.Formatter("ctl: %(message)s"))
  logger = logging.getLogger("ctl")
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False  # else a root handler (TF adds one) prints each line again


if __name__ == "__main__":
  main()
