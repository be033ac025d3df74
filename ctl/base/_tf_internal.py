"""Every use of a private TensorFlow, Keras or gin attribute, in one place.

    from ctl.base import _tf_internal
    if _tf_internal.too_late_for_collectives(): ...

Each function here reads something that the public API does not offer, says
what and why, and falls back to a safe answer when the attribute is gone. They
were checked against the versions in `CHECKED`; under another version the
first use logs, once, that the reads are unchecked there. Nothing else in the
project reaches a private TF, Keras or gin attribute (a test scans for it).
"""

import collections
import contextlib
import functools
import importlib.metadata
import logging

_log = logging.getLogger("ctl")

# Distribution name -> the release series these reads were checked against (TF 2.18,
# the oldest pyproject.toml accepts, by .ci/run's fast tier; 2.20 by hand).
CHECKED = {"tensorflow": ("2.18", "2.20", "2.21"), "keras": ("3.15",), "gin-config": ("0.5",)}


@functools.cache  # once per package
def _note_version(distribution):
  """Logs when the installed version of `distribution` was not checked here."""
  try:
    version = importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return
  if not version.startswith(tuple(f"{series}." for series in CHECKED[distribution])):
    _log.warning("%s %s: ctl reads some of its private attributes (ctl/base/_tf_internal.py), "
                 "checked against %s only; if something fails, that is the place to "
                 "look.", distribution, version, ", ".join(CHECKED[distribution]))


def too_late_for_collectives():
  """Whether TF ran an op already, so that collective ops can no longer be set up:
  the eager context's handle and collective leader, as TF's `configure_collective_ops`
  reads them; False if they are not there."""
  _note_version("tensorflow")
  from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
  ctx = context.context()
  return (getattr(ctx, "_context_handle", None) is not None and
          getattr(ctx, "_collective_leader", "") is None)


def configure_coordination_service(cluster, heartbeat_timeout_ms):
  """Sets up the coordination service as MultiWorkerMirroredStrategy would, with our
  heartbeat timeout (the strategy sets none, and only if nothing did before); False if
  the service was configured already."""
  _note_version("tensorflow")
  # The strategy's module holds the proto module wherever TF keeps it this release.
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tensorflow.python.distribute import collective_all_reduce_strategy as mwms  # pylint: disable=import-outside-toplevel
  from tensorflow.python.distribute import multi_worker_util  # pylint: disable=import-outside-toplevel
  from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
  ctx = context.context()
  if ctx.coordination_service is not None:
    return False
  spec = tf.train.ClusterSpec(dict(cluster))
  jobs = [mwms.coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
          for job in ("chief", "worker") if job in spec.jobs]
  ctx.configure_coordination_service(
      service_type="standalone", service_leader=multi_worker_util.coordination_leader(spec),
      coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(heartbeat_timeout_ms))
  return True


def on_internal_platform():
  """Whether TF's preemption handler watches SIGTERM here: on its "internal" CPU/GPU
  platforms (anything but GCE, whose metadata server it watches instead)."""
  _note_version("tensorflow")
  from tensorflow.python.distribute.failure_handling import failure_handling_util  # pylint: disable=import-outside-toplevel
  return failure_handling_util.detect_platform() in (
      failure_handling_util.PlatformDevice.INTERNAL_CPU,
      failure_handling_util.PlatformDevice.INTERNAL_GPU)


def preemption_handler_received_sigterm(handler):
  """Whether a `PreemptionCheckpointHandler` caught a SIGTERM to this process (its
  private flag, which ctl reports); False if the flag is gone."""
  _note_version("tensorflow")
  received = getattr(handler, "_received_own_sigterm", None)
  return received is not None and received.is_set()


def stop_preemption_handler_threads(handler):
  """Stops the watcher threads a `PreemptionCheckpointHandler` leaves running until
  garbage collection, where a later handler (a second `fit`) would find them."""
  _note_version("tensorflow")
  for stop in ("_stop_poll_termination_signal_thread",
               "_stop_cluster_wise_termination_watcher_thread"):
    with contextlib.suppress(Exception):
      getattr(handler, stop)()


def optimizer_variables(optimizer):
  """The variables a built Keras optimizer was built on (`_trainable_variables`:
  Keras 3 has no public getter), to build a wrapper on them."""
  _note_version("keras")
  return optimizer._trainable_variables  # pylint: disable=protected-access


# id(optimizer) -> how many replicas are inside `gradients_summed_by_caller` for it.
_summing_callers = collections.Counter()


