"""The outer loop's outputs, read back: schedules, event files, samples,
evaluation, exports (loaded without ctl), progress lines and the gin record."""

import glob
import io
import logging
import os
import threading
import time

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import ctl
from ctl.loop.progress import Progress

import toy_gan
from helpers import python

GLOBAL_BATCH = 8
NOISE = 3


@pytest.fixture(scope="module")
def mirrored():
  return ctl.make_strategy("mirrored", logical_cpus=2)


class FakeClock:

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def data(n=64):
  x = np.linspace(-2, 2, n * 2, dtype="float32").reshape(n, 2)
  return toy_gan.batches(x, GLOBAL_BATCH)


def build():
  """toy_gan's GAN of linear models on 2-D points; SGD for the discriminator."""
  models = {"generator": toy_gan.mlp("generator", NOISE, 2, hidden=None),
            "discriminator": toy_gan.mlp("discriminator", 2, 1, hidden=None)}
  optimizers = {"generator": keras.optimizers.Adam(1e-3),
                "discriminator": keras.optimizers.SGD(0.05)}
  return models, optimizers


# Imported by tests/test_stopping.py, with build, data and runner.
step = toy_gan.make_step(NOISE)


def score_step(ctx, real):
  logits = ctx.models["discriminator"](real)[:, 0]
  return {"real_score": ctx.average(tf.sigmoid(logits)),        # a share: summed
          "real_accuracy": tf.reduce_mean(tf.cast(logits > 0, tf.float32))}  # averaged


def runner(strategy=None, steps_per_loop=4, **kwargs):
  return ctl.Runner(step, build, data().repeat(), strategy=strategy or tf.distribute.get_strategy(),
                    steps_per_loop=steps_per_loop, **kwargs)


def events(path):
  accumulator = event_accumulator.EventAccumulator(
      path, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.IMAGES: 0})
  accumulator.Reload()
  return accumulator


def scalars(accumulator, tag):
  return {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in accumulator.Tensors(tag)}


# Every: when periodic work is due.

def test_every_steps_fires_on_multiples():
  every = ctl.Every(steps=5)
  every.start(0)
  fired = []
  for step in range(1, 21):
    if every.due(step):
      every.fired(step)
      fired.append(step)
  assert fired == [5, 10, 15, 20]
  assert every.steps_to_next(7) == 3 and every.steps_to_next(10) == 5


def test_every_seconds_uses_the_injected_clock():
  clock = FakeClock()
  every = ctl.Every(seconds=60, clock=clock)
  every.start(0)
  clock.now = 59.9
  assert not every.due(1)
  clock.now = 60.0
  assert every.due(2)
  every.fired(2)
  clock.now = 100.0
  assert not every.due(3)
  assert every.steps_to_next(3) is None


def test_every_steps_or_seconds_whichever_first():
  clock = FakeClock()
  every = ctl.Every(steps=100, seconds=10, clock=clock)
  every.start(0)
  clock.now = 11
  assert every.due(3)          # time first
  every.fired(3)
  clock.now = 12
  assert every.due(100)        # then the step multiple
  assert not every.due(99)


def test_fit_schedule_with_injected_clock_and_loop_alignment(tmp_path):
  """Step actions land on exact multiples even when steps_per_loop does not
  divide them; second actions follow the injected clock."""
  clock = FakeClock()
  calls = []

  class Record(ctl.Action):
    def __init__(self, name, every):
      self.name, self.every = name, every

    def __call__(self, context):
      calls.append((self.name, context.step))
      if self.name == "tick":
        clock.now += 10  # every step "takes" 10 seconds

  runner(steps_per_loop=4).fit(20, tmp_path, actions=[
      Record("tick", ctl.Every(steps=1)),
      Record("steps", ctl.Every(steps=5)),
      Record("seconds", ctl.Every(seconds=60, clock=clock)),
      Record("end", None)], progress=False)
  by_name = lambda name: [s for n, s in calls if n == name]  # noqa: E731
  assert by_name("tick") == list(range(1, 21))
  assert by_name("steps") == [5, 10, 15, 20]
  # Due at step 7 (60 s after the start), then 60 s after that firing (step
  # 14), and at the end (step 20) because every action runs for the last step.
  assert by_name("seconds") == [7, 14, 20]
  assert by_name("end") == [20]


