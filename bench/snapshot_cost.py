"""What a background save's snapshot costs the next step, in one run.

    python bench/snapshot_cost.py                # 40 variables of 32 MB (1.3 GB)
    python bench/snapshot_cost.py --variables 4 --megabytes 8 --repetitions 2   # a smoke run

The step updates every variable in place (`assign_add`, as Adam does). Before
it, three ways, their repetitions interleaved: nothing (`none`); a snapshot
as the background save takes it, held by the writer while the step runs
(`held`: TF's copy-on-write copies each variable on the step's path); and
the same snapshot after the writing thread's own copy (`copied`: what
`ctl.Checkpoint(asynchronous=True)` does, `_tf_internal.frozen(...).own()`),
which lets go of the variables' memory. TF runs on one thread, the copy on
another, as on a CPU with a core for the write. Prints a table of the step's
seconds (min / median / max), then one JSON line.
"""

import argparse
import json
import statistics
import threading
import time


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--variables", type=int, default=40)
  parser.add_argument("--megabytes", type=int, default=32, help="each variable's size")
  parser.add_argument("--repetitions", type=int, default=5)
  args = parser.parse_args()
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  from ctl.base import _tf_internal  # pylint: disable=import-outside-toplevel

  values = args.megabytes * 2**20 // 4
  variables = [tf.Variable(tf.random.normal([values])) for _ in range(args.variables)]

  @tf.function
  def step():
    for v in variables:
      v.assign_add(tf.fill([values], 1e-3))

  def own(snapshot):
    for part in snapshot:
      part.own()

  step()
  step()
  times = {"none": [], "held": [], "copied": []}
  for _ in range(args.repetitions):
    for way in times:
      snapshot = [_tf_internal.frozen(v) for v in variables] if way != "none" else []
      if way == "copied":  # the writer's copy, done before the step (as while it computes)
        writer = threading.Thread(target=own, args=(snapshot,))
        writer.start()
        writer.join()
      start = time.perf_counter()
      step()
      times[way].append(time.perf_counter() - start)
      del snapshot
  print(f"| {args.variables} variables of {args.megabytes} MB: the step after | min | median "
        "| max |\n|---|---|---|---|")
  for way, seconds in times.items():
    print(f"| {way} | {min(seconds):.3f} s | {statistics.median(seconds):.3f} s | "
          f"{max(seconds):.3f} s |")
  print(json.dumps({"variables": args.variables, "megabytes": args.megabytes,
                    "seconds": {k: [round(s, 4) for s in v] for k, v in times.items()}}))


if __name__ == "__main__":
  main()
