"""Trains the GAN a .gin file describes (see examples/configs/): `ctl train`, as a script.

    python examples/train_gan.py dcgan      # a config the package ships, by name
    python examples/train_gan.py examples/configs/dcgan.gin    # the same file, by path
    python examples/train_gan.py examples/configs/wgan_gp.gin --workdir runs/wgan_gp
    python examples/train_gan.py examples/configs/bigan.gin --gin "gan.Schedule.total_steps = 20"
    python examples/train_gan.py examples/configs/dcgan.gin --strategy mirrored --logical-cpus 2

Each line is the same as `ctl train` with the same arguments (this script
runs it): rerunning resumes from the newest checkpoint in the work directory
(default `runs/<config name>`), and the operative config is saved next to the
checkpoints. `ctl eval` and `ctl export` then evaluate or export the run.
"""

import sys

from ctl import cli


def main(argv=None):
  return cli.main(["train"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
  sys.exit(main())
