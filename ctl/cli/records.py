"""`ctl records`: write a dataset as sharded TFRecord files (ctl/tools/records.py writes them).

    ctl records --dataset mnist --out data/mnist --shards 8   # or tfds:NAME, folder:PATH

`--dataset` names are those of the sources that packages register under the
entry points `ctl.record_sources` (gan registers mnist, tfds:NAME and
folder:PATH); ctl/tools/records.py says what a source is.
"""

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
  """Adds `ctl records`: write a dataset as sharded TFRecord files."""
  parser = subparsers.add_parser(
      "records", help="write a dataset as sharded TFRecord files",
      description="Writes a dataset as sharded TFRecord files plus spec.json, for "
      "ctl.read_records: the embedded MNIST digits, a prepared TFDS "
      "dataset, or a folder of images.")
  parser.add_argument("--dataset", required=True, metavar="mnist|tfds:NAME|folder:PATH",
                      help="mnist: the embedded digits, (uint8 image [28,28,1], int32 "
                      "label); tfds:NAME: a TFDS dataset prepared locally (no "
                      "download), (image, label) or image; folder:PATH: the images in "
                      "a folder, uint8 [H,W,C]")
  parser.add_argument("--out", required=True, help="the directory to write")
  parser.add_argument("--shards", type=int, default=8, help="number of files (default 8)")
  parser.add_argument("--split", default="train",
                      help="mnist: train or test; tfds: any split of the dataset; "
                      "folder: train or test (the held-out files)")
  parser.add_argument("--limit", type=int, default=None,
                      help="write only the first N examples")
  parser.add_argument("--data-dir", default=None, help="tfds: where TFDS keeps datasets")
  parser.add_argument("--image-size", type=int, nargs=2, default=None,
                      metavar=("HEIGHT", "WIDTH"),
                      help="folder: resize every image (needed to batch them later)")
  parser.add_argument("--channels", type=int, default=3, choices=(1, 3),
                      help="folder: 1 (grey) or 3 (RGB)")
  parser.add_argument("--with-labels", action="store_true",
                      help="folder: labels from first-level subfolders")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  """Runs `ctl records`; returns the exit code."""
  try:
    if args.shards < 1:
      raise ValueError(f"--shards must be at least 1, got {args.shards}.")
    if args.limit is not None and args.limit < 1:
      raise ValueError(f"--limit must be at least 1, got {args.limit}.")
    from ctl.tools import records  # pylint: disable=import-outside-toplevel
    dataset = _source(args)
    if args.limit is not None:
      dataset = dataset.take(args.limit)
    files = records.write_records(dataset, args.out, num_shards=args.shards)
  except (ValueError, FileNotFoundError) as e:
    print(f"ctl records: error: {e}", file=sys.stderr)
    return 2
  spec = records.read_spec(args.out)
  print(f"wrote {spec['num_examples']} examples of {args.dataset} ({args.split}) to "
        f"{len(files)} files in {args.out}: {_describe(spec['element'])}")
  return 0


def _source(args):
  """The unbatched dataset `--dataset` names, from the installed sources."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel

  from ctl.tools import records  # pylint: disable=import-outside-toplevel
  sources = [entry.load() for entry in metadata.entry_points(group=records.SOURCES_GROUP)]
  for source in sources:
    dataset = source(args.dataset, args.split, data_dir=args.data_dir,
                     channels=args.channels, with_labels=args.with_labels,
                     image_size=tuple(args.image_size) if args.image_size else None)
    if dataset is not None:
      return dataset
  usage = " or ".join(source.usage for source in sources) or (
      f"none: no package registers a source under the entry points {records.SOURCES_GROUP!r}")
  raise ValueError(f"--dataset {args.dataset!r} is not known; use {usage}.")


def _describe(encoded):
  """`uint8[28,28,1]`, `(uint8[28,28,1], int32[])`: an element spec as spec.json holds it."""
  if "tuple" in encoded:
    return "(" + ", ".join(_describe(s) for s in encoded["tuple"]) + ")"
  if "dict" in encoded:
    return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in encoded["dict"].items()) + "}"
  shape = "?" if encoded["shape"] is None else "[" + ",".join(
      "?" if d is None else str(d) for d in encoded["shape"]) + "]"
  return f"{encoded['dtype']}{shape}"
