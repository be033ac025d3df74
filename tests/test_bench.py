"""Smoke test of bench/run.py: it runs, and every JSON row is complete and sane.

    pytest tests/test_bench.py

A short run of the `tiny` workload only (20 steps, 1 repetition, under the
default strategy, mirrored over 2 logical CPUs, and a local parameter-server
cluster; first steps in fresh processes): it checks the rows' shape, that
every ratio is set against the floor it names, that no variant retraces and
that every target is reported, never the timings themselves, which depend
on the machine.
"""

import json
import os
import re

import pytest

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

FIELDS = ("workload", "variant", "strategy", "ms_per_step", "examples_per_s",
          "ratio_to_handwritten", "floor", "ratio_to_floor", "peak_rss_mb", "steps",
          "repetitions", "traces_after_first_call", "gflop_per_step", "gflop_per_s",
          "share_of_ceiling")


@pytest.fixture(scope="module")
def records():
  proc = helpers.python(["bench/run.py", "--quick", "--workloads", "tiny",
                         "--steps", "20", "--repetitions", "1"], timeout=600)
  lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  return proc.stdout, lines


def test_quick_tiny_rows(records):
  _, lines = records
  rows = [r for r in lines if "ms_per_step" in r and "measure" not in r]
  groups = {(r["strategy"], r["variant"]) for r in rows}
  assert {("default", "handwritten"), ("default", "handwritten in-graph loop of 10"),
          ("default", "handwritten in-graph loop of 100"),
          ("default", "ctl steps_per_loop=1"), ("default", "ctl steps_per_loop=10"),
          ("default", "ctl steps_per_loop=100"), ("default", "keras fit spe=1"),
          ("default", "keras fit spe=10"), ("default", "ctl steps_per_loop=10 stateful noise"),
          ("mirrored", "handwritten"), ("mirrored", "handwritten in-graph loop of 10"),
          ("mirrored", "ctl steps_per_loop=10")} <= groups, groups
  by_name = {(r["strategy"], r["variant"]): r for r in rows}
  for row in rows:
    missing = [f for f in FIELDS if f not in row]
    assert not missing, (missing, row)
    assert row["workload"] == "tiny"
    assert row["steps"] == 20 and row["repetitions"] == 1
    assert row["ms_per_step"] > 0 and row["gflop_per_step"] > 0, row
    assert row["share_of_ceiling"] is None  # no convolution workload, no ceiling
    # A retrace after the warm-up call would be paid on every later call.
    assert row["traces_after_first_call"] == 0, row
    floor = by_name[(row["strategy"], row["floor"])]
    assert row["ratio_to_floor"] == pytest.approx(row["ms_per_step"] / floor["ms_per_step"],
                                                  rel=0.02, abs=0.002), row
  assert by_name[("default", "ctl steps_per_loop=10")]["floor"] == (
      "handwritten in-graph loop of 10")
  # Each strategy's rows are set against its own hand-written loop.
  floors = [r for r in rows if r["variant"] == "handwritten"]
  assert sorted(r["strategy"] for r in floors) == ["default", "mirrored"]
  assert all(r["ratio_to_handwritten"] == 1.0 for r in floors)


def test_first_step_parameter_server_cpu_and_target_records(records):
  text, lines = records
  first = [r for r in lines if r.get("measure") == "first_step"]
  assert {r["variant"] for r in first} == {"handwritten", "ctl steps_per_loop=1"}
  assert all(r["first_step_s"] > 0 and r["repetitions"] == 1 for r in first), first
  ps = [r for r in lines if r.get("measure") == "parameter_server"]
  assert sorted(r["variant"] for r in ps) == ["ctl steps_per_loop=1", "ctl steps_per_loop=10"]
  assert all(r["workers"] == 2 and r["ps"] == 1 and r["traces_after_first_call"] == 0
             for r in ps), ps
  cpu = [r for r in lines if "bfloat16_instructions" in r]
  assert len(cpu) == 1 and "avx512_bf16" in cpu[0]["features"], cpu
  targets = [r for r in lines if "target" in r]
  assert len(targets) >= 10 and all({"value", "met"} <= set(t) for t in targets), targets
  # The tiny targets have values; the DCGAN ones say they were not run.
  assert all(t["value"] is not None for t in targets if t["target"].startswith("tiny")), targets
  assert all(t["met"] is None for t in targets if t["target"].startswith("dcgan: ctl")), targets
  assert "targets:" in text and "CPU:" in text
  # A row without bfloat16 instructions says so instead of failing the target.
  bf16 = [t for t in targets if "mixed_bfloat16" in t["target"]]
  assert len(bf16) == 1
  if not cpu[0]["bfloat16_instructions"]:
    assert bf16[0]["met"] == "n/a"


