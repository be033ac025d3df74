"""Strategies by name: one function from a string to a `tf.distribute.Strategy`;
and, for a strategy made, its `Placement` (`placement`, `kind_of`, `worker`).

Call it first, before any other TensorFlow work: logical CPU devices and
collective ops can only be configured before TensorFlow runs its first op, and
`make_strategy` refuses, with the fix in the message, when that moment has passed.

    import ctl
    strategy = ctl.make_strategy("mirrored", logical_cpus=2)  # 2 replicas on 1 CPU
    strategy = ctl.make_strategy("auto")  # TPU, TF_CONFIG cluster, GPUs, or CPU
    runner = ctl.Runner(train_step, build, data, strategy=strategy)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TypeAlias

import tensorflow as tf

from ctl.base import _tf_internal
from ctl.base import arguments
from ctl.base.constants import READY_DIR_VARIABLE
from ctl.base.constants import TPU_TENSORFLOW
from ctl.distribute import cluster
from ctl.distribute import launch
from ctl.distribute import peers
from ctl.distribute.placement import KINDS
from ctl.distribute.placement import Kind
from ctl.distribute.placement import Placement
from ctl.distribute.placement import Worker

logger = logging.getLogger("ctl")

STRATEGY_NAMES = ("auto", "default", "one_device", "mirrored", "central_storage",
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
    name: one of `STRATEGY_NAMES`. `auto` picks from the machine and logs why (see
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
      seconds to wait for the cluster's other tasks before exiting with code 1,
      naming those that never answered; None reads `CTL_STARTUP_TIMEOUT`, else
      600; 0 waits forever (see `ctl.distribute.peers`).
    heartbeat_timeout: `multi_worker`: seconds a peer may miss its heartbeats
      before every task stops with an error naming it; None reads
      `CTL_HEARTBEAT_TIMEOUT`, else 60 (see `ctl.distribute.peers`).

  Returns:
    A `tf.distribute.Strategy`; the same one again for the same arguments
    (TF's collectives fail when two strategies share devices in a process).

  Raises:
    ValueError: for an unknown name or knob, or a knob the strategy has no use for.
    RuntimeError: when the devices can no longer be configured because
      TensorFlow already ran an op, or when no TPU or cluster is reachable.
  """
  if name not in STRATEGY_NAMES:
    raise ValueError(f"strategy {name!r} is not known"
                     f"{arguments.did_you_mean(name, STRATEGY_NAMES)}; "
                     f"use one of {', '.join(STRATEGY_NAMES)}.")
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
  for knob, value, known in (("cross_device_ops", cross_device_ops, (None, *CROSS_DEVICE_OPS)),
                             ("communication", communication, tuple(COMMUNICATION))):
    if value not in known:
      raise ValueError(f"{knob} {value!r} is not known; use one of "
                       f"{', '.join(map(str, known))}.")
  if name in ("auto", "multi_worker", "parameter_server"):
    peers.startup_timeout(startup_timeout)  # a bad value fails before any wait
    peers.heartbeat_timeout(heartbeat_timeout)
    cluster.export_tf_config()  # AI Platform's and Vertex AI's names, as TF reads them
  if logical_cpus is not None:
    configure_logical_cpus(logical_cpus)
  if name == "auto":
    name, reason = cluster.choose_strategy()
    if name == "default" and (logical_cpus or 1) > 1:
      name, reason = "mirrored", f"no TPU, cluster or GPU, and logical_cpus={logical_cpus}"
    logger.info("strategy 'auto' chose %r: %s", name, reason)
  # A second strategy on the same devices (a cell run twice) fails its all-reduces.
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
  """Leaves `<$CTL_LAUNCH_READY_DIR>/<task type>-<index>` if a launcher asked for it, once
  the strategy is made: the launcher tells a slow start from a peer that never comes."""
  env = os.environ if env is None else env
  directory = env.get(READY_DIR_VARIABLE)
  if not directory:
    return
  task = cluster.parse_tf_config(env).get("task", {})
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
  chiefs = len(jobs.get("chief", []))
  count = max(1, chiefs + len(jobs.get("worker", [])))
  resolver = strategy.cluster_resolver if count > 1 else None
  index = chiefs + int(resolver.task_id) if resolver and resolver.task_type != "chief" else 0
  return Worker(index, count, bool(strategy.extended.should_checkpoint))


