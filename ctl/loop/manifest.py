"""The run manifest: what each `fit` of a run ran with, one JSON line per `fit`
in `<workdir>/manifest.jsonl`, so a run can be reproduced weeks later.

    record = manifest.describe(placement, seed=0, start_step=0, total_steps=10_000)
    previous = manifest.last(workdir)           # the record of the fit this one resumes
    manifest.append(workdir, record)             # on the chief, as each fit starts
    for change in manifest.differences(previous, record): _log.warning(change)

A record's fields, with an example: docs/workflow.md ("The run manifest"). `fit`
writes it, shows it in TensorBoard and hands it to the loggers; `params` flattens
it for trackers.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import TYPE_CHECKING
from typing import Any

from ctl.base import _tf_internal

if TYPE_CHECKING:
  from ctl.distribute.placement import Placement

FILE_NAME = "manifest.jsonl"
# The distributions whose versions a record holds (the first is ctl's own).
DISTRIBUTIONS = ("ctl-loops", "tensorflow", "keras", "numpy", "gin-config",
                 "tensorflow-datasets", "tqdm")
# What a resume should not change unnoticed: a record's keys compared (`differences`).
_COMPARED = ("seed", "versions", "strategy", "determinism")
# CPU instructions TensorFlow's kernels choose between (Linux's /proc/cpuinfo flags).
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")

_log = logging.getLogger("ctl")


def describe(placement: Placement, *, seed: int | None, start_step: int,
             total_steps: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The record of a `fit` under `placement` from `start_step` to `total_steps`;
  `extra` (e.g. `steps_per_loop`, the global batch size) goes in `run`."""
  import keras  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  record = {
      "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      "start_step": int(start_step), "total_steps": int(total_steps),
      "seed": seed,
      "run": dict(extra or {}),
      "strategy": {"kind": placement.kind.name, "class": type(placement.strategy).__name__,
                   "replicas": placement.replicas, "workers": placement.workers},
      "versions": {"python": platform.python_version(), **_versions()},
      "machine": {"platform": platform.platform(), "cpu": cpu(),
                  "cpu_count": os.cpu_count(),
                  "gpus": [d.name for d in tf.config.list_physical_devices("GPU")]},
      "determinism": {"op_determinism": _tf_internal.op_determinism_enabled(),
                      "mixed_precision": keras.mixed_precision.global_policy().name,
                      "jit": bool(tf.config.optimizer.get_jit()),
                      "TF_DETERMINISTIC_OPS": os.environ.get("TF_DETERMINISTIC_OPS")},
      "command": list(sys.argv),
      "cwd": os.getcwd(),  # where the command's relative paths start
      "git": _git(),
  }
  config, bindings = _gin()
  if config:
    record["gin"] = {"config": config, "bindings": bindings}
  return record


def append(workdir: str, record: dict[str, Any]) -> str:
  """Appends `record` to `<workdir>/manifest.jsonl`, on a line of its own even
  after a line cut short (a crash, a full disk); returns the file's path."""
  path = os.path.join(workdir, FILE_NAME)
  os.makedirs(workdir, exist_ok=True)
  with open(path, "a+b") as f:
    cut = False
    if f.tell() > 0:  # "a+" starts at the end
      f.seek(-1, os.SEEK_END)
      cut = f.read(1) != b"\n"
    f.write((b"\n" if cut else b"") + (json.dumps(record, default=str) + "\n").encode())
  return path


def read(workdir: str) -> list[dict[str, Any]]:
  """Every record of `<workdir>/manifest.jsonl`, oldest first ([] if none); a
  line cut short or unreadable is left out, with a warning naming it."""
  path = os.path.join(workdir, FILE_NAME)
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      lines = f.read().splitlines()
  except FileNotFoundError:
    return []
  records, bad = [], []
  for number, line in enumerate(lines, 1):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      record = None
    if isinstance(record, dict):
      records.append(record)
    elif line.strip():
      bad.append(number)
  if bad:
    _log.warning("%s: left out line%s %s, cut short or unreadable", path,
                 "s" if len(bad) > 1 else "", ", ".join(map(str, bad)))
  return records


