"""Every step's numbers: `ctl.History`, `<workdir>/history.jsonl` across resumes,
`runner.history`, and `ctl.EachStep`."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.loop import history as history_lib

import toy_gan

GLOBAL_BATCH = 8
NOISE = 3


def build():
  models = {"generator": toy_gan.mlp("generator", NOISE, 2, hidden=None),
            "discriminator": toy_gan.mlp("discriminator", 2, 1, hidden=None)}
  optimizers = {name: keras.optimizers.SGD(0.05) for name in models}
  return models, optimizers


def data(poison_batch=None):
  x = np.linspace(-2, 2, 64 * 2, dtype="float32").reshape(64, 2)
  if poison_batch is not None:
    x[poison_batch * GLOBAL_BATCH] = np.nan
  return toy_gan.batches(x, GLOBAL_BATCH)


def runner(steps_per_loop=4, poison_batch=None):
  return ctl.Runner(toy_gan.make_step(NOISE), build, data(poison_batch).repeat(),
                    steps_per_loop=steps_per_loop, seed=3)


def lines(workdir):
  with open(workdir / "history.jsonl") as f:
    return [json.loads(line) for line in f]


def test_history_is_a_mapping_of_per_step_arrays():
  history = ctl.History()
  history.append(0, {"a": np.array([1.0, 2.0]), "b": np.array([3.0, 4.0])})
  history.append(2, {"a": np.array([5.0])})  # a step that did not return "b"
  np.testing.assert_array_equal(history.steps, [0, 1, 2])
  np.testing.assert_array_equal(history["a"], [1, 2, 5])
  np.testing.assert_array_equal(history["b"], [3, 4, np.nan])
  assert sorted(history) == ["a", "b"] and len(history) == 2
  assert list(history.rows())[2] == {"step": 2, "a": 5.0}
  history.drop_from(1)
  np.testing.assert_array_equal(history.steps, [0])
  with pytest.raises(KeyError, match="its keys are \\['a', 'b'\\]"):
    history["c"]  # noqa: B018


def test_many_one_step_calls_are_joined_into_few_arrays():
  history = ctl.History()
  for step in range(1000):  # fit with steps_per_loop=1: one append per step
    history.append(step, {"a": np.float32([step])})
  history.append(2000, {"a": np.float32([7, 8])})  # not contiguous: a chunk of its own
  np.testing.assert_array_equal(history.steps, list(range(1000)) + [2000, 2001])
  np.testing.assert_array_equal(history["a"], list(range(1000)) + [7, 8])
  assert sum(1 for _ in history.rows()) == 1002


def test_plot_draws_a_panel_per_key():
  pytest.importorskip("matplotlib")
  history = ctl.History()
  history.append(10, {"d_loss": np.linspace(1, 0, 50), "g_loss": np.linspace(0, 1, 50)})
  figure = history.plot(smoothing=0.9, title="toy")
  assert [axis.get_ylabel() for axis in figure.axes] == ["d_loss", "g_loss"]
  assert figure.axes[0].lines[-1].get_xdata()[0] == 10
  assert len(history.plot("g_loss").axes) == 1
  with pytest.raises(ValueError, match="smoothing=1"):
    history.plot(smoothing=1)
  with pytest.raises(ValueError, match="no steps yet"):
    ctl.History().plot()


def test_fit_writes_every_step_once_and_returns_a_history(tmp_path):
  r = runner()
  returned = r.fit(10, tmp_path, progress=False)
  assert isinstance(returned, ctl.History)
  rows = lines(tmp_path)
  assert [row["step"] for row in rows] == list(range(10))
  for key in ("discriminator_loss", "generator_loss"):
    np.testing.assert_array_equal(np.float32([row[key] for row in rows]), returned[key])
    np.testing.assert_array_equal(r.history[key], returned[key])
  np.testing.assert_array_equal(ctl.read_history(str(tmp_path)).steps, np.arange(10))
  pandas = pytest.importorskip("pandas")
  frame = pandas.read_json(tmp_path / "history.jsonl", lines=True)
  assert list(frame.columns) == ["step", "discriminator_loss", "generator_loss"]
  assert len(frame) == 10


def test_a_resume_drops_the_steps_after_its_checkpoint(tmp_path):
  reference = runner().fit(8, None, progress=False)
  runner().fit(4, tmp_path, progress=False)  # checkpoint at step 4
  # As after a crash at step 7: lines of steps 4-6 past the checkpoint, the last cut short.
  with open(tmp_path / "history.jsonl", "a") as f:
    f.write("".join(json.dumps({"step": s, "discriminator_loss": 99.0,
                                "generator_loss": 99.0}) + "\n" for s in (4, 5, 6)))
    f.write('{"step": 7, "discrimin')
  resumed = runner()
  ran = resumed.fit(8, tmp_path, progress=False)
  np.testing.assert_array_equal(ran.steps, np.arange(4, 8))
  rows = lines(tmp_path)
  assert [row["step"] for row in rows] == list(range(8))
  for key in reference:
    np.testing.assert_array_equal(np.float32([row[key] for row in rows]), reference[key])
    # A new runner's history starts from the file: the whole run, not only this call.
    np.testing.assert_array_equal(resumed.history[key], reference[key])
  assert resumed.fit(8, tmp_path, progress=False) == {}  # done: nothing appended
  assert len(lines(tmp_path)) == 8


def test_a_new_file_starts_with_the_steps_trained_before_fit(tmp_path):
  r = runner()
  trained = r.train(4)  # in memory, as in a notebook, then fit into a workdir
  r.fit(8, tmp_path, progress=False)
  rows = lines(tmp_path)
  assert [row["step"] for row in rows] == list(range(8))
  np.testing.assert_array_equal(np.float32([row["generator_loss"] for row in rows[:4]]),
                                trained["generator_loss"])
  resumed = runner()
  resumed.fit(12, tmp_path, progress=False)
  np.testing.assert_array_equal(resumed.history.steps, np.arange(12))


def test_train_appends_to_the_runner_history():
  r = runner(steps_per_loop=3)
  first, second = r.train(4), r.train(3)
  np.testing.assert_array_equal(second.steps, [4, 5, 6])
  np.testing.assert_array_equal(r.history.steps, np.arange(7))
  np.testing.assert_array_equal(
      r.history["generator_loss"],
      np.concatenate([first["generator_loss"], second["generator_loss"]]))


def test_the_steps_up_to_a_nan_are_written(tmp_path):
  with pytest.raises(FloatingPointError, match="step 5"):
    runner(steps_per_loop=4, poison_batch=5).fit(8, tmp_path, progress=False)
  rows = lines(tmp_path)
  # The call of steps 4-7 up to the NaN's step: not 6 and 7, run on NaN weights.
  assert [row["step"] for row in rows] == list(range(6))
  assert np.isfinite(rows[4]["discriminator_loss"])
  assert np.isnan(rows[5]["discriminator_loss"])


def test_each_step_gets_every_step_without_shortening_calls(tmp_path):
  seen = []
  r = runner(steps_per_loop=4)
  calls = []
  run_steps = r.compiled_step.run
  r.compiled_step.run = lambda n: calls.append(n) or run_steps(n)
  ran = r.fit(10, tmp_path, progress=False, summaries=False,
              loggers=[ctl.EachStep(lambda step, values: seen.append((step, values)))])
  assert calls == [4, 4, 2]
  assert [step for step, _ in seen] == list(range(10))
  np.testing.assert_allclose([v["generator_loss"] for _, v in seen], ran["generator_loss"])
  with pytest.raises(TypeError, match="EachStep fn must be a function"):
    ctl.EachStep("print")


def test_each_step_given_to_a_second_fit_gets_its_steps_too(tmp_path):
  seen = []
  each = ctl.EachStep(lambda step, values: seen.append(step))
  for _ in range(2):  # a notebook cell run again: a new runner, the same action
    runner(steps_per_loop=4).fit(4, None, progress=False, loggers=[each])
  assert seen == [0, 1, 2, 3, 0, 1, 2, 3]


def test_each_step_says_at_which_step_fn_raised_and_the_run_goes_on(tmp_path, caplog):
  seen = []

  def fn(step, values):
    seen.append(step)
    if step == 1:
      raise RuntimeError("logger down")
  with caplog.at_level("WARNING", logger="ctl"):
    ran = runner(steps_per_loop=4).fit(8, None, progress=False, loggers=[ctl.EachStep(fn)])
  assert len(ran["generator_loss"]) == 8 and seen == [0, 1]  # as any logger that fails
  assert "EachStep failed at step 0 (RuntimeError: EachStep's fn raised at step 1 " \
         "(ctx.step): RuntimeError: logger down)" in caplog.text


def test_a_logger_given_as_an_action_is_told_where_it_goes():
  with pytest.raises(TypeError, match=r"ctl.EachStep is a logger: fit\(loggers=\[\.\.\.\]\)"):
    runner().fit(4, None, progress=False, actions=[ctl.EachStep(print)])


def test_checkpoint_false_leaves_an_earlier_runs_history_alone(tmp_path):
  runner().fit(8, tmp_path, progress=False)
  with pytest.warns(UserWarning, match="history.jsonl, which this run leaves as it is"):
    runner().fit(4, tmp_path, progress=False, checkpoint=False)
  assert [row["step"] for row in lines(tmp_path)] == list(range(8))


def test_a_result_named_step_is_refused():
  def step(ctx, real):
    return {"step": tf.constant(0.5)}
  r = ctl.Runner(step, build, data().repeat())
  with pytest.raises(ValueError, match="result named 'step'.*rename the result"):
    r.train(1)


def test_reading_after_every_append_stays_linear():
  history = ctl.History()
  for step in range(3000):
    history.append(step, {"a": np.float32([step])})
    assert history["a"][-1] == step


def test_a_null_value_reads_as_nan(tmp_path):
  (tmp_path / "history.jsonl").write_text('{"step": 0, "a": null}\n{"step": 1, "a": 2.5}\n')
  np.testing.assert_array_equal(ctl.read_history(str(tmp_path))["a"], [np.nan, 2.5])


def test_read_history_names_the_fix_when_there_is_none(tmp_path):
  with pytest.raises(FileNotFoundError, match="history.jsonl as it trains"):
    ctl.read_history(str(tmp_path))


def test_history_file_is_not_written_without_a_workdir(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  runner().fit(4, None, progress=False)
  assert not list(tmp_path.iterdir())


def test_lines_hold_float32_exactly(tmp_path):
  values = np.float32([0.1, 1 / 3, 1e-30, 3.4e38, np.inf, -np.inf]) * np.float32(0.3)
  file = history_lib.HistoryFile(str(tmp_path))
  file.open(0)
  file.write(0, {"x": values})
  file.close()
  np.testing.assert_array_equal(ctl.read_history(str(tmp_path))["x"], values)


def _cut_at(path, step, keep=0.5):
  """Cuts `path` in the middle of the line of `step` (as a crash or a full disk
  leaves it): that line half there, the later ones gone."""
  with open(path) as f:
    text = f.read()
  start = text.index(f'{{"step": {step},')
  end = text.index("\n", start)
  with open(path, "w") as f:
    f.write(text[:start + int((end - start) * keep)])


class Score(ctl.Action):
  """Every 4 steps, a metric published (metrics.jsonl and TensorBoard), as ctl.Evaluate."""
  collective = False

  def __init__(self):
    self.every = ctl.Every(steps=4)

  def __call__(self, context):
    context.report({"score": 1.0 / (1 + context.step)})


def _fit(workdir, total_steps):
  return runner().fit(total_steps, workdir, progress=False, actions=[Score()],
                      checkpoint=ctl.Checkpoint(ctl.Every(steps=4)))


def test_a_history_cut_mid_line_names_the_line_and_marks_the_steps_lost(tmp_path, caplog):
  """Cut in the line of step 6 with the checkpoint at 12: steps 6 to 11 are not
  trained again, so they are marked lost, said at the resume and by read_history."""
  _fit(tmp_path, 12)
  _cut_at(tmp_path / "history.jsonl", 6)
  with caplog.at_level("WARNING", logger="ctl"):
    _fit(tmp_path, 16)
  assert "history.jsonl: dropped line 7 (step 6), cut short or unreadable" in caplog.text
  assert "history.jsonl holds no line of steps 6 to 11, trained before step 12" in caplog.text
  rows = lines(tmp_path)
  assert rows[6] == {"step": 6, "lost_through": 11}
  assert [row["step"] for row in rows] == list(range(7)) + list(range(12, 16))
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):
    history = ctl.read_history(str(tmp_path))
  assert list(history.steps) == list(range(6)) + list(range(12, 16))
  assert "no values of steps 6 to 11 (lost in a damaged file" in caplog.text
  pandas = pytest.importorskip("pandas")
  frame = pandas.read_json(tmp_path / "history.jsonl", lines=True)
  assert list(frame.step) == [row["step"] for row in rows]
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):  # said once: the next resume is quiet
    _fit(tmp_path, 20)
  assert "history.jsonl" not in caplog.text


def test_a_garbage_line_in_a_history_is_named_not_dropped_silently(tmp_path, caplog):
  _fit(tmp_path, 12)
  rows = (tmp_path / "history.jsonl").read_text().splitlines()
  rows[3] = "\x00\x00 garbage"
  (tmp_path / "history.jsonl").write_text("\n".join(rows) + "\n")
  with caplog.at_level("WARNING", logger="ctl"):
    history = ctl.read_history(str(tmp_path))
  assert "left out line 4 (no step), cut short or unreadable" in caplog.text
  assert "no values of step 3 (not in the file)" in caplog.text
  assert list(history.steps) == [0, 1, 2] + list(range(4, 12))
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):
    _fit(tmp_path, 16)
  assert "dropped line 4 (no step)" in caplog.text
  assert "holds no line of step 3, trained before step 12" in caplog.text
  assert lines(tmp_path)[3] == {"step": 3, "lost_through": 3}


def test_metrics_cut_mid_line_are_put_back_from_tensorboard(tmp_path, caplog):
  """metrics.jsonl cut in the line of step 8 (12's gone too): the resume from ckpt-12
  puts both back from TensorBoard's events, where each was published."""
  _fit(tmp_path, 12)
  expected = (tmp_path / "metrics.jsonl").read_text().splitlines()
  _cut_at(tmp_path / "metrics.jsonl", 8)
  with caplog.at_level("WARNING", logger="ctl"):
    _fit(tmp_path, 16)
  assert "metrics.jsonl: dropped line 2 (step 8), cut short or unreadable" in caplog.text
  assert "put back the metrics of steps 8, 12 from TensorBoard's events" in caplog.text
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows] == [4, 8, 12, 16]
  for row, line in zip(rows, expected):
    assert row["score"] == pytest.approx(json.loads(line)["score"], rel=1e-7)  # float32