def test_unknown_workload_is_named():
  proc = helpers.python(["bench/run.py", "--workloads", "tiny,resnet"], check=False)
  assert proc.returncode != 0
  assert "resnet" in proc.stderr and "tiny, dcgan, bigan" in proc.stderr, proc.stderr


def test_table_renders_every_row_and_the_kernel_line(tmp_path):
  row = {"workload": "tiny", "variant": "handwritten", "strategy": "default",
         "ms_per_step": 2.5, "examples_per_s": 102400.0, "ratio_to_handwritten": 1.0,
         "floor": "handwritten", "ratio_to_floor": 1.0,
         "peak_rss_mb": 900.0, "steps": 20, "repetitions": 2,
         "traces_after_first_call": 0, "gflop_per_step": 0.02, "gflop_per_s": 8.0,
         "share_of_ceiling": None}
  kernel = {"kernel": "dcgan dominant convolution", "ceiling_gflop_per_s": 90.0,
            "bfloat16_speed_vs_float32": 0.1}
  cpu = {"cpu": "a CPU", "cores": 2, "features": {"avx512_bf16": False}, "onednn": True,
         "bfloat16_instructions": False}
  first = {"measure": "first_step", "workload": "tiny", "variant": "handwritten",
           "strategy": "default", "first_step_s": 0.5, "min_s": 0.5, "max_s": 0.6,
           "ratio_to_handwritten": 1.0, "repetitions": 3}
  ps = {"measure": "parameter_server", "workload": "tiny", "strategy": "parameter_server",
        "variant": "ctl steps_per_loop=10", "workers": 2, "ps": 1, "ms_per_step": 5.0,
        "steps_per_s": 200.0, "ratio_to_one_step_per_call": 0.4, "steps": 200,
        "repetitions": 3, "traces_after_first_call": 0}
  target = {"target": "tiny: something", "value": 1.1, "met": False}
  lines = ["a table line", json.dumps(cpu), json.dumps(kernel), json.dumps(row),
           json.dumps(dict(row, variant="ctl steps_per_loop=1", input_wait_share=0.01)),
           json.dumps(first), json.dumps(ps), json.dumps(target)]
  (tmp_path / "bench.txt").write_text("\n".join(lines) + "\n")
  text = helpers.python(["bench/table.py", str(tmp_path / "bench.txt")]).stdout
  assert text.count("| tiny | default |") == 2
  assert "90.0 GFLOP/s" in text and "input wait 1.0%" in text
  assert "| tiny | handwritten | 0.500 |" in text  # the first-step table
  assert "| ctl steps_per_loop=10 | 5.000 | 200.0 | 0.400 |" in text
  assert "| tiny: something | 1.1 | no |" in text and "a CPU" in text


def test_eval_speed_prints_every_path_under_both_strategies():
  """bench/eval_speed.py, shrunk: every row there and complete (no timing asserts)."""
  proc = helpers.python(["bench/eval_speed.py", "--samples", "100", "--repeats", "1"],
                        timeout=600)
  rows = [json.loads(line) for line in proc.stdout.splitlines()
          if line.startswith("{") and "path" in line]
  assert {(r["strategy"], r["path"]) for r in rows} == {
      (strategy, path) for strategy in ("default", "mirrored:2")
      for path in ("chief only", "distributed, FID", "distributed, every metric")}
  for row in rows:
    assert row["samples"] == 100 and row["min_s"] <= row["median_s"] <= row["max_s"], row
    assert row["ratio_to_chief_only"] > 0
  assert "| 100 | mirrored:2 | distributed, FID |" in proc.stdout


def test_snapshot_cost_prints_each_way():
  """bench/snapshot_cost.py, shrunk: every way's times (no timing asserts)."""
  proc = helpers.python(["bench/snapshot_cost.py", "--variables", "3", "--megabytes", "1",
                         "--repetitions", "2"], timeout=300)
  [row] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert {way: len(v) for way, v in row["seconds"].items()} == {"none": 2, "held": 2,
                                                                "copied": 2}, row
  assert "| copied |" in proc.stdout


