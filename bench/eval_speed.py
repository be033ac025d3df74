"""Evaluation speed: classifier FID of N generated digits, the chief-only path against
the distributed one, in the same run.

    python bench/eval_speed.py                    # 5,000 and 10,000 samples; ~3 minutes here
    python bench/eval_speed.py --samples 1000 --repeats 1   # a smoke run

For each strategy (default, and mirrored on 2 logical CPUs), in a process of its
own, with the main job's generator (`gan.dcgan_generator`, noise 64, untrained:
the same arithmetic as a trained one):
  - "chief only": what `gan.ClassifierFID` did before evaluation was
    distributed: NumPy noise, the generator and the classifier called on
    this process in batches of 500, features gathered, `frechet_distance`;
  - "distributed, FID": `ClassifierFID.outputs(runner.over_samples)` (every
    replica generates and scores its share; moments summed across replicas)
    and `frechet_distance_from_moments`;
  - "distributed, every metric": `ClassifierFID.measure` (FID, KID, scores).
The real digits' features are computed before the clock starts (both paths
reuse them). Each is called once untimed (tracing), then timed `--repeats`
times: min / median / max seconds and the median's ratio to "chief only".
Prints one JSON line per row and a Markdown table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = 64
BATCH = 500


def child(strategy, samples, repeats):
  """In a fresh process: times each path under `strategy`; prints JSON rows."""
  import ctl
  if strategy == "mirrored":
    ctl.configure_logical_cpus(2)
  import keras
  import numpy as np
  import tensorflow as tf

  import gan
  from gan import evaluation

  def build():
    keras.utils.set_random_seed(0)
    return ({"generator": gan.dcgan_generator(NOISE)},
            {"generator": keras.optimizers.Adam()})

  data = tf.data.Dataset.from_tensor_slices(np.zeros((8, 1), "float32")).batch(
      2, drop_remainder=True).repeat()
  runner = ctl.Runner(lambda ctx, batch: {}, build, data, strategy=strategy)
  reference = evaluation.reference_outputs("test")
  evaluation.classifier_model()  # loaded before either path is timed
  z = np.random.default_rng(1).normal(size=(samples, NOISE)).astype("float32")

  def chief_only():
    generator = runner.models["generator"]
    images = np.concatenate([np.asarray(generator(z[i:i + BATCH], training=False))
                             for i in range(0, samples, BATCH)])
    return evaluation.frechet_distance(evaluation.classifier_features(images),
                                       reference["features"])

  action = gan.experiment.ClassifierFID(NOISE, num_samples=samples, batch_size=BATCH)

  def distributed_fid():
    outputs = action.outputs(runner.over_samples)
    return evaluation.frechet_distance_from_moments(outputs["feature_moments"],
                                                    reference["moments"])

  def every_metric():
    return action.measure(runner.over_samples)["classifier_fid"]

  rows = []
  for name, fn in (("chief only", chief_only), ("distributed, FID", distributed_fid),
                   ("distributed, every metric", every_metric)):
    fn()  # traces
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    rows.append({"strategy": strategy if strategy == "default" else "mirrored:2",
                 "samples": samples, "path": name, "min_s": min(times),
                 "median_s": statistics.median(times), "max_s": max(times)})
  base = rows[0]["median_s"]
  for row in rows:
    row["ratio_to_chief_only"] = row["median_s"] / base
    print(json.dumps(row), flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--samples", default="5000,10000",
                      help="comma-separated sample counts (default 5000,10000)")
  parser.add_argument("--repeats", type=int, default=3, help="timed calls per path")
  parser.add_argument("--child", nargs=2, metavar=("STRATEGY", "SAMPLES"),
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child(args.child[0], int(args.child[1]), args.repeats)
    return 0
  sys.path.insert(0, os.path.join(ROOT, "bench"))
  from run import cpu_features  # pylint: disable=import-outside-toplevel
  cpu = cpu_features()
  print(json.dumps(cpu), flush=True)
  rows = []
  for samples in (int(s) for s in args.samples.split(",")):
    for strategy in ("default", "mirrored"):
      proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--repeats",
                             str(args.repeats), "--child", strategy, str(samples)],
                            cwd=ROOT, capture_output=True, text=True, check=False,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
      if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
      for line in proc.stdout.splitlines():
        if line.startswith("{"):
          print(line, flush=True)
          rows.append(json.loads(line))
  print(f"\nCPU: {cpu['cpu']}, {cpu['cores']} cores; AVX-512 "
        f"{'yes' if cpu['features']['avx512f'] else 'no'}; {args.repeats} timed calls "
        "per row after one untimed.\n")
  print("| samples | strategy | path | min s | median s | max s | ratio to chief only |")
  print("|---:|---|---|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r['samples']} | {r['strategy']} | {r['path']} | {r['min_s']:.2f} | "
          f"{r['median_s']:.2f} | {r['max_s']:.2f} | {r['ratio_to_chief_only']:.2f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