@pytest.mark.parametrize("damage", ["a middle line deleted", "the file deleted"])
def test_metrics_missing_anywhere_are_put_back_from_tensorboard(tmp_path, caplog, damage):
  """Not only after a cut: a line deleted from the middle of metrics.jsonl, or the
  whole file, is put back at the resume from the events (it used to stay a hole,
  without a word)."""
  _fit(tmp_path, 12)
  path = tmp_path / "metrics.jsonl"
  expected = [json.loads(line) for line in path.read_text().splitlines()]
  if damage == "the file deleted":
    path.unlink()
  else:
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                            if not line.startswith('{"step": 8,')))
  with caplog.at_level("WARNING", logger="ctl"):
    _fit(tmp_path, 16)
  put_back = "steps 4, 8, 12" if damage == "the file deleted" else "step 8"
  assert f"put back the metrics of {put_back} from TensorBoard's events" in caplog.text
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert [row["step"] for row in rows] == [4, 8, 12, 16]
  for row, before in zip(rows, expected):
    assert row["score"] == pytest.approx(before["score"], rel=1e-7)


def test_reading_metrics_says_nothing_of_the_steps_without_an_evaluation(tmp_path, caplog):
  """metrics.jsonl has a line per step that had metrics: the steps between are no
  hole (read_history used to warn "no values of steps 0 to 3, 5 to 7, ...")."""
  _fit(tmp_path, 12)
  with caplog.at_level("WARNING", logger="ctl"):
    metrics = ctl.read_history(str(tmp_path / "metrics.jsonl"))
  assert metrics.steps.tolist() == [4, 8, 12]
  assert caplog.text == ""


