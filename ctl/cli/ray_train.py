"""`ctl train` on a Ray cluster: `ctl train ARGS --strategy multi_worker` on each worker.

    from ctl.cli import ray_train
    result = ray_train.train(["dcgan", "--workdir", "/shared/runs/dcgan"], num_workers=2,
                             max_failures=3)   # restarted from the last checkpoint

`ctl.distribute.ray.train` starts the workers. An exit other than 0, a
preemption's 42 included, is a failure: Ray starts every worker again and the
run resumes from its work directory, which every worker must see.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ctl.base.constants import PREEMPTED_EXIT_CODE
from ctl.distribute import ray as ray_lib


class RunFailed(RuntimeError):
  """A worker's `ctl train` ended with a non-zero exit code (Ray restarts on it)."""


def train(command: Sequence[str], **options: Any) -> Any:
  """Runs `ctl train COMMAND --strategy multi_worker` on Ray's workers.

  `command` is `ctl train`'s arguments after `train` (e.g. `["dcgan",
  "--workdir", path]`); `options` are `ctl.distribute.ray.train`'s
  (`num_workers`, `max_failures`, ...), whose Ray `Result` this returns.
  """
  if isinstance(command, (str, bytes)) or not (
      isinstance(command, Sequence) and all(isinstance(a, str) for a in command)):
    raise TypeError("command must be ctl train's arguments as a list of strings (e.g. "
                    "['dcgan', '--workdir', 'runs/x']), got "
                    f"{command!r}; for a function, use ctl.distribute.ray.train.")
  if "--strategy" in command:
    raise ValueError("command has --strategy: Ray's workers always run 'multi_worker'; "
                     "drop it.")
  return ray_lib.train(functools.partial(_ctl_train, list(command)), **options)


def _ctl_train(command):
  """One worker's `ctl train`; RunFailed on a non-zero exit code."""
  from ray import train as ray_train  # pylint: disable=import-outside-toplevel

  from ctl import cli  # pylint: disable=import-outside-toplevel
  code = cli.main(["train", *command, "--strategy", "multi_worker"])
  if code:
    what = " (preempted: saved, and resumes when restarted)" if (
        code == PREEMPTED_EXIT_CODE) else ""
    context = ray_train.get_context()
    raise RunFailed(f"ctl train exited with code {code}{what} on Ray worker "
                    f"{context.get_world_rank()} of {context.get_world_size()}.")