def test_save_stall_prints_each_way_and_the_ratio():
  """bench/save_stall.py, shrunk: the kit's dcgan row, complete (no timing asserts)."""
  proc = helpers.python(["bench/save_stall.py", "--models", "dcgan", "--steps", "6",
                         "--every", "2", "--tail", "2", "--repetitions", "1"], timeout=600)
  rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert [r["model"] for r in rows] == ["dcgan"], proc.stdout
  row = rows[0]
  assert row["scheduled_saves"] == 2 and row["parameters"] > 0 and row["tf_threads"] == "all"
  assert set(row["stall_seconds"]) == {"synchronous", "asynchronous"}
  assert all(len(v) == 1 for v in row["stall_each"].values())
  assert "| dcgan | 0.8M |" in proc.stdout


def test_save_stall_with_an_idle_host_saves_the_same_values():
  """--device-step: the step only waits, and each checkpoint holds what the real
  step's does (the optimizers' slots made at build); a negative wait is refused."""
  command = ["bench/save_stall.py", "--models", "dcgan", "--steps", "6", "--every", "2",
             "--tail", "2", "--repetitions", "1"]
  real, idle = (helpers.python(command + extra, timeout=600)
                for extra in ([], ["--device-step", "0.05"]))
  rows = [[json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
          for proc in (real, idle)]
  assert rows[1][0]["device_step"] == 0.05 and rows[0][0]["device_step"] is None
  assert rows[1][0]["saved_values"] == rows[0][0]["saved_values"], rows
  assert "each step waits 0.05 s" in idle.stdout
  proc = helpers.python(command + ["--device-step", "-1"], check=False)
  assert proc.returncode == 2 and "--device-step -1.0: use seconds >= 0" in proc.stderr


def test_gan_quality_quick_records_every_run_and_summary(tmp_path):
  """bench/gan_quality.py --quick on the main job (unconditional, its own step) and three
  kinds of config (conditional, BiGAN, stacked MNIST): every record complete (no quality
  asserts). The unconditional configs train in test_gan_examples."""
  proc = helpers.python(["bench/gan_quality.py", "--quick", "--configs",
                         "main_job,conditional_dcgan,bigan,stacked_mnist", "--first-seed", "1",
                         "--workdir", str(tmp_path)],
                        timeout=900)
  lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  floor = [line["floor"] for line in lines if "floor" in line]
  assert len(floor) == 1 and 0.3 < floor[0] < 1.0, floor  # the real-vs-real FID
  runs = {line["run"]["config"]: line["run"] for line in lines if "run" in line}
  assert sorted(runs) == ["bigan", "conditional_dcgan", "main_job", "stacked_mnist"]
  for config, run in runs.items():  # the main job is measured at its end only
    assert run["seed"] == 1 and f"seed1{os.sep}samples" in run["grid"], run
    assert [point["step"] for point in run["curve"]] == ([10] if config == "main_job"
                                                         else [5, 10]), run
    for point in run["curve"]:
      assert point["classifier_fid"] > 0 and point["num_samples"] == 500, point
      assert 0 < point["seconds"] <= run["seconds"], point
    assert run["grid"].endswith(".png") and os.path.exists(run["grid"])
  assert "label_accuracy" in runs["conditional_dcgan"]["curve"][-1]
  assert "encoder_1nn_accuracy" in runs["bigan"]["curve"][-1]
  stacked = runs["stacked_mnist"]["curve"][-1]
  assert 1 <= stacked["modes"] <= 500 and stacked["mode_kl"] >= 0, stacked
  assert stacked["mode_samples"] == 500, stacked
  summaries = [line["summary"] for line in lines if "summary" in line]
  assert [s["config"] for s in summaries] == ["main_job", "conditional_dcgan", "bigan",
                                              "stacked_mnist"]
  for summary in summaries:
    assert summary["seeds"] == 1 and summary["best_fid"][0] > 0
    assert {"reached_10x", "minutes_to_10x", "step_to_3x"} <= set(summary)
  # Each config's row names its target and whether it was met (not asserted: quality).
  assert re.search(r"\| conditional_dcgan \| ≤ 2x; label accuracy ≥ 0.97 \| – \| (met|not met) "
                   r"\| 10 \|", proc.stdout), proc.stdout
  assert "final_label_accuracy" in summaries[1] and "final_encoder_1nn_accuracy" in summaries[2]
  assert "final_modes" in summaries[3] and "final_mode_kl" in summaries[3]
  assert ("| stacked_mnist | ≥ 990 of 1,000 modes; KL ≤ 0.1 (26,000 samples) | PacGAN (Lin et "
          "al. 2018, Table 2)") in proc.stdout
