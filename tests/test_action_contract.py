"""The action contract: `begin` and `end` around each fit, metrics one action
reports and a later one reads at the same step, and the checkpointer an
action can ask to keep a checkpoint (`ctl.BestCheckpoints`, its proof)."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import ctl

from test_outer_loop import runner

# A made-up metric: its value at each step (lower is better).
VALUES = {2: 5.0, 4: 3.0, 6: 4.0, 8: 1.0, 10: 2.0, 12: 0.5, 14: 9.0}


class Reports(ctl.Action):
  """Reports `VALUES[step]` as "score" (an evaluation, as far as others can tell)."""

  def __init__(self, every):
    self.every = every

  def __call__(self, context):
    if context.step in VALUES:
      context.report({"score": VALUES[context.step]})


class Log(ctl.Action):
  """Records what the contract calls, in order."""
  collective = True

  def __init__(self, every=None):
    self.every = every
    self.calls = []

  def begin(self, context):
    self.calls.append(("begin", context.step))

  def __call__(self, context):
    self.calls.append(("call", context.step, context.metrics.get("score")))

  def end(self, context):
    self.calls.append(("end", context.step))


def test_begin_and_end_frame_every_fit_however_it_ends(tmp_path):
  log = Log(ctl.Every(steps=4))
  runner().fit(8, tmp_path, actions=[Reports(ctl.Every(steps=2)), log], progress=False)
  # At the last step, the scheduled call is the end's.
  assert log.calls == [("begin", 0), ("call", 4, 3.0), ("call", 8, 1.0), ("end", 8)]
  # A second fit of the same actions begins again, from the step it resumed at.
  log.calls.clear()
  runner().fit(10, tmp_path, actions=[log], progress=False)
  assert log.calls == [("begin", 8), ("call", 10, None), ("end", 10)]

  class Fails(ctl.Action):
    every = ctl.Every(steps=2)

    def __call__(self, context):
      raise RuntimeError("the action's own error")

  log.calls.clear()
  with pytest.raises(RuntimeError, match="the action's own error"):
    runner().fit(20, tmp_path, actions=[log, Fails()], progress=False)
  assert log.calls[0] == ("begin", 10) and log.calls[-1] == ("end", 12)


def test_a_metric_is_read_only_at_the_step_it_was_reported(tmp_path):
  log = Log(ctl.Every(steps=2))
  # Reported every 4 steps, read every 2: the steps between read nothing.
  runner().fit(8, tmp_path, actions=[Reports(ctl.Every(steps=4)), log], progress=False)
  assert [c for c in log.calls if c[0] == "call"] == [
      ("call", 2, None), ("call", 4, 3.0), ("call", 6, None), ("call", 8, 1.0)]


def test_reported_metrics_go_to_metrics_jsonl_and_a_resume_reports_later_steps_again(
    tmp_path):
  runner().fit(8, tmp_path, actions=[Reports(ctl.Every(steps=2))],
               checkpoint=ctl.Checkpoint(ctl.Every(steps=4)), progress=False)
  metrics = ctl.read_history(os.path.join(tmp_path, "metrics.jsonl"))
  assert metrics.steps.tolist() == [2, 4, 6, 8]
  assert metrics["score"].tolist() == [VALUES[s] for s in (2, 4, 6, 8)]
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    written = f.read()
  # A run killed after reporting at step 10 but before its checkpoint there:
  # the resume from step 8 reports step 10 again, once, and keeps the lines
  # before as they were written.
  with open(os.path.join(tmp_path, "metrics.jsonl"), "a") as f:
    f.write('{"step": 10, "score": 99.0}\n{"step": 12, "sco')  # the last line cut short
  runner().fit(12, tmp_path, actions=[Reports(ctl.Every(steps=2))], progress=False)
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    assert f.read().startswith(written)
  metrics = ctl.read_history(os.path.join(tmp_path, "metrics.jsonl"))
  assert metrics.steps.tolist() == [2, 4, 6, 8, 10, 12]
  assert metrics["score"].tolist() == [VALUES[s] for s in (2, 4, 6, 8, 10, 12)]


def kept(workdir):
  with open(os.path.join(workdir, "checkpoints", "best", "best.json")) as f:
    record = json.load(f)
  files = sorted(f for f in os.listdir(os.path.join(workdir, "checkpoints", "best"))
                 if f.endswith(".index"))
  return [(k["step"], k["value"]) for k in record["kept"]], files


def generator_weights(checkpoint_path):
  r = runner()
  tf.train.Checkpoint(models={"generator": r.models["generator"].variables}).restore(
      checkpoint_path).expect_partial()
  return [v.numpy() for v in r.models["generator"].variables]


def test_best_checkpoints_keeps_the_best_k_and_resumes_its_record(tmp_path):
  every = ctl.Every(steps=2)
  # Checkpoints every 4 steps, 2 kept: the best steps' own checkpoints are saved for it.
  fit = dict(checkpoint=ctl.Checkpoint(ctl.Every(steps=4), keep=2), progress=False)
  runner().fit(8, tmp_path, actions=[
      Reports(every), ctl.BestCheckpoints("score", every, keep=2)], **fit)
  assert kept(tmp_path) == ([(8, 1.0), (4, 3.0)], ["ckpt-4.index", "ckpt-8.index"])
  # Resumed: the record goes on, a better step displaces the worst.
  runner().fit(14, tmp_path, actions=[
      Reports(every), ctl.BestCheckpoints("score", every, keep=2)], **fit)
  assert kept(tmp_path) == ([(12, 0.5), (8, 1.0)], ["ckpt-12.index", "ckpt-8.index"])
  best = os.path.join(tmp_path, "checkpoints", "best")
  assert tf.train.latest_checkpoint(best) == os.path.join(best, "ckpt-12")
  # A kept checkpoint whose files were deleted by hand is dropped, not a crash.
  os.remove(os.path.join(best, "ckpt-8.index"))
  runner().fit(16, tmp_path, actions=[
      Reports(every), ctl.BestCheckpoints("score", every, keep=2)], **fit)
  assert kept(tmp_path) == ([(12, 0.5)], ["ckpt-12.index"])
  # A kept checkpoint holds the weights of its step: train a new run to step 12.
  reference = runner()
  reference.train(12)
  weights = generator_weights(os.path.join(best, "ckpt-12"))
  for a, b in zip(weights, reference.models["generator"].variables):
    np.testing.assert_allclose(a, b.numpy(), rtol=1e-6)


def test_best_checkpoints_refuses_a_fit_without_checkpoints_and_names_a_missing_metric(
    tmp_path, caplog):
  with pytest.raises(ValueError, match=r"BestCheckpoints\('score'\) keeps checkpoints, "
                     "and this fit saves none"):
    runner().fit(4, tmp_path, checkpoint=False, progress=False,
                 actions=[ctl.BestCheckpoints("score", ctl.Every(steps=2))])
  with caplog.at_level("WARNING", logger="ctl"):
    runner().fit(4, tmp_path / "other", progress=False, actions=[
        Reports(ctl.Every(steps=2)), ctl.BestCheckpoints("scroe", ctl.Every(steps=2))])
  assert "BestCheckpoints('scroe'): no action reported that metric" in caplog.text
  # Said at the first step where other metrics came, too, with the likely name.
  assert ("BestCheckpoints('scroe'): not among the metrics reported at step 2 (score) "
          "(did you mean 'score'?); nothing is kept until it is reported.") in caplog.text
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):  # listed before the action that reports
    runner().fit(4, tmp_path / "third", progress=False, actions=[
        ctl.BestCheckpoints("score", ctl.Every(steps=2)), Reports(ctl.Every(steps=2))])
  assert "reported only after this action ran at each step" in caplog.text
  for bad, message in (
      (dict(keep=0), "keep"), (dict(mode="lowest"), "use 'min'"),
      (dict(directory="a/b"), "folder name")):
    with pytest.raises((TypeError, ValueError), match=message):
      ctl.BestCheckpoints("score", **bad)


def test_metrics_of_an_earlier_step_are_not_this_steps(tmp_path, caplog):
  # Reported every 4 steps, kept every 2: at steps 2 and 6 nothing was reported,
  # and the metrics of step 4 must not pass for step 6's (no false typo warning).
  with caplog.at_level("WARNING", logger="ctl"):
    runner().fit(8, tmp_path, progress=False, actions=[
        Reports(ctl.Every(steps=4)), ctl.BestCheckpoints("score", ctl.Every(steps=2))])
  assert "not among the metrics" not in caplog.text
  assert [step for step, _ in kept(tmp_path)[0]] == [8, 4]


def test_the_loop_takes_parts_and_its_context_gives_actions_what_they_use(tmp_path):
  """`ctl.loop.fit.fit` is given the runner's parts, not the runner; an action
  reads the models, evaluates and exports through its `FitContext`, and
  `ctl.Evaluate` is refused before the first step when the fit has no evaluator."""
  from ctl.loop import fit as fit_lib  # pylint: disable=import-outside-toplevel
  seen = {}

  class Uses(ctl.Action):
    collective = True

    def check(self, context):
      seen["models"] = sorted(context.models)

    def __call__(self, context):
      seen["examples_per_step"] = context.examples_per_step
      seen["can_evaluate"] = context.can_evaluate
      seen["export"] = context.export("generator", str(tmp_path / "export"))

  r = runner()
  fit_lib.fit(r.compiled_step, r.history, 2, str(tmp_path / "run"), actions=[Uses()],
              progress=False)
  assert seen["models"] == sorted(r.models) and seen["can_evaluate"] is False
  assert seen["examples_per_step"] == r.feed.global_batch_size
  assert all(os.path.exists(path) for path in seen["export"])
  evaluate = ctl.Evaluate(lambda ctx, x: {"n": 1.0}, tf.data.Dataset.range(2).batch(1))
  with pytest.raises(ValueError, match="ctl.Evaluate needs a fit with an evaluator"):
    fit_lib.fit(r.compiled_step, r.history, 4, None, actions=[evaluate], progress=False)
  assert int(r.global_step.numpy()) == 2  # refused before the first step


def test_an_action_off_the_contract_is_told_the_contract_before_the_first_step(tmp_path):
  class GuessedCheck(ctl.Action):
    def check(self, runner, workdir):  # another library's signature
      pass

  class UsesRunner(ctl.Action):
    every = ctl.Every(steps=2)

    def __call__(self, context):
      return context.runner.models

  r = runner()
  with pytest.raises(TypeError, match=r"GuessedCheck.check\(runner, workdir\) does not take "
                     r"the fit's context: the contract is check\(self, context\)"):
    r.fit(4, tmp_path, actions=[GuessedCheck()], progress=False)
  assert int(r.global_step.numpy()) == 0
  with pytest.raises(AttributeError, match="FitContext has no runner: .* context.models"):
    r.fit(4, tmp_path, actions=[UsesRunner()], progress=False)


def test_going_back_sets_the_later_best_copies_aside_with_their_record(tmp_path):
  """`resume_from=4` after steps 8 and 12 were kept as the best: their copies move
  into checkpoints/after-ckpt-4/best/ with best.json as it was (they used to be
  deleted when the resumed run dropped later steps from its record), and the new
  branch keeps its own best."""
  every = ctl.Every(steps=2)
  fit = dict(progress=False, actions=[Reports(every),
                                      ctl.BestCheckpoints("score", every, keep=2)])
  runner().fit(14, tmp_path, checkpoint=ctl.Checkpoint(ctl.Every(steps=4), keep=10), **fit)
  record = os.path.join(tmp_path, "checkpoints", "best", "best.json")
  with open(record) as f:
    before = f.read()
  best = os.path.join(tmp_path, "checkpoints", "best")
  weights = generator_weights(os.path.join(best, "ckpt-12"))
  runner().fit(6, tmp_path, checkpoint=ctl.Checkpoint(ctl.Every(steps=4), keep=10,
                                                      resume_from=4), **fit)
  aside = os.path.join(tmp_path, "checkpoints", "after-ckpt-4", "best")
  assert sorted(f for f in os.listdir(aside) if f.endswith(".index")) == [
      "ckpt-12.index", "ckpt-8.index"]
  with open(os.path.join(aside, "best.json")) as f:
    assert f.read() == before
  for a, b in zip(generator_weights(os.path.join(aside, "ckpt-12")), weights):
    np.testing.assert_array_equal(a, b)
  assert kept(tmp_path) == ([(6, 4.0)], ["ckpt-6.index"])  # the new branch's own


def test_restore_picks_the_best_kept_checkpoint_or_the_newest(tmp_path):
  every = ctl.Every(steps=2)
  runner().fit(10, tmp_path, checkpoint=ctl.Checkpoint(ctl.Every(steps=4)), progress=False,
               actions=[Reports(every), ctl.BestCheckpoints("score", every, keep=2)])
  assert runner().restore(str(tmp_path)) == 10
  best = runner()
  assert best.restore(str(tmp_path), "best") == 8  # VALUES: 1.0 at step 8, the lowest
  reference = runner()
  reference.train(8)
  for a, b in zip(best.models["generator"].variables, reference.models["generator"].variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
  with pytest.raises(FileNotFoundError, match=r"no kept checkpoint in .*ctl.BestCheckpoints.*"
                     r"the folders of kept checkpoints there are \['best'\]"):
    runner().restore(str(tmp_path), "bset")
  with pytest.raises(ValueError, match="give 'newest', 'best'"):
    runner().restore(str(tmp_path), os.path.join("..", "best"))
