"""Sharded TFRecords: round trips, order, shuffling, per-pipeline files, the CLI, errors."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import gan
from ctl import cli
from ctl.tools import records

import helpers

COUNT = 300  # not a multiple of the shard count: the last round is partial
SHARDS = 8


@pytest.fixture(scope="module")
def digits():
  images, labels = gan.data.load_mnist()
  return images[:COUNT, ..., None], labels[:COUNT].astype(np.int32)


@pytest.fixture(scope="module")
def written(digits, tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("mnist"))
  files = records.write_records(tf.data.Dataset.from_tensor_slices(digits), directory,
                                num_shards=SHARDS)
  return directory, files


def as_arrays(dataset):
  images, labels = zip(*dataset.as_numpy_iterator())
  return np.stack(images), np.stack(labels)


def test_writes_shards_and_spec(written):
  directory, files = written
  assert [os.path.basename(f) for f in files] == [
      f"records-{i:05d}-of-{SHARDS:05d}.tfrecord" for i in range(SHARDS)]
  assert sorted(os.listdir(directory)) == sorted(
      [os.path.basename(f) for f in files] + ["spec.json"])  # no temporary files left
  spec = records.read_spec(directory)
  assert spec["num_examples"] == COUNT and spec["num_shards"] == SHARDS
  assert spec["element"] == {"tuple": [{"dtype": "uint8", "shape": [28, 28, 1]},
                                       {"dtype": "int32", "shape": []}]}
  # Round robin: shard s holds examples s, s + 8, ...
  sizes = [sum(1 for _ in tf.data.TFRecordDataset(f)) for f in files]
  assert sizes == [len(range(s, COUNT, SHARDS)) for s in range(SHARDS)]


def test_unshuffled_read_is_the_source_in_order(written, digits):
  data = records.read_records(written[0])
  assert data.element_spec == (tf.TensorSpec([28, 28, 1], tf.uint8),
                               tf.TensorSpec([], tf.int32))
  images, labels = as_arrays(data)
  np.testing.assert_array_equal(images, digits[0])
  np.testing.assert_array_equal(labels, digits[1])


def test_a_pattern_reads_those_files(written, digits):
  directory, _ = written
  images, _ = as_arrays(records.read_records(os.path.join(directory, "records-0000[01]-*")))
  np.testing.assert_array_equal(images, digits[0][[i for i in range(COUNT) if i % SHARDS < 2]])


def test_batches_are_static_and_drop_the_remainder(written, digits):
  data = records.read_records(written[0], 64)
  assert [s.shape.as_list() for s in data.element_spec] == [[64, 28, 28, 1], [64]]
  batches = list(data.as_numpy_iterator())
  assert len(batches) == COUNT // 64
  np.testing.assert_array_equal(batches[1][1], digits[1][64:128])


def order(dataset):
  """Each image's index in the source (the embedded digits are distinct)."""
  index = {image.tobytes(): i for i, image in enumerate(gan.data.load_mnist()[0][:COUNT])}
  return [index[image[..., 0].tobytes()] for image, _ in dataset.as_numpy_iterator()]


def test_a_seed_fixes_the_shuffled_order(written):
  first = order(records.read_records(written[0], shuffle_seed=3))
  assert first == order(records.read_records(written[0], shuffle_seed=3))
  assert first != order(records.read_records(written[0], shuffle_seed=4))
  assert first != list(range(COUNT)) and sorted(first) == list(range(COUNT))


def test_repeat_reshuffles_each_epoch(written):
  both = order(records.read_records(written[0], shuffle_seed=3, repeat=True).take(2 * COUNT))
  assert sorted(both[:COUNT]) == sorted(both[COUNT:]) == list(range(COUNT))
  assert both[:COUNT] != both[COUNT:]