def _all_reduce_unless_summed(optimizer, original):
  def all_reduce_sum_gradients(grads_and_vars):
    if _summing_callers[id(optimizer)]:
      return list(grads_and_vars)
    return original(grads_and_vars)
  return all_reduce_sum_gradients


@contextlib.contextmanager
def gradients_summed_by_caller(optimizer):
  """Inside, `optimizer.apply_gradients` takes gradients already summed over replicas.

  Keras' TF optimizer sums them itself, in `_all_reduce_sum_gradients`, but only
  after clipping them (and a LossScaleOptimizer checks them for inf first), so each
  replica would act on its own share. Here that method passes them through while a
  caller is inside (a count, not a flag: replicas run in threads of their own).

  Yields:
    Whether the method was found; if not (another Keras), the optimizer
    still sums, and the caller must pass per-replica gradients.
  """
  _note_version("keras")
  optimizers = [o for o in (optimizer, getattr(optimizer, "inner_optimizer", None))
                if o is not None]
  if not all(hasattr(type(o), "_all_reduce_sum_gradients") for o in optimizers):
    yield False
    return
  for o in optimizers:
    if "_all_reduce_sum_gradients" not in vars(o):
      object.__setattr__(o, "_all_reduce_sum_gradients",
                         _all_reduce_unless_summed(o, o._all_reduce_sum_gradients))  # pylint: disable=protected-access
  _summing_callers.update(id(o) for o in optimizers)
  try:
    yield True
  finally:
    _summing_callers.subtract(id(o) for o in optimizers)


def cross_device_ops(strategy):
  """The all-reduce implementation a MirroredStrategy uses (None if unknown)."""
  _note_version("tensorflow")
  return getattr(strategy.extended, "_cross_device_ops", None)


def op_determinism_enabled():
  """Whether `tf.config.experimental.enable_op_determinism()` ran (TF exports
  the switch but not the reading; the run manifest records it)."""
  _note_version("tensorflow")
  from tensorflow.python.framework import config  # pylint: disable=import-outside-toplevel
  return bool(config.is_op_determinism_enabled())


def gin_registry():
  """gin's registry of configurables (no public listing), to suggest the closest
  configurable or parameter for a misspelt one."""
  _note_version("gin-config")
  import gin  # pylint: disable=import-outside-toplevel
  return gin.config._REGISTRY  # pylint: disable=protected-access


def gin_bindings_and_uses():
  """(gin's bindings, what the calls so far used): two dicts from `(scope,
  selector)` to `{parameter: value}`, copied (gin has no public listing of either).

  A macro `NAME = value` is the binding `("NAME", "gin.macro")`; a use is keyed
  by the whole scope the configurable was called under.
  """
  # pylint: disable=protected-access
  _note_version("gin-config")
  from gin import config  # pylint: disable=import-outside-toplevel
  with config._OPERATIVE_CONFIG_LOCK:
    uses = {key: dict(values) for key, values in config._OPERATIVE_CONFIG.items()}
  return {key: dict(values) for key, values in config._CONFIG.items()}, uses


@contextlib.contextmanager
def gin_search_paths_first(directories):
  """Inside, gin looks for an included file in `directories` before anywhere else
  (its search paths start with the current directory, with no public way to
  search elsewhere first)."""
  _note_version("gin-config")
  from gin import config  # pylint: disable=import-outside-toplevel
  previous = list(config._LOCATION_PREFIXES)  # pylint: disable=protected-access
  config._LOCATION_PREFIXES[:] = list(directories) + previous  # pylint: disable=protected-access
  try:
    yield
  finally:
    config._LOCATION_PREFIXES[:] = previous  # pylint: disable=protected-access


def gin_errors_not_converted_by_autograph():
  """Has AutoGraph leave gin's error helper as it is (marked do_not_convert, once): a
  gin-configured function raising in a compiled step calls it, and AutoGraph would
  warn "could not transform ..." before the user's own error."""
  _note_version("gin-config")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from gin import utils  # pylint: disable=import-outside-toplevel
  helper = getattr(utils, "augment_exception_message_and_reraise", None)
  if helper is None or getattr(helper, "_ctl_not_converted", False):
    return
  quiet = tf.autograph.experimental.do_not_convert(helper)
  quiet._ctl_not_converted = True  # pylint: disable=protected-access
  utils.augment_exception_message_and_reraise = quiet


