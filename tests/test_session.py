"""One owner per concern in a fit: the `Session` is the only place that saves
or restores, and an action sees a small `FitContext`."""

import ast
import inspect
import os

import numpy as np
import pytest

import ctl
from ctl.loop import checkpoints

from helpers import ROOT
from test_outer_loop import runner

# What an action may rely on: the whole public face of `ctl.FitContext`.
CONTEXT = ["agree", "can_evaluate", "evaluate", "examples_per_step", "export", "history",
           "is_chief", "keep", "metrics", "models", "optimizers", "over_samples", "report",
           "results", "step", "workdir"]


def _calls(method, receiver_words):
  """`path:line` of each call `<x>.method(...)` in ctl/ whose receiver's text
  holds one of `receiver_words`."""
  found = []
  for directory, _, files in os.walk(os.path.join(ROOT, "ctl")):
    for name in sorted(files):
      if not name.endswith(".py"):
        continue
      path = os.path.join(directory, name)
      with open(path) as f:
        tree = ast.parse(f.read(), path)
      for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
            and any(word in ast.unparse(node.func.value).lower() for word in receiver_words)):
          found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
  return found


def test_the_session_is_the_one_place_that_saves_and_restores():
  saves = _calls("save", ("checkpointer", "manager"))
  # The session's save; inside it, the Checkpointer's write through TF's manager.
  assert [s.split(":")[0] for s in saves] == ["ctl/loop/checkpoints.py",
                                              "ctl/loop/session.py"], saves
  restores = _calls("restore", ("checkpointer",))
  # The session's (a fit's, a dry run's read of the real run), and Runner.restore
  # (a trained run's, for evaluation or export: no fit).
  assert {s.split(":")[0] for s in restores} == {"ctl/loop/session.py", "ctl/runner.py"}
  assert len([s for s in restores if s.startswith("ctl/runner.py")]) == 1, restores
  assert not _calls("keep", ("checkpointer",)) and not _calls("copy_newest", ("context",))


class Reports(ctl.Action):
  every = ctl.Every(steps=2)
  collective = True

  def __init__(self):
    self.seen = []

  def __call__(self, context):
    self.seen = sorted(n for n in dir(context) if not n.startswith("_"))
    context.report({"score": 1.0 / (1 + context.step)})


class FailsAt(ctl.Action):
  every = ctl.Every(steps=2)

  def __call__(self, context):
    if context.step == 4:
      raise RuntimeError("a bug in an action")


def test_every_save_of_a_fit_goes_through_its_session(tmp_path, monkeypatch):
  callers = []
  save = checkpoints.Checkpointer.save

  def recorded(self, **kwargs):
    callers.append(os.path.basename(inspect.stack()[1].filename))
    return save(self, **kwargs)

  monkeypatch.setattr(checkpoints.Checkpointer, "save", recorded)
  reports = Reports()
  r = runner(steps_per_loop=2)
  r.fit(6, str(tmp_path / "a"), checkpoint=ctl.Checkpoint(ctl.Every(steps=4)), progress=False,
        actions=[reports, ctl.BestCheckpoints("score", ctl.Every(steps=2), mode="max")])
  r.fit(8, str(tmp_path / "a"), progress=False, dry_run=True)
  with pytest.raises(RuntimeError, match="a bug in an action"):
    runner(steps_per_loop=2).fit(6, str(tmp_path / "b"), progress=False, actions=[FailsAt()])
  assert len(callers) > 5 and set(callers) == {"session.py"}, callers
  assert reports.seen == CONTEXT


def test_only_the_tensorboard_logger_writes_a_fits_events():
  writes = []
  for directory, _, files in os.walk(os.path.join(ROOT, "ctl")):
    for name in files:
      path = os.path.join(directory, name)
      if name.endswith(".py") and not path.endswith(os.path.join("tools", "sweep_table.py")):
        with open(path) as f:  # (a sweep's table is no fit's record)
          writes += [f"{os.path.relpath(path, ROOT)}:{i}" for i, line in enumerate(f, 1)
                     if "tf.summary." in line and "noop" not in line]
  assert {w.split(":")[0] for w in writes} == {"ctl/loop/loggers.py"}, writes


class Tracker(ctl.Logger):
  def __init__(self):
    self.metrics = {}

  def log_metrics(self, step, metrics):
    self.metrics[step] = dict(metrics)


class GradientNorm(ctl.Action):
  every = ctl.Every(steps=2)

  def __call__(self, context):
    context.report({"norm": float(context.step)})


def test_one_report_reaches_tensorboard_metrics_jsonl_and_every_logger(tmp_path):
  from test_outer_loop import events  # pylint: disable=import-outside-toplevel
  from test_outer_loop import scalars  # pylint: disable=import-outside-toplevel
  tracker = Tracker()
  runner(steps_per_loop=2).fit(4, str(tmp_path), actions=[GradientNorm()], loggers=[tracker],
                               progress=False)
  assert tracker.metrics == {2: {"norm": 2.0}, 4: {"norm": 4.0}}
  assert scalars(events(str(tmp_path / "events" / "eval")), "norm") == {2: 2.0, 4: 4.0}
  assert [row["norm"] for row in ctl.read_history(str(tmp_path / "metrics.jsonl")).rows()] == [
      2.0, 4.0]


class Measures(ctl.Action):
  every = ctl.Every(steps=2)
  collective = True
  broken = True

  def __call__(self, context):
    if context.step == 4 and Measures.broken:
      raise RuntimeError("a bug in an action")
    context.report({"score": float(context.step)})


def test_an_action_that_failed_runs_first_when_the_fixed_run_resumes(tmp_path, caplog):
  with pytest.raises(RuntimeError, match="a bug in an action") as raised:
    runner(steps_per_loop=2).fit(6, str(tmp_path), actions=[Measures()], progress=False)
  assert any("it runs Measures at step 4 first" in note for note in raised.value.__notes__)
  Measures.broken = False  # fixed
  with caplog.at_level("WARNING", logger="ctl"):
    runner(steps_per_loop=2).fit(6, str(tmp_path), actions=[Measures()], progress=False)
  assert "running again at step 4 what a stop abandoned there: Measures" in caplog.text
  assert [row["step"] for row in ctl.read_history(str(tmp_path / "metrics.jsonl")).rows()] == [
      2, 4, 6]


def test_a_name_that_left_the_context_names_its_replacement(tmp_path):
  class Old(ctl.Action):
    def __call__(self, context):
      context.publish({"score": 1.0})

  with pytest.raises(AttributeError, match=r"FitContext has no publish: use context.report"):
    runner().fit(2, None, actions=[Old()], progress=False)
  class Flat(ctl.Action):
    def __call__(self, context):
      context.report(images={"grid": np.zeros((4, 4))})

  with pytest.raises(ValueError, match=r"images=\{'grid': ...\}\): an image is \[height, "
                     r"width, channels\].*got shape \(4, 4\)"):
    runner().fit(2, str(tmp_path), actions=[Flat()], progress=False)
