"""`ctl check`: each TPU hazard is found on a CPU, and a clean step passes.

Runners are tiny (one Dense layer on random rows) and run in-process under
the default strategy; one `ctl check` run goes through the command line.
"""

import os
import re
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.distribute import strategies
from ctl.tools import check
from tests.helpers import ctl as run_ctl

FEATURES = 4


def _runner(loss=lambda outputs, rows: tf.square(outputs[:, 0]), data=None,
            prepare=lambda batch: batch):
  """A one-Dense-layer runner whose step minimises `loss(outputs, rows)` per example.

  The rows are `prepare(batch)`; by default 64 random rows in batches of 16.
  """
  def build():
    model = keras.Sequential([keras.Input([FEATURES]), keras.layers.Dense(1)])
    return {"model": model}, {"model": keras.optimizers.SGD(0.1)}

  def step(ctx, batch):
    rows = prepare(batch)
    with tf.GradientTape() as tape:
      value = ctx.average(loss(ctx.models["model"](rows), rows))
    ctx.minimize(value, "model", tape=tape)
    return {"loss": value}

  if data is None:
    rows = np.random.default_rng(0).normal(size=(64, FEATURES)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices(rows).batch(16, drop_remainder=True)
  return ctl.Runner(step, build, data, strategy="default")


def _by_name(findings):
  assert len({f.name for f in findings}) == len(findings) == 6, findings
  return {f.name: f for f in findings}


def test_a_clean_step_passes_and_leaves_the_weights_alone():
  runner = _runner()
  before = [v.numpy() for v in runner.models["model"].variables]
  findings = check.check_step(runner.compiled_step, num_batches=2)
  assert all(f.ok for f in findings), check.format_findings(findings)
  after = [v.numpy() for v in runner.models["model"].variables]
  assert all(np.array_equal(a, b) for a, b in zip(before, after))
  assert int(runner.global_step.numpy()) == 0


def test_a_short_last_batch_is_dynamic_and_retraces():
  rows = np.zeros((40, FEATURES), "float32")  # batches of 16, 16, 8
  runner = _runner(data=tf.data.Dataset.from_tensor_slices(rows).batch(16))
  findings = _by_name(check.check_step(runner.compiled_step, num_batches=3))
  assert not findings[check.STATIC_INPUTS].ok
  assert "drop_remainder=True" in findings[check.STATIC_INPUTS].message
  assert not findings[check.RETRACING].ok
  assert "traced 2 times for 3 batches" in findings[check.RETRACING].message
  assert findings[check.XLA].ok


def test_images_of_several_sizes_are_dynamic_and_retrace():
  widths = tf.data.Dataset.range(3).map(lambda i: 2 + tf.cast(i, tf.int32))
  data = widths.map(lambda width: tf.ones([8, FEATURES, width]))  # 8 "images" a batch
  runner = _runner(data=data, prepare=lambda images: tf.reduce_mean(images, axis=2))
  findings = _by_name(check.check_step(runner.compiled_step, num_batches=3))
  assert not findings[check.STATIC_INPUTS].ok
  assert "one shape" in findings[check.STATIC_INPUTS].message
  assert "traced 3 times" in findings[check.RETRACING].message


def test_boolean_mask_is_a_data_dependent_shape():
  def loss(outputs, rows):
    positive = tf.boolean_mask(rows, rows[:, 0] > 0)
    return tf.square(outputs[:, 0]) + tf.reduce_sum(positive) * 0.0
  findings = _by_name(check.check_step(_runner(loss).compiled_step, num_batches=1))
  finding = findings[check.DATA_DEPENDENT]
  assert not finding.ok and "Where" in finding.message and "tf.boolean_mask" in finding.message
  assert findings[check.HOST_PYTHON].ok


def test_print_in_the_step_is_host_python():
  def loss(outputs, rows):
    print("outputs", outputs)
    return tf.square(outputs[:, 0])
  findings = _by_name(check.check_step(_runner(loss).compiled_step, num_batches=1))
  finding = findings[check.HOST_PYTHON]
  assert not finding.ok
  assert f"{os.path.basename(__file__)}:" in finding.message and "tf.print" in finding.message


def test_py_function_is_host_python_and_not_compiled():
  def loss(outputs, rows):
    doubled = tf.py_function(lambda x: x * 2, [outputs[:, 0]], tf.float32)
    return tf.square(outputs[:, 0]) + tf.stop_gradient(tf.reshape(doubled, [-1])) * 0.0
  findings = _by_name(check.check_step(_runner(loss).compiled_step, num_batches=1))
  assert not findings[check.HOST_PYTHON].ok
  assert "tf.py_function" in findings[check.HOST_PYTHON].message
  assert not findings[check.XLA].ok and "EagerPyFunc" in findings[check.XLA].message


def test_numpy_in_the_step_is_host_python():
  def loss(outputs, rows):
    return tf.square(outputs[:, 0]) * float(np.mean(outputs.numpy()))
  findings = _by_name(check.check_step(_runner(loss).compiled_step, num_batches=1))
  assert not findings[check.HOST_PYTHON].ok
  assert ".numpy()" in findings[check.HOST_PYTHON].message
  assert not findings[check.XLA].ok  # not run


def test_a_tf_random_draw_is_found_with_its_line():
  def loss(outputs, rows):
    noise = tf.random.normal(tf.shape(outputs))  # the draw the layout changes
    return tf.square(outputs[:, 0] + noise[:, 0])
  with pytest.warns(UserWarning, match="a random draw whose numbers depend on the layout"):
    findings = _by_name(check.check_step(_runner(loss).compiled_step, num_batches=1))
  finding = findings[check.DRAWS]
  assert not finding.ok and "tf.random.normal(tf.shape(outputs))" in finding.message
  assert f"{os.path.basename(__file__)}:" in finding.message and "ctx.normal" in finding.message
  assert findings[check.DRAWS].name == "draws from ctx"


def test_a_stateless_draw_of_the_replicas_rows_is_found_and_ctx_draws_are_not():
  def build():
    model = keras.Sequential([keras.Input([FEATURES]), keras.layers.Dense(1)])
    return {"model": model}, {"model": keras.optimizers.SGD(0.1)}

  def step(ctx, batch):
    own = tf.random.stateless_normal([ctx.per_replica_batch_size, FEATURES], ctx.seed())
    with tf.GradientTape() as tape:
      value = ctx.average(tf.square(ctx.models["model"](batch + own + ctx.normal([FEATURES]))
                                    [:, 0]))
    ctx.minimize(value, "model", tape=tape)
    return {"loss": value}

  rows = np.zeros((32, FEATURES), "float32")
  runner = ctl.Runner(step, build, tf.data.Dataset.from_tensor_slices(rows).batch(
      16, drop_remainder=True),
                      strategy="default")
  with pytest.warns(UserWarning) as warned:
    runner.train(1)
  messages = [str(w.message) for w in warned if "depend on the layout" in str(w.message)]
  assert len(messages) == 1 and "tf.random.stateless_normal(" in messages[0], messages
  assert "(StatelessRandomNormalV2)" in messages[0] and "ctx.normal" in messages[0]


def test_a_draw_in_an_evaluation_function_is_warned_of_once():
  runner = _runner()
  runner.train(1)

  def samples(models, indices):
    return {"x": models["model"](tf.random.uniform([tf.size(indices), FEATURES]))}

  with pytest.warns(UserWarning, match="normal_by_index") as warned:
    runner.over_samples(samples, 40, batch_size=20)
    runner.over_samples(samples, 40, batch_size=20)
  assert len([w for w in warned if "depend on the layout" in str(w.message)]) == 1


def test_a_mixed_precision_is_timed_against_float32_on_this_cpu():
  rows = np.random.default_rng(0).normal(size=(64, FEATURES)).astype("float32")
  data = tf.data.Dataset.from_tensor_slices(rows).batch(16, drop_remainder=True).repeat()
  runner = _runner(data=data)
  trains = {"mixed_bfloat16": runner.with_options(mixed_precision="mixed_bfloat16").train,
            "float32": runner.with_options().train}
  finding = check.precision_speed("mixed_bfloat16", trains, num_steps=2, repeats=2)
  assert finding.name == check.PRECISION
  assert re.search(r"^mixed_bfloat16 takes \d+\.\d\dx float32's time per step on this "
                   r"CPU \(", finding.message), finding.message
  assert finding.ok != ("train in float32 here" in finding.message)  # slower is not ok
  assert int(runner.global_step.numpy()) == 0  # timed on runners of their own


def test_check_refuses_several_replicas():
  two_replicas = types.SimpleNamespace(placement=types.SimpleNamespace(replicas=2))
  with pytest.raises(ValueError, match="strategy='default'"):
    check.check_step(two_replicas)


@pytest.mark.slow  # builds and compiles an example's models
def test_ctl_check_passes_on_an_example_config():
  proc = run_ctl("check", os.path.join("examples", "configs", "dcgan.gin"), "--steps", "2",
                 "--gin", "gan.dcgan_generator.width = 4",
                 "--gin", "gan.dcgan_discriminator.width = 4",
                 "--gin", "gan.Experiment.batch_size = 8", "--gin", "gan.Experiment.noise_dim = 8",
                 "--gin", "generatr/keras.optimizers.Adam.learning_rate = 1e-3",
                 "--gin", "gan.Experiment.mixed_precision = 'mixed_bfloat16'")
  assert proc.stdout.count(" ok ") == 6, proc.stdout
  # Timed against float32 on this CPU, said after the table, whichever is faster.
  assert re.search(r"\n\nprecision speed: mixed_bfloat16 takes \d+\.\d\dx float32's",
                   proc.stdout), proc.stdout
  # And, with a TensorFlow no TPU runs, which ones it does (also not a check).
  note = strategies.tpu_version_note()
  assert ("\n\ntpu strategy: " + note[:40] in proc.stdout) == bool(note), proc.stdout
  # The misspelt scope is the one binding the build and steps did not use.
  warning = proc.stderr[proc.stderr.index("ctl check: warning: building the runner and 2 "
                                          "steps used none"):]
  assert warning.splitlines()[1:3] == ["  generatr/keras.optimizers.Adam.learning_rate",
                                       "gin checks a binding's function and parameter, not "
                                       "its scope, nor whether the run calls the function: "
                                       "check the scope's spelling, that the config calls the "
                                       "function through gin (a penalty's weight with no "
                                       "penalty set is unused, and so is a rate on a "
                                       "default optimizer, which passes its own: bind the "
                                       "optimizer by reference first, e.g. "
                                       "gan.Experiment.generator_optimizer = "
                                       "@generator/keras.optimizers.Adam), and that its "
                                       "caller does not pass that argument itself."], warning


def test_the_help_lists_every_check_the_report_gives(capsys):
  from ctl import cli  # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit):
    cli.main(["check", "--help"])
  text = capsys.readouterr().out
  for name in (check.STATIC_INPUTS, check.XLA, check.RETRACING, check.DATA_DEPENDENT,
               check.HOST_PYTHON, check.DRAWS):
    assert name in text, name
