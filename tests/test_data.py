"""Data checks and the per-replica split of global batches."""

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.distribute import strategies
from ctl.parts import data as data_lib


@pytest.fixture(scope="module")
def mirrored():
  return ctl.make_strategy("mirrored", logical_cpus=2)


DEFAULT = strategies.placement(tf.distribute.get_strategy())


def batches(n=4, batch=8, **kwargs):
  x = np.arange(n * batch * 3, dtype="float32").reshape(n * batch, 3)
  return tf.data.Dataset.from_tensor_slices(x).batch(batch, **kwargs)


@pytest.mark.parametrize("size, replicas, message", [
    (7, 2, r"global batch size \(7\) is not divisible by the 2 replicas in sync; "
           r"use a multiple of 2, e.g. 6"),
    (1, 2, r"global batch size \(1\) is smaller than the 2 replicas in sync"),
    (6, 4, r"not divisible by the 4 replicas in sync; use a multiple of 4, e.g. 4"),
])
def test_global_batch_must_split_evenly(size, replicas, message):
  with pytest.raises(ValueError, match=message):
    data_lib.check_global_batch_size(size, replicas)


def test_dynamic_batch_is_refused_on_several_replicas(mirrored):
  with pytest.raises(ValueError, match=r"no static batch size .* splitting it across 2 "
                     r"replicas needs; batch it with drop_remainder=True"):
    data_lib.make_feed(batches(), strategies.placement(mirrored))


def test_dynamic_batch_is_refused_under_xla():
  with pytest.raises(ValueError, match=r"XLA \(jit_compile\) needs"):
    data_lib.make_feed(batches(), DEFAULT, static_shapes=True)


def test_dynamic_batch_is_accepted_on_one_replica():
  feed = data_lib.make_feed(batches(), DEFAULT)
  assert feed.global_batch_size is None
  assert feed.next().shape == (8, 3)


def test_replicas_get_consecutive_rows_in_order(mirrored):
  feed = data_lib.make_feed(batches(drop_remainder=True), strategies.placement(mirrored))
  first, second = (mirrored.experimental_local_results(feed.next()) for _ in range(2))
  np.testing.assert_array_equal(np.concatenate(first), np.arange(24).reshape(8, 3))
  assert [r.shape[0] for r in first] == [4, 4]
  np.testing.assert_array_equal(second[0][0], [24, 25, 26])


def test_nested_elements_are_split_leaf_by_leaf(mirrored):
  x = tf.data.Dataset.range(16).map(lambda i: {"image": tf.fill([2], i), "label": i})
  feed = data_lib.make_feed(x.batch(8, drop_remainder=True), strategies.placement(mirrored))
  parts = mirrored.experimental_local_results(feed.next())
  assert [p["label"].numpy().tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert parts[1]["image"].shape == (4, 2)


def test_several_batches_per_step_come_as_a_tuple(mirrored):
  feed = data_lib.make_feed(batches(drop_remainder=True), strategies.placement(mirrored),
                            batches_per_step=2)
  a, b = feed.next()
  assert mirrored.experimental_local_results(b)[0][0, 0] == 24.0


def test_dataset_function_needs_the_global_batch_size(mirrored):
  with pytest.raises(ValueError, match="pass global_batch_size="):
    data_lib.make_feed(lambda context: batches(batch=4), strategies.placement(mirrored))


def test_dataset_function_gets_the_per_replica_batch(mirrored):
  seen = []

  def dataset_fn(context):
    seen.append(context.get_per_replica_batch_size(8))
    return batches(batch=context.get_per_replica_batch_size(8), drop_remainder=True)

  feed = data_lib.make_feed(dataset_fn, strategies.placement(mirrored), global_batch_size=8)
  parts = mirrored.experimental_local_results(feed.next())
  assert seen == [4] and [p.shape for p in parts] == [(4, 3), (4, 3)]


@pytest.mark.parametrize("batch, remainder", [(8, True), (4, False)])
def test_dataset_function_batches_must_be_per_replica_and_static(batch, remainder, mirrored):
  with pytest.raises(ValueError, match=r"each of the 2 replicas needs 4 .* batch it by "
                     r"input_context."
                     r"get_per_replica_batch_size\(global_batch_size\) with drop_remainder=True"):
    data_lib.make_feed(lambda context: batches(batch=batch, drop_remainder=remainder),
                       strategies.placement(mirrored), global_batch_size=8)


def test_the_runner_reads_data_without_tf_datas_autotune_thread():
  # TF 2.21 can take up to a minute to free a read iterator of an autotuned
  # dataset (its autotune thread misses the wake-up), at exit too.
  assert data_lib.prefetched(batches()).options().autotune.enabled is False
  options = tf.data.Options()
  options.autotune.enabled = True  # the user's choice stands
  assert data_lib.prefetched(batches().with_options(options)).options().autotune.enabled
