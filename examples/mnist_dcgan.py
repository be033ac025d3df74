"""Trains a DCGAN with the hinge loss on the MNIST digits embedded in `gan`.

    python examples/mnist_dcgan.py                       # about 3 minutes on a 2-core CPU
    python examples/mnist_dcgan.py --strategy mirrored --logical-cpus 2 --steps 50
    python examples/mnist_dcgan.py --verbose             # with TensorFlow's own log lines

Papers: Radford et al. 2016 (DCGAN's networks), the hinge loss of Lim & Ye 2017 as
in Miyato et al. 2018 (SN-GAN), updates as in Goodfellow et al. 2014; three models:
the generator, the discriminator and a moving average of the generator (EMA),
which draws the samples and is exported. Writes to --workdir: checkpoints (rerun
to resume), TensorBoard events, an 8x8 grid of samples from fixed noise every
--samples-every steps (`samples/`), the EMA generator at the end (`export/`),
and its classifier FID, KID, precision and recall against the held-out digits
(logged, and in `metrics.jsonl`). What the default 2,800 steps reach, over 3
seeds: docs/quality.md (`python bench/gan_quality.py --configs main_job`).
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
# Both players' losses, one family. Hinge rather than DCGAN's non-saturating loss: over
# 3 seeds, classifier FID 5.43 +- 0.58 at step 2,800 (hinge, 1.5e-3) against 7.62 +- 0.66
# (non-saturating, 2e-3), both before R1; the runs that chose it: docs/quality/tuning.md.
LOSS = gan.losses.hinge
LEARNING_RATE = 1.5e-3  # 7.5x the DCGAN paper's: quality in minutes, not hours
EMA_DECAY, EMA_START = 0.99, 500  # a short average: the weights move fast in a short run
# R1 (Mescheder et al. 2018): (weight / 2) |grad D(real)|^2, on every 4th step at 4x the
# weight (lazy, as in StyleGAN2). It keeps the discriminator from memorising the 5,000
# digits: the same recipe in gan/configs/dcgan.gin reached classifier FID 3.31 at step
# 3,000 with it against 6.15 without (seed 0; docs/quality/tuning.md, round 4).
R1_WEIGHT, R1_EVERY = 1.0, 4


def build():
  import keras
  generator = gan.dcgan_generator(NOISE_DIM, width=64)
  models = {"generator": generator, "discriminator": gan.dcgan_discriminator(width=32),
            # A moving average of the generator's weights: the model that samples and
            # is exported (Yazici et al. 2019). No optimizer; the step updates it.
            "generator_ema": gan.ema.ema_copy(generator)}
  # Adam with beta_1 = 0.5, as in DCGAN.
  optimizers = {name: keras.optimizers.Adam(LEARNING_RATE, beta_1=0.5)
                for name in ("generator", "discriminator")}
  return models, optimizers


def train_step(ctx, real):
  import tensorflow as tf
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  # The discriminator's update, then the generator's against the updated
  # discriminator, each with its own noise (Goodfellow et al. 2014, Algorithm 1).
  with tf.GradientTape() as tape:
    fake = generator(ctx.normal([NOISE_DIM]), training=True)
    d_loss = ctx.average(LOSS.discriminator(discriminator(real, training=True),
                                            discriminator(fake, training=True)))
    r1 = ctx.average(gan.penalties.r1_penalty(ctx, discriminator, real, fake,
                                              weight=R1_WEIGHT, every=R1_EVERY))
    total = d_loss + r1  # inside the block: the tape records what it differentiates
  ctx.minimize(total, "discriminator", tape=tape)
  with tf.GradientTape() as tape:
    fake = generator(ctx.normal([NOISE_DIM]), training=True)
    g_loss = ctx.average(LOSS.generator(discriminator(fake, training=True)))
  ctx.minimize(g_loss, "generator", tape=tape)
  gan.ema.update_ema(ctx, ctx.models["generator_ema"], generator,
                     decay=EMA_DECAY, start_step=EMA_START)
  return {"discriminator_loss": d_loss, "generator_loss": g_loss, "r1": r1}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--steps", type=int, default=2800, help="train up to this step")
  p.add_argument("--batch-size", type=int, default=64, help="global batch size")
  p.add_argument("--strategy", default="default", choices=ctl.STRATEGY_NAMES,
                 help="tf.distribute strategy (docs/strategies.md)")
  p.add_argument("--logical-cpus", type=int, help="split the CPU for mirrored")
  p.add_argument("--steps-per-loop", type=int, default=100,
                 help="steps in one compiled call")
  p.add_argument("--samples-every", type=int, default=500,
                 help="draw an 8x8 grid into <workdir>/samples every this many steps")
  p.add_argument("--fid-samples", type=int, default=5000,
                 help="samples for the classifier FID at the end (0: none)")
  p.add_argument("--seed", type=int, default=0, help="initial weights and noise")
  p.add_argument("--mixed-precision", choices=ctl.MIXED_PRECISIONS,
                 help="compute in 16 bits, keep float32 weights (without it: float32 "
                      "throughout); bfloat16 is faster only on a CPU with bfloat16 "
                      "instructions (docs/quality.md); float16 is for GPUs (a CPU emulates "
                      "it, many times slower)")
  p.add_argument("--eager", action="store_true", help="run the step as Python")
  p.add_argument("--workdir", default=os.path.join("runs", "mnist_dcgan"),
                 help="checkpoints, events, samples and export; rerunning resumes from it")
  p.add_argument("--verbose", action="store_true", help="show TensorFlow's own log lines")
  args = p.parse_args(argv)
  if args.steps < 1:
    p.error(f"--steps {args.steps}: give the step to train up to, at least 1")
  if args.fid_samples < 0 or args.fid_samples == 1:
    p.error(f"--fid-samples {args.fid_samples}: give 0 (no FID) or at least 2 (5000 is usual)")
  log_to_stderr()

  strategy = ctl.make_strategy(args.strategy, logical_cpus=args.logical_cpus)
  runner = ctl.Runner(train_step, build, gan.mnist_dataset(args.batch_size),
                      strategy=strategy, steps_per_loop=args.steps_per_loop,
                      seed=args.seed, eager=args.eager, mixed_precision=args.mixed_precision)
  actions = [
      # An 8x8 grid from the same noise each time, drawn by the averaged generator.
      ctl.Samples(gan.experiment.fixed_samples(NOISE_DIM, model="generator_ema"),
                  ctl.Every(steps=args.samples_every)),
      ctl.Export("generator_ema"),
  ]
  if args.fid_samples:  # at the end: classifier FID, KID, precision, recall, ... (logged)
    actions.append(gan.experiment.ClassifierFID(NOISE_DIM, model="generator_ema",
                                                num_samples=args.fid_samples))
  # Rerunning the same command resumes from the newest checkpoint in --workdir.
  try:
    runner.fit(args.steps, args.workdir, actions=actions)
  except ctl.Interrupted as e:  # Ctrl-C: saved; exit as a shell expects of it
    print(e, file=sys.stderr)
    sys.exit(ctl.INTERRUPTED_EXIT_CODE)
  except ctl.CheckpointError as e:  # e.g. another run's checkpoints, or another precision
    # The library's message names the cause and its fix; the flags are this script's.
    sys.exit(f"{p.prog}: {e}\n{p.prog}: if the run there was started with other flags "
             f"(--mixed-precision, --batch-size), give the flags the run was started with; "
             f"to start anew, another --workdir.")
  except ctl.WorkdirInUse as e:  # another process trains in --workdir
    sys.exit(f"{p.prog}: {e}")
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
