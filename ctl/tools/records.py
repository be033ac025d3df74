"""Sharded TFRecord files: data that many workers or TPU hosts read in parallel.

A dataset is written once as `num_shards` files plus a `spec.json` naming its
element structure, dtypes and shapes; it is then read back as the same
elements, each input pipeline reading only its own files.

    from ctl.tools import records
    files = records.write_records(dataset, "data/mnist", num_shards=8)
    data = records.read_records("data/mnist", global_batch_size=256, shuffle_seed=0)
    runner = ctl.Runner(train_step, build, lambda context: records.read_records(
        "gs://bucket/mnist", 256, input_context=context, shuffle_seed=0, repeat=True),
        global_batch_size=256, strategy=strategy)   # each worker reads its own files

    ctl records --dataset mnist --out data/mnist --shards 8   # or tfds:NAME, folder:PATH

Example `i` goes to shard `i % num_shards`, each tensor serialized in a
`tf.train.Example` feature named by its path in the element (`0`, `1` for a
tuple; the key for a dict; `value` for a lone tensor). Paths may be on any
filesystem TensorFlow reads (`gs://` for TPUs).
"""

import json
import os
import time

import tensorflow as tf

from ctl.base import arguments

SPEC_FILE = "spec.json"
_SHARD_NAME = "records-{index:05d}-of-{count:05d}.tfrecord"
_SPEC_VERSION = 1
_LONE = "value"  # feature name of an element that is a single tensor

# Where `ctl records --dataset NAME` finds NAME: functions packages register under
# this entry-point group, each `source(name, split, *, data_dir, channels,
# with_labels, image_size)` -> an unbatched tf.data.Dataset, or None for a name it
# does not know, with a `usage` string naming what it knows.
SOURCES_GROUP = "ctl.record_sources"


def write_records(dataset: tf.data.Dataset, directory: str, *,
                  num_shards: int = 8) -> list[str]:
  """Writes the unbatched elements of `dataset` as sharded TFRecord files.

  Every shard is written under a temporary name and renamed when all are
  complete, and `spec.json` is renamed last: a directory with a `spec.json`
  holds a complete set, and a crash mid-write leaves the previous set readable.
  Shards of an earlier write with another shard count are removed.

  Args:
    dataset: a finite `tf.data.Dataset` of single examples (not batches): a
      tensor, or a tuple or dict (nested) of tensors, e.g. `(image, label)`.
    directory: where to write (created if missing).
    num_shards: how many files. Use at least as many as there will be input
      pipelines (workers, TPU hosts) and a few more, so each gets several.

  Returns:
    The paths of the shard files, in shard order.

  Raises:
    ValueError: for a bad `num_shards`, an element structure that is not
      tensors, tuples and dicts, or an empty dataset.
  """
  arguments.integer("num_shards", num_shards, minimum=1,
                    fix="use e.g. 8, or more than the number of input pipelines")
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(f"dataset must be a tf.data.Dataset of single examples, got "
                    f"{type(dataset).__name__}.")
  structure = _encode_structure(dataset.element_spec)
  names = _feature_names(structure)
  tf.io.gfile.makedirs(directory)
  final = [os.path.join(directory, _SHARD_NAME.format(index=i, count=num_shards))
           for i in range(num_shards)]
  # A name per write, so two writers into one directory cannot mix their shards.
  suffix = f".tmp-{os.getpid()}-{time.time_ns()}"
  temporary = [path + suffix for path in final]
  writers = [tf.io.TFRecordWriter(path) for path in temporary]
  count = 0
  try:
    for element in dataset:
      features = {name: tf.train.Feature(bytes_list=tf.train.BytesList(
                      value=[tf.io.serialize_tensor(tensor).numpy()]))
                  for name, tensor in zip(names, tf.nest.flatten(element))}
      example = tf.train.Example(features=tf.train.Features(feature=features))
      writers[count % num_shards].write(example.SerializeToString())
      count += 1
  finally:
    for writer in writers:
      writer.close()
    if count == 0:
      _remove(temporary)
  if count == 0:
    raise ValueError("dataset is empty: there is nothing to write.")
  spec = {"version": _SPEC_VERSION, "num_examples": count, "num_shards": num_shards,
          "files": [os.path.basename(path) for path in final],
          "features": names, "element": structure}
  spec_path = os.path.join(directory, SPEC_FILE)
  with tf.io.gfile.GFile(spec_path + suffix, "w") as f:
    f.write(json.dumps(spec, indent=1) + "\n")
  for source, target in zip(temporary, final):
    tf.io.gfile.rename(source, target, overwrite=True)
  tf.io.gfile.rename(spec_path + suffix, spec_path, overwrite=True)
  stale = set(tf.io.gfile.glob(os.path.join(directory, "records-*-of-*.tfrecord")))
  _remove(sorted(stale - set(final)))
  return final