def last(workdir: str | None) -> dict[str, Any] | None:
  """The newest record in `workdir`, or None."""
  records = read(workdir) if workdir else []
  return records[-1] if records else None


def differences(previous: dict[str, Any] | None, record: dict[str, Any]) -> list[str]:
  """A sentence for each change from `previous` that bears on the numbers: the
  seed, a version, the strategy's replicas or workers, a determinism setting."""
  if not previous:
    return []
  changes = []
  for key in _COMPARED:
    before, now = _flat({key: previous.get(key)}), _flat({key: record.get(key)})
    changes += [f"{name} was {before.get(name)!r} and is now {now.get(name)!r}"
                for name in sorted(before.keys() | now.keys()) if before.get(name) != now.get(name)]
  return changes


def params(record: dict[str, Any]) -> dict[str, str]:
  """`record` as flat name -> text pairs (what trackers take as parameters):
  `seed`, `strategy.replicas`, `versions.tensorflow`, `gin.<binding>`, ...;
  not the fit's own start and end steps (each fit's record holds them)."""
  flat = _flat({key: value for key, value in record.items()  # not what each fit has
                if key not in ("gin", "command", "cwd", "time", "start_step",
                               "total_steps")})
  flat["command"] = " ".join(record.get("command", []))
  flat.update({f"gin.{name}": value
               for name, value in record.get("gin", {}).get("bindings", {}).items()})
  return {name: str(value) for name, value in flat.items()}


def text(record: dict[str, Any]) -> str:
  """`record` as Markdown (TensorBoard's text summary renders it)."""
  return "```\n" + json.dumps(record, indent=2, default=str) + "\n```"


def _flat(tree, prefix=""):
  flat = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      flat.update(_flat(value, name + "."))
    else:
      flat[name] = value
  return flat


def _versions():
  versions = {}
  for name in DISTRIBUTIONS:
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      versions[name] = None
  return versions


def cpu() -> dict[str, Any]:
  """The CPU's model name and which of `_CPU_FLAGS` it has (Linux), else the
  platform's processor string."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      info = f.read()
  except OSError:
    return {"model": platform.processor() or platform.machine()}
  model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                if line.startswith("model name")), platform.machine())
  flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                if line.startswith("flags")), [])
  return {"model": model, "flags": [flag for flag in _CPU_FLAGS if flag in flags]}


def _git():
  """The commits of the code that runs (the script's directory, else the current
  one) and of ctl's own checkout (docs/workflow.md, "The run manifest")."""
  script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else ""
  found = {}
  for name, directory in (("code", os.path.dirname(os.path.abspath(script)) if script
                           else os.getcwd()),
                          ("ctl", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))):
    about = _commit(directory)
    if about and about not in found.values():
      found[name] = about
  return found


def _commit(directory):
  try:
    top = _run_git(directory, "rev-parse", "--show-toplevel")
    commit = _run_git(top, "rev-parse", "HEAD") if top is not None else None
    if commit is None:
      return None
    status = _run_git(top, "status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return None
  return {"commit": commit, "dirty": bool(status), "repository": os.path.basename(top)}


def _run_git(directory, *args):
  done = subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True,
                        timeout=10, check=False)
  return done.stdout.strip() if done.returncode == 0 else None


def _gin():
  """The parsed gin configuration's text and its bindings, or ("", {})."""
  if "gin" not in sys.modules:  # nothing was configured through gin
    return "", {}
  import gin  # pylint: disable=import-outside-toplevel
  config = gin.config_str().strip()
  if not config:
    return "", {}
  bindings, _ = _tf_internal.gin_bindings_and_uses()
  flat = {}
  for (scope, selector), values in bindings.items():
    for parameter, value in values.items():
      name = scope if selector == "gin.macro" else (
          f"{scope + '/' if scope else ''}{selector}.{parameter}")
      flat[name] = repr(value)
  return config, flat