# Event files, samples, evaluation.

def test_fit_writes_scalars_images_and_eval_metrics(tmp_path):
  r = runner(steps_per_loop=5)
  z = np.random.default_rng(0).normal(size=(6, NOISE)).astype("float32")

  def show(models):  # 2-D points drawn as 1x2 "images"
    return models["generator"](z).numpy().reshape(6, 1, 2, 1)

  history = r.fit(20, tmp_path, summaries=ctl.Summaries(ctl.Every(steps=10)), actions=[
      ctl.Samples(show, ctl.Every(steps=10)),
      ctl.Evaluate(score_step, data(16), ctl.Every(steps=20)),
  ], progress=False)
  train = events(str(tmp_path / "events" / "train"))
  for key in ("discriminator_loss", "generator_loss"):
    got = scalars(train, key)
    # Each write is the mean of the last compiled call's steps (5 per call).
    np.testing.assert_allclose([got[10], got[20]],
                               [history[key][5:10].mean(), history[key][15:20].mean()],
                               rtol=1e-6)
  np.testing.assert_allclose(list(scalars(train, "learning_rate/generator").values()),
                             [1e-3, 1e-3])
  np.testing.assert_allclose(list(scalars(train, "learning_rate/discriminator").values()),
                             [0.05, 0.05])
  assert scalars(train, "steps_per_second")[20] > 0
  assert scalars(train, "examples_per_second")[20] == pytest.approx(
      scalars(train, "steps_per_second")[20] * GLOBAL_BATCH, rel=1e-5)
  assert train.Tags()["tensors"].count("samples") == 1
  pngs = sorted(os.listdir(tmp_path / "samples"))
  assert pngs == ["samples_00000010.png", "samples_00000020.png"]
  image = tf.io.decode_png(tf.io.read_file(str(tmp_path / "samples" / pngs[-1]))).numpy()
  assert image.shape == (2, 6, 1)  # 6 images of 1x2: 2 rows of 3
  evaluation = events(str(tmp_path / "events" / "eval"))
  assert set(scalars(evaluation, "real_score")) == {20}
  metrics = r.evaluate(score_step, data(16))
  assert scalars(evaluation, "real_score")[20] == pytest.approx(metrics["real_score"])


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_evaluate_is_the_mean_over_the_whole_dataset(strategy_name, mirrored):
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
  r = runner(strategy)
  x = np.concatenate(list(data(24).as_numpy_iterator()))
  logits = r.models["discriminator"](x).numpy()[:, 0]
  metrics = r.evaluate(score_step, data(24))
  assert metrics["real_score"] == pytest.approx(np.mean(1 / (1 + np.exp(-logits))), rel=1e-5)
  assert metrics["real_accuracy"] == pytest.approx(np.mean(logits > 0), rel=1e-6)
  assert r.evaluate(score_step, data(24)) == metrics  # starts from the top each time


def test_evaluate_weights_a_short_last_batch_by_its_size():
  r = runner()
  x = np.linspace(-2, 2, 40, dtype="float32").reshape(20, 2)
  uneven = tf.data.Dataset.from_tensor_slices(x).batch(8)  # 8, 8 and 4 examples
  logits = r.models["discriminator"](x).numpy()[:, 0]
  metrics = r.evaluate(score_step, uneven)
  assert metrics["real_score"] == pytest.approx(np.mean(1 / (1 + np.exp(-logits))), rel=1e-5)


# Export: loadable by plain TensorFlow and Keras, without ctl.

LOAD_WITHOUT_CTL = """
import sys
import numpy as np
import tensorflow as tf
import keras
z = np.load(sys.argv[3])
saved_model = tf.saved_model.load(sys.argv[1])  # keep it: it owns the variables
served = saved_model.serve(tf.constant(z)).numpy()
loaded = keras.saving.load_model(sys.argv[2])(z).numpy()
assert "ctl" not in sys.modules and "gan" not in sys.modules
np.save(sys.argv[4], np.stack([served, loaded]))
"""