def legacy_h5_weights_writer():
  """Keras' writer of the legacy HDF5 weights format of pretrained weight files
  (InceptionV3's), or None if it is gone; tests write one with random weights."""
  _note_version("keras")
  try:
    from keras.src.legacy.saving import legacy_h5_format  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return legacy_h5_format.save_weights_to_hdf5_group


def tape_is_recording(tape):
  """Whether `tape` (a tf.GradientTape) records now; its `_recording` flag."""
  _note_version("tensorflow")
  return bool(getattr(tape, "_recording", False))


def trackable_object_graph(serialized):
  """The object graph TF writes into every checkpoint (a `TrackableObjectGraph`,
  not public), parsed from its bytes: which object owns which variable."""
  _note_version("tensorflow")
  from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=import-outside-toplevel
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(serialized)
  return graph


def frozen(trackable):
  """A trackable that a checkpoint writes as it would write `trackable` now, read
  at once through TF's save protocols (`_serialize_to_tensors`, or the older
  `_gather_saveables_for_checkpoint` of a MirroredVariable or a parameter server's
  variable; not public): the background save's snapshot. A variable read shares its
  buffer until the next update copies it (TF's copy-on-write), so the snapshot costs
  no copy; a data iterator's state is serialized here, at this step. Its `own()`,
  called by the thread that writes it, copies those buffers there and lets go of
  the variables', so that the step's next update finds its buffer unshared and
  does not copy it (1.3 GB: 0.15-2 s on the step's path)."""
  _note_version("tensorflow")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tensorflow.python.checkpoint import saveable_compat  # pylint: disable=import-outside-toplevel
  from tensorflow.python.training.saving import saveable_object  # pylint: disable=import-outside-toplevel
  from tensorflow.python.training.saving import saveable_object_util  # pylint: disable=import-outside-toplevel

  if saveable_object_util.trackable_has_serialize_to_tensor(trackable):
    tensors = trackable._serialize_to_tensors()  # pylint: disable=protected-access
  else:  # each saveable made under its attribute's name, as TF names its tensors
    saveables = []  # a factory may give a plain variable (a parameter server's), as TF allows
    for name, factory in trackable._gather_saveables_for_checkpoint().items():  # pylint: disable=protected-access
      made = factory(name=name) if callable(factory) else factory
      saveables.extend(saveable_object_util.saveable_objects_for_op(made, name))
    tensors = saveable_object_util.saveable_object_to_tensor_dict(saveables)

  def read(value):  # a SaveSpec reads when asked; a partitioned one is {slice: value}
    if isinstance(value, dict):
      return {k: read(v) for k, v in value.items()}
    value = value.tensor if isinstance(value, saveable_object.SaveSpec) else value
    if value is None:  # an uninitialized variable
      return None
    with tf.device("/cpu:0"):  # a variable (a Keras one's MirroredVariable) is read now
      return tf.identity(value)

  tensors = {k: read(v) for k, v in tensors.items()}
  copy = _frozen_class(tf)({k: v for k, v in tensors.items() if v is not None})  # None: unset
  legacy = saveable_compat.get_saveable_name(trackable)  # a data iterator's "ITERATOR"
  return copy if legacy is None else saveable_compat.legacy_saveable_name(legacy)(copy)


@functools.cache
def _frozen_class(tf):
  class Frozen(tf.__internal__.tracking.Trackable):
    def __init__(self, tensors):
      self._tensors = tensors

    def own(self):
      self._tensors = tf.nest.map_structure(_own_copy, self._tensors)

    def _serialize_to_tensors(self):
      return self._tensors

  def _own_copy(value):  # an iterator's state (a string, a variant) shares no variable's
    if value.dtype in (tf.string, tf.variant, tf.resource):
      return value
    with tf.device("/cpu:0"):
      return tf.raw_ops.DeepCopy(x=value)
  return Frozen


def wrap_checkpoint_state_update(wrapper):
  """Replaces TF's update of a directory's `checkpoint` file, the moment a save
  becomes the newest, by `wrapper(original)` (fault tests pause or crash there).
  Returns a function that puts the original back."""
  from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=import-outside-toplevel
  return _wrap(checkpoint_management, "update_checkpoint_state_internal", wrapper)


def wrap_checkpoint_merge(wrapper):
  """Replaces TF's merge of a save's written data (under `<prefix>_temp/`) into the
  checkpoint's files by `wrapper(original)`, called as `(sources, prefix, ...)`:
  fault tests pause a save there, halfway. Returns a function that puts it back."""
  from tensorflow.python.checkpoint import functional_saver  # pylint: disable=import-outside-toplevel
  return _wrap(functional_saver.gen_io_ops, "merge_v2_checkpoints", wrapper)