def read_records(directory_or_pattern: str, global_batch_size: int | None = None, *,
                 input_context: tf.distribute.InputContext | None = None,
                 shuffle_seed: int | None = None, shuffle_buffer: int = 10_000,
                 repeat: bool = False) -> tf.data.Dataset:
  """Reads what `write_records` wrote: the same elements, structure and dtypes.

  The shards are read round-robin, so an unshuffled read gives the examples in
  the order they were written.

  Args:
    directory_or_pattern: the directory `write_records` wrote, or a glob of
      some of its shard files (`spec.json` is read from the same directory).
    global_batch_size: batch by this (with `drop_remainder=True`, so every
      batch has a static size, as replicas and XLA need); with
      `input_context`, by this replica's share of it. None: single examples.
    input_context: a `tf.distribute.InputContext`: read only this input
      pipeline's files (`num_input_pipelines` must not exceed the number of
      shards). Without it the dataset asks `tf.distribute` to shard by file
      (`AutoShardPolicy.FILE`) if it is distributed.
    shuffle_seed: shuffle files and examples with this seed (the same order
      on every run); None keeps the written order.
    shuffle_buffer: examples in the shuffle buffer.
    repeat: repeat endlessly (for training); each epoch is shuffled anew.

  Returns:
    A `tf.data.Dataset`.

  Raises:
    FileNotFoundError: no such directory, no `spec.json`, or no matching files.
    ValueError: bad batch size or input context, or batching records whose
      shapes vary.
  """
  files, spec = _files_and_spec(directory_or_pattern)
  element_spec = _decode_structure(spec["element"])
  if global_batch_size is not None:
    arguments.integer("global_batch_size", global_batch_size, minimum=1,
                      fix="or None for single records")
    if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(element_spec)):
      raise ValueError(f"the records in {directory_or_pattern!r} have shapes that vary "
                       f"({element_spec}), so they cannot be batched; write them with "
                       "a fixed size (e.g. `ctl records ... --image-size H W`).")
  batch_size = global_batch_size
  # In shard order: the round-robin read below then restores the written order.
  data = tf.data.Dataset.list_files(files, shuffle=False)
  if input_context is not None:
    pipelines = input_context.num_input_pipelines
    if pipelines > len(files):
      raise ValueError(f"{pipelines} input pipelines share {len(files)} files, so "
                       "some would read nothing; write more shards "
                       f"(num_shards >= {pipelines}).")
    data = data.shard(pipelines, input_context.input_pipeline_id)
    if global_batch_size is not None:
      batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  if shuffle_seed is not None:
    data = data.shuffle(len(files), seed=shuffle_seed)
  data = data.interleave(tf.data.TFRecordDataset, cycle_length=len(files), block_length=1,
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if shuffle_seed is not None:
    data = data.shuffle(shuffle_buffer, seed=shuffle_seed)
  if repeat:
    data = data.repeat()
  names, flat_specs = spec["features"], tf.nest.flatten(element_spec)
  features = {name: tf.io.FixedLenFeature([], tf.string) for name in names}

  def parse(serialized):
    example = tf.io.parse_single_example(serialized, features)
    tensors = [tf.ensure_shape(tf.io.parse_tensor(example[name], s.dtype), s.shape)
               for name, s in zip(names, flat_specs)]
    return tf.nest.pack_sequence_as(element_spec, tensors)

  data = data.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if batch_size is not None:
    data = data.batch(batch_size, drop_remainder=True)
  if input_context is None:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.FILE)
    data = data.with_options(options)
  return data.prefetch(tf.data.AUTOTUNE)


