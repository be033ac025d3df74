"""Strategy factory: names, knobs, `auto` decisions, and device-ordering errors."""

import json
import re
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.base import _tf_internal
from ctl.distribute import placement as placement_lib
from ctl.distribute import strategies

import helpers


@pytest.mark.parametrize("name, kind", [
    ("default", type(tf.distribute.get_strategy())),
    ("one_device", tf.distribute.OneDeviceStrategy),
    ("central_storage", tf.distribute.experimental.CentralStorageStrategy),
])
def test_names_build_their_strategy(name, kind):
  assert isinstance(ctl.make_strategy(name), kind)


def test_mirrored_over_logical_cpus_has_one_replica_each():
  strategy = ctl.make_strategy("mirrored", logical_cpus=2)  # as configured in conftest
  assert isinstance(strategy, tf.distribute.MirroredStrategy)
  assert strategy.num_replicas_in_sync == 2


def test_mirrored_uses_every_logical_cpu_by_default():
  assert ctl.make_strategy("mirrored").num_replicas_in_sync == 2
  assert ctl.make_strategy("central_storage").num_replicas_in_sync == 2


@pytest.mark.parametrize("ops", ["reduce_to_one_device", "hierarchical_copy", "nccl"])
def test_mirrored_cross_device_ops_knob(ops):
  strategy = ctl.make_strategy("mirrored", logical_cpus=2, cross_device_ops=ops)
  assert isinstance(_tf_internal.cross_device_ops(strategy),
                    strategies.CROSS_DEVICE_OPS[ops])


@pytest.mark.parametrize("name, knob", [
    ("default", {"devices": ["/cpu:1"]}),
    ("mirrored", {"tpu": "local"}),
    ("default", {"communication": "ring"}),
])
def test_knobs_for_other_strategies_are_refused(name, knob):
  (key, value), = knob.items()
  with pytest.raises(ValueError, match=re.escape(f"{key} ({value!r}) only applies to strategy")):
    ctl.make_strategy(name, **knob)


def test_auto_with_logical_cpus_mirrors_over_them():
  assert ctl.make_strategy("auto", logical_cpus=2).num_replicas_in_sync == 2


def test_unknown_knob_values_are_refused():
  with pytest.raises(ValueError, match="cross_device_ops 'fast' is not known"):
    ctl.make_strategy("mirrored", cross_device_ops="fast")
  with pytest.raises(ValueError,
                     match="communication 'mpi' is not known; use one of auto, ring, nccl"):
    ctl.make_strategy("multi_worker", communication="mpi")


@pytest.mark.parametrize("count, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                          (True, TypeError), ("2", TypeError)])
def test_logical_cpus_must_be_a_positive_int(count, error):
  with pytest.raises(error, match="logical_cpus must be an int >= 1"):
    ctl.configure_logical_cpus(count)


def test_same_logical_cpus_again_is_fine():
  ctl.configure_logical_cpus(2)
  assert len(tf.config.list_logical_devices("CPU")) == 2


@pytest.mark.slow  # a subprocess that imports TensorFlow
def test_logical_cpus_before_any_op_works_in_a_fresh_process():
  proc = helpers.python(["-c", "import ctl; s = ctl.make_strategy('mirrored', logical_cpus=3); "
                               "print('replicas', s.num_replicas_in_sync)"])
  assert "replicas 3" in proc.stdout


def test_parameter_server_without_cluster_says_what_is_missing():
  with pytest.raises(RuntimeError, match=r"needs a cluster with 'chief' \(the coordinator\), "
                     r"'worker' and 'ps' jobs"):
    ctl.make_strategy("parameter_server")


@pytest.mark.slow  # a subprocess that imports TensorFlow
def test_multi_worker_after_first_op_names_the_fix():
  code = ("import tensorflow as tf, ctl; tf.constant(1.0) + 1; "
          "ctl.make_strategy('multi_worker')")
  cluster = {"worker": [f"127.0.0.1:{p}" for p in helpers.free_ports(2)]}
  config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
  proc = helpers.python(["-c", code], env={"TF_CONFIG": config}, check=False, timeout=60)
  assert proc.returncode != 0
  assert "must be created before TensorFlow runs any op" in proc.stderr


def _config(**cluster):
  return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})}


