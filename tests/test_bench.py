"""Smoke test of bench/run.py: it runs, and every JSON row is complete and sane.

    pytest tests/test_bench.py

A short run of the `tiny` workload only (20 steps, 2 repetitions, under the
default strategy and mirrored over 2 logical CPUs): it checks the rows' shape
and that no variant retraces, never the timings themselves, which depend on
the machine.
"""

import json

import pytest

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

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


def test_table_renders_every_row_and_the_kernel_line(tmp_path):
  row = {"workload": "tiny", "variant": "handwritten", "strategy": "default",
         "ms_per_step": 2.5, "examples_per_s": 102400.0, "ratio_to_handwritten": 1.0,
         "peak_rss_mb": 900.0, "steps": 20, "repetitions": 2,
         "traces_after_first_call": 0, "gflop_per_step": 0.02, "gflop_per_s": 8.0,
         "share_of_ceiling": None}
  kernel = {"kernel": "dcgan dominant convolution", "ceiling_gflop_per_s": 90.0,
            "bfloat16_speed_vs_float32": 0.1}
  lines = ["a table line", json.dumps(kernel), json.dumps(row),
           json.dumps(dict(row, variant="ctl steps_per_loop=1", input_wait_share=0.01))]
  (tmp_path / "bench.txt").write_text("\n".join(lines) + "\n")
  text = helpers.python(["bench/table.py", str(tmp_path / "bench.txt")]).stdout
  assert text.count("| tiny | default |") == 2
  assert "90.0 GFLOP/s" in text and "input wait 1.0%" in text
