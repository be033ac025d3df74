"""Evaluation parity: one checkpoint evaluated under several layouts, compared.

    ctl eval dcgan --across default,mirrored:2,mirrored:4,multi_worker:2

Each layout evaluates in a process of its own (a process fixes its devices once),
under `ctl launch` for `multi_worker:N`. Every number is compared with the first
layout's, within `TOLERANCE` relative (docs/evaluation.md shows a report).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import TextIO

from ctl.distribute import launch
from ctl.tools import parity

# Largest relative difference called rounding: evaluation has no training to
# amplify rounding, each sample's features are computed alike whatever its batch,
# and moments sum in float64 (docs/evaluation.md has the measured differences).
TOLERANCE = 1e-6
_KINDS = ("default", "mirrored", "multi_worker")
# The first worker's (or the chief's) line of `ctl launch`'s output: its JSON.
_LAUNCHED_JSON = re.compile(r"^\[(?:chief|worker 0)\] (\{.*\})\s*$")


def parse_layouts(text: str) -> list[tuple[str, int]]:
  """`default,mirrored:2,multi_worker:2` as [(kind, count)]; ValueError naming a bad one."""
  layouts = []
  for item in text.split(","):
    kind, _, count = item.strip().partition(":")
    if kind in _KINDS and count.isdigit() and int(count) < 1:
      raise ValueError(f"--across: {item.strip()!r}: N must be at least 1.")
    if kind not in _KINDS or (kind == "default") != (count == "") or (
        count and not count.isdigit()):
      raise ValueError(f"--across: {item.strip()!r} is not a layout; use default, "
                       "mirrored:N (N logical CPUs) or multi_worker:N (N local workers "
                       "through ctl launch), joined with commas.")
    layouts.append((kind, int(count) if count else 1))
  if len(layouts) < 2:
    raise ValueError(f"--across {text!r}: name at least two layouts to compare, e.g. "
                     "default,mirrored:2.")
  return layouts


def name(layout: tuple[str, int]) -> str:
  kind, count = layout
  return kind if kind == "default" else f"{kind}:{count}"


def command(layout: tuple[str, int], eval_args: Sequence[str]) -> list[str]:
  """The command that evaluates under `layout`; `eval_args` follow `ctl eval`."""
  kind, count = layout
  evaluate = [sys.executable, "-m", "ctl.cli", "eval", *eval_args, "--strategy", kind]
  if kind == "mirrored":
    return evaluate + ["--logical-cpus", str(count)]
  if kind == "multi_worker":
    return [sys.executable, "-m", "ctl.cli", "launch", "--workers", str(count), "--", *evaluate]
  return evaluate


def result_of(layout: tuple[str, int], stdout: str) -> dict[str, float]:
  """The metrics a layout's run printed (under `ctl launch`: the first worker's)."""
  for line in reversed(stdout.splitlines()):
    if layout[0] == "multi_worker":
      match = _LAUNCHED_JSON.match(line)
      line = match.group(1) if match else ""
    if line.startswith("{"):
      return json.loads(line)
  raise ValueError(f"{name(layout)}: printed no metrics (its output ends: {stdout[-300:]!r})")


def compare(results: dict[str, dict[str, float]]) -> tuple[list[tuple[str, str, float, float]],
                                                          bool]:
  """Rows (metric, layout, value, relative difference to the first layout) and
  whether every one is within `TOLERANCE`."""
  rows = []
  for metric, expected in next(iter(results.values())).items():
    for layout, values in results.items():
      value = values.get(metric)
      if not isinstance(value, (int, float)):
        rows.append((metric, layout, math.nan, math.inf))
        continue
      value, reference = float(value), float(expected)
      difference = abs(value - reference) / max(abs(reference), abs(value), 1e-30)
      rows.append((metric, layout, value, 0.0 if value == reference else difference))
  return rows, all(difference <= TOLERANCE for *_, difference in rows)


def _evaluate(evaluate, cwd, timeout):
  """(exit code, stdout, stderr) of one layout's evaluation, in a process group
  that an interruption or a timeout stops first."""
  with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
    proc = subprocess.Popen(evaluate, cwd=cwd, stdout=stdout, stderr=stderr, text=True,
                            start_new_session=True,
                            env={**os.environ, **launch.stopped_with_this_process(grace=3)})
    try:
      proc.wait(timeout=timeout)
    except BaseException:
      parity.stop_groups([proc])
      raise
    stdout.seek(0)
    stderr.seek(0)
    return proc.returncode, stdout.read(), stderr.read()


def _last_lines(text, count=6):
  """The end of a failed evaluation's stderr, without TensorFlow's log lines."""
  lines = [line for line in text.splitlines()
           if line.strip() and not line.startswith(("I0000", "W0000", "E0000", "WARNING:"))]
  return "\n".join(lines[-count:])


def table(rows: Sequence[tuple[str, str, float, float]], layouts: Sequence[str]) -> str:
  """The rows of `compare`, a line each; every line names its metric, so that
  `| grep classifier_fid` keeps every layout's."""
  metric_width = max(len("metric"), *(len(metric) for metric, *_ in rows))
  layout_width = max(len("layout"), *(len(layout) for layout in layouts))
  lines = [f"{'metric':<{metric_width}}  {'layout':<{layout_width}}  {'value':>22}  "
           f"difference from {layouts[0]} (relative)"]
  for metric, layout, value, difference in rows:
    if math.isinf(difference):  # `compare`'s row of a missing or non-numeric value
      shown, said = "missing", "missing"
    else:
      shown = f"{value:.15g}"
      said = ("reference" if layout == layouts[0] else
              "0" if difference == 0 else f"{difference:.1e}")
      if math.isnan(difference):  # NaN, or inf against a number: agrees with nothing
        said += "  not comparable"
      elif difference > TOLERANCE:
        said += f"  over {TOLERANCE:g}"
    lines.append(f"{metric:<{metric_width}}  {layout:<{layout_width}}  {shown:>22}  {said}")
  return "\n".join(lines)


def run(layouts: Sequence[tuple[str, int]], eval_args: Sequence[str], *, cwd: str | None = None,
        timeout: float = 1800, out: TextIO | None = None) -> int:
  """Evaluates under each layout in turn, prints the table; 0 if all agree, else 1."""
  out = out or sys.stdout
  results, failed = {}, []
  for layout in layouts:
    print(f"ctl eval --across: {name(layout)} ...", file=sys.stderr, flush=True)
    code, stdout, stderr = _evaluate(command(layout, eval_args), cwd, timeout)
    if code != 0:  # said, and the other layouts still run
      print(f"ctl eval --across: {name(layout)} exited {code}:\n{_last_lines(stderr)}",
            file=sys.stderr)
      failed.append(name(layout))
      continue
    results[name(layout)] = result_of(layout, stdout)
  if len(results) < 2:
    print(f"ctl eval --across: fewer than two layouts evaluated ({', '.join(failed)} "
          "failed): nothing to compare.", file=out)
    return 1
  rows, agree = compare(results)
  print(table(rows, list(results)), file=out)
  if failed:
    print(f"FAILED: {', '.join(failed)} (their errors are above)", file=out)
    agree = False
  first = next(iter(results))
  print(f"SAME: every value within {TOLERANCE:g} (relative) of {first}'s" if agree else
        f"DIFFERS: a value is more than {TOLERANCE:g} (relative) from {first}'s, or missing",
        file=out)
  return 0 if agree else 1
