"""Trains the GAN a .gin file describes (see examples/configs/): one command each.

    python examples/train_gan.py examples/configs/dcgan.gin
    python examples/train_gan.py examples/configs/wgan_gp.gin --workdir runs/wgan_gp
    python examples/train_gan.py examples/configs/bigan.gin --gin "gan.train.num_steps = 20"
    python examples/train_gan.py examples/configs/dcgan.gin --strategy mirrored --logical-cpus 2

Rerunning the same command resumes from the newest checkpoint in the work
directory (default `runs/<config name>`). The operative config is saved next to
the checkpoints.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ctl  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("config", help="a .gin file binding gan.train")
  p.add_argument("--gin", action="append", default=[], help="extra gin bindings")
  p.add_argument("--workdir", help="default: runs/<config name>")
  p.add_argument("--strategy", choices=ctl.STRATEGY_NAMES, help="overrides the config")
  p.add_argument("--logical-cpus", type=int, help="split the CPU for mirrored")
  args = p.parse_args(argv)
  if args.logical_cpus:  # before any TensorFlow op
    ctl.configure_logical_cpus(args.logical_cpus)

  import gin
  import gan
  gin.parse_config_files_and_bindings([args.config], args.gin)
  workdir = args.workdir or os.path.join(
      "runs", os.path.splitext(os.path.basename(args.config))[0])
  gan.train(workdir, **({"strategy": args.strategy} if args.strategy else {}))
  print(f"wrote {workdir}: checkpoints, events, samples, export")


if __name__ == "__main__":
  main()
