"""The .gin files installed packages ship, by name: `ctl train dcgan`.

    from ctl.tools import configs
    configs.shipped()          # {"dcgan": ".../site-packages/gan/configs/dcgan.gin", ...}
    configs.is_name("dcgan")   # True: no .gin ending, no directory
    configs.is_name("examples/configs/dcgan.gin")   # False: a path

A package ships configs by registering a directory of .gin files under the
entry points `ctl.configs` (pyproject.toml): `gan = "gan.configs"` names the
directory configs/ of the package gan (the GAN kit's; ctl's core names no
config of its own). A config's name is its file name without `.gin`. The
directory is found without importing the package, so `ctl train --help` lists
the names without importing TensorFlow or gin.
"""

import importlib.util
import os
from importlib import metadata

ENTRY_POINTS = "ctl.configs"


def is_name(config: str) -> bool:
  """Whether `config` reads as a shipped config's name rather than a path:
  no `.gin` ending and no directory in it."""
  return not config.endswith(".gin") and os.sep not in config and "/" not in config


def shipped() -> dict[str, str]:
  """`{name: path}` of every .gin file the installed packages ship, sorted by name.

  If two packages ship the same name, the entry point that sorts first (by its
  name, then its value) wins; the other's file is still there to run by path.
  """
  found = {}
  entries = sorted(metadata.entry_points(group=ENTRY_POINTS), key=lambda e: (e.name, e.value))
  for entry in entries:
    directory = _directory(entry.value)
    if directory is None:
      continue  # a package uninstalled but its metadata left behind
    for file in sorted(os.listdir(directory)):
      if file.endswith(".gin"):
        found.setdefault(file[:-len(".gin")], os.path.join(directory, file))
  return dict(sorted(found.items()))


def _directory(value):
  """The directory `package.sub.dir` names, found without importing the package."""
  top, *rest = value.strip().split(".")
  try:
    spec = importlib.util.find_spec(top)
  except (ImportError, ValueError):
    return None
  for location in (spec.submodule_search_locations or []) if spec else []:
    directory = os.path.join(location, *rest)
    if os.path.isdir(directory):
      return directory
  return None
