"""Where a dispatch-bound step's time goes: the ops of one step, and the host's share.

    python bench/profile_step.py            # the tiny workload of bench/run.py
    python bench/profile_step.py --calls 2000

Two views of bench/run.py's `tiny` GAN, the workload where ctl's own work can
show:

1. **Ops per step.** The graph of one step on one replica as the hand-written
   loop traces it (`strategy.run` of its step) and as ctl does
   (`strategy.run(runner.compiled_step.replica_step)`): the op count, and the op types whose
   counts differ. Every op is scheduled by TensorFlow's executor, which costs
   a few microseconds each whatever its size; in a step of half a
   millisecond, tens of extra ops show.
2. **The host, per call.** `runner.train(calls)` at `steps_per_loop=1` under
   cProfile: the functions with the most time of their own, which is what
   Python adds to each compiled call.
"""

import argparse
import collections
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (bench/run.py: the same networks and steps)


def step_ops(strategy):
  """Op types of one step's graph: the hand-written step's and ctl's."""
  import tensorflow as tf
  hand = bench.handwritten("tiny", strategy)
  hand_graph = hand.concrete().graph
  variant = bench.library("tiny", strategy, 1)
  variant.run(1)  # ctl builds and checks its step on the first call
  runner = variant.runner
  spec = tf.TensorSpec([bench.BATCH, 2], tf.float32)

  @tf.function(input_signature=[spec])
  def ctl_step(batch):
    return strategy.run(runner.compiled_step.replica_step, args=(batch, tf.constant(0, tf.int64)))

  ctl_graph = ctl_step.get_concrete_function().graph
  return (collections.Counter(op.type for op in hand_graph.get_operations()),
          collections.Counter(op.type for op in ctl_graph.get_operations()))


def host_profile(strategy, calls, lines=15):
  """cProfile of `runner.train(calls)` (one step per call), after a warm-up."""
  variant = bench.library("tiny", strategy, 1)
  variant.run(10)
  profile = cProfile.Profile()
  profile.enable()
  variant.run(calls)
  profile.disable()
  out = io.StringIO()
  pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(lines)
  return out.getvalue()


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--calls", type=int, default=1000, help="calls of runner.train to profile")
  args = p.parse_args()
  import tensorflow as tf
  strategy = tf.distribute.get_strategy()
  hand, ctl_ops = step_ops(strategy)
  print(f"ops in one step's graph: hand-written {sum(hand.values())}, "
        f"ctl {sum(ctl_ops.values())}")
  for name in sorted(set(hand) | set(ctl_ops), key=lambda n: hand[n] - ctl_ops[n]):
    if hand[name] != ctl_ops[name]:
      print(f"  {name:36s} hand-written {hand[name]:4d}  ctl {ctl_ops[name]:4d}")
  print(f"\nrunner.train({args.calls}) at steps_per_loop=1, under cProfile "
        "(the host's own time per function):")
  print(host_profile(strategy, args.calls))


if __name__ == "__main__":
  main()
