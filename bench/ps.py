"""Parameter-server training: steps/s with `steps_per_loop` steps per scheduled call.

    python bench/ps.py                  # 2 workers, 1 parameter server, on 127.0.0.1
    python bench/ps.py --steps 400 --repetitions 5

Starts a local cluster with `ctl launch --workers 2 --ps 1` (every task runs
this file with `--task`); the coordinator trains bench/run.py's `tiny`
workload through `ctl.Runner.train` under `parameter_server` twice over, with
`steps_per_loop=1` (one step per scheduled call, how the runner scheduled
every step before) and `steps_per_loop=10` (an in-graph loop of 10 steps per
call), repetitions interleaved. Each `train(n)` hands out calls of
`steps_per_loop` steps, one per worker at a time (`TrainStep.steps_per_call`),
and waits for them. Prints a line per variant and one JSON object per
variant. Updates are asynchronous, so the losses are not compared.
"""

import argparse
import json
import os
import subprocess
import sys

VARIANTS = (1, 10)  # steps_per_loop


def task(steps, repetitions):
  """Every task runs this; only the coordinator (the chief) returns from
  `make_strategy` and measures."""
  import ctl
  strategy = ctl.make_strategy("parameter_server")  # workers and ps serve here
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import run as bench
  variants = {n: bench.library("tiny", strategy, n) for n in VARIANTS}
  results = bench.measure(variants, steps, repetitions)
  cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
  floor = results[1][0]
  for n, (seconds, traces) in results.items():
    print(json.dumps({
        "measure": "parameter_server", "workload": "tiny", "strategy": "parameter_server",
        "variant": f"ctl steps_per_loop={n}", "workers": len(cluster.get("worker", [])),
        "ps": len(cluster.get("ps", [])), "ms_per_step": round(seconds * 1e3, 3),
        "steps_per_s": round(1 / seconds, 1), "ratio_to_one_step_per_call":
        round(seconds / floor, 3), "steps": steps, "repetitions": repetitions,
        "traces_after_first_call": traces}), flush=True)


def measure(steps, repetitions, timeout=600):
  """Launches the cluster; returns the coordinator's rows."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  command = [sys.executable, "-m", "ctl.cli", "launch", "--workers", "2", "--ps", "1",
             "--grace", "5", "--", sys.executable, os.path.abspath(__file__), "--task",
             "--steps", str(steps), "--repetitions", str(repetitions)]
  proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                        check=False)
  rows = []
  for line in proc.stdout.splitlines():
    text = line.split("] ", 1)[-1]  # the launcher prefixes each task's lines
    if text.startswith("{"):
      rows.append(json.loads(text))
  if proc.returncode or len(rows) != len(VARIANTS):
    raise RuntimeError(f"the parameter-server cluster failed (exit {proc.returncode}):\n"
                       f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=200, help="steps per repetition")
  p.add_argument("--repetitions", type=int, default=3, help="timed repetitions per variant")
  p.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.task:
    task(args.steps, args.repetitions)
    return
  rows = measure(args.steps, args.repetitions)
  for r in rows:
    print(f"parameter_server ({r['workers']} workers, {r['ps']} ps) tiny {r['variant']:22s} "
          f"{r['ms_per_step']:8.3f} ms/step  {r['steps_per_s']:8.1f} steps/s  ratio "
          f"{r['ratio_to_one_step_per_call']:.3f}")
  for r in rows:
    print(json.dumps(r))


if __name__ == "__main__":
  main()