def test_input_pipelines_read_disjoint_files_covering_everything(written, digits):
  seen = []
  for pipeline in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                         num_replicas_in_sync=2)
    images, labels = as_arrays(records.read_records(written[0], input_context=context))
    # Pipeline p reads shards p, p + 2, ...: examples whose index mod 8 is even or odd.
    expected = [i for i in range(COUNT) if i % SHARDS % 2 == pipeline]
    np.testing.assert_array_equal(labels, digits[1][expected])
    np.testing.assert_array_equal(images, digits[0][expected])
    seen.append(set(expected))
  assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(COUNT))
  batched = records.read_records(written[0], 64, input_context=context)
  assert batched.element_spec[0].shape.as_list() == [32, 28, 28, 1]  # per replica


def test_without_input_context_tf_distribute_shards_by_file(written):
  policy = records.read_records(written[0]).options().experimental_distribute.auto_shard_policy
  assert policy == tf.data.experimental.AutoShardPolicy.FILE


def test_nested_structures_and_dtypes_round_trip(tmp_path):
  element = {"image": tf.reshape(tf.range(6, dtype=tf.float16), [2, 3]),
             "meta": (tf.constant(b"name"), tf.constant([True, False]))}
  data = tf.data.Dataset.from_tensors(element).repeat(5)
  records.write_records(data, str(tmp_path), num_shards=2)
  back = records.read_records(str(tmp_path))
  assert back.element_spec == data.element_spec
  for got in back:
    tf.nest.map_structure(np.testing.assert_array_equal, got, element)
  assert records.read_spec(str(tmp_path))["features"] == ["image", "meta/0", "meta/1"]


def test_rewriting_with_fewer_shards_removes_the_old_ones(tmp_path, digits):
  data = tf.data.Dataset.from_tensor_slices(digits).take(10)
  records.write_records(data, str(tmp_path), num_shards=4)
  records.write_records(data, str(tmp_path), num_shards=2)
  assert sorted(os.listdir(tmp_path)) == [
      "records-00000-of-00002.tfrecord", "records-00001-of-00002.tfrecord", "spec.json"]


def test_cli_writes_records_read_records_reads(tmp_path, capsys, digits):
  out = str(tmp_path / "test-digits")
  code = cli.main(["records", "--dataset", "mnist", "--split", "test", "--out", out,
                   "--shards", "3", "--limit", "50"])
  assert code == 0
  assert f"wrote 50 examples of mnist (test) to 3 files in {out}" in capsys.readouterr().out
  images, labels = as_arrays(records.read_records(out))
  test_images, test_labels = gan.data.load_mnist("test")
  np.testing.assert_array_equal(images[..., 0], test_images[:50])
  np.testing.assert_array_equal(labels, test_labels[:50])


def test_cli_image_folder(tmp_path):
  for i, name in enumerate(["a/1.png", "a/2.png", "b/3.png", "b/4.png"]):
    path = tmp_path / "images" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_png(tf.fill([5 + i, 4, 3], tf.constant(i, tf.uint8))).numpy())
  out = str(tmp_path / "out")
  assert cli.main(["records", "--dataset", f"folder:{tmp_path / 'images'}", "--out", out,
                   "--shards", "2", "--image-size", "8", "8", "--with-labels"]) == 0
  spec = records.read_spec(out)
  assert spec["element"] == {"tuple": [{"dtype": "uint8", "shape": [8, 8, 3]},
                                       {"dtype": "int32", "shape": []}]}
  labels = as_arrays(records.read_records(out))[1]
  assert set(labels) <= {0, 1} and len(labels) == spec["num_examples"] >= 1


def test_cli_without_tfds_data_says_where_to_put_it(tmp_path, capsys):
  assert cli.main(["records", "--dataset", "tfds:mnist", "--data-dir", str(tmp_path),
                   "--out", str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err
  assert "ctl records: error: TFDS dataset 'mnist' is not prepared in" in err
  assert "does not download" in err


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "mnist", "--shards", "0"], "--shards must be at least 1, got 0"),
    (["--dataset", "cifar"], "--dataset 'cifar' is not known; use mnist, tfds:NAME"),
    (["--dataset", "mnist", "--split", "validation"], "--split for mnist must be train or test"),
])
def test_cli_bad_arguments(argv, message, tmp_path, capsys):
  assert cli.main(["records", "--out", str(tmp_path / "out")] + argv) == 2
  assert message in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "out" / "spec.json")


