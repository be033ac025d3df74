"""What one `ctl parity` process runs (ctl/tools/parity_runs.py), in this process.

A compiled configuration traces its step once per precision and runs every
later seed by putting its first runner where a new runner of that seed starts
(`start_as`): that must train as the new runner would, to the bit, whatever
the step, the strategy, the precision and the data's shuffling.
"""

import numpy as np
import pytest
import tensorflow as tf

import ctl
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