def test_a_step_on_two_lines_is_named_and_written_once_at_the_resume(tmp_path, caplog):
  """A history joined to a copy of a part of itself, or a line edited in by hand:
  read_history names the step and reads the last value; the resume keeps one line."""
  _fit(tmp_path, 12)
  path = tmp_path / "history.jsonl"
  text = path.read_text().splitlines(keepends=True)
  path.write_text("".join(text[:8] + ['{"step": 7, "generator_loss": 9.5, '
                                      '"discriminator_loss": 9.5}\n'] + text[8:]))
  with caplog.at_level("WARNING", logger="ctl"):
    history = ctl.read_history(str(tmp_path))
  assert "history.jsonl: step 7 has a value on more than one line" in caplog.text
  assert history.steps.tolist() == list(range(12))
  assert history["generator_loss"][7] == 9.5
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):
    _fit(tmp_path, 16)
  assert "step 7 has a value on more than one line" in caplog.text
  assert [row["step"] for row in lines(tmp_path)] == list(range(16))


def test_a_deleted_history_is_marked_lost_at_the_resume(tmp_path, caplog):
  _fit(tmp_path, 12)
  (tmp_path / "history.jsonl").unlink()
  with caplog.at_level("WARNING", logger="ctl"):
    _fit(tmp_path, 16)
  assert "history.jsonl holds no line of steps 0 to 11, trained before step 12" in (
      caplog.text)
  assert lines(tmp_path)[0] == {"step": 0, "lost_through": 11}


def test_an_empty_history_says_why_it_holds_no_value():
  """What a fit returns when its work directory was already at total_steps: a
  new user's `history["d_loss"]` then named the step, not the finished run."""
  with pytest.raises(KeyError, match="holds no step .*trains none.*ctl.read_history"):
    history_lib.History()["d_loss"]
