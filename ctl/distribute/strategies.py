"""Strategies by name: one function from a string to a `tf.distribute.Strategy`.

Call it first, before any other TensorFlow work: logical CPU devices and
collective ops can only be configured before TensorFlow runs its first op, and
`make_strategy` refuses, with the fix in the message, when that moment has passed.

    import ctl
    strategy = ctl.make_strategy("mirrored", logical_cpus=2)  # 2 replicas on 1 CPU
    strategy = ctl.make_strategy("auto")  # TPU, TF_CONFIG cluster, GPUs, or CPU
    runner = ctl.Runner(train_step, build, data, strategy=strategy)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from collections.abc import MutableMapping
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import TypeAlias

import tensorflow as tf

from ctl.base import _tf_internal
from ctl.base import arguments
from ctl.base.constants import READY_DIR_VARIABLE
from ctl.distribute import launch
from ctl.distribute import peers

logger = logging.getLogger("ctl")

NAMES = ("auto", "default", "one_device", "mirrored", "central_storage",
         "multi_worker", "parameter_server", "tpu")

ClusterCoordinator: TypeAlias = tf.distribute.experimental.coordinator.ClusterCoordinator
"""What schedules the steps of a `parameter_server` run on its workers."""

# Knobs TF offers for all-reduce between the devices of one machine.
CROSS_DEVICE_OPS = {
    "nccl": tf.distribute.NcclAllReduce,
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduce_to_one_device": tf.distribute.ReductionToOneDevice,
}

# Knobs TF offers for all-reduce between workers.
COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def make_strategy(name: str = "auto", *, logical_cpus: int | None = None,
                  devices: str | Sequence[str] | None = None,
                  cross_device_ops: str | None = None, communication: str = "auto",
                  tpu: str | None = None, startup_timeout: float | None = None,
                  heartbeat_timeout: float | None = None) -> tf.distribute.Strategy:
  """Returns the `tf.distribute.Strategy` called `name`.

  Args:
    name: one of `NAMES`. `auto` picks from the machine and logs why (see
      `choose_strategy`).
    logical_cpus: split the CPU into this many logical devices, so that
      `mirrored` and `central_storage` have that many replicas on a machine
      without accelerators (tests, laptops). Must come before any other
      TensorFlow op in the process.
    devices: devices to replicate over (`mirrored`, `central_storage`) or the
      device to run on (`one_device`). Default for the first two: all GPUs,
      or every logical CPU when there is no GPU.
    cross_device_ops: `mirrored` only: one of `CROSS_DEVICE_OPS`
      (`nccl`, `hierarchical_copy`, `reduce_to_one_device`); None lets TF pick.
    communication: `multi_worker` only: one of `COMMUNICATION`
      (`auto`, `ring`, `nccl`).
    tpu: `tpu` only: the TPU name or address given to `TPUClusterResolver`
      (`local` on a TPU VM); None reads `TPU_NAME`.
    startup_timeout: `multi_worker` and `parameter_server` (coordinator):
      seconds to wait for the cluster's other tasks before exiting with code 1
      and a message naming those that never answered; None reads
      `CTL_STARTUP_TIMEOUT`, else 600; 0 waits forever. SIGTERM and Ctrl-C
      end the wait at once (see `ctl.peers`).
    heartbeat_timeout: `multi_worker`: seconds a peer may miss its heartbeats
      before TensorFlow's coordination service declares it dead and every
      task stops with an error naming it; None reads `CTL_HEARTBEAT_TIMEOUT`,
      else 60 (TensorFlow's own is 10, which a busy peer on a loaded machine
      can exceed).

  Returns:
    A `tf.distribute.Strategy`; the same one again for the same arguments
    (TF's collectives fail when two strategies share devices in a process).

  Raises:
    ValueError: for an unknown name or knob, or a knob the strategy has no use for.
    RuntimeError: when the devices can no longer be configured because
      TensorFlow already ran an op, or when no TPU or cluster is reachable.
  """
  if name not in NAMES:
    raise ValueError(f"strategy {name!r} is not known{arguments.did_you_mean(name, NAMES)}; "
                     f"use one of {', '.join(NAMES)}.")
  launch.watch_launcher()  # in a task of `ctl launch`: stop if the launcher dies
  for knob, value, default, users in (
      ("cross_device_ops", cross_device_ops, None, ("mirrored",)),
      ("devices", devices, None, ("one_device", "mirrored", "central_storage")),
      ("communication", communication, "auto", ("multi_worker",)),
      ("tpu", tpu, None, ("tpu",)),
      ("startup_timeout", startup_timeout, None, ("multi_worker", "parameter_server")),
      ("heartbeat_timeout", heartbeat_timeout, None, ("multi_worker",))):
    if value != default and name not in users + ("auto",):
      raise ValueError(f"{knob} ({value!r}) only applies to strategy "
                       f"{' or '.join(map(repr, users))}, not {name!r}; drop it.")
  if cross_device_ops is not None and cross_device_ops not in CROSS_DEVICE_OPS:
    raise ValueError(f"cross_device_ops {cross_device_ops!r} is not known; use one "
                     f"of {', '.join(CROSS_DEVICE_OPS)} (or None for TF's choice).")
  if communication not in COMMUNICATION:
    raise ValueError(f"communication {communication!r} is not known; use one of "
                     f"{', '.join(COMMUNICATION)}.")
  if name in ("auto", "multi_worker", "parameter_server"):
    peers.startup_timeout(startup_timeout)  # a bad value fails before any wait
    peers.heartbeat_timeout(heartbeat_timeout)
    export_tf_config()  # AI Platform's and Vertex AI's names, as TF reads them
  if logical_cpus is not None:
    configure_logical_cpus(logical_cpus)
  if name == "auto":
    name, reason = choose_strategy()
    if name == "default" and (logical_cpus or 1) > 1:
      name, reason = "mirrored", f"no TPU, cluster or GPU, and logical_cpus={logical_cpus}"
    logger.info("strategy 'auto' chose %r: %s", name, reason)
  # Two strategies over the same devices in one process (a notebook cell run
  # twice) number their collectives alike, and the second one's all-reduces
  # then fail with "Shape mismatch in the collective instance": hand back the
  # first.
  key = (name, tuple(devices) if devices else None, cross_device_ops, communication, tpu)
  if key not in _MADE:
    _MADE[key] = _BUILDERS[name](devices=devices, cross_device_ops=cross_device_ops,
                                 communication=communication, tpu=tpu,
                                 startup_timeout=startup_timeout,
                                 heartbeat_timeout=heartbeat_timeout)
    if name in ("multi_worker", "parameter_server"):
      announce_ready()
  return _MADE[key]


def announce_ready(env: Mapping[str, str] | None = None) -> None:
  """Leaves `<$CTL_LAUNCH_READY_DIR>/<task type>-<index>` if a launcher asked for it.

  Each task leaves it once its strategy is made (for multi-worker, once all
  peers have connected), so the launcher can tell a slow start from a peer
  that will never come.
  """
  env = os.environ if env is None else env
  directory = env.get(READY_DIR_VARIABLE)
  if not directory:
    return
  task = parse_tf_config(env).get("task", {})
  name = f"{task.get('type', 'worker')}-{task.get('index', 0)}"
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, name), "w") as f:
    f.write(f"{os.getpid()}\n")


_MADE = {}  # arguments -> the strategy made with them


def configure_logical_cpus(count: int) -> None:
  """Splits the first CPU into `count` logical devices (idempotent).

  TensorFlow fixes its devices when it runs its first op; after that only the
  same configuration can be asked for again.
  """
  arguments.integer("logical_cpus", count, minimum=1)
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
  except RuntimeError:
    have = len(tf.config.list_logical_devices("CPU"))
    if have != count:
      raise RuntimeError(
          f"logical_cpus={count} cannot be applied: TensorFlow already ran an op "
          f"in this process and fixed its devices at {have} CPU device(s). Call "
          f"ctl.make_strategy(..., logical_cpus={count}) at the top of the "
          "program, before creating any dataset, tensor or model.") from None


def choose_strategy(env: Mapping[str, str] | None = None, num_gpus: int | None = None,
                    tpu_devices: bool | None = None) -> tuple[str, str]:
  """Decides what `auto` means on this machine.

  Only cheap local signals are read: probing for a TPU over the network can
  stall for minutes on a machine that has none. In order:

  1. `TPU_NAME` or `COLAB_TPU_ADDR` set, or TPU chips attached: `tpu`.
  2. A cluster in `TF_CONFIG` (what Kubeflow's TFJob, Vertex AI, AI Platform
     and `ctl launch` set) or, without it, in `CLUSTER_SPEC` (Vertex AI's and
     AI Platform's custom containers), its task types as `parse_tf_config`
     names them: `parameter_server` if it has a `ps` job; `multi_worker` if
     it has more than one `chief` + `worker` task. A task of type `evaluator`
     evaluates beside the training cluster, not in it, so it gets a local
     strategy. `TF_CONFIG` wins over Slurm when both are present.
  3. A Slurm job step of more than one task (`srun` inside an allocation:
     `SLURM_JOB_ID` and `SLURM_STEP_NUM_TASKS` > 1): `multi_worker`, its
     cluster read from Slurm's variables (see `slurm_cluster_resolver`).
     Parameter-server training on Slurm is not supported: use `TF_CONFIG`.
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
    cluster, task = _check_tf_config(config)
    if task.get("type") == "evaluator":
      # A side-car evaluator reads the checkpoints the workers write; joining
      # their collectives (or coordinating their parameter servers) would
      # make it a second trainer.
      note = "TF_CONFIG task is an 'evaluator', which does not train: "
    elif cluster.get("ps"):
      return "parameter_server", "TF_CONFIG names a 'ps' job"
    elif _training_workers(cluster) > 1:
      return "multi_worker", (f"TF_CONFIG names {_training_workers(cluster)} "
                              "workers (chief + worker tasks)")
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


def _training_workers(cluster):
  # The chief trains too; TF counts it as a worker (multi_worker_util.worker_count).
  return len(cluster.get("chief", ())) + len(cluster.get("worker", ()))


def _check_tf_config(config):
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
  """The number of tasks of this Slurm job step (0 outside `srun`).

  `srun` sets `SLURM_STEP_NUM_TASKS` for each task it starts; a batch script
  run by `sbatch` has only `SLURM_NTASKS`, and a process started from it
  without `srun` is one process, whatever the allocation.
  """
  env = os.environ if env is None else env
  if not env.get("SLURM_JOB_ID"):
    return 0
  return _int(env.get("SLURM_STEP_NUM_TASKS"))


# Slurm tasks listen on SLURM_PORT_BASE + their index on the node (TF's own
# default, 8888, is Jupyter's, which clusters often run on compute nodes).
# Set CTL_SLURM_PORT_BASE to move it, e.g. when two jobs share a node.
SLURM_PORT_BASE = 23456
SLURM_PORT_BASE_VARIABLE = "CTL_SLURM_PORT_BASE"


class _SlurmClusterResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
  """TF's Slurm resolver, also for nodes without GPUs.

  TF's resolver lays tasks out on a node by stepping through its GPUs, so with
  no GPUs it makes no tasks (a zero step), and it reports `gpus_per_task`
  GPUs, which MultiWorkerMirroredStrategy then places replicas on. This one
  lays tasks out as if each had at least one GPU but reports the GPUs this
  process really sees (Slurm's `--gpus-per-task` binds them).
  """

  def __init__(self, num_gpus, **kwargs):
    super().__init__(**kwargs)
    self._visible_gpus = num_gpus

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    del task_type, task_id, config_proto
    return {"GPU": self._visible_gpus} if self._visible_gpus else {}


def slurm_cluster_resolver(num_gpus: int | None = None, env: Mapping[str, str] | None = None
                           ) -> tf.distribute.cluster_resolver.SlurmClusterResolver:
  """The cluster of this Slurm job step, as `multi_worker` builds it.

  TF's `SlurmClusterResolver` reads `SLURM_PROCID` (this task's rank),
  `SLURM_STEP_NUM_TASKS`, `SLURM_STEP_NODELIST` (expanded in Python, e.g.
  `node[01-02]`; no `scontrol` call) and `SLURM_STEP_TASKS_PER_NODE` (e.g.
  `1(x2)`) from `os.environ`. Every task is a `worker`; the task of rank 0 is
  worker 0, the chief. Task `i` on a node listens on port
  `SLURM_PORT_BASE + i` (`$CTL_SLURM_PORT_BASE` overrides it). The resolver
  does not set `CUDA_VISIBLE_DEVICES`: give each task its GPUs with Slurm
  (`--gpus-per-task`) or run one task per node.

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


class Worker(NamedTuple):
  """This process's place among those that run the training program: `worker(strategy)`.

  Attributes:
    index: 0 to `count - 1`; the chief (TF_CONFIG's `chief`, else worker 0) is 0.
    count: processes that run the replicas in sync.
    is_chief: whether this process writes summaries, samples, exports and kept
      checkpoints (what `FitContext.is_chief` says inside an action).
  """
  index: int
  count: int
  is_chief: bool


def worker(strategy: tf.distribute.Strategy | None = None) -> Worker:
  """Which process this is, from `strategy` (default: the current one), not TF_CONFIG.

      me = ctl.worker(runner.strategy)
      if me.is_chief: print(f"worker {me.index} of {me.count}")

  One process (default, one_device, mirrored, ...) is `Worker(0, 1, True)`.
  Under `parameter_server` only the coordinator runs the program (workers and
  parameter servers run `serve`), so it is `Worker(0, 1, True)` too.
  """
  strategy = strategy or tf.distribute.get_strategy()
  return _worker(strategy, kind_of(strategy))


@dataclasses.dataclass(frozen=True)
class Kind:
  """What ctl needs to know of a kind of strategy: the same for every instance.

  Every other module asks a `Placement` (which holds its kind) instead of
  looking at the strategy's class. A new kind is described here, in `KINDS`,
  or by `register(Kind(...))`; a strategy of no known kind is refused when a
  runner is made, naming what to describe.

  Attributes:
    name: the kind's name (`make_strategy`'s, for the built-in ones).
    strategy_class: the `tf.distribute.Strategy` class (its subclasses are of
      this kind too, unless registered as kinds of their own).
    multi_process: its replicas span processes that run the program in sync,
      one per worker of its cluster (`multi_worker`).
    asynchronous: this process only schedules the steps, each on a free
      worker, which updates shared variables as it finishes (parameter
      servers); there is no evaluation in it and no eager mode.
    distributed_datasets: its input must come through TF's distributed
      datasets (a TPU program cannot call a host-side iterator).
    merge_call_updates: variables are updated through merge calls from the
      replicas, which TF cannot run inside a `tf.cond` in replica context (so
      Keras' `gradient_accumulation_steps` and `ema_overwrite_frequency`,
      which update under one, fail).
    merge_call_gradients: the gradient's sum over replicas is a merge call,
      which XLA cannot compile: `jit_compile` compiles each update instead.
    xla_always: the whole step is compiled with XLA anyway (a TPU).
    replica_updates: Keras may update its own variables from each replica
      (False under central storage, which refuses it: EMA, loss scaling).
    not_eager: why the step cannot run eagerly under it (None: it can).
    label: what messages call it (default: the class's name).
  """
  name: str
  strategy_class: type
  multi_process: bool = False
  asynchronous: bool = False
  distributed_datasets: bool = False
  merge_call_updates: bool = False
  merge_call_gradients: bool = False
  xla_always: bool = False
  replica_updates: bool = True
  not_eager: str | None = None
  label: str = ""

  def __str__(self) -> str:
    return self.label or self.strategy_class.__name__


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
  """Makes `kind` known to every `placement` from now on; returns it."""
  if not isinstance(kind, Kind):
    raise TypeError(f"register takes a ctl.strategies.Kind, got {kind!r}.")
  if not (isinstance(kind.strategy_class, type) and
          issubclass(kind.strategy_class, tf.distribute.Strategy)):
    raise TypeError(f"Kind {kind.name!r}: strategy_class must be a subclass of "
                    f"tf.distribute.Strategy, got {kind.strategy_class!r}.")
  for other in KINDS.values():
    if kind.name != other.name and kind.strategy_class is other.strategy_class:
      raise ValueError(f"Kind {kind.name!r}: {kind.strategy_class.__name__} is already "
                       f"kind {other.name!r}.")
  KINDS[kind.name] = kind
  return kind


for _kind in (
    Kind("default", _tf_internal.default_strategy_class(), label="the default strategy"),
    Kind("one_device", tf.distribute.OneDeviceStrategy),
    Kind("mirrored", tf.distribute.MirroredStrategy, merge_call_updates=True,
         merge_call_gradients=True),
    Kind("central_storage", tf.distribute.experimental.CentralStorageStrategy,
         merge_call_updates=True, replica_updates=False),
    Kind("multi_worker", tf.distribute.MultiWorkerMirroredStrategy, multi_process=True,
         merge_call_updates=True, merge_call_gradients=True,
         label="MultiWorkerMirroredStrategy"),
    Kind("parameter_server", tf.distribute.experimental.ParameterServerStrategy,
         asynchronous=True, not_eager="workers run the functions the coordinator schedules",
         label="ParameterServerStrategy"),
    Kind("tpu", tf.distribute.TPUStrategy, distributed_datasets=True,
         merge_call_updates=True, xla_always=True,
         not_eager="a TPU only runs compiled programs", label="TPUStrategy")):
  register(_kind)


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a strategy runs the step, described once: what every module asks.

      placement = ctl.strategies.placement(strategy)
      placement.replicas, placement.worker.is_chief, placement.kind.asynchronous

  Attributes:
    strategy: the strategy itself (to run, reduce and build under).
    kind: its `Kind`.
    replicas: replicas in sync (over every worker).
    worker: this process's place among those that run the program (`Worker`).
    parallel_calls: calls that run at once: the workers of a parameter-server
      cluster, each running the calls scheduled on it; 1 otherwise.
    in_cluster: whether this process is a task of a cluster that TF's
      coordination service connects (a multi-worker cluster, even of one).
  """
  strategy: tf.distribute.Strategy = dataclasses.field(repr=False, compare=False)
  kind: Kind
  replicas: int
  worker: Worker
  parallel_calls: int = 1
  in_cluster: bool = False

  @property
  def is_chief(self) -> bool:
    """Whether this process writes checkpoints, summaries, samples and exports."""
    return self.worker.is_chief

  @property
  def workers(self) -> int:
    """Processes that run the replicas in sync."""
    return self.worker.count

  def created_in_scope(self, variable: tf.Variable) -> bool:
    """Whether `variable` was made in the strategy's scope (so it is replicated)."""
    return bool(self.strategy.extended.variable_created_in_scope(variable))

  @property
  def resolver(self) -> tf.distribute.cluster_resolver.ClusterResolver | None:
    """The cluster's resolver (TF's preemption handler needs it); None outside one."""
    return getattr(self.strategy, "cluster_resolver", None)


def placement(strategy: tf.distribute.Strategy) -> Placement:
  """Describes `strategy` once; raises TypeError for one of no known `Kind`."""
  kind = kind_of(strategy)
  return Placement(
      strategy=strategy, kind=kind, replicas=int(strategy.num_replicas_in_sync),
      worker=_worker(strategy, kind),
      parallel_calls=(_tf_internal.parameter_server_workers(strategy)
                      if kind.asynchronous else 1),
      in_cluster=bool(_jobs(strategy, kind)))


def _jobs(strategy, kind):
  """The training cluster's jobs of a multi-process strategy ({} otherwise)."""
  resolver = getattr(strategy, "cluster_resolver", None) if kind.multi_process else None
  return resolver.cluster_spec().as_dict() if resolver else {}


def _worker(strategy, kind):
  jobs = _jobs(strategy, kind)
  count = max(1, len(jobs.get("chief", [])) + len(jobs.get("worker", [])))
  is_chief = bool(strategy.extended.should_checkpoint)
  if count == 1:
    return Worker(0, 1, is_chief)
  resolver = strategy.cluster_resolver
  index = 0 if resolver.task_type == "chief" else len(jobs.get("chief", [])) + int(
      resolver.task_id)
  return Worker(index, count, is_chief)


def kind_of(strategy: tf.distribute.Strategy) -> Kind:
  """The `Kind` of `strategy` (from its class alone); TypeError if none is known."""
  if not isinstance(strategy, tf.distribute.Strategy):
    raise TypeError(f"strategy must be a tf.distribute.Strategy or one of "
                    f"{', '.join(NAMES)}, got {strategy!r}.")
  cls = strategy.__class__  # (a stand-in's too: mock.Mock(spec=...))
  by_class = {kind.strategy_class: kind for kind in KINDS.values()}
  for base in cls.__mro__:
    if base in by_class:
      return by_class[base]
  raise TypeError(
      f"strategy {cls.__name__} is of no kind ctl knows ({', '.join(KINDS)}). "
      "Describe it once, before making a runner: ctl.strategies.register("
      f"ctl.strategies.Kind('my_kind', {cls.__name__}, ...)), saying whether its "
      "replicas span processes, update through merge calls, and so on (see Kind).")


# What cloud trainers call TensorFlow's task types. AI Platform (runtime
# versions before 2.1, and its custom containers' CLUSTER_SPEC) calls the chief
# `master`; Vertex AI's CLUSTER_SPEC names its worker pools: pool 0 holds the
# chief, 1 the workers, 2 the parameter servers (or a Reduction Server, whose
# own image does not run ctl), 3 the evaluators.
TASK_TYPE_ALIASES = {"master": "chief", "workerpool0": "chief", "workerpool1": "worker",
                     "workerpool2": "ps", "workerpool3": "evaluator"}


def parse_tf_config(env: Mapping[str, str] | None = None) -> dict[str, Any]:
  """Returns the cluster as TensorFlow names it ({} when none is set).

  Read from `TF_CONFIG` (Kubeflow, Vertex AI, AI Platform, `ctl launch`), or,
  when that is unset, from `CLUSTER_SPEC` (what Vertex AI and AI Platform set
  in custom containers). Task types under other names are renamed (see
  `TASK_TYPE_ALIASES`: AI Platform's `master` is the chief); an evaluator
  job read from `CLUSTER_SPEC` is left out of the cluster, as TF_CONFIG
  leaves it (it may list several; TensorFlow allows one). Other keys
  (`environment`, `job`, a task's `trial` and `cloud`) are kept as they are.

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
  task = config.get("task")
  kind = task.get("type") if isinstance(task, dict) else None
  if not (set(cluster) & set(TASK_TYPE_ALIASES) or kind in TASK_TYPE_ALIASES
          or (source == "CLUSTER_SPEC" and "evaluator" in cluster)):
    return config
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
  config = dict(config, cluster=renamed)
  if kind in TASK_TYPE_ALIASES:
    config["task"] = dict(task, type=TASK_TYPE_ALIASES[kind])
  return config


def export_tf_config(env: MutableMapping[str, str] | None = None) -> None:
  """Sets `TF_CONFIG` to `parse_tf_config`'s cluster where TensorFlow would read another.

  TensorFlow reads `TF_CONFIG` itself (its resolvers and strategies) and knows
  neither `CLUSTER_SPEC` nor the `master` task type; `make_strategy` calls
  this first, so that TensorFlow and ctl read the same cluster.
  """
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
              {job: len(a) for job, a in config["cluster"].items()})


def _default(**unused):
  return tf.distribute.get_strategy()


def _one_device(devices, **unused):
  if devices is None:
    devices = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
  elif not isinstance(devices, str):
    if len(devices) != 1:
      raise ValueError(f"one_device runs on one device; got devices={devices!r}.")
    devices = devices[0]
  return tf.distribute.OneDeviceStrategy(devices)


def _replica_devices(devices):
  # TF's own default is all GPUs, else CPU:0 alone, which would ignore a CPU
  # split into logical devices for local multi-replica runs.
  if devices is not None or tf.config.list_physical_devices("GPU"):
    return devices
  return [d.name for d in tf.config.list_logical_devices("CPU")]


def _mirrored(devices, cross_device_ops, **unused):
  ops = CROSS_DEVICE_OPS[cross_device_ops]() if cross_device_ops else None
  return tf.distribute.MirroredStrategy(_replica_devices(devices), cross_device_ops=ops)


def _central_storage(devices, **unused):
  return tf.distribute.experimental.CentralStorageStrategy(_replica_devices(devices))


def _multi_worker(communication, startup_timeout, heartbeat_timeout, **unused):
  # TF_CONFIG wins over Slurm, as in `choose_strategy`; with neither, TF's
  # default resolver gives a one-worker strategy.
  resolver, others, me, training, kind = None, [], None, {}, None
  config = parse_tf_config()
  if config.get("cluster") or "sparseCluster" in config:
    cluster, task = _check_tf_config(config)
    training = {job: cluster[job] for job in ("chief", "worker") if job in cluster}
    kind = task["type"]
    others, me = peers.cluster_peers(training, kind, task.get("index", 0))
  elif slurm_step_tasks() > 1:
    resolver = slurm_cluster_resolver()
    training, kind = resolver.cluster_spec().as_dict(), resolver.task_type
    logger.info("multi_worker: Slurm task %s %d of %s", resolver.task_type,
                resolver.task_id, training)
    others, me = peers.cluster_peers(training, resolver.task_type, resolver.task_id)
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=COMMUNICATION[communication])
  if others and _tf_internal.too_late_for_collectives():  # say so now, not after waiting for peers
    raise RuntimeError(_MULTI_WORKER_TOO_LATE)
  if others and kind in ("chief", "worker"):
    seconds = peers.heartbeat_timeout(heartbeat_timeout)
    if not _tf_internal.configure_coordination_service(training, seconds * 1000):
      logger.warning("multi_worker: the coordination service was configured before ctl "
                     "could set its heartbeat timeout (%g s); TensorFlow's applies.", seconds)
  timeout = peers.startup_timeout(startup_timeout)
  left = peers.wait_for_peers(others, me, timeout) if others else 0
  # Every peer listens; should one die before joining, TF's constructor would
  # wait for it forever, deaf to signals: a watchdog bounds it.
  limit = max(left, 60.0) if others and timeout else 0
  message = (f"ctl: the multi_worker strategy was not made {limit:g} s after every "
             "peer answered; a peer may have stopped while joining. Killing this "
             "process (SIGKILL); restart every task of the cluster.")
  try:
    with peers.watchdog(limit, message):
      return tf.distribute.MultiWorkerMirroredStrategy(
          cluster_resolver=resolver, communication_options=options)
  except (RuntimeError, ValueError) as e:
    if "program startup" not in str(e):
      raise
    raise RuntimeError(_MULTI_WORKER_TOO_LATE) from e


_MULTI_WORKER_TOO_LATE = (
    "strategy 'multi_worker' must be created before TensorFlow runs any op in this "
    "process (TF configures collective ops once, at start-up). Call "
    "ctl.make_strategy('multi_worker') at the top of the program.")


def _parameter_server(startup_timeout, **unused):
  config = parse_tf_config()
  cluster = config.get("cluster", {})
  if not cluster.get("ps") or not cluster.get("worker") or not cluster.get("chief"):
    raise RuntimeError(
        "strategy 'parameter_server' needs a cluster with 'chief' (the "
        "coordinator), 'worker' and 'ps' jobs in TF_CONFIG; got jobs "
        f"{sorted(cluster) or 'none'}. Start the run through a launcher that sets "
        "TF_CONFIG, or pick 'multi_worker' or 'mirrored'.")
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  if resolver.task_type in ("worker", "ps"):
    serve(resolver)  # never returns
  others, me = peers.cluster_peers(cluster, resolver.task_type, resolver.task_id)
  peers.wait_for_peers(others, me, peers.startup_timeout(startup_timeout))
  return tf.distribute.experimental.ParameterServerStrategy(resolver)


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
  """Runs this worker's or parameter server's TF server until the process is killed.

  In parameter-server training only the coordinator (the `chief` task) runs
  the program; the other tasks serve it. Running the same command on every
  task (as `ctl launch` and the cluster examples do) thus reaches this point
  on workers and parameter servers, which serve and never return.
  """
  # Workers wait for a parameter server that restarts instead of failing
  # the coordinator's calls at once (TF's parameter-server tutorial).
  os.environ["GRPC_FAIL_FAST"] = "use_caller"
  server = tf.distribute.Server(
      resolver.cluster_spec(), job_name=resolver.task_type,
      task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
  logger.info("serving as %s %d of the parameter-server cluster", resolver.task_type,
              resolver.task_id)
  announce_ready()
  server.join()


def _tpu(tpu, **unused):
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, tf.errors.NotFoundError, tf.errors.UnavailableError) as e:
    raise RuntimeError(
        f"strategy 'tpu' found no TPU (tpu={tpu!r}): {e}. On a TPU VM pass "
        "tpu='local'; elsewhere set TPU_NAME or pick another strategy.") from e
  return tf.distribute.TPUStrategy(resolver)


_BUILDERS = {
    "default": _default,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "central_storage": _central_storage,
    "multi_worker": _multi_worker,
    "parameter_server": _parameter_server,
    "tpu": _tpu,
}
