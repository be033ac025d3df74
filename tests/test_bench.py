"""Smoke test of bench/run.py: it runs, and every JSON row is complete and sane.

    pytest tests/test_bench.py

A short run of the `tiny` workload only (20 steps, 2 repetitions): it checks
the rows' shape and that no variant retraces, never the timings themselves,
which depend on the machine.
"""

import json

import helpers

FIELDS = ("workload", "variant", "strategy", "ms_per_step", "examples_per_s",
          "ratio_to_handwritten", "peak_rss_mb", "steps", "repetitions",
          "traces_after_first_call")


def test_quick_tiny_rows():
  proc = helpers.python(["bench/run.py", "--quick", "--workloads", "tiny",
                         "--steps", "20", "--repetitions", "2"], timeout=300)
  rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  variants = {r["variant"] for r in rows}
  assert {"handwritten", "ctl steps_per_loop=1", "ctl steps_per_loop=10",
          "keras fit spe=1", "keras fit spe=10"} <= variants, variants
  for row in rows:
    missing = [f for f in FIELDS if f not in row]
    assert not missing, (missing, row)
    assert row["workload"] == "tiny"
    assert row["steps"] == 20 and row["repetitions"] == 2
    assert row["ms_per_step"] > 0, row
    # A retrace after the warm-up call would be paid on every later call.
    assert row["traces_after_first_call"] == 0, row
  floor, = [r for r in rows if r["variant"] == "handwritten"]
  assert floor["ratio_to_handwritten"] == 1.0


def test_unknown_workload_is_named():
  proc = helpers.python(["bench/run.py", "--workloads", "tiny,resnet"], check=False)
  assert proc.returncode != 0
  assert "resnet" in proc.stderr and "tiny, dcgan, bigan" in proc.stderr, proc.stderr