def kind_of(strategy: tf.distribute.Strategy) -> Kind:
  """The `Kind` of `strategy` (from its class alone); TypeError if none is known."""
  if not isinstance(strategy, tf.distribute.Strategy):
    raise TypeError(f"strategy must be a tf.distribute.Strategy or one of "
                    f"{', '.join(STRATEGY_NAMES)}, got {strategy!r}.")
  cls = strategy.__class__  # (a stand-in's too: mock.Mock(spec=...))
  by_class = {kind.strategy_class: kind for kind in KINDS.values()}
  kind = next((by_class[base] for base in cls.__mro__ if base in by_class), None)
  if kind is not None:
    return kind
  raise TypeError(
      f"strategy {cls.__name__} is of no kind ctl knows ({', '.join(KINDS)}). "
      "Describe it once, before making a runner: ctl.distribute.placement.register("
      f"ctl.distribute.placement.Kind('my_kind', {cls.__name__}, ...)), saying whether "
      "its replicas span processes, update through merge calls, and so on (see Kind).")


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
  resolver, training, kind, index = None, {}, None, 0
  config = cluster.parse_tf_config()
  if config.get("cluster") or "sparseCluster" in config:
    jobs, task = cluster.check_tf_config(config)
    training = {job: jobs[job] for job in ("chief", "worker") if job in jobs}
    kind, index = task["type"], task.get("index", 0)
  elif cluster.slurm_step_tasks() > 1:
    resolver = cluster.slurm_cluster_resolver()
    training, kind, index = (resolver.cluster_spec().as_dict(), resolver.task_type,
                             resolver.task_id)
    logger.info("multi_worker: Slurm task %s %d of %s", kind, index, training)
  others, me = peers.cluster_peers(training, kind, index)
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
  jobs = cluster.parse_tf_config().get("cluster", {})
  if not jobs.get("ps") or not jobs.get("worker") or not jobs.get("chief"):
    raise RuntimeError(
        "strategy 'parameter_server' needs a cluster with 'chief' (the "
        "coordinator), 'worker' and 'ps' jobs in TF_CONFIG; got jobs "
        f"{sorted(jobs) or 'none'}. Start the run through a launcher that sets "
        "TF_CONFIG, or pick 'multi_worker' or 'mirrored'.")
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  if resolver.task_type in ("worker", "ps"):
    serve(resolver)  # never returns
  others, me = peers.cluster_peers(jobs, resolver.task_type, resolver.task_id)
  peers.wait_for_peers(others, me, peers.startup_timeout(startup_timeout))
  return tf.distribute.experimental.ParameterServerStrategy(resolver)


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
  """Runs this worker's or parameter server's TF server until the process is killed: the
  same command on every task reaches here on all but the coordinator (`chief`)."""
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


def tpu_version_note(version: str = tf.__version__) -> str:
  """Why TensorFlow `version` cannot run the `tpu` strategy, or "" when it can."""
  low, high = TPU_TENSORFLOW
  release = tuple(int(part) for part in version.split(".")[:2])
  if tuple(map(int, low.split("."))) <= release <= tuple(map(int, high.split("."))):
    return ""
  return (f"TensorFlow {version} has no TPU build: a TPU runs TensorFlow {low} to {high} "
          f"(a Cloud TPU VM image's, or tensorflow-tpu=={high}.* in a TPU VM's venv).")


def _tpu(tpu, **unused):
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, tf.errors.NotFoundError, tf.errors.UnavailableError) as e:
    note = tpu_version_note()
    raise RuntimeError(
        f"strategy 'tpu' found no TPU (tpu={tpu!r}): {e}. On a TPU VM pass "
        "tpu='local'; elsewhere set TPU_NAME or pick another strategy."
        + (f" {note}" if note else "")) from e
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