@pytest.mark.parametrize("shards, error", [(0, ValueError), (-1, ValueError),
                                           (2.0, TypeError), (True, TypeError)])
def test_bad_shard_counts(shards, error, tmp_path, digits):
  with pytest.raises(error, match=f"num_shards must be an int >= 1, got {shards!r}"):
    records.write_records(tf.data.Dataset.from_tensor_slices(digits), str(tmp_path),
                          num_shards=shards)


def test_empty_dataset_writes_nothing(tmp_path, digits):
  with pytest.raises(ValueError, match="dataset is empty"):
    records.write_records(tf.data.Dataset.from_tensor_slices(digits).take(0), str(tmp_path))
  assert os.listdir(tmp_path) == []


def test_missing_directory_and_missing_spec(tmp_path, written):
  with pytest.raises(FileNotFoundError, match="records directory .* does not exist; write it"):
    records.read_records(str(tmp_path / "nowhere"))
  (tmp_path / "records-00000-of-00001.tfrecord").write_bytes(b"")
  with pytest.raises(FileNotFoundError, match="has no spec.json, so it holds no complete set"):
    records.read_records(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="no files match"):
    records.read_records(os.path.join(written[0], "records-9*"))


def test_too_many_pipelines_and_unbatchable_shapes(written, tmp_path):
  context = tf.distribute.InputContext(num_input_pipelines=SHARDS + 1, input_pipeline_id=0)
  with pytest.raises(ValueError, match=f"{SHARDS + 1} input pipelines share {SHARDS} files"):
    records.read_records(written[0], input_context=context)
  ragged = tf.data.Dataset.range(1, 4).map(lambda n: tf.zeros([n]))
  records.write_records(ragged, str(tmp_path), num_shards=1)
  assert [len(x) for x in records.read_records(str(tmp_path))] == [1, 2, 3]
  with pytest.raises(ValueError, match="shapes that vary .* cannot be batched"):
    records.read_records(str(tmp_path), 2)
  with pytest.raises(ValueError, match="global_batch_size must be an int >= 1"):
    records.read_records(written[0], 0)


def test_spec_is_json_a_reader_can_use(written):
  with open(os.path.join(written[0], "spec.json")) as f:
    assert json.load(f)["files"][0] == "records-00000-of-00008.tfrecord"


@pytest.mark.slow  # a subprocess that imports TensorFlow
def test_cli_subcommand_runs_as_a_program(tmp_path):
  proc = helpers.python(["-m", "ctl.cli", "records", "--dataset", "mnist", "--out",
                         str(tmp_path), "--shards", "2", "--limit", "4"])
  assert "wrote 4 examples of mnist (train) to 2 files" in proc.stdout


def test_gan_records_dataset_gives_unit_range_batches(written, digits):
  directory, _ = written
  images, labels = next(iter(gan.data.records_dataset(16, path=directory, with_labels=True)))
  assert images.shape == (16, 28, 28, 1) and images.dtype == tf.float32
  assert labels.shape == (16,) and labels.dtype == tf.int32
  assert -1.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
  # Every image read is one of the written digits, rescaled.
  written_images = {d.tobytes() for d in digits[0]}
  restored = np.round((images.numpy() + 1.0) * 127.5).astype(np.uint8)
  assert all(image.tobytes() in written_images for image in restored)
  unlabelled = tf.data.Dataset.from_tensor_slices(digits[0])
  plain = os.path.join(os.path.dirname(directory), "unlabelled")
  records.write_records(unlabelled, plain, num_shards=2)
  with pytest.raises(ValueError, match="hold no labels"):
    gan.data.records_dataset(16, path=plain, with_labels=True)
  assert gan.data.records_dataset(16, path=plain).element_spec.shape == (16, 28, 28, 1)
  # Endless as tf.data sees it, so an evaluation without `.take(n)` is refused.
  assert int(gan.data.records_dataset(16, path=plain).cardinality()) == int(
      tf.data.INFINITE_CARDINALITY)