@pytest.mark.slow  # a subprocess that imports TensorFlow
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_export_loads_without_ctl(tmp_path, strategy_name, mirrored):
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
  r = runner(strategy)
  r.fit(4, tmp_path, actions=[ctl.Export("generator")], progress=False)
  z = np.random.default_rng(1).normal(size=(5, NOISE)).astype("float32")
  np.save(tmp_path / "z.npy", z)
  script = tmp_path / "load.py"
  script.write_text(LOAD_WITHOUT_CTL)
  python([str(script), str(tmp_path / "export" / "generator"),
          str(tmp_path / "export" / "generator.keras"), str(tmp_path / "z.npy"),
          str(tmp_path / "out.npy")], env={"PYTHONPATH": ""})
  served, loaded = np.load(tmp_path / "out.npy")
  expected = r.models["generator"](z).numpy()
  np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(loaded, expected, rtol=1e-6, atol=1e-6)


def test_export_names_the_models_when_the_name_is_wrong(tmp_path):
  with pytest.raises(ValueError, match=r"no model named 'gen'.*'discriminator', 'generator'"):
    runner().export("gen", str(tmp_path))


# Progress, the gin record, resume bookkeeping, bad arguments.

def test_progress_logs_lines_when_not_a_terminal():
  clock = FakeClock()
  lines = io.StringIO()
  handler = logging.StreamHandler(lines)
  logger = logging.getLogger("ctl")
  logger.addHandler(handler)
  level = logger.level
  logger.setLevel(logging.INFO)  # the level an application shows progress at
  try:
    progress = Progress(100, 0, stream=io.StringIO(), log_seconds=30, clock=clock)
    clock.now = 5
    progress.update(10, {"loss": np.array([1.0])})          # the first call: said at once
    clock.now = 15
    progress.update(20, {"loss": np.array([0.5, 0.25])})   # 10 s later: too soon
    clock.now = 45
    progress.update(40, {"loss": np.array([0.125])})
    clock.now = 55
    progress.update(100, {"loss": np.array([0.0625])})      # the end always logs
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
  logged = lines.getvalue().splitlines()
  assert len(logged) == 3, logged
  assert logged[0] == "step 10/100  loss 1  first call 5.0 s (compiling the step included)"
  # Speed and time left from the first call's end: 30 steps in 40 s, not 40 in 45.
  assert logged[1].startswith("step 40/100 (40%)  loss 0.125  0.75 steps/s  ETA 1:20")
  assert logged[2].startswith("step 100/100 (100%)  loss 0.0625")


def test_progress_is_a_tqdm_bar_on_a_terminal():
  class Terminal(io.StringIO):
    def isatty(self):
      return True

  terminal = Terminal()
  progress = Progress(10, 2, stream=terminal)
  progress.update(6, {"generator_loss": np.array([1.5])})
  progress.close()
  out = terminal.getvalue()
  assert "6/10" in out and "generator_loss=1.5" in out


def test_progress_shows_each_result_as_its_mean_over_the_call():
  """A lazy penalty, due every 4th step, is not shown as 0 when the call ends
  between two (the last step's value); Summaries writes the same mean."""
  clock = FakeClock()
  progress = Progress(8, 0, stream=io.StringIO(), clock=clock)
  progress.update(4, {"penalty": np.array([0.0, 0.0, 0.0, 2.0])})   # the first call
  clock.now = 100
  penalty = np.array([2.0, 0.0, 0.0, 0.0])
  assert "penalty 0.5 " in progress.line(8, {"penalty": float(np.mean(penalty))}, clock.now)
  lines = io.StringIO()
  handler = logging.StreamHandler(lines)
  logger = logging.getLogger("ctl")
  logger.addHandler(handler)
  level = logger.level
  logger.setLevel(logging.INFO)
  try:
    progress.update(8, {"penalty": penalty})
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
  assert "penalty 0.5 " in lines.getvalue()


@gin.configurable
def learning_rate_for_test(value=0.1):
  return value


def test_operative_gin_config_is_saved_next_to_the_checkpoints(tmp_path):
  gin.clear_config()
  gin.parse_config("learning_rate_for_test.value = 0.25")
  try:
    assert learning_rate_for_test() == 0.25
    runner().fit(2, tmp_path, progress=False)
    saved = (tmp_path / "checkpoints" / "operative_config.gin").read_text()
  finally:
    gin.clear_config()
  assert "learning_rate_for_test.value = 0.25" in saved
  assert glob.glob(str(tmp_path / "checkpoints" / "ckpt-2.index"))


