"""`fit(dry_run=True)` and `ctl train --dry-run`: every part once, tiny, in a
scratch directory; the runner put back exactly; the work directory untouched."""

import logging
import os

import numpy as np
import pytest

import ctl

import helpers
import test_outer_loop
from helpers import TINY_GAN


class Measures(ctl.Action):
  """At the end: an evaluation over 1000 samples, as the GAN kit's FID."""
  collective = True

  def __init__(self):
    self.counts = []

  def __call__(self, context):
    out = context.over_samples(lambda models, indices: {"i": indices}, 1000)
    self.counts.append(len(out["i"]))


class Fails(ctl.Action):
  """A bug in the user's sample function, an hour into the real run."""

  def __call__(self, context):
    raise ZeroDivisionError("the sample function divides by zero")


def actions():
  return [ctl.Samples(lambda models: np.zeros((4, 2, 2, 1)), ctl.Every(steps=4)),
          ctl.Evaluate(test_outer_loop.score_step, test_outer_loop.data(),
                       ctl.Every(steps=8)),
          ctl.Export("generator"), Measures()]


def weights(runner):
  return [v.numpy() for model in runner.models.values() for v in model.weights]


def test_a_dry_run_runs_each_part_once_and_puts_the_runner_back(tmp_path, caplog):
  runner = test_outer_loop.runner(steps_per_loop=4)
  measured = actions()
  with caplog.at_level(logging.INFO, logger="ctl"):
    dry = runner.fit(1000, str(tmp_path / "run"), actions=measured, dry_run=True)
  assert list(dry.steps) == [0]  # one compiled call of one step
  assert not (tmp_path / "run").exists()
  assert int(runner.global_step.numpy()) == 0 and len(runner.history.steps) == 0
  line = next(r.getMessage() for r in caplog.records if "dry run:" in r.getMessage())
  for part in ("compiled call of 1 step", "checkpoint save", "Summaries", "Samples",
               "Evaluate", "Export", "Measures", "restore ckpt-1"):
    assert part in line, line
  assert measured[-1].counts == [16]  # a handful of samples, not 1000

  # The same run as one never dry-run: weights, slots, step and data position back.
  runner.fit(8, str(tmp_path / "after"), progress=False)
  fresh = test_outer_loop.runner(steps_per_loop=4)
  fresh.fit(8, str(tmp_path / "fresh"), progress=False)
  for mine, theirs in zip(weights(runner), weights(fresh)):
    np.testing.assert_array_equal(mine, theirs)
  for key in fresh.history:
    np.testing.assert_array_equal(runner.history[key], fresh.history[key])


def test_a_dry_run_of_a_started_run_restores_its_checkpoint_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  test_outer_loop.runner().fit(8, str(workdir), progress=False)
  before = {p: os.stat(os.path.join(d, p)).st_mtime_ns
            for d, _, files in os.walk(workdir) for p in files}
  runner = test_outer_loop.runner()
  dry = runner.fit(100, str(workdir), actions=actions(), dry_run=True)
  assert list(dry.steps) == [8]  # trained on from the run's checkpoint
  assert int(runner.global_step.numpy()) == 0  # and put back where it was
  after = {p: os.stat(os.path.join(d, p)).st_mtime_ns
           for d, _, files in os.walk(workdir) for p in files}
  assert after == before


def test_a_dry_run_of_a_resume_under_another_seed_says_so(tmp_path, caplog):
  test_outer_loop.runner(seed=0).fit(8, str(tmp_path), progress=False)
  with caplog.at_level(logging.INFO, logger="ctl"):
    test_outer_loop.runner(seed=1).fit(8, str(tmp_path), dry_run=True)
  assert f"this fit resumes {tmp_path} at step 8" in caplog.text
  assert "seed was 0 and is now 1" in caplog.text
  assert "the real run would train nothing" in caplog.text  # it is at total_steps


def test_a_dry_run_shows_a_bug_of_the_end_in_seconds_and_leaves_nothing(tmp_path):
  runner = test_outer_loop.runner()
  with pytest.raises(ZeroDivisionError, match="divides by zero"):
    runner.fit(100_000, str(tmp_path / "run"), actions=[Fails()], dry_run=True)
  assert int(runner.global_step.numpy()) == 0
  assert not (tmp_path / "run").exists()


def test_dry_run_must_be_a_bool(tmp_path):
  with pytest.raises(TypeError, match="pass True or False"):
    test_outer_loop.runner().fit(4, str(tmp_path), dry_run="yes")


@pytest.mark.slow
def test_ctl_train_dry_run_reports_each_part_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  proc = helpers.ctl("train", os.path.join("examples", "configs", "dcgan.gin"), "--workdir",
                     str(workdir), *TINY_GAN, "--gin", "gan.Schedule.fid_every = 2",
                     "--gin", "generatr/keras.optimizers.Adam.learning_rate = 1e-3",
                     "--dry-run")
  assert f"nothing was written to {workdir}" in proc.stdout
  assert "dry run: every part ran once" in proc.stderr, proc.stderr[-3000:]
  assert "ClassifierFID" in proc.stderr and "16 samples" in proc.stderr
  assert not workdir.exists()
  # The misspelt scope the real run would list as unused (the dry run said nothing).
  warning = proc.stderr[proc.stderr.index("ctl train: warning: this dry run used none"):]
  listed = warning.splitlines()[1:3]
  assert listed[0] == "  generatr/keras.optimizers.Adam.learning_rate", warning
  assert listed[1].startswith("gin checks"), warning  # the only one: no false alarms
