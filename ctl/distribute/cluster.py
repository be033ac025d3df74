"""Where this process is: the cluster a launcher described, read as TensorFlow reads it.

    from ctl.distribute import cluster
    name, reason = cluster.choose_strategy()    # what `make_strategy("auto")` picks
    config = cluster.parse_tf_config()          # TF_CONFIG, or CLUSTER_SPEC, TF's names
    resolver = cluster.slurm_cluster_resolver() # a Slurm job step of several tasks

Only the environment is read (TF_CONFIG, CLUSTER_SPEC, Slurm's variables, TPU
names): nothing here waits for a peer or builds a strategy (`strategies` does).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from collections.abc import MutableMapping
from typing import Any

import tensorflow as tf

from ctl.base import arguments

logger = logging.getLogger("ctl")

def choose_strategy(env: Mapping[str, str] | None = None, num_gpus: int | None = None,
                    tpu_devices: bool | None = None) -> tuple[str, str]:
  """Decides what `auto` means on this machine, from cheap local signals only
  (probing for a TPU over the network can stall for minutes). In order:

  1. `TPU_NAME` or `COLAB_TPU_ADDR` set, or TPU chips attached: `tpu`.
  2. A cluster in `TF_CONFIG` or `CLUSTER_SPEC` (see `parse_tf_config`):
     `parameter_server` if it has a `ps` job; `multi_worker` if it has more
     than one `chief` + `worker` task. An `evaluator` task evaluates beside
     the training cluster, not in it, so it gets a local strategy.
  3. Else a Slurm job step of more than one task (`slurm_step_tasks`):
     `multi_worker`; parameter-server training needs `TF_CONFIG`.
  4. Otherwise by GPUs: `mirrored` for several, `one_device` for one,
     `default` for none.

  Args:
    env: environment variables (default `os.environ`).
    num_gpus: GPU count (default: TensorFlow's physical GPUs).
    tpu_devices: whether TPU chips are attached (default: `/dev/accel0` or
      `/dev/vfio/0` exists, as on a Cloud TPU VM).

  Returns:
    `(name, reason)`.

  Raises:
    ValueError: if `TF_CONFIG` is malformed or its task is not in its cluster.
  """
  env = os.environ if env is None else env
  if tpu_devices is None:
    tpu_devices = os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")
  if env.get("TPU_NAME") or env.get("COLAB_TPU_ADDR"):
    return "tpu", "TPU_NAME or COLAB_TPU_ADDR is set"
  if tpu_devices:
    return "tpu", "TPU chips are attached to this host"
  config = parse_tf_config(env)
  note = ""
  if config.get("cluster") or "sparseCluster" in config:
    cluster, task = check_tf_config(config)
    # The chief trains too; TF counts it as a worker (multi_worker_util.worker_count).
    workers = len(cluster.get("chief", ())) + len(cluster.get("worker", ()))
    if task.get("type") == "evaluator":
      # Joining the workers' collectives would make it a second trainer.
      note = "TF_CONFIG task is an 'evaluator', which does not train: "
    elif cluster.get("ps"):
      return "parameter_server", "TF_CONFIG names a 'ps' job"
    elif workers > 1:
      return "multi_worker", f"TF_CONFIG names {workers} workers (chief + worker tasks)"
  else:
    tasks = slurm_step_tasks(env)
    if tasks > 1:
      return "multi_worker", (f"Slurm job {env.get('SLURM_JOB_ID')} runs this step "
                              f"as {tasks} tasks (SLURM_STEP_NUM_TASKS)")
    if _int(env.get("SLURM_NTASKS")) > 1 and env.get("SLURM_JOB_ID"):
      logger.warning(
          "Slurm job %s has SLURM_NTASKS=%s but this process was not started by "
          "srun (no SLURM_STEP_NUM_TASKS), so it is one process on its own; to "
          "train on every task, run it as `srun ctl train ...`.",
          env.get("SLURM_JOB_ID"), env.get("SLURM_NTASKS"))
  if num_gpus is None:
    num_gpus = len(tf.config.list_physical_devices("GPU"))
  if num_gpus > 1:
    return "mirrored", f"{note}{num_gpus} GPUs are visible"
  if num_gpus == 1:
    return "one_device", f"{note}1 GPU is visible"
  return "default", f"{note}no TPU, cluster or GPU found: one CPU device"


# The task types TensorFlow's multi-worker code accepts (multi_worker_util).
TASK_TYPES = ("chief", "worker", "ps", "evaluator")


def check_tf_config(config: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, Any]]:
  """Returns `(cluster, task)` of a TF_CONFIG with a cluster, or raises naming the fix."""
  if "sparseCluster" in config and not config.get("cluster"):
    raise arguments.VariableError(
        "TF_CONFIG has a 'sparseCluster' (Kubeflow TFJob with enableDynamicWorker: "
        "true), which MultiWorkerMirroredStrategy and ParameterServerStrategy "
        "cannot use; set enableDynamicWorker: false in the TFJob spec.")
  cluster = config["cluster"]
  for job, addresses in cluster.items():
    if job not in TASK_TYPES:
      raise arguments.VariableError(f"TF_CONFIG cluster has a job {job!r}; TensorFlow knows only "
                       f"{', '.join(TASK_TYPES)} (and ctl reads "
                       f"{', '.join(TASK_TYPE_ALIASES)} as theirs). Rename it.")
    if (not isinstance(addresses, list) or not addresses
        or not all(isinstance(a, str) and ":" in a for a in addresses)):
      raise arguments.VariableError(f"TF_CONFIG cluster job {job!r} must be a non-empty list of "
                       f"'host:port' strings, got {addresses!r}.")
  for job in ("chief", "evaluator"):
    if len(cluster.get(job, ())) > 1:
      raise arguments.VariableError(f"TF_CONFIG cluster has {len(cluster[job])} {job!r} tasks; "
                       f"TensorFlow allows one. Make the others 'worker' tasks.")
  task = config.get("task")
  if not isinstance(task, dict) or "type" not in task:
    raise arguments.VariableError(
        f"TF_CONFIG names a cluster but not this process's task (got task={task!r}); "
        'add "task": {"type": "worker", "index": <i>} (Kubeflow and `ctl launch` '
        "set it for each task).")
  kind, index = task["type"], task.get("index", 0)
  if kind not in TASK_TYPES:
    raise arguments.VariableError(f"TF_CONFIG task type {kind!r} is not one of "
                                  f"{', '.join(TASK_TYPES)}.")
  # TF lets an evaluator be left out of the cluster (it is not part of
  # training), whatever its index: AI Platform may run several.
  count = (len(cluster.get(kind, ())) if kind != "evaluator" or kind in cluster
           else float("inf"))
  if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
    raise arguments.VariableError(f"TF_CONFIG task {kind!r} index {index!r} is not in the cluster, "
                     f"which has {count} {kind!r} task(s); use 0 to {count - 1}.")
  return cluster, task


def _int(text):
  try:
    return int(text)
  except (TypeError, ValueError):
    return 0


def slurm_step_tasks(env: Mapping[str, str] | None = None) -> int:
  """The number of tasks of this Slurm job step (0 outside `srun`): a process that a batch
  script starts without `srun` has only `SLURM_NTASKS`, and is one process."""
  env = os.environ if env is None else env
  return _int(env.get("SLURM_STEP_NUM_TASKS")) if env.get("SLURM_JOB_ID") else 0


# Slurm tasks listen on SLURM_PORT_BASE + their index on the node (TF's own
# default, 8888, is Jupyter's, which clusters often run on compute nodes).
# Set CTL_SLURM_PORT_BASE to move it, e.g. when two jobs share a node.
SLURM_PORT_BASE = 23456
SLURM_PORT_BASE_VARIABLE = "CTL_SLURM_PORT_BASE"


class _SlurmClusterResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
  """TF's Slurm resolver, which lays tasks out by a node's GPUs (none: no tasks),
  laying them out as if each had one but reporting the GPUs this process sees."""

  def __init__(self, num_gpus, **kwargs):
    super().__init__(**kwargs)
    self._visible_gpus = num_gpus

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    del task_type, task_id, config_proto
    return {"GPU": self._visible_gpus} if self._visible_gpus else {}


def slurm_cluster_resolver(num_gpus: int | None = None, env: Mapping[str, str] | None = None
                           ) -> tf.distribute.cluster_resolver.SlurmClusterResolver:
  """The cluster of this Slurm job step, as `multi_worker` builds it.

  Every task is a `worker`; rank 0 (`SLURM_PROCID`) is worker 0, the chief. Task
  `i` on a node listens on port `SLURM_PORT_BASE + i`. `CUDA_VISIBLE_DEVICES` is
  not set: give each task its GPUs with Slurm (`--gpus-per-task`) or run one
  task per node.

  Args:
    num_gpus: GPUs this task uses (default: TensorFlow's physical GPUs).
    env: environment variables to check (default `os.environ`; the resolver
      itself always reads `os.environ`).

  Raises:
    RuntimeError: outside a Slurm step of several tasks, or when a variable
      the resolver needs is missing.
  """
  env = os.environ if env is None else env
  tasks = slurm_step_tasks(env)
  if tasks < 2:
    raise RuntimeError(
        "not in a Slurm job step of several tasks (SLURM_JOB_ID="
        f"{env.get('SLURM_JOB_ID')!r}, SLURM_STEP_NUM_TASKS="
        f"{env.get('SLURM_STEP_NUM_TASKS')!r}); start every task with `srun` "
        "inside an allocation of 2 or more tasks, or set TF_CONFIG.")
  port_base = env.get(SLURM_PORT_BASE_VARIABLE) or SLURM_PORT_BASE
  if not str(port_base).isdigit() or not 0 < int(port_base) < 65536:
    raise arguments.VariableError(f"{SLURM_PORT_BASE_VARIABLE} ({port_base!r}) must be a port "
                     "number, e.g. 23456.")
  if num_gpus is None:
    num_gpus = len(tf.config.list_physical_devices("GPU"))
  per_task = max(num_gpus, 1)
  # No node has more tasks than the step, so `per_task * tasks` "GPUs" per node
  # leave room for every task; TF would otherwise run nvidia-smi to count them.
  return _SlurmClusterResolver(num_gpus, port_base=int(port_base),
                               gpus_per_node=per_task * tasks, gpus_per_task=per_task,
                               auto_set_gpu=False)


# What cloud trainers call TensorFlow's task types: AI Platform's `master` is the
# chief; Vertex AI's CLUSTER_SPEC names worker pools 0-3: the chief, the workers,
# the parameter servers (or a Reduction Server, which runs no ctl), the evaluators.
TASK_TYPE_ALIASES = {"master": "chief", "workerpool0": "chief", "workerpool1": "worker",
                     "workerpool2": "ps", "workerpool3": "evaluator"}


def parse_tf_config(env: Mapping[str, str] | None = None) -> dict[str, Any]:
  """Returns the cluster as TensorFlow names it ({} when none is set).

  Read from `TF_CONFIG` (Kubeflow, Vertex AI, AI Platform, `ctl launch`), or,
  when that is unset, from `CLUSTER_SPEC` (Vertex AI's and AI Platform's custom
  containers). Task types are renamed by `TASK_TYPE_ALIASES`; an evaluator job
  read from `CLUSTER_SPEC` is left out of the cluster, as TF_CONFIG leaves it
  (it may list several; TensorFlow allows one). Other keys are kept.

  Raises:
    ValueError: naming the fix, if the variable is not a JSON object with a
      `cluster` object, or names a task type twice (`master` and `chief`).
  """
  env = os.environ if env is None else env
  source = "TF_CONFIG" if env.get("TF_CONFIG", "").strip() else "CLUSTER_SPEC"
  text = env.get(source, "")
  if not text.strip():
    return {}
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise arguments.VariableError(f"{source} is not valid JSON ({e}): {text[:200]!r}. Set it to "
                     '\'{"cluster": {"worker": ["host:port", ...]}, "task": '
                     '{"type": "worker", "index": 0}}\'.') from None
  if not isinstance(config, dict) or not isinstance(config.get("cluster", {}), dict):
    raise arguments.VariableError(f"{source} must be a JSON object with a 'cluster' object, got "
                     f"{text[:200]!r}.")
  return _tensorflow_names(config, source)


def _tensorflow_names(config, source):
  """`config` with TASK_TYPE_ALIASES renamed (the same object if none is used)."""
  cluster = config.get("cluster") or {}
  renamed = {}
  for job, addresses in cluster.items():
    name = TASK_TYPE_ALIASES.get(job, job)
    if name in renamed:
      raise arguments.VariableError(f"{source} cluster names the {name!r} job twice (as "
                       f"{[j for j in cluster if TASK_TYPE_ALIASES.get(j, j) == name]}); "
                       f"keep one of them.")
    renamed[name] = addresses
  if source == "CLUSTER_SPEC":
    renamed.pop("evaluator", None)
  if renamed != cluster:
    config = dict(config, cluster=renamed)
  task = config.get("task")
  if isinstance(task, dict) and task.get("type") in TASK_TYPE_ALIASES:
    config = dict(config, task=dict(task, type=TASK_TYPE_ALIASES[task["type"]]))
  return config


def export_tf_config(env: MutableMapping[str, str] | None = None) -> None:
  """Sets `TF_CONFIG` to `parse_tf_config`'s cluster where TensorFlow would read another:
  TF knows neither `CLUSTER_SPEC` nor the `master` task type (`make_strategy` calls this)."""
  env = os.environ if env is None else env
  config = parse_tf_config(env)
  if not config:
    return
  text = env.get("TF_CONFIG", "")
  if text.strip() and json.loads(text) == config:
    return
  env["TF_CONFIG"] = json.dumps(config)
  task = config.get("task") or {}
  logger.info("TF_CONFIG set to the cluster %s names with TensorFlow's task types: "
              "this task is %s %s of %s", "TF_CONFIG" if text.strip() else "CLUSTER_SPEC",
              task.get("type"), task.get("index", 0),
              {job: len(a) for job, a in config.get("cluster", {}).items()})

