"""`ctl parity`'s verdicts on steps nobody tuned it for: false alarms and detections.

    python bench/parity_suite.py                  # seeds 0-4, about 25 min on 2 cores
    python bench/parity_suite.py --seeds 0-1 --no-float32-alone

Runs the matrices of tests/test_parity_suite.py (five ordinary GAN steps,
tests/parity_gans.py, each with its mix of optimizer options, 10 steps against
`mirrored:2`) and tests/test_parity_planted.py (every planted bug of
tests/parity_planted.py, 3 steps), on each seed; once as `ctl parity` judges
(float64 deciding), and once with `float64=False` (float32 alone, its floor
the largest over 3 perturbed runs and each variable's group), for contrast.
Prints a row per case and the totals: correct runs called rounding (the
false-alarm rate is the rest) and planted bugs called DIFFERS with their cause
named.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import test_parity_planted as bugs  # noqa: E402  (the matrices the tests check)
import test_parity_suite as suite  # noqa: E402

from ctl.cli.parity import parse_seeds  # noqa: E402
from ctl.tools import parity  # noqa: E402


def judge(module, configs, steps, seeds, env, float64):
  """{case: (within rounding, deciding precision, largest difference, its
  tolerance, causes)} for one `check`, and its seconds."""
  os.environ.update(env)
  started = time.monotonic()
  report = parity.check(module, configs, steps=steps, seeds=seeds, float64=float64, jobs=2)
  cases = {}
  for name in report.configs:
    if name in report.errors:
      cases[name] = (False, "error", float("nan"), float("nan"), [report.errors[name]])
      continue
    largest = report.worst(name)
    cases[name] = (report.within_rounding(name), report.precision(name), largest.difference,
                   largest.tolerance, report.causes.get(name, []))
  return cases, time.monotonic() - started


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seeds", default="0-4")
  p.add_argument("--steps", type=int, default=10, help="steps of the GAN runs (default 10)")
  p.add_argument("--no-float32-alone", dest="float32_alone", action="store_false",
                 help="skip the float32-alone pass (half the time)")
  args = p.parse_args(argv)
  seeds = parse_seeds(args.seeds)
  passes = [True, False] if args.float32_alone else [True]
  totals = {}
  print("| case | seed | judged by | verdict | closest to tolerance (difference / "
        "tolerance) | cause named |")
  print("|---|---|---|---|---|---|")
  for float64 in passes:
    label = "float64" if float64 else "float32 alone"
    for gan in suite.GANS:
      cases, seconds = judge(suite.GANS_MODULE, ["mirrored:2"], args.steps, seeds,
                             {"PARITY_GAN": gan}, float64)
      for name, (ok, precision, difference, tolerance, _) in cases.items():
        totals.setdefault((label, "correct"), []).append(ok)
        print(f"| {gan} | {name.rpartition('=')[2]} | {precision} | "
              f"{'rounding' if ok else 'DIFFERS'} | {difference:.1e} / {tolerance:.1e} | |")
      print(f"<!-- {gan} {label}: {seconds:.0f} s -->", flush=True)
    for bug, (configs, words) in bugs.PLANTED.items():
      cases, seconds = judge(bugs.PLANTED_MODULE, configs, 3, seeds,
                             {"PLANTED_BUG": bug}, float64)
      for name, (ok, precision, difference, tolerance, causes) in cases.items():
        config, _, seed = name.partition(" seed=")
        named = words is not None and any(all(w in c for w in words) for c in causes)
        if words is None:
          totals.setdefault((label, "correct"), []).append(ok)
        else:
          totals.setdefault((label, "planted"), []).append(not ok)
          totals.setdefault((label, "named"), []).append(not ok and named)
        print(f"| {bug or 'no bug'} ({config}) | {seed} | {precision} | "
              f"{'rounding' if ok else 'DIFFERS'} | {difference:.1e} / {tolerance:.1e} | "
              f"{'' if words is None else 'yes' if named else 'no'} |")
      print(f"<!-- planted {bug or 'none'} {label}: {seconds:.0f} s -->", flush=True)
  print()
  for label in ("float64", "float32 alone")[:len(passes)]:
    correct = totals[(label, "correct")]
    planted, named = totals[(label, "planted")], totals[(label, "named")]
    print(f"{label}: correct runs called rounding {sum(correct)} of {len(correct)} "
          f"(false alarms {len(correct) - sum(correct)}); planted bugs called DIFFERS "
          f"{sum(planted)} of {len(planted)}, with their cause named {sum(named)} of "
          f"{len(named)}")


if __name__ == "__main__":
  main()
