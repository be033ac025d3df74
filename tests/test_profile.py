"""`ctl.Profile` and `ctl train --profile`: a profiler trace of a few steps,
written where TensorBoard's profile plugin finds it.

    .venv/bin/python -m pytest -o addopts="" -n 0 -q tests/test_profile.py
"""

import glob
import logging
import os
from unittest import mock

import pytest
import tensorflow as tf

import ctl
from ctl import cli

import helpers
import test_outer_loop as toy

# TensorBoard's profile plugin reads <logdir>/plugins/profile/<session>/<host>.xplane.pb.
TRACES = os.path.join("events", "train", "plugins", "profile", "*", "*.xplane.pb")


def traces(workdir):
  return glob.glob(os.path.join(str(workdir), TRACES))


def fit_counting_calls(runner, total_steps, workdir, actions):
  """`runner.fit`; the number of steps of each compiled call."""
  calls = []
  run_steps = runner.compiled_step.run

  def spy(n):
    calls.append(int(n))
    return run_steps(n)

  with mock.patch.object(runner.compiled_step, "run", spy):
    runner.fit(total_steps, str(workdir) if workdir else None, actions=actions,
               progress=False)
  return calls


def test_profile_traces_the_steps_asked_for(tmp_path, caplog):
  runner = toy.runner(steps_per_loop=5)
  with caplog.at_level(logging.INFO, logger="ctl"):
    calls = fit_counting_calls(runner, 8, tmp_path, [ctl.Profile(start=2, steps=2)])
  assert calls == [2, 2, 4]  # landed on step 2 (trace starts) and 4 (it stops)
  [trace] = traces(tmp_path)
  with open(trace, "rb") as f:
    assert b"_in_graph_loop" in f.read()  # the compiled call (ctl/parts/steps.py) is in it
  assert "traced steps 2 to 4 into" in caplog.text
  tf.profiler.experimental.start(str(tmp_path / "mine"))  # no profiler left running
  tf.profiler.experimental.stop()


def test_profile_stops_at_the_end_of_a_shorter_fit(tmp_path, caplog):
  runner = toy.runner(steps_per_loop=5)
  with caplog.at_level(logging.INFO, logger="ctl"):
    calls = fit_counting_calls(runner, 5, tmp_path, [ctl.Profile(start=3, steps=10)])
  assert calls == [3, 2]
  assert len(traces(tmp_path)) == 1
  assert "traced steps 3 to 5 (the fit ended 8 steps early)" in caplog.text


def test_profile_stops_when_the_fit_fails_mid_trace(tmp_path):
  class Fail(ctl.Action):
    every = ctl.Every(steps=3)

    def __call__(self, context):
      raise RuntimeError("a failing action")

  runner = toy.runner(steps_per_loop=5)
  with pytest.raises(RuntimeError, match="a failing action"):
    runner.fit(8, str(tmp_path), actions=[ctl.Profile(start=2, steps=4), Fail()],
               progress=False)
  assert int(runner.global_step.numpy()) == 3
  assert len(traces(tmp_path)) == 1  # the trace of steps 2 to 3, stopped and written
  tf.profiler.experimental.start(str(tmp_path / "mine"))
  tf.profiler.experimental.stop()


def test_profile_of_a_fit_that_ends_where_it_would_start(tmp_path, caplog):
  runner = toy.runner(steps_per_loop=2)
  with caplog.at_level(logging.INFO, logger="ctl"):
    calls = fit_counting_calls(runner, 2, tmp_path, [ctl.Profile(start=2, steps=2)])
  assert calls == [2]
  assert not traces(tmp_path)  # nothing to trace: the end is not the start of a trace
  assert "the fit ended at step 2, not past step 2 where the trace starts" in caplog.text


def test_profile_says_a_fit_resumed_past_its_whole_window_is_not_profiled(tmp_path, caplog):
  fit_counting_calls(toy.runner(steps_per_loop=4), 8, tmp_path, [])
  with caplog.at_level(logging.INFO, logger="ctl"):
    fit_counting_calls(toy.runner(steps_per_loop=4), 12, tmp_path,
                       [ctl.Profile(start=2, steps=2)])
  assert "this fit starts at step 8, not before step 2" in caplog.text


def test_a_trace_that_cannot_be_written_does_not_hide_why_fit_ends(tmp_path, caplog):
  (tmp_path / "events" / "train").mkdir(parents=True)  # the run's events go here,
  (tmp_path / "events" / "train" / "plugins").write_text("where the trace's directory goes")
  with caplog.at_level(logging.WARNING, logger="ctl"), pytest.raises(FloatingPointError):
    toy.runner(steps_per_loop=2).fit(
        8, str(tmp_path), progress=False, summaries=False,
        actions=[ctl.Profile(start=2, steps=4), NaNAt(4)])
  assert "could not be written" in caplog.text


class NaNAt(ctl.Action):
  """Makes the generator's weights NaN at `step`: the next call's results are NaN."""

  def __init__(self, step):
    self.every = ctl.Every(steps=step)

  def __call__(self, context):
    for weight in context.models["generator"].weights:
      weight.assign(tf.fill(weight.shape, float("nan")))


def test_profile_is_skipped_by_a_run_resumed_past_its_start(tmp_path, caplog):
  fit_counting_calls(toy.runner(steps_per_loop=3), 3, tmp_path, [])
  with caplog.at_level(logging.INFO, logger="ctl"):
    calls = fit_counting_calls(toy.runner(steps_per_loop=5), 8, tmp_path,
                               [ctl.Profile(start=2, steps=2)])
  assert calls == [5]  # resumed at 3: no call shortened for the profile
  assert not traces(tmp_path)
  assert "this fit starts at step 3, not before step 2" in caplog.text


@pytest.mark.parametrize("kwargs, error, words", [
    ({"start": 0, "steps": 2}, ValueError, ("ctl.Profile: start", "got 0", "start at 1")),
    ({"start": -1, "steps": 2}, ValueError, ("ctl.Profile: start", "got -1")),
    ({"start": 2, "steps": 0}, ValueError, ("ctl.Profile: steps", "got 0", "steps=5")),
    ({"start": 2.5, "steps": 2}, TypeError, ("ctl.Profile: start", "got 2.5")),
])
def test_profile_refuses_bad_arguments(kwargs, error, words):
  with pytest.raises(error) as raised:
    ctl.Profile(**kwargs)
  for word in words:
    assert word in str(raised.value)


def test_profile_needs_a_workdir():
  with pytest.raises(ValueError, match="ctl.Profile writes files but workdir is None"):
    toy.runner(steps_per_loop=1).fit(2, None, checkpoint=False, summaries=False,
                     actions=[ctl.Profile(start=1, steps=1)], progress=False)


@pytest.mark.parametrize("value", ["10", "a:b", "1:0", "0:2", "1:2:3"])
def test_cli_refuses_a_bad_profile_option(value, capsys):
  with pytest.raises(SystemExit) as raised:
    cli.main(["train", "dcgan.gin", "--profile", value])
  assert raised.value.code == 2
  err = capsys.readouterr().err
  assert f"--profile: {value!r}" in err and "START:STEPS" in err


@pytest.mark.slow
def test_ctl_train_profile_writes_a_trace(tmp_path):
  config = os.path.join(helpers.ROOT, "examples", "configs", "dcgan.gin")
  helpers.ctl("train", config, "--workdir", str(tmp_path), "--profile", "1:2",
              *helpers.TINY_GAN)
  assert len(traces(tmp_path)) == 1