def test_checkpoint_false_over_an_earlier_run_warns(tmp_path):
  runner().fit(2, tmp_path, progress=False)
  with pytest.warns(UserWarning, match=r"fit\(checkpoint=False\): .* holds the checkpoints "
                    r"of an earlier run, which this run neither restores nor replaces"):
    runner().fit(2, tmp_path, checkpoint=False, progress=False)


def test_fit_again_resumes_and_does_nothing_past_the_target(tmp_path):
  first = runner()
  first.fit(6, tmp_path, progress=False)
  second = runner()
  history = second.fit(10, tmp_path, progress=False)
  assert len(history["generator_loss"]) == 4
  assert int(second.global_step.numpy()) == 10
  assert runner().fit(10, tmp_path, progress=False) == {}
  # The restored weights are the saved ones.
  for a, b in zip(second.models["generator"].weights, runner().models["generator"].weights):
    assert a.shape == b.shape


def test_a_workdir_starting_with_a_tilde_is_in_the_home_directory(tmp_path, monkeypatch):
  """`fit(workdir="~/run")` trains into $HOME/run, as a shell would read it (it
  trained into a folder named `~` under the current directory)."""
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  (tmp_path / "cwd").mkdir()
  monkeypatch.chdir(tmp_path / "cwd")
  runner().fit(4, "~/run", progress=False)
  assert (tmp_path / "home" / "run" / "checkpoints" / "ckpt-4.index").exists()
  assert os.listdir(tmp_path / "cwd") == []
  assert runner().restore("~/run") == 4


def test_restore_takes_the_checkpoint_of_a_step(tmp_path):
  """`Runner.restore(workdir, 4)` (`ctl eval --checkpoint 4`): that step's
  checkpoint, not the newest, and not a folder named 4."""
  first = runner()
  first.fit(8, str(tmp_path), checkpoint=ctl.Checkpoint(ctl.Every(steps=4)), progress=False)
  for checkpoint in (4, "4", "ckpt-4"):
    again = runner()
    assert again.restore(str(tmp_path), checkpoint) == 4
  assert runner().restore(str(tmp_path)) == 8
  with pytest.raises(FileNotFoundError, match="the steps saved there are 4, 8"):
    runner().restore(str(tmp_path), 6)


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_an_asynchronous_save_writes_its_steps_values_while_training_goes_on(
    tmp_path, monkeypatch, strategy_name, mirrored):
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
  save, began, writing = tf.train.CheckpointManager.save, [], []

  def slow(manager, checkpoint_number, **kwargs):  # a large model's write
    writing.append(checkpoint_number)
    assert len(writing) == 1, writing  # one save at a time
    if threading.current_thread() is not threading.main_thread():
      time.sleep(0.5)
      began.append((checkpoint_number, int(r.state.global_step.numpy())))
    try:
      return save(manager, checkpoint_number=checkpoint_number, **kwargs)
    finally:
      writing.remove(checkpoint_number)

  monkeypatch.setattr(tf.train.CheckpointManager, "save", slow)
  every = ctl.Every(steps=4)
  r = runner(strategy, steps_per_loop=1)
  history = r.fit(12, str(tmp_path / "async"), progress=False,
                  checkpoint=ctl.Checkpoint(every, keep=5, asynchronous=True))
  # Saved in the background at 4 and 8, training on meanwhile; the end waits.
  assert [step for step, _ in began] == [4, 8] and all(now > step for step, now in began)
  expected = runner(strategy, steps_per_loop=1).fit(
      12, str(tmp_path / "sync"), progress=False, checkpoint=ctl.Checkpoint(every, keep=5))
  for key, values in expected.items():
    np.testing.assert_array_equal(history[key], values)
  for step in (4, 8, 12):  # each holds its step's values, not those of the write's time
    saved, reference = (tf.train.load_checkpoint(str(tmp_path / run / "checkpoints" /
                                                     f"ckpt-{step}"))
                        for run in ("async", "sync"))
    keys = set(reference.get_variable_to_shape_map())
    assert set(saved.get_variable_to_shape_map()) == keys
    for key in keys - {"_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
                       "data/.ATTRIBUTES/ITERATOR_STATE"}:
      np.testing.assert_array_equal(saved.get_tensor(key), reference.get_tensor(key), key)
  # The data position too: resumed from the background's ckpt-4, the run is the same.
  resumed = runner(strategy, steps_per_loop=1).fit(
      12, str(tmp_path / "async"), progress=False, checkpoint=ctl.Checkpoint(resume_from=4))
  for key, values in expected.items():
    np.testing.assert_array_equal(resumed[key], values[4:])


