"""What one `ctl parity` process runs (ctl/tools/parity_runs.py), in this process.

A compiled configuration traces its step once per precision and runs every
later seed by putting its first runner where a new runner of that seed starts
(`start_as`): that must train as the new runner would, to the bit, whatever
the step, the strategy, the precision and the data's shuffling.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.base import _tf_internal
from ctl.tools import parity
from ctl.tools import parity_runs

import helpers
import toy_gan

pytestmark = pytest.mark.slow  # trains for seconds

GANS_MODULE = helpers.ROOT + "/tests/parity_gans.py"


@pytest.fixture(scope="module")
def mirrored():
  return ctl.make_strategy("mirrored", logical_cpus=2)


def everything(runner, history):
  """A runner's numbers: all it trained (`state_arrays`) and its draws' key."""
  arrays = parity_runs.state_arrays(runner, history)
  arrays["draw_key"] = runner.state.draw_key.numpy()
  return arrays


def assert_the_same(got, expected):
  assert sorted(got) == sorted(expected)
  for key in expected:
    np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def assert_started_as_new(new_runner, trained_before=4, seed=3):
  """A runner of seed 0, trained, then started as a new runner of `seed`, trains
  3 steps as that new runner does; returns it."""
  traced = new_runner(0)
  traced.train(trained_before)
  assert parity_runs.start_as(traced, new_runner(seed))
  got = everything(traced, traced.train(3))
  fresh = new_runner(seed)
  assert_the_same(got, everything(fresh, fresh.train(3)))
  return traced


@pytest.mark.parametrize("gan, strategy_name, float64", [
    ("wgan_gp_encoder_bn", "mirrored", False),  # BN, EMA, schedules, micro-batches
    ("wgan_gp_encoder", "default", True),  # 2 batches a step, loss scaling, RMSprop
    ("conditional", "mirrored", True),  # labels, a projection discriminator
])
def test_a_traced_runner_started_as_a_new_one_trains_as_it(gan, strategy_name, float64,
                                                           mirrored, monkeypatch):
  monkeypatch.setenv("PARITY_GAN", gan)
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()

  def new_runner(seed):
    module = parity.load_module(GANS_MODULE)
    return ctl.Runner(module.train_step, module.build, module.data(), strategy=strategy, seed=seed,
                      batches_per_step=module.batches_per_step,
                      mixed_precision="float64" if float64 else None)

  assert assert_started_as_new(new_runner).compiled_step.trace_count == 1


def test_a_reshuffling_dataset_starts_in_the_new_runners_order():
  """A new iterator of a dataset that reshuffles each iteration (TF's default)
  reads another order: the new runner's own position is carried over."""
  x = toy_gan.normal_features(256, seed=1)

  def new_runner(seed):
    # A dataset's shuffle seed also takes TF's global seed when it is made,
    # which the last runner's seed set: the same for every dataset here.
    tf.random.set_seed(7)
    return ctl.Runner(toy_gan.make_step(), toy_gan.mlp_gan(toy_gan.FEATURES),
                      toy_gan.batches(x, shuffle_seed=2, repeat=True), seed=seed)

  assert_started_as_new(new_runner, trained_before=5, seed=4)


def test_data_whose_position_cannot_move_changes_nothing():
  """A dataset function's position cannot be carried over: the process makes
  a new runner (and a new trace) for that seed instead."""
  def dataset_fn(context):
    x = toy_gan.normal_features(64, seed=1)
    return tf.data.Dataset.from_tensor_slices(x).repeat().batch(
        context.get_per_replica_batch_size(toy_gan.GLOBAL_BATCH), drop_remainder=True)

  def new_runner(seed):
    return ctl.Runner(toy_gan.make_step(), toy_gan.mlp_gan(toy_gan.FEATURES), dataset_fn,
                      global_batch_size=toy_gan.GLOBAL_BATCH, seed=seed)

  traced = new_runner(0)
  before = everything(traced, traced.train(2))
  assert not parity_runs.start_as(traced, new_runner(4))
  assert_the_same(everything(traced, traced.history), before)


# What a step writes that names (or defaults to) float32.
NAMING_FLOAT32 = {
    "tf.cast": lambda x: tf.cast(x, tf.float32),
    "a dtype string": lambda x: tf.cast(x, "float32"),
    "tf.constant": lambda x: tf.constant(1.5, dtype=tf.float32),
    "a Python float's constant": lambda x: tf.constant(1.5),
    "a NumPy float32 constant": lambda x: tf.constant(np.ones(3, np.float32)),
    "tf.convert_to_tensor": lambda x: tf.convert_to_tensor(0.1, tf.float32),
    "tf.zeros": lambda x: tf.zeros([3], tf.float32),
    "tf.ones by default": lambda x: tf.ones([3]),
    "tf.fill": lambda x: tf.fill([3], 0.1),
    "tf.range": lambda x: tf.range(3, dtype=tf.float32),
    "tf.linspace": lambda x: tf.linspace(0.0, 1.0, 3),
    "tf.eye": lambda x: tf.eye(3, dtype=tf.float32),
    "tf.random.normal by default": lambda x: tf.random.normal([3]),
    "tf.random.stateless_uniform": lambda x: tf.random.stateless_uniform(
        [3], [1, 2], dtype=tf.float32),
    "keras.ops.cast": lambda x: keras.ops.cast(x, "float32"),
    "keras.ops.zeros": lambda x: keras.ops.zeros([3], dtype="float32"),
    "a shape cast to float": lambda x: tf.cast(tf.shape(x)[0], tf.float32),
    "tf.ones_like": lambda x: tf.ones_like(x, dtype=tf.float32),
    "a NumPy float32 scalar": lambda x: x * np.float32(0.5),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_float64_replay_widens_every_float32_a_step_names(compiled):
  x = tf.ones([3], tf.float64)
  made_before = tf.ones([3], tf.float32)
  with _tf_internal.promoted_to_float64():
    dense = keras.layers.Dense(2, dtype="float32")
    mixed = keras.layers.Dense(2, dtype="mixed_bfloat16")
    for name, make in NAMING_FLOAT32.items():
      out = (tf.function(make) if compiled else make)(x)
      assert out.dtype == tf.float64, name
      assert (x[:1] * tf.reshape(tf.cast(out, tf.float64), [-1])[:1]).dtype == tf.float64
    for layer in (dense, mixed):
      assert layer(x[None]).dtype == tf.float64 and layer.kernel.dtype == "float64"
    # Keras makes the loss scale float32 by name, from a constant the replay widened.
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    scaled.build([dense.kernel])
    assert scaled.dynamic_scale.value.dtype == tf.float64
    # A float32 tensor that exists stays float32, and ops on it still trace.
    assert tf.function(lambda: tf.reduce_sum(made_before * made_before))().dtype == tf.float32
  assert tf.constant(1.5).dtype == tf.float32 and tf.zeros([1]).dtype == tf.float32
  assert tf.cast(x, tf.float32).dtype == tf.float32
