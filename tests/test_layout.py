"""The layers' import direction: command line -> gan -> ctl core, never the reverse."""

import os
import re

from helpers import ROOT


def test_no_module_of_ctl_imports_gan():
  importing = []
  for directory, _, files in os.walk(os.path.join(ROOT, "ctl")):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        with open(path) as f:
          for number, line in enumerate(f, 1):
            if re.match(r"\s*(import gan\b|from gan\b)", line):
              importing.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
  assert not importing, "\n".join(importing)


def test_only_ctl_cli_parses_command_lines():
  # The command line is its own layer: the library modules hold no parsers or
  # subcommands, and so can import TensorFlow at the top.
  parsing = []
  for directory, _, files in os.walk(os.path.join(ROOT, "ctl")):
    if os.path.relpath(directory, ROOT).split(os.sep)[:2] == ["ctl", "cli"]:
      continue
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        with open(path) as f:
          for number, line in enumerate(f, 1):
            if re.match(r"\s*(import argparse\b|from argparse\b|def add_parser\b)", line):
              parsing.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
  assert not parsing, "\n".join(parsing)