@pytest.mark.parametrize("env, gpus, tpu, expected", [
    ({}, 0, False, "default"),
    ({}, 1, False, "one_device"),
    ({}, 4, False, "mirrored"),
    ({"TPU_NAME": "my-tpu"}, 0, False, "tpu"),
    ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, 0, False, "tpu"),
    ({}, 0, True, "tpu"),
    (_config(worker=["a:1", "b:1"]), 8, False, "multi_worker"),
    (_config(chief=["a:1"], worker=["b:1"]), 0, False, "multi_worker"),
    (_config(worker=["a:1"]), 2, False, "mirrored"),
    (_config(worker=["a:1", "b:1"], ps=["c:1"]), 0, False, "parameter_server"),
    ({"TF_CONFIG": "  "}, 0, False, "default"),
])
def test_auto_decisions(env, gpus, tpu, expected):
  name, reason = ctl.choose_strategy(env=env, num_gpus=gpus, tpu_devices=tpu)
  assert name == expected
  assert reason


@pytest.mark.parametrize("version, runs", [
    ("2.17.1", False), ("2.18.1", True), ("2.20.0", True), ("2.21.0", False),
    ("2.22.0-rc0", False)])
def test_the_tpu_note_says_which_tensorflow_a_tpu_runs(version, runs):
  note = strategies.tpu_version_note(version)
  if runs:
    assert note == ""
  else:
    assert note.startswith(f"TensorFlow {version} has no TPU build: a TPU runs "
                           "TensorFlow 2.18 to 2.20"), note
    assert "tensorflow-tpu==2.20.*" in note, note


def test_auto_logs_its_choice(caplog):
  with caplog.at_level("INFO", logger="ctl"):
    strategy = ctl.make_strategy("auto")
  assert strategy.num_replicas_in_sync == 1
  assert "strategy 'auto' chose 'default': no TPU, cluster or GPU found" in caplog.text


def test_malformed_tf_config_is_a_clear_error():
  with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
    ctl.choose_strategy(env={"TF_CONFIG": "{cluster: nope"}, num_gpus=0, tpu_devices=False)
  with pytest.raises(ValueError, match="TF_CONFIG must be a JSON object with a 'cluster' object"):
    ctl.choose_strategy(env={"TF_CONFIG": "[1, 2]"}, num_gpus=0, tpu_devices=False)


def test_the_same_arguments_give_the_same_strategy():
  # A second MirroredStrategy over the same devices numbers its collectives
  # like the first, and its all-reduces fail ("Shape mismatch in the
  # collective instance") once both have run: a rerun notebook cell must not
  # make one.
  first = ctl.make_strategy("mirrored", logical_cpus=2)
  assert ctl.make_strategy("mirrored", logical_cpus=2) is first
  other = ctl.make_strategy("mirrored", logical_cpus=2, cross_device_ops="reduce_to_one_device")
  assert other is not first


@pytest.mark.parametrize("name", ["default", "one_device", "mirrored"])
def test_one_process_is_worker_0_of_1_and_the_chief(name):
  strategy = ctl.make_strategy(name)
  assert ctl.worker(strategy) == ctl.Worker(index=0, count=1, is_chief=True)
  with strategy.scope():
    assert ctl.worker() == (0, 1, True)  # the current strategy


