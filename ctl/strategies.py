"""Strategies by name: one function from a string to a `tf.distribute.Strategy`.

Call it first, before any other TensorFlow work: logical CPU devices and
collective ops can only be configured before TensorFlow runs its first op, and
`make_strategy` refuses, with the fix in the message, when that moment has passed.

    import ctl
    strategy = ctl.make_strategy("mirrored", logical_cpus=2)  # 2 replicas on 1 CPU
    strategy = ctl.make_strategy("auto")  # TPU, TF_CONFIG cluster, GPUs, or CPU
    runner = ctl.Runner(step, build, data, strategy=strategy)
"""

import json
import logging
import os

import tensorflow as tf

logger = logging.getLogger("ctl")

NAMES = ("auto", "default", "one_device", "mirrored", "central_storage",
         "multi_worker", "parameter_server", "tpu")

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


def make_strategy(name="auto", *, logical_cpus=None, devices=None,
                  cross_device_ops=None, communication="auto", tpu=None):
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

  Returns:
    A `tf.distribute.Strategy`; the same one again for the same arguments
    (TF's collectives fail when two strategies share devices in a process).

  Raises:
    ValueError: for an unknown name or knob, or a knob the strategy has no use for.
    RuntimeError: when the devices can no longer be configured because
      TensorFlow already ran an op, or when no TPU or cluster is reachable.
  """
  if name not in NAMES:
    raise ValueError(f"strategy {name!r} is not known; use one of {', '.join(NAMES)}.")
  for knob, value, default, users in (
      ("cross_device_ops", cross_device_ops, None, ("mirrored",)),
      ("devices", devices, None, ("one_device", "mirrored", "central_storage")),
      ("communication", communication, "auto", ("multi_worker",)),
      ("tpu", tpu, None, ("tpu",))):
    if value != default and name not in users + ("auto",):
      raise ValueError(f"{knob} ({value!r}) only applies to strategy "
                       f"{' or '.join(map(repr, users))}, not {name!r}; drop it.")
  if cross_device_ops is not None and cross_device_ops not in CROSS_DEVICE_OPS:
    raise ValueError(f"cross_device_ops {cross_device_ops!r} is not known; use one "
                     f"of {', '.join(CROSS_DEVICE_OPS)} (or None for TF's choice).")
  if communication not in COMMUNICATION:
    raise ValueError(f"communication {communication!r} is not known; use one of "
                     f"{', '.join(COMMUNICATION)}.")
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
                                 communication=communication, tpu=tpu)
  return _MADE[key]


_MADE = {}  # arguments -> the strategy made with them


def configure_logical_cpus(count):
  """Splits the first CPU into `count` logical devices (idempotent).

  TensorFlow fixes its devices when it runs its first op; after that only the
  same configuration can be asked for again.
  """
  if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    raise ValueError(f"logical_cpus must be a positive int, got {count!r}.")
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


def choose_strategy(env=None, num_gpus=None, tpu_devices=None):
  """Decides what `auto` means on this machine.

  Only cheap local signals are read: probing for a TPU over the network can
  stall for minutes on a machine that has none.

  Args:
    env: environment variables (default `os.environ`).
    num_gpus: GPU count (default: TensorFlow's physical GPUs).
    tpu_devices: whether TPU chips are attached (default: `/dev/accel0` or
      `/dev/vfio/0` exists, as on a Cloud TPU VM).

  Returns:
    `(name, reason)`.
  """
  env = os.environ if env is None else env
  if tpu_devices is None:
    tpu_devices = os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")
  if env.get("TPU_NAME") or env.get("COLAB_TPU_ADDR"):
    return "tpu", "TPU_NAME or COLAB_TPU_ADDR is set"
  if tpu_devices:
    return "tpu", "TPU chips are attached to this host"
  cluster = parse_tf_config(env).get("cluster", {})
  if cluster.get("ps"):
    return "parameter_server", "TF_CONFIG names a 'ps' job"
  workers = len(cluster.get("worker", ())) + len(cluster.get("chief", ()))
  if workers > 1:
    return "multi_worker", f"TF_CONFIG names {workers} workers"
  if num_gpus is None:
    num_gpus = len(tf.config.list_physical_devices("GPU"))
  if num_gpus > 1:
    return "mirrored", f"{num_gpus} GPUs are visible"
  if num_gpus == 1:
    return "one_device", "1 GPU is visible"
  return "default", "no TPU, cluster or GPU found: one CPU device"


def parse_tf_config(env=None):
  """Returns TF_CONFIG as a dict ({} when unset), with a clear error if malformed."""
  env = os.environ if env is None else env
  text = env.get("TF_CONFIG", "")
  if not text.strip():
    return {}
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"TF_CONFIG is not valid JSON ({e}): {text[:200]!r}. Set it to "
                     '\'{"cluster": {"worker": ["host:port", ...]}, "task": '
                     '{"type": "worker", "index": 0}}\'.') from None
  if not isinstance(config, dict) or not isinstance(config.get("cluster", {}), dict):
    raise ValueError(f"TF_CONFIG must be a JSON object with a 'cluster' object, got "
                     f"{text[:200]!r}.")
  return config


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


def _multi_worker(communication, **unused):
  parse_tf_config()
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=COMMUNICATION[communication])
  try:
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
  except (RuntimeError, ValueError) as e:
    if "program startup" not in str(e):
      raise
    raise RuntimeError(
        "strategy 'multi_worker' must be created before TensorFlow runs any op "
        "in this process (TF configures collective ops once, at start-up). Call "
        "ctl.make_strategy('multi_worker') at the top of the program.") from e


def _parameter_server(**unused):
  cluster = parse_tf_config().get("cluster", {})
  if not cluster.get("ps") or not cluster.get("worker"):
    raise RuntimeError(
        "strategy 'parameter_server' needs a cluster with 'worker' and 'ps' jobs "
        "in TF_CONFIG; none is set. Start the run through a launcher that sets "
        "TF_CONFIG, or pick 'multi_worker' or 'mirrored'.")
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  return tf.distribute.experimental.ParameterServerStrategy(resolver)


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