def _wrap(module, name, wrapper):
  _note_version("tensorflow")
  original = getattr(module, name)
  setattr(module, name, wrapper(original))
  return lambda: setattr(module, name, original)


@contextlib.contextmanager
def checkpoint_pointer_naming_nothing_as_missing():
  """Inside, TF takes a `checkpoint` file that names no checkpoint (an empty one:
  a disk that filled) as missing, as it takes one it cannot parse, instead of
  `tf.train.CheckpointManager` raising "Invalid checkpoint state"; ctl then finds
  the checkpoints from their files."""
  _note_version("tensorflow")
  from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=import-outside-toplevel
  original = checkpoint_management.get_checkpoint_state

  def naming_nothing_as_missing(checkpoint_dir, latest_filename=None):
    try:
      return original(checkpoint_dir, latest_filename)
    except ValueError:
      return None

  checkpoint_management.get_checkpoint_state = naming_nothing_as_missing
  try:
    yield
  finally:
    checkpoint_management.get_checkpoint_state = original


def parameter_server_workers(strategy):
  """The workers of a `ParameterServerStrategy` cluster (1 if unknown), which the
  strategy counts but does not expose."""
  _note_version("tensorflow")
  return max(1, int(getattr(strategy, "_num_workers", 1) or 1))


def in_xla_context():
  """Whether ops made now are compiled by XLA: inside a `jit_compile=True`
  function being traced, or a TPU computation (TF marks both graphs with an
  XLA control-flow context, which it does not expose)."""
  _note_version("tensorflow")
  try:
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util
    return bool(control_flow_util.GraphOrParentsInXlaContext(
        tf.compat.v1.get_default_graph()))
  except (ImportError, AttributeError):
    return True  # the formula: the same numbers as TF's kernel everywhere, a few more ops


def in_control_flow_branch():
  """Whether ops made now go into a branch of a `tf.cond` or the body of a
  `tf.while_loop` (what autograph makes of a Python `if` or `for` on a
  tensor): TF builds those as graphs of their own types, not exported."""
  _note_version("tensorflow")
  try:
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util_v2 as util
    return isinstance(tf.compat.v1.get_default_graph(), (
        util.CondBranchFuncGraph, util.WhileBodyFuncGraph, util.WhileCondFuncGraph))
  except (ImportError, AttributeError):
    return False


def stack():
  """The current Python stack, outermost frame first, as TF records it for its ops
  (`tf_stack.extract_stack`: autograph's generated lines mapped back to the user's
  source); Python's own stack if that is gone."""
  _note_version("tensorflow")
  try:
    from tensorflow.python.util import tf_stack  # pylint: disable=import-outside-toplevel
    return list(tf_stack.extract_stack())
  except (ImportError, AttributeError):
    import traceback  # pylint: disable=import-outside-toplevel
    return traceback.extract_stack()


def op_stack(op):
  """The stack at which graph op `op` was made (as `stack`), or [] if TF kept none."""
  _note_version("tensorflow")
  try:
    return list(op.traceback)
  except (AttributeError, ValueError):
    return []


def function_graphs(graph):
  """The graphs of the functions `graph` holds (a tf.cond's branches, a while
  loop's body, a nested tf.function's), recursively, from `FuncGraph._functions`;
  [] if TF keeps none."""
  _note_version("tensorflow")
  found, stack = [], [graph]
  while stack:
    for function in list(getattr(stack.pop(), "_functions", {}).values()):
      inner = getattr(function, "graph", None)
      if inner is not None and all(inner is not g for g in found):
        found.append(inner)
        stack.append(inner)
  return found


def learning_rate_schedule(optimizer):
  """The `LearningRateSchedule` a Keras optimizer was given, or None (a fixed
  rate). Keras' `learning_rate` property returns the schedule's current value;
  this reads `Optimizer._learning_rate`."""
  _note_version("keras")
  import keras  # pylint: disable=import-outside-toplevel
  schedule = getattr(optimizer, "_learning_rate", None)
  return schedule if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule) else None


def default_strategy_class():
  """The class of TF's default strategy (what `tf.distribute.get_strategy()`
  returns outside any scope), which TF does not export."""
  _note_version("tensorflow")
  from tensorflow.python.distribute import distribute_lib  # pylint: disable=import-outside-toplevel
  return distribute_lib._DefaultDistributionStrategy  # pylint: disable=protected-access


_NARROW_FLOATS = ("float16", "bfloat16", "float32")