def read_spec(directory: str) -> dict:
  """The `spec.json` of a records directory, as a dict."""
  if not tf.io.gfile.isdir(directory):
    raise FileNotFoundError(f"records directory {directory!r} does not exist; write "
                            "it first with ctl.tools.records.write_records or `ctl records`.")
  path = os.path.join(directory, SPEC_FILE)
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(
        f"{directory!r} has no {SPEC_FILE}, so it holds no complete set of records "
        "(write_records writes it last); write them with "
        "ctl.tools.records.write_records or `ctl records --out ...`.")
  with tf.io.gfile.GFile(path) as f:
    spec = json.load(f)
  if spec.get("version") != _SPEC_VERSION:
    raise ValueError(f"{path} has version {spec.get('version')!r}; this ctl reads "
                     f"version {_SPEC_VERSION}. Write the records again.")
  return spec


def _files_and_spec(directory_or_pattern):
  if tf.io.gfile.isdir(directory_or_pattern):
    spec = read_spec(directory_or_pattern)
    files = [os.path.join(directory_or_pattern, f) for f in spec["files"]]
    missing = [f for f in files if not tf.io.gfile.exists(f)]
    if missing:
      raise FileNotFoundError(f"{len(missing)} shard file(s) named in "
                              f"{SPEC_FILE} are missing, e.g. {missing[0]!r}; write "
                              "the records again.")
    return files, spec
  if not any(c in os.path.basename(directory_or_pattern) for c in "*?["):
    read_spec(directory_or_pattern)  # not a directory, nor a pattern: says so
  spec = read_spec(os.path.dirname(directory_or_pattern) or ".")
  files = sorted(tf.io.gfile.glob(directory_or_pattern))
  if not files:
    raise FileNotFoundError(f"no files match {directory_or_pattern!r}.")
  return files, spec


def _remove(paths):
  for path in paths:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)


def _feature_names(encoded, prefix=""):
  """Feature names: each tensor's path, in `tf.nest.flatten` order (dict keys sorted)."""
  if "tuple" in encoded:
    parts = [(str(i), s) for i, s in enumerate(encoded["tuple"])]
  elif "dict" in encoded:
    parts = sorted(encoded["dict"].items())
  else:
    return [prefix or _LONE]
  return [name for key, sub in parts
          for name in _feature_names(sub, f"{prefix}/{key}" if prefix else key)]


def _encode_structure(spec):
  """The element spec as JSON: tensors as dtype and shape; tuples and dicts nest."""
  if isinstance(spec, tf.TensorSpec):
    return {"dtype": spec.dtype.name, "shape": spec.shape.as_list()
            if spec.shape.rank is not None else None}
  if isinstance(spec, tuple) and not hasattr(spec, "_fields"):
    return {"tuple": [_encode_structure(s) for s in spec]}
  if isinstance(spec, dict):
    return {"dict": {str(k): _encode_structure(v) for k, v in spec.items()}}
  raise ValueError(f"elements must be tensors, or tuples or dicts of them, to be "
                   f"written as records; got a part {spec!r}. Map the dataset to "
                   "such elements first.")


def _decode_structure(encoded):
  if "tuple" in encoded:
    return tuple(_decode_structure(s) for s in encoded["tuple"])
  if "dict" in encoded:
    return {k: _decode_structure(v) for k, v in encoded["dict"].items()}
  return tf.TensorSpec(encoded["shape"], tf.as_dtype(encoded["dtype"]))

