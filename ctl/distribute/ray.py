"""ctl on a Ray cluster: Ray Train's workers as the tasks of one multi-worker run.

    import ctl
    from ctl.distribute import ray as ctl_ray
    result = ctl_ray.train(lambda: my_fit(ctl.make_strategy("multi_worker")),
                           num_workers=2, max_failures=3)

Ray Train's `TensorflowTrainer` starts the workers and writes each one's
`TF_CONFIG`, which `make_strategy` reads (`ctl train` on the workers:
`ctl.cli.ray_train`). After a failure Ray starts every worker again: a fit
resumes from a work directory every worker sees (relative paths are the
caller's). Needs `pip install 'ctl-loops[ray]'`; joins the cluster `RAY_ADDRESS`
names, or starts one here (`ray.init()`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ctl.base import arguments

# Ray sets this in its TensorFlow workers: `tf.keras` is then Keras 2.
LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"


def train(fn: Callable[[], Any], *, num_workers: int = 2, max_failures: int = 0,
          cpus_per_worker: float = 1, name: str | None = None,
          storage_path: str | None = None) -> Any:
  """Runs `fn()` on `num_workers` Ray workers as one multi-worker run.

  Args:
    fn: what each worker runs, with the `TF_CONFIG` Ray set: it makes the
      strategy (`ctl.make_strategy("multi_worker")`) and trains (what it
      returns is not kept).
    num_workers: Ray workers, one TensorFlow worker each.
    max_failures: how many times Ray starts every worker again after one
      failed (Ray Train's `FailureConfig.max_failures`; -1: without limit).
    cpus_per_worker: CPUs Ray reserves for each worker.
    name: the run's name under Ray's storage path (default: Ray's).
    storage_path: where Ray keeps the run's records (default: Ray's,
      `~/ray_results`); ctl's checkpoints are in the work directory.

  Returns:
    Ray Train's `Result` (`result.path`: Ray's records of the run).

  Raises:
    ValueError or TypeError: naming a bad argument, before Ray starts.
    ImportError: when Ray Train is not installed, naming the extra.
    Ray Train's error (e.g. `ray.train.WorkerGroupError`) when the run failed
      more than `max_failures` times.
  """
  if not callable(fn):
    raise TypeError(f"fn must be a function of no arguments that each worker runs, got "
                    f"{fn!r}; for `ctl train` on the workers, use ctl.cli.ray_train.train.")
  arguments.integer("num_workers", num_workers, minimum=1)
  arguments.integer("max_failures", max_failures, minimum=-1)
  arguments.number("cpus_per_worker", cpus_per_worker, above=0, meaning="CPUs")
  try:
    import ray  # pylint: disable=import-outside-toplevel
    from ray import train as ray_train  # pylint: disable=import-outside-toplevel
    from ray.train.tensorflow import TensorflowTrainer  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(f"ctl.distribute.ray needs Ray Train ({e}); install it with "
                      "pip install 'ctl-loops[ray]'.") from None
  if not ray.is_initialized():
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=True)
  trainer = TensorflowTrainer(
      _worker, train_loop_config={"fn": fn, "cwd": os.getcwd()},
      scaling_config=ray_train.ScalingConfig(
          num_workers=num_workers, resources_per_worker={"CPU": cpus_per_worker}),
      run_config=ray_train.RunConfig(
          name=name, storage_path=storage_path,
          failure_config=ray_train.FailureConfig(max_failures=max_failures)))
  return trainer.fit()


def _worker(config):
  """One Ray worker: Keras 3 and the caller's directory, then `fn`."""
  os.environ.pop(LEGACY_KERAS_VARIABLE, None)  # before TensorFlow imports Keras
  # No GCE metadata server off Google Cloud: TF's preemption handler's probe fails fast.
  os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
  if os.path.isdir(config["cwd"]):  # relative paths are the caller's, where it exists
    os.chdir(config["cwd"])
  config["fn"]()
