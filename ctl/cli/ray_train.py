"""ctl runs on a Ray cluster: Ray Train's workers as the tasks of one multi-worker run.

    import ctl
    # `ctl train` on 2 Ray workers, restarted from the last checkpoint after a failure:
    result = ctl.ray.train(["dcgan", "--workdir", "/shared/runs/dcgan"], num_workers=2,
                           max_failures=3)
    # or a function of your own, given the strategy ctl made in each worker:
    result = ctl.ray.train(lambda strategy: my_fit(strategy), num_workers=2)

Ray Train's `TensorflowTrainer` starts the workers, one Ray actor each, and
writes each one's `TF_CONFIG`; in each, `train` then makes the `multi_worker`
strategy and runs the command (`ctl train ARGS --strategy multi_worker`) or the
function. Ray also sets `TF_USE_LEGACY_KERAS=1` there, which sends `tf.keras` to
Keras 2 (tf_keras), while ctl and the GAN kit use Keras 3: it is removed first.

When a worker dies (or a run ends with anything but success, a preemption's
exit 42 included), Ray stops the others and starts every worker again, up to
`max_failures` times, and the run resumes from the last checkpoint in its work
directory: give a work directory that every worker sees (on one machine, any;
on a cluster, the shared filesystem Ray's `storage_path` is on). Relative paths
are the caller's: each worker starts in the caller's directory where it exists.
Needs `pip install 'ctl-loops[ray]'`; connects to the cluster `RAY_ADDRESS`
names, or to one started on this machine (`ray.init()`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from ctl.base import arguments
from ctl.base.constants import PREEMPTED_EXIT_CODE

# Ray sets this in its TensorFlow workers: `tf.keras` is then Keras 2.
LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"


class RunFailed(RuntimeError):
  """A worker's `ctl train` ended with a non-zero exit code (Ray restarts on it)."""


def train(command: Sequence[str] | Callable[[Any], Any], *, num_workers: int = 2,
          max_failures: int = 0, cpus_per_worker: float = 1, name: str | None = None,
          storage_path: str | None = None) -> Any:
  """Runs `command` on `num_workers` Ray workers as one multi-worker run.

  Args:
    command: `ctl train`'s arguments after `train` (a config and its options,
      e.g. `["dcgan", "--workdir", path]`; `--strategy multi_worker` is added),
      or a function `fn(strategy)` that trains under the `multi_worker`
      strategy ctl made in the worker (what it returns is not kept).
    num_workers: Ray workers, one TensorFlow worker each.
    max_failures: how many times Ray starts every worker again after one
      failed (Ray Train's `FailureConfig.max_failures`; -1: without limit).
    cpus_per_worker: CPUs Ray reserves for each worker.
    name: the run's name under Ray's storage path (default: Ray's).
    storage_path: where Ray keeps the run's records (default: Ray's,
      `~/ray_results`); ctl's checkpoints are in the work directory.

  Returns:
    Ray Train's `Result` (`result.path`: Ray's records of the run; ctl's
    checkpoints, summaries, samples and export are in the work directory).

  Raises:
    ValueError or TypeError: naming a bad argument, before Ray starts.
    ImportError: when Ray Train is not installed, naming the extra.
    Ray Train's error (e.g. `ray.train.WorkerGroupError`, with the worker's
      inside) when the run failed more than `max_failures` times.
  """
  if isinstance(command, (str, bytes)) or not (callable(command) or (
      isinstance(command, Sequence) and all(isinstance(a, str) for a in command))):
    raise TypeError("command must be ctl train's arguments as a list of strings (e.g. "
                    "['dcgan', '--workdir', 'runs/x']) or a function of the strategy, got "
                    f"{command!r}.")
  if not callable(command) and "--strategy" in command:
    raise ValueError("command has --strategy: Ray's workers always run 'multi_worker'; "
                     "drop it.")
  arguments.integer("num_workers", num_workers, minimum=1)
  arguments.integer("max_failures", max_failures, minimum=-1)
  arguments.number("cpus_per_worker", cpus_per_worker, above=0, meaning="CPUs")
  try:
    import ray  # pylint: disable=import-outside-toplevel
    from ray import train as ray_train  # pylint: disable=import-outside-toplevel
    from ray.train.tensorflow import TensorflowTrainer  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(f"ctl.ray needs Ray Train ({e}); install it with "
                      "pip install 'ctl-loops[ray]'.") from None
  if not ray.is_initialized():
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=True)
  trainer = TensorflowTrainer(
      _worker, train_loop_config={"command": command, "cwd": os.getcwd()},
      scaling_config=ray_train.ScalingConfig(
          num_workers=num_workers, resources_per_worker={"CPU": cpus_per_worker}),
      run_config=ray_train.RunConfig(
          name=name, storage_path=storage_path,
          failure_config=ray_train.FailureConfig(max_failures=max_failures)))
  return trainer.fit()


def _worker(config):
  """One Ray worker: the strategy from Ray's TF_CONFIG, then the command."""
  os.environ.pop(LEGACY_KERAS_VARIABLE, None)  # before TensorFlow imports Keras
  # No GCE metadata server off Google Cloud: TF's preemption handler's probe fails fast.
  os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
  from ray import train as ray_train  # pylint: disable=import-outside-toplevel
  if os.path.isdir(config["cwd"]):  # relative paths are the caller's, where it exists
    os.chdir(config["cwd"])
  command = config["command"]
  context = ray_train.get_context()
  if callable(command):
    import ctl  # pylint: disable=import-outside-toplevel
    command(ctl.make_strategy("multi_worker"))
    return
  from ctl import cli  # pylint: disable=import-outside-toplevel
  code = cli.main(["train", *command, "--strategy", "multi_worker"])
  if code:
    what = " (preempted: saved, and resumes when restarted)" if (
        code == PREEMPTED_EXIT_CODE) else ""
    raise RunFailed(f"ctl train exited with code {code}{what} on Ray worker "
                    f"{context.get_world_rank()} of {context.get_world_size()}.")