def test_fit_does_not_discard_steps_trained_in_memory(tmp_path):
  r = runner()
  r.fit(4, tmp_path, progress=False)
  r.train(2)
  with pytest.raises(ValueError, match=r"at step 6 \(trained or restored in memory\), but "
                                       "the newest checkpoint .* is at step 4"):
    r.fit(8, tmp_path, progress=False)
  fresh = runner()
  fresh.train(3)  # trained without a workdir: fit starts a new one from here
  assert len(fresh.fit(5, tmp_path / "other", progress=False)["generator_loss"]) == 2


def test_end_actions_run_again_if_the_run_stopped_after_its_last_checkpoint(tmp_path):
  class FailOnce(ctl.Action):
    calls = []

    def __call__(self, context):
      self.calls.append(context.step)
      if len(self.calls) == 1:
        raise RuntimeError("export failed")

  with pytest.raises(RuntimeError, match="export failed"):
    runner().fit(4, tmp_path, actions=[FailOnce()], progress=False)
  assert (tmp_path / "checkpoints" / "ckpt-4.index").exists()  # saved first
  assert not (tmp_path / "checkpoints" / "finished_step").exists()
  assert runner().fit(4, tmp_path, actions=[FailOnce()], progress=False) == {}
  assert FailOnce.calls == [4, 4]
  assert (tmp_path / "checkpoints" / "finished_step").read_text() == "4\n"
  runner().fit(4, tmp_path, actions=[FailOnce()], progress=False)
  assert FailOnce.calls == [4, 4]  # finished: not again


def test_summaries_and_evaluate_take_dynamic_batches_and_dataset_functions(tmp_path):
  x = np.linspace(-2, 2, 40, dtype="float32").reshape(20, 2)
  unbatched = tf.data.Dataset.from_tensor_slices(x)
  r = ctl.Runner(step, build, unbatched.repeat().batch(8), steps_per_loop=2)
  assert r.feed.global_batch_size is None
  r.fit(4, tmp_path, summaries=ctl.Summaries(ctl.Every(steps=2)), progress=False)
  train = events(str(tmp_path / "events" / "train"))
  assert "steps_per_second" in train.Tags()["tensors"]
  assert "examples_per_second" not in train.Tags()["tensors"]
  dataset_fn = lambda context: unbatched.batch(  # noqa: E731
      context.get_per_replica_batch_size(8), drop_remainder=True)
  by_function = r.evaluate(score_step, dataset_fn, global_batch_size=8)
  assert by_function == pytest.approx(r.evaluate(score_step, unbatched.batch(8).take(2)))
  r.fit(6, tmp_path, progress=False, actions=[
      ctl.Evaluate(score_step, dataset_fn, ctl.Every(steps=2), global_batch_size=8)])


def test_a_failing_action_saves_the_steps_first(tmp_path):
  def broken_samples(models):  # a researcher's bug, met at step 6
    raise ValueError("bad samples function")

  r = runner(steps_per_loop=2)
  actions = [ctl.Samples(broken_samples, ctl.Every(steps=6))]
  with pytest.raises(ValueError, match="bad samples function") as raised:
    r.fit(12, str(tmp_path), checkpoint=ctl.Checkpoint(ctl.Every(steps=4)), actions=actions,
          progress=False)
  assert any("Samples failed at step 6; the steps trained are saved in" in note
             for note in raised.value.__notes__)
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-6")


def test_samples_show_true_needs_a_notebook(tmp_path):
  samples = ctl.Samples(lambda models: tf.zeros([4, 8, 8, 1]), show=True)
  with pytest.raises(ValueError, match="Samples\\(show=True\\).*no Jupyter kernel"):
    runner().fit(4, tmp_path, progress=False, actions=[samples])
  with pytest.raises(TypeError, match="Samples\\(show='yes'\\)"):
    ctl.Samples(lambda models: None, show="yes")
