"""What ctl knows of a strategy: its `Kind`, and where it runs a step (`Placement`).

    from ctl.distribute import placement, strategies
    where = strategies.placement(strategy)   # made once per runner
    where.replicas, where.worker.is_chief, where.kind.asynchronous
    placement.register(placement.Kind("my_kind", MyStrategy, multi_process=True))

Every other module asks a `Placement` instead of looking at the strategy
(`strategies` makes one: `placement`, `kind_of`, `worker`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import tensorflow as tf

from ctl.base import _tf_internal


class Worker(NamedTuple):
  """This process's place among those that run the training program: `ctl.worker(strategy)`.

  Attributes:
    index: 0 to `count - 1`; the chief (TF_CONFIG's `chief`, else worker 0) is 0.
    count: processes that run the replicas in sync.
    is_chief: whether this process writes summaries, samples, exports and kept
      checkpoints (what `FitContext.is_chief` says inside an action).
  """
  index: int
  count: int
  is_chief: bool


@dataclasses.dataclass(frozen=True)
class Kind:
  """What ctl needs to know of a kind of strategy: the same for every instance.

  A new kind is described by `register(Kind(...))`; a strategy of no known kind
  is refused when a runner is made, naming what to describe.

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
    merge_call_updates: variables are updated through merge calls from the replicas,
      which TF cannot run inside a `tf.cond` (where Keras' `gradient_accumulation_steps`
      and `ema_overwrite_frequency` update).
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
    raise TypeError(f"register takes a ctl.distribute.placement.Kind, got {kind!r}.")
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
  """Where a strategy runs the step, described once (`strategies.placement`).

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

