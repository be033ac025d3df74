"""Smoke test of bench/run.py: it runs, and every JSON row is complete and sane.

    pytest tests/test_bench.py

A short run of the `tiny` workload only (20 steps, 2 repetitions, under the
default strategy and mirrored over 2 logical CPUs): it checks the rows' shape
and that no variant retraces, never the timings themselves, which depend on
the machine.
"""

import json

import helpers

FIELDS = ("workload", "variant", "strategy", "ms_per_step", "examples_per_s",
          "ratio_to_handwritten", "peak_rss_mb", "steps", "repetitions",
          "traces_after_first_call", "gflop_per_step", "gflop_per_s", "share_of_ceiling")


def test_quick_tiny_rows():
  proc = helpers.python(["bench/run.py", "--quick", "--workloads", "tiny",
                         "--steps", "20", "--repetitions", "2"], timeout=300)
  rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  groups = {(r["strategy"], r["variant"]) for r in rows}
  assert {("default", "handwritten"), ("default", "ctl steps_per_loop=1"),
          ("default", "ctl steps_per_loop=10"), ("default", "ctl steps_per_loop=100"),
          ("default", "keras fit spe=1"), ("default", "keras fit spe=10"),
          ("mirrored", "handwritten"), ("mirrored", "ctl steps_per_loop=10")} <= groups, groups
  for row in rows:
    missing = [f for f in FIELDS if f not in row]
    assert not missing, (missing, row)
    assert row["workload"] == "tiny"
    assert row["steps"] == 20 and row["repetitions"] == 2
    assert row["ms_per_step"] > 0 and row["gflop_per_step"] > 0, row
    assert row["share_of_ceiling"] is None  # no convolution workload, no ceiling
    # A retrace after the warm-up call would be paid on every later call.
    assert row["traces_after_first_call"] == 0, row
  # Each strategy's rows are set against its own hand-written loop.
  floors = [r for r in rows if r["variant"] == "handwritten"]
  assert sorted(r["strategy"] for r in floors) == ["default", "mirrored"]
  assert all(r["ratio_to_handwritten"] == 1.0 for r in floors)


def test_unknown_workload_is_named():
  proc = helpers.python(["bench/run.py", "--workloads", "tiny,resnet"], check=False)
  assert proc.returncode != 0
  assert "resnet" in proc.stderr and "tiny, dcgan, bigan" in proc.stderr, proc.stderr
