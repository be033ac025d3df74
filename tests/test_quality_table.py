"""bench/gan_quality.py's table: rows from separate invocations meet in one file,
and each config is judged against its target from the figures alone (no training)."""

import json
import os
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import gan_quality  # noqa: E402  (bench/ is no package)

FLOOR = 0.6
CPU = {"cpu": "test CPU", "cores": 2, "bfloat16_instructions": False}


def _run(config, seed, curve, seconds=170.0):
  return {"config": config, "seed": seed, "seconds": seconds,
          "curve": [{"step": step, "seconds": t, "classifier_fid": fid, **extra}
                    for step, t, fid, extra in curve], "grid": None}


def test_rows_of_two_invocations_share_one_table_and_are_judged(tmp_path):
  docs = str(tmp_path)
  main = [_run("main_job", seed, [(2800, 165.0, fid, {"precision": 0.7})])
          for seed, fid in enumerate([5.0, 5.5, 5.9])]  # all under 10 x 0.6 = 6
  main_row = gan_quality.summarize("main_job", main, FLOOR)
  assert main_row["reached_10x"] == 3 and main_row["best_fid"][0] == pytest.approx(5.4667, 1e-4)
  gan_quality.save_row(docs, "main_job", main_row, "python bench/gan_quality.py --configs main_job",
                       CPU)
  scores = {"classifier_score_32": 7.0, "real_score_32": 8.0}  # ratio 0.875 < 0.95
  tfgan = [_run("tfgan_mnist", 0, [(500, 30.0, 40.0, {}), (5000, 300.0, 9.0, dict(scores))])]
  tfgan_row = gan_quality.summarize("tfgan_mnist", tfgan, FLOOR)
  assert tfgan_row["final_score_32_ratio"][0] == pytest.approx(0.875)
  results = gan_quality.save_row(docs, "tfgan_mnist", tfgan_row,
                                 "python bench/gan_quality.py --configs tfgan_mnist", CPU)
  assert sorted(results) == ["main_job", "tfgan_mnist"]  # the first invocation's row kept
  with open(os.path.join(docs, "quality", "results.json")) as f:
    assert sorted(json.load(f)) == ["main_job", "tfgan_mnist"]
  text = gan_quality.markdown(results)
  main_line = next(line for line in text.splitlines() if line.startswith("| main_job | ≤"))
  assert "| met |" in main_line and "5.47 ± 0.45 (9.1x)" in main_line
  tfgan_line = next(line for line in text.splitlines() if line.startswith("| tfgan_mnist | s"))
  assert "| not met |" in tfgan_line
  assert "`python bench/gan_quality.py --configs tfgan_mnist`" in text


@pytest.mark.parametrize("config", gan_quality.CONFIGS)
def test_every_configs_target_can_be_judged(config):
  final = {"label_accuracy": 0.98, "encoder_1nn_accuracy": 0.9,
           "random_encoder_1nn_accuracy": 0.5, "pixels_1nn_accuracy": 0.8,
           "reconstruction_ratio": 0.5, "classifier_score_32": 7.9, "real_score_32": 8.0}
  good = [_run(config, 0, [(100, 60.0, 1.1, final)])]  # under 2x 0.6 in a minute
  assert gan_quality.met(gan_quality.summarize(config, good, FLOOR)) == "met"
  bad = [_run(config, 0, [(100, 60.0, 30.0, dict(final, label_accuracy=0.5,
                                                   reconstruction_ratio=0.9,
                                                   classifier_score_32=5.0))])]
  assert gan_quality.met(gan_quality.summarize(config, bad, FLOOR)) == "not met"


def test_the_main_job_misses_its_target_when_one_seed_misses_or_it_is_slow():
  slow = [_run("main_job", 0, [(2800, 200.0, 5.0, {})], seconds=200.0)]
  assert gan_quality.met(gan_quality.summarize("main_job", slow, FLOOR)) == "not met"
  one_misses = [_run("main_job", s, [(2800, 100.0, fid, {})]) for s, fid in enumerate([5, 7])]
  assert gan_quality.met(gan_quality.summarize("main_job", one_misses, FLOOR)) == "not met"