@pytest.mark.parametrize("cluster, task, expected", [
    ({"worker": ["a:1", "b:1", "c:1"]}, ("worker", 0), (0, 3, True)),
    ({"worker": ["a:1", "b:1", "c:1"]}, ("worker", 2), (2, 3, False)),
    ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("chief", 0), (0, 3, True)),
    ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("worker", 0), (1, 3, False)),
])
def test_multi_worker_index_counts_the_chief_first(cluster, task, expected):
  # A stand-in: a real MultiWorkerMirroredStrategy needs a cluster (the real
  # one is checked by tests/resume_task.py under tests/test_multi_worker.py).
  strategy = mock.Mock(spec=tf.distribute.MultiWorkerMirroredStrategy)
  strategy.cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), task_type=task[0], task_id=task[1])
  strategy.extended.should_checkpoint = expected[2]
  assert ctl.worker(strategy) == expected


# A new kind of strategy: described once, in ctl.distribute.placement, and every module follows.

class _Engine(tf.distribute.OneDeviceStrategy):
  """A strategy ctl was not written for (an engine's own, say). On one device:
  a second strategy with collectives over the logical CPUs would break the
  first one's in this process (see `ctl.make_strategy`)."""


def _tiny_runner(strategy, **options):
  import keras
  import numpy as np
  optimizer = options.pop("optimizer", {})

  def build():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    return {"model": model}, {"model": keras.optimizers.SGD(0.1, **optimizer)}

  def step(ctx, x):
    with tf.GradientTape() as tape:
      loss = ctx.average(tf.square(ctx.models["model"](x)[:, 0] - x[:, 0]))
    ctx.minimize(loss, "model", tape=tape)
    return {"loss": loss}

  x = np.arange(64, dtype="float32")[:, None] / 64
  data = tf.data.Dataset.from_tensor_slices(x).batch(8, drop_remainder=True)
  return ctl.Runner(step, build, data, strategy=strategy, **options)


def test_a_new_kind_is_described_once_and_every_module_follows_it():
  ctl.make_strategy("mirrored", logical_cpus=2)  # the module's devices, before any op
  strategy = _Engine("/cpu:0")
  # A subclass is of its base's kind until described as a kind of its own.
  assert strategies.placement(strategy).kind.name == "one_device"
  kind = placement_lib.register(placement_lib.Kind(
      "engine", _Engine, merge_call_updates=True,
      not_eager="its engine runs compiled programs only"))
  try:
    placement = strategies.placement(strategy)
    assert placement.kind is kind and placement.replicas == 1
    assert placement.worker == ctl.Worker(0, 1, True) and not placement.in_cluster
    # What the kind says is what the runner refuses, and nothing else.
    with pytest.raises(ValueError, match=r"eager=True cannot run under _Engine \(its "
                       r"engine runs compiled programs only\)"):
      _tiny_runner(strategy, eager=True)
    with pytest.raises(ValueError, match="cannot run under engine"):
      _tiny_runner(strategy, optimizer={"gradient_accumulation_steps": 2})
    runner = _tiny_runner(strategy)
    reference = _tiny_runner(tf.distribute.get_strategy())
    np.testing.assert_allclose(runner.train(3)["loss"], reference.train(3)["loss"],
                               rtol=1e-6)
    assert runner.placement.kind is kind
  finally:
    del placement_lib.KINDS["engine"]


def test_a_strategy_of_no_known_kind_is_refused_naming_what_to_describe():

  class Bare(tf.distribute.Strategy):
    pass

  with pytest.raises(TypeError, match=r"strategy Bare is of no kind ctl knows .*"
                     r"ctl.distribute.placement.register\(ctl.distribute.placement.Kind\("
                     r"'my_kind', Bare"):
    strategies.placement(Bare.__new__(Bare))
  with pytest.raises(TypeError, match="strategy must be a tf.distribute.Strategy or one "
                     "of auto, default"):
    ctl.Runner(lambda ctx, x: {}, lambda: ({}, {}), tf.data.Dataset.range(1).batch(1),
               strategy=object())
  with pytest.raises(ValueError, match="is already kind 'mirrored'"):
    placement_lib.register(placement_lib.Kind("mine", tf.distribute.MirroredStrategy))