@contextlib.contextmanager
def promoted_to_float64():
  """While it lasts, every float a program asks TensorFlow or Keras for is
  float64: what a float64 replay needs to run a step that writes
  `dtype=tf.float32` (a `tf.cast`, `tf.zeros`, `ctx.normal`, `tf.random.*`, a
  layer given dtype="float32" or a mixed policy, `keras.ops.cast(x, "float32")`)
  or a Python float's constant (float32 by default) without an edit.

  Promotes a requested dtype where TF reads it (the functions patched below), not the
  dtype of a tensor that exists (a float32 tensor stays float32). Not thread-safe
  against float32 work elsewhere: for a process that runs one thing at a time.
  """
  _note_version("tensorflow")
  _note_version("keras")
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from keras.src import dtype_policies  # pylint: disable=import-outside-toplevel
  from tensorflow.python import pywrap_tfe  # pylint: disable=import-outside-toplevel
  from tensorflow.python.eager import execute  # pylint: disable=import-outside-toplevel
  from tensorflow.python.framework import constant_op  # pylint: disable=import-outside-toplevel
  from tensorflow.python.framework import dtypes  # pylint: disable=import-outside-toplevel
  from tensorflow.python.framework import tensor_conversion_registry  # pylint: disable=import-outside-toplevel
  from tensorflow.python.ops import array_ops  # pylint: disable=import-outside-toplevel
  from tensorflow.python.types import core  # pylint: disable=import-outside-toplevel

  def wide(dtype):
    """`dtype` (anything as_dtype reads), float64 if a narrower float."""
    as_type = dtypes.as_dtype(dtype)
    return dtypes.float64 if as_type.name in _NARROW_FLOATS else dtype

  def wide_argument(value):
    """An op's argument: a dtype widened; a Python float a float64 (a subclass
    of float, which an attribute still reads as one)."""
    if isinstance(value, dtypes.DType):
      return wide(value)
    if type(value) is float:  # pylint: disable=unidiomatic-typecheck
      return np.float64(value)
    if isinstance(value, list) and value and isinstance(value[0], dtypes.DType):
      return [wide(v) for v in value]
    return value

  def fast_path_execute(*args):
    return originals[pywrap_tfe, "TFE_Py_FastPathExecute"](*[wide_argument(a) for a in args])

  def make_type(value, arg_name):
    return originals[execute, "make_type"](wide(value), arg_name)

  def constant_impl(value, dtype, *args, **kwargs):
    if not isinstance(value, core.Symbol):
      if dtype is not None:
        dtype = wide(dtype)
      else:
        with contextlib.suppress(ValueError, TypeError):  # ragged, or not numbers
          if np.asarray(value).dtype.kind == "f":
            dtype = dtypes.float64
    return originals[constant_op, "_constant_impl"](value, dtype, *args, **kwargs)

  def convert(value, dtype=None, *args, **kwargs):
    # A value that is not a tensor yet, or a float64 tensor asked for as float32
    # (LossScaleOptimizer's float32 scale, from an initializer that made float64).
    if dtype is not None and (not isinstance(value, core.Symbol) or
                              getattr(value, "dtype", None) == dtypes.float64):
      dtype = wide(dtype)
    return originals[tensor_conversion_registry, "convert"](value, dtype, *args, **kwargs)

  def policy(identifier):
    found = originals[dtype_policies, "get"](identifier)
    if found.compute_dtype in _NARROW_FLOATS or found.variable_dtype in _NARROW_FLOATS:
      return keras.DTypePolicy("float64")
    return found

  def filled(make):
    # tf.zeros and tf.ones check that they made the dtype they were asked for.
    def wrapper(shape, dtype=dtypes.float32, *args, **kwargs):
      return make(shape, wide(dtype), *args, **kwargs)
    return wrapper

  patched = [(owner, filled(getattr(owner, name)), name)
             for owner in (array_ops, tf) for name in ("zeros", "ones")]
  patched += [(pywrap_tfe, fast_path_execute, "TFE_Py_FastPathExecute"),
             (execute, make_type, "make_type"),  # what generated ops call, traced too
             (constant_op, constant_impl, "_constant_impl"),
             (tensor_conversion_registry, convert, "convert"),
             (dtype_policies, policy, "get")]
  originals = {(owner, name): getattr(owner, name) for owner, _, name in patched}
  for owner, replacement, name in patched:
    setattr(owner, name, replacement)
  try:
    yield
  finally:
    for (owner, name), original in originals.items():
      setattr(owner, name, original)
