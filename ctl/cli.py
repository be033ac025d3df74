"""The `ctl` command: train, evaluate, export, check and launch runs from .gin files.

    ctl train examples/configs/dcgan.gin --workdir runs/dcgan --strategy mirrored
    ctl eval examples/configs/dcgan.gin --workdir runs/dcgan
    ctl check examples/configs/dcgan.gin            # what would fail on a TPU
    ctl launch --workers 2 -- ctl train cfg.gin --strategy multi_worker --workdir runs/x

Each subcommand lives in the module that does its work and adds itself with
`add_parser(subparsers)`, setting `run=function(args) -> exit code`.
TensorFlow is imported only inside those functions, so `ctl --help` is fast.
"""

import argparse
import importlib
import sys

# Modules that add a subcommand, in the order `ctl --help` lists them.
_SUBCOMMANDS = ("ctl.experiments", "ctl.check", "ctl.launch", "ctl.records")


def make_parser():
  parser = argparse.ArgumentParser(
      prog="ctl", description="Custom training loops over several models: run an "
      "experiment described by a .gin file on any tf.distribute strategy.")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for module in _SUBCOMMANDS:
    importlib.import_module(module).add_parser(subparsers)
  return parser


def main(argv=None):
  args = make_parser().parse_args(argv)
  return args.run(args)


if __name__ == "__main__":
  sys.exit(main())
