"""`ctl parity`'s verdicts on steps nobody tuned it for: false alarms and detections.

    python bench/parity_suite.py                  # an hour or more on 2 cores
    python bench/parity_suite.py --seeds 0-1 --no-float32-alone
    python bench/parity_suite.py --gans lazy_r1 --seeds 0 --steps 3 --no-planted

Runs the matrices of tests/test_parity_suite.py (nine ordinary GAN steps,
tests/parity_gans.py, each in its two dtype variants, "following" and
"explicit"; 10 steps against `mirrored:2` on every seed, and against
`multi_worker:2` on the first two) and tests/test_parity_planted.py (every
planted bug of tests/parity_planted.py, 3 steps), on each seed; once as `ctl
parity` judges (float64 deciding), and once with `float64=False` (float32 alone,
its floor the largest over 3 perturbed runs and each variable's group), for
contrast. Prints a row per case and the totals: correct runs called rounding
(the false-alarm rate is the rest), how many float64 decided, and planted bugs
called DIFFERS with their cause named. Each check's seconds follow its rows as
an HTML comment.
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

MIRRORED, MULTI_WORKER = "mirrored:2", "multi_worker:2"


def judge(module, configs, steps, seeds, env, float64):
  """{(configuration, seed): (within rounding, deciding precision, largest
  difference, its tolerance, causes)} for one `check`, and its seconds."""
  os.environ.update(env)
  started = time.monotonic()
  report = parity.check(module, configs, steps=steps, seeds=seeds, float64=float64, jobs=2)
  cases = {}
  for name in report.configs:
    config, _, seed = name.partition(" seed=")
    key = config, seed or str(seeds[0])  # one seed: the name has no "seed="
    if name in report.errors:
      cases[key] = ("failed", "error", float("nan"), float("nan"), [report.errors[name]])
      continue
    largest = report.worst(name)
    cases[key] = (report.verdict(name), report.precision(name), largest.difference,
                  largest.tolerance, report.causes.get(name, []))
  return cases, time.monotonic() - started


def gan_checks(gans, seeds, multi_worker_seeds):
  """(GAN, dtype variant, configuration, seeds) of each check of the GAN matrix."""
  for gan in gans:
    for dtype in suite.DTYPES:
      if seeds:
        yield gan, dtype, MIRRORED, seeds
      if multi_worker_seeds:
        yield gan, dtype, MULTI_WORKER, multi_worker_seeds


def count(totals, key, value):
  totals.setdefault(key, []).append(value)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seeds", default="0-4",
                 help="seeds against mirrored:2, and of the planted bugs (default 0-4; '' "
                      "for no GAN run against mirrored:2)")
  p.add_argument("--multi-worker-seeds", default="0-1",
                 help="seeds against multi_worker:2 (default 0-1; '' for none)")
  p.add_argument("--steps", type=int, default=10, help="steps of the GAN runs (default 10)")
  p.add_argument("--gans", default=",".join(suite.GANS),
                 help="the GANs of tests/parity_gans.py to run, comma-separated (default all; "
                      "'' for none)")
  p.add_argument("--no-planted", dest="planted", action="store_false",
                 help="skip the planted bugs")
  p.add_argument("--no-float32-alone", dest="float32_alone", action="store_false",
                 help="skip the float32-alone pass (half the time)")
  p.add_argument("--no-float64", dest="float64", action="store_false",
                 help="skip the float64 pass (the float32-alone pass only)")
  args = p.parse_args(argv)
  seeds = parse_seeds(args.seeds) if args.seeds else []
  multi_worker_seeds = parse_seeds(args.multi_worker_seeds) if args.multi_worker_seeds else []
  gans = [g.strip() for g in args.gans.split(",") if g.strip()]
  unknown = [g for g in gans if g not in suite.GANS]
  if unknown:
    p.error(f"--gans: no GAN {', '.join(unknown)} in tests/parity_gans.py; give some of "
            f"{', '.join(suite.GANS)}.")
  passes = [True] * args.float64 + [False] * args.float32_alone
  totals = {}
  print("| case | seed | judged by | verdict | closest to tolerance (difference / "
        "tolerance) | cause named |")
  print("|---|---|---|---|---|---|")
  for float64 in passes:
    label = "float64" if float64 else "float32 alone"
    for gan, dtype, config, check_seeds in gan_checks(gans, seeds, multi_worker_seeds):
      cases, seconds = judge(suite.GANS_MODULE, [config], args.steps, check_seeds,
                             {"PARITY_GAN": gan, "PARITY_DTYPE": dtype}, float64)
      for (_, seed), (verdict, precision, difference, tolerance, _) in cases.items():
        for key in ("all", config, dtype):
          count(totals, (label, "correct", key), verdict == "rounding")
          count(totals, (label, "float64 decided", key), precision == "float64")
        count(totals, (label, "correct margin", "all"), difference / tolerance)
        print(f"| {gan} ({dtype}, {config}) | {seed} | {precision} | "
              f"{verdict} | {difference:.1e} / {tolerance:.1e} | |")
      print(f"<!-- {gan} {dtype} {config} {label}: {seconds:.0f} s -->", flush=True)
    for bug, (configs, words) in bugs.PLANTED.items() if args.planted else ():
      cases, seconds = judge(bugs.PLANTED_MODULE, configs, 3, seeds,
                             {"PLANTED_BUG": bug}, float64)
      for (config, seed), (verdict, precision, difference, tolerance, causes) in cases.items():
        named = words is not None and any(all(w in c for w in words) for c in causes)
        if words is None:
          count(totals, (label, "correct", "all"), verdict == "rounding")
          count(totals, (label, "float64 decided", "all"), precision == "float64")
          count(totals, (label, "correct margin", "all"), difference / tolerance)
        elif not (bug == "tf_random" and config == "compiled" and verdict == "rounding"):
          # (a fresh op-seeded draw can give the eager numbers compiled: no difference)
          count(totals, (label, "planted", "all"), verdict == "DIFFERS")
          count(totals, (label, "named", "all"), verdict == "DIFFERS" and named)
          count(totals, (label, "bug margin", "all"), difference / tolerance)
        print(f"| {bug or 'no bug'} ({config}) | {seed} | {precision} | "
              f"{verdict} | {difference:.1e} / {tolerance:.1e} | "
              f"{'' if words is None else 'yes' if named else 'no'} |")
      print(f"<!-- planted {bug or 'none'} {label}: {seconds:.0f} s -->", flush=True)
  print()
  for float64 in passes:
    print(summary(totals, "float64" if float64 else "float32 alone"))


def summary(totals, label):
  """The totals of one pass as a paragraph."""
  def of(kind, key="all"):
    values = totals.get((label, kind, key), [])
    return f"{sum(values)} of {len(values)}"

  correct = totals.get((label, "correct", "all"), [])
  text = (f"{label}: correct runs called rounding {of('correct')} (false alarms "
          f"{len(correct) - sum(correct)}), decided by float64 {of('float64 decided')}")
  text += (f"; largest difference / tolerance of a correct run "
           f"{max(totals.get((label, 'correct margin', 'all'), [0])):.2g}")
  if (label, "planted", "all") in totals:
    text += (f"; planted bugs called DIFFERS {of('planted')}, with their cause named "
             f"{of('named')}; smallest difference / tolerance of a bug "
             f"{min(totals[(label, 'bug margin', 'all')]):.2g}")
  parts = [f"{key} {of('correct', key)} ({of('float64 decided', key)} by float64)"
           for key in (MIRRORED, MULTI_WORKER) + suite.DTYPES
           if (label, "correct", key) in totals]
  if parts:
    text += "\n  the GAN runs called rounding: " + "; ".join(parts)
  return text


if __name__ == "__main__":
  main()
