"""Bad input is refused early, with a message that names what is wrong and the fix.

One table, `CASES`: each entry is one mistake a user can make (a bad argument,
bad data, a broken step, a damaged work directory, a bad cluster set-up), the
error type it must raise, and the words its message must hold: the argument or
thing that is wrong, the bad value, and the fix. A case that gets as far as a
runner adds `[global step N]` to the message it checks (the runner's step after
the error), so "raised before the first training step, nothing restored" is
asserted as `[global step 0]`. Subprocess cases (the `ctl` command, TF_CONFIG,
the launcher) turn a non-zero exit into `CommandFailed("exit code N\\n<stderr>")`
and check that text.

A case the library does not handle yet has a `gap` (the change it needs) and a
`today` (what happens now). It runs as a strict xfail: it xfails only while the
library does what `today` says, and fails the suite once the library is fixed
(then drop `gap` and `today`). `CASES` also feeds docs/reliability.md: each
case's `name` and `outcome` (one line: what the user sees today).

    .venv/bin/python -m pytest tests/test_bad_input.py -n 0 -q
"""

import contextlib
import io
import os
import socket
import sys
import time
import typing
import warnings
from unittest import mock

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl import cli
from ctl.cli import ray_train
from ctl.distribute import strategies
from ctl.loop import workdir as workdir_lib

import helpers

BATCH = 8
CONFIG = os.path.join(helpers.ROOT, "examples", "configs", "dcgan.gin")


class Case(typing.NamedTuple):
  """One bad input.

  Attributes:
    name: a short id (the pytest id and the docs' row).
    outcome: one line, what the user sees today.
    trigger: function of a `Scratch` that makes the mistake.
    error: the exception type (or a tuple of them) the mistake must raise.
    must_contain: substrings of the message: argument, value, fix. `<tmp>` and
      other `<key>`s are filled from `Scratch.values`.
    gap: None, or what the library lacks (the case is then a strict xfail).
    today: with a gap, what happens today: `(exception type or None for
      nothing, substrings...)`; the xfail counts only if that is what happened.
  """
  name: str
  outcome: str
  trigger: typing.Callable
  error: type | tuple
  must_contain: tuple
  gap: str | None = None
  today: tuple | None = None


class Scratch:
  """What a trigger gets: a fresh directory and values for `must_contain`."""

  def __init__(self, path):
    self.path = path
    self.values = {"tmp": str(path)}

  def fill(self, text):
    for key, value in self.values.items():
      text = text.replace(f"<{key}>", str(value))
    return text


class CommandFailed(Exception):
  """A command exited non-zero; the message is `exit code N` and its stderr."""


# Small parts: one Dense model on 1 feature, batches of 8.

def _mirrored():
  return ctl.make_strategy("mirrored", logical_cpus=2)  # as tests/conftest.py set up


def _data(n=64, batch=BATCH, features=1, drop_remainder=True):
  x = np.arange(n * features, dtype="float32").reshape(n, features)
  return tf.data.Dataset.from_tensor_slices(x).batch(batch, drop_remainder=drop_remainder)


def _model(features=1):
  return keras.Sequential([keras.Input((features,)), keras.layers.Dense(1)])


def _build():
  return {"model": _model()}, {"model": keras.optimizers.SGD(0.01)}


def _step(ctx, x):
  model = ctx.models["model"]
  with tf.GradientTape() as tape:
    loss = ctx.average(tf.square(model(x)[:, 0] - tf.cast(x[:, 0], tf.float32)))
  ctx.minimize(loss, "model", tape=tape)
  return {"loss": loss}


def _runner(step=_step, build=_build, data=None, **kwargs):
  return ctl.Runner(step, build, _data().repeat() if data is None else data, **kwargs)


def _steps(runner, call, *args, **kwargs):
  """Calls `call`; an error's message gets `[global step N]`: the step reached."""
  try:
    return call(*args, **kwargs)
  except Exception as e:
    e.add_note(f"[global step {int(runner.global_step.numpy())}]")
    raise


def _train(steps=1, **kwargs):
  runner = _runner(**kwargs)
  _steps(runner, runner.train, steps)


def _command(proc):
  if proc.returncode != 0:
    raise CommandFailed(f"exit code {proc.returncode}\n{proc.stderr}")


def _cli(*args):
  """`ctl ARGS` in this process (no TensorFlow work is done before a gin error)."""
  err = io.StringIO()
  try:
    with contextlib.redirect_stderr(err):
      code = cli.main(list(args))
  finally:
    gin.clear_config()  # a failed parse leaves bindings behind
  if code:
    raise CommandFailed(f"exit code {code}\n{err.getvalue()}")


def _within(seconds, fn, *args, **kwargs):
  """Calls `fn`; whatever it raises must come within `seconds` (no long stall).

  `seconds` parts the two outcomes with room on both sides, whatever the
  machine's load: the stalls guarded against last minutes or forever (TFDS
  retries for ~200 s offline; a multi-worker strategy waits for a missing peer
  forever), the refusals take seconds.
  """
  start = time.monotonic()
  try:
    return fn(*args, **kwargs)
  finally:
    took = time.monotonic() - start
    if took > seconds:
      raise AssertionError(f"took {took:.0f} s, more than {seconds} s")


# Triggers: strategies.

def unknown_strategy(s):
  ctl.make_strategy("mirorred")


def strategy_name_with_a_space(s):
  ctl.make_strategy("Mirrored ")


def runner_strategy_misspelt(s):
  _runner(strategy="mirored")


def unknown_strategy_on_the_command_line(s):
  _cli("train", CONFIG, "--workdir", str(s.path), "--strategy", "mirroed")


def knob_for_another_strategy(s):
  ctl.make_strategy("default", cross_device_ops="nccl")


def logical_cpus_after_the_first_op(s):
  tf.constant(1.0) + 1  # an op: the devices are fixed now (2, by tests/conftest.py)
  ctl.make_strategy("mirrored", logical_cpus=4)


def tpu_that_is_not_there(s):
  ctl.make_strategy("tpu", tpu="local")


# Batches and data.

def batch_not_divisible(s):
  _runner(data=_data(batch=7), strategy=_mirrored())


def batch_smaller_than_replicas(s):
  _runner(data=_data(batch=1), strategy=_mirrored())


def dynamic_batch_on_two_replicas(s):
  _runner(data=_data(drop_remainder=False), strategy=_mirrored())


def global_batch_size_disagrees(s):
  _runner(global_batch_size=16)


def dataset_function_with_a_float_batch_size(s):
  _runner(data=lambda context: _data(batch=4), global_batch_size=8.0)


def dataset_function_without_batch_size(s):
  _runner(data=lambda context: _data(batch=4))


def data_shape_does_not_fit(s):
  _train(data=_data(features=3).repeat())


def data_dtype_does_not_fit(s):
  words = tf.data.Dataset.from_tensor_slices(np.array([["seven"]] * 64))
  _train(data=words.batch(BATCH, drop_remainder=True).repeat())


def data_not_batched(s):
  _runner(data=tf.data.Dataset.from_tensor_slices(np.zeros(64, "float32")))


def data_of_mixed_batch_sizes(s):
  _runner(data=tf.data.Dataset.zip((_data(batch=8), _data(batch=4))))


def data_not_a_dataset(s):
  _runner(data=np.zeros((64, 1), "float32"))


def empty_dataset(s):
  _train(data=_data(n=0))


def dataset_smaller_than_a_batch(s):
  _train(data=_data(n=5).repeat())


def finite_data_shorter_than_the_run(s):
  runner = _runner(data=_data())  # 8 batches, no .repeat()
  try:
    runner.fit(10, str(s.path), progress=False)
  finally:  # refused before any step: nothing trained, nothing to lose
    assert int(runner.global_step.numpy()) == 0


def nan_in_the_data(s):
  x = np.arange(64, dtype="float32")[:, None]
  x[2 * BATCH + 3] = np.nan  # in the batch of step 2
  data = tf.data.Dataset.from_tensor_slices(x).batch(BATCH, drop_remainder=True)
  runner = _runner(data=data, steps_per_loop=4)  # the NaN is inside a compiled call
  runner.fit(4, None, progress=False)


# build().

def build_returns_a_list(s):
  _runner(build=lambda: [_model(), keras.optimizers.SGD()])


def model_without_variables(s):
  _runner(build=lambda: ({"model": keras.Sequential([keras.layers.Dense(1)])}, {}))


def model_made_outside_the_scope(s):
  outside = _build()
  _runner(build=lambda: outside, strategy=_mirrored())


def model_made_before_build(s):
  generator = _model()  # a global model, built before the runner calls build()
  _runner(build=lambda: ({"model": generator}, {"model": keras.optimizers.SGD()}))


def optimizer_made_outside_the_scope(s):
  optimizer = keras.optimizers.SGD(0.01)
  _runner(build=lambda: ({"model": _model()}, {"model": optimizer}), strategy=_mirrored())


def optimizer_named_after_no_model(s):
  _runner(build=lambda: ({"model": _model()}, {"generator": keras.optimizers.SGD()}))


def one_optimizer_under_two_names(s):
  def build():
    adam = keras.optimizers.Adam()
    return {"generator": _model(), "discriminator": _model()}, {
        "generator": adam, "discriminator": adam}
  _runner(build=build)


def layer_in_two_models_with_two_optimizers(s):
  def build():
    trunk = keras.layers.Dense(4, name="trunk")
    models = {}
    for name in ("generator", "discriminator"):
      x = keras.Input((1,))
      models[name] = keras.Model(x, keras.layers.Dense(1)(trunk(x)), name=name)
    return models, {"generator": keras.optimizers.Adam(), "discriminator": keras.optimizers.SGD()}
  with warnings.catch_warnings():
    warnings.simplefilter("error", ctl.SharedVariableWarning)  # raised here to be checked
    _runner(build=build)


def model_name_not_a_string(s):
  _runner(build=lambda: ({0: _model()}, {}))


def optimizer_not_keras(s):
  _runner(build=lambda: ({"model": _model()}, {"model": "adam"}))


# Runner arguments, execution modes.

def steps_per_loop_zero(s):
  _runner(steps_per_loop=0)


def eager_and_jit_compile(s):
  _runner(eager=True, jit_compile=True)


def unknown_mixed_precision(s):
  _runner(mixed_precision="float16")


def jit_compile_with_a_tape_under_mirrored(s):
  _train(strategy=_mirrored(), jit_compile=True)


def jit_compile_with_a_dynamic_batch(s):
  _runner(data=_data(drop_remainder=False), jit_compile=True)


def _stand_in(strategy_class):
  # No parameter-server cluster or TPU here: an uninitialised instance is
  # enough for the runner's type check, which comes before any use of it.
  return strategy_class.__new__(strategy_class)


def eager_under_parameter_servers(s):
  _runner(eager=True, strategy=_stand_in(tf.distribute.experimental.ParameterServerStrategy))


def eager_under_tpu(s):
  _runner(eager=True, strategy=_stand_in(tf.distribute.TPUStrategy))


# The step.

def step_returns_a_list(s):
  _train(step=lambda ctx, x: [ctx.average(x[:, 0])])


def step_result_not_a_tensor(s):
  _train(step=lambda ctx, x: {"loss": object()})


def step_result_not_a_scalar(s):
  _train(step=lambda ctx, x: {"loss": tf.zeros([3])})


def _step_counting_rows(ctx, x):
  return {**_step(ctx, x), "batch": tf.shape(x)[0]}  # 8 on one replica, 4 on each of two


def integer_step_result(s):
  _train(step=_step_counting_rows)


def integer_step_result_on_two_replicas(s):
  _train(step=_step_counting_rows, strategy=_mirrored())


def minimize_unknown_optimizer(s):
  _train(step=lambda ctx, x: {"loss": ctx.minimize(
      lambda: ctx.average(ctx.models["model"](x)[:, 0]), "generator")})


def average_of_a_scalar(s):
  _train(step=lambda ctx, x: {"loss": ctx.minimize(
      lambda: ctx.average(tf.reduce_mean(tf.square(ctx.models["model"](x)))), "model")})


def minimize_a_per_replica_mean(s):
  _train(step=lambda ctx, x: {"loss": ctx.minimize(
      lambda: tf.reduce_mean(ctx.models["model"](x)), "model")})


def result_mixing_shares(s):
  _train(step=lambda ctx, x: {"rms": tf.sqrt(ctx.average(tf.square(x[:, 0])))})


def python_float_of_a_share_on_two_replicas(s):
  def step(ctx, x):
    return {"loss": float(_step(ctx, x)["loss"])}  # eager: a number, its share lost
  _train(step=step, strategy=_mirrored(), eager=True)


def step_and_build_swapped(s):
  ctl.Runner(_build, _step, _data().repeat())


def minimize_with_the_name_first(s):
  def step(ctx, x):
    with tf.GradientTape() as tape:
      loss = ctx.average(tf.square(ctx.models["model"](x)[:, 0]))
    ctx.minimize("model", loss, tape=tape)
    return {"loss": loss}
  _train(step=step)


def minimize_twice_from_one_tape(s):
  def step(ctx, x):
    model = ctx.models["model"]
    with tf.GradientTape(persistent=True) as tape:
      loss = ctx.average(tf.square(model(x)[:, 0]))
    for _ in range(2):  # two critic updates from one forward pass
      ctx.minimize(loss, "model", tape=tape)
    return {"loss": loss}
  _train(step=step)


def loss_computed_outside_the_tape(s):
  def step(ctx, x):
    with tf.GradientTape() as tape:
      fake = ctx.normal([1])
    loss = ctx.average(tf.square(ctx.models["model"](fake)[:, 0]))  # after the block
    return {"loss": ctx.minimize(loss, "model", tape=tape)}
  _train(step=step)


def noise_shape_with_the_batch_size(s):
  def step(ctx, x):
    noise = ctx.normal([tf.shape(x)[0], 1])  # as for tf.random.normal
    return {"loss": ctx.minimize(lambda: ctx.average(ctx.models["model"](noise)[:, 0]), "model")}
  _train(step=step)


def loss_of_another_model(s):
  def build():
    return ({"generator": _model(), "discriminator": _model()},
            {"generator": keras.optimizers.SGD(), "discriminator": keras.optimizers.SGD()})

  def step(ctx, x):
    with tf.GradientTape() as tape:
      fake = ctx.models["generator"](x)
      d_fake = ctx.models["discriminator"](tf.stop_gradient(fake))
      g_loss = ctx.average(tf.square(fake[:, 0]))
    return {"loss": ctx.minimize(g_loss, "discriminator", tape=tape), "d": tf.reduce_mean(d_fake)}
  _train(step=step, build=build)


def keras_gradient_accumulation_under_mirrored(s):
  def build():
    return {"model": _model()}, {"model": keras.optimizers.Adam(gradient_accumulation_steps=4)}
  _runner(build=build, strategy=_mirrored())


def keras_ema_overwrite_under_mirrored(s):
  def build():
    optimizer = keras.optimizers.Adam(use_ema=True, ema_overwrite_frequency=100)
    return {"model": _model()}, {"model": optimizer}
  _runner(build=build, strategy=_mirrored())


def keras_ema_under_central_storage(s):
  def build():
    return {"model": _model()}, {"model": keras.optimizers.Adam(use_ema=True)}
  _runner(build=build, strategy=ctl.make_strategy("central_storage", logical_cpus=2))


def _sliced_loss(ctx, x):
  return ctx.average(tf.square(ctx.models["model"](x)[:, 0]))


def micro_batches_of_a_loss_tensor(s):
  def step(ctx, x):
    with tf.GradientTape() as tape:
      loss = _sliced_loss(ctx, x)
    return {"loss": ctx.minimize(loss, "model", tape=tape, batch=x, micro_batches=2)}
  _train(step=step)


def micro_batches_without_the_batch(s):
  _train(step=lambda ctx, x: {"loss": ctx.minimize(
      lambda: _sliced_loss(ctx, x), "model", micro_batches=2)})


def micro_batches_that_do_not_divide_the_batch(s):
  _train(step=lambda ctx, x: {"loss": ctx.minimize(
      lambda x: _sliced_loss(ctx, x), "model", batch=x, micro_batches=3)})


def micro_batches_with_a_value_of_the_whole_batch(s):
  def step(ctx, x):
    whole = tf.square(ctx.models["model"](x)[:, 0])  # outside the loss function
    return {"loss": ctx.minimize(lambda x: _sliced_loss(ctx, x) + ctx.average(whole),
                                 "model", batch=x, micro_batches=2)}
  _train(step=step)


def _step_making_a_layer(ctx, x):
  extra = keras.layers.Dense(1)  # a new layer, and so new variables, at each call
  with tf.GradientTape() as tape:
    loss = ctx.average(extra(ctx.models["model"](x))[:, 0])
  ctx.minimize(loss, "model", tape=tape)
  return {"loss": loss}


def variable_made_in_the_eager_step(s):
  _train(step=_step_making_a_layer, eager=True)


def variable_made_in_the_step_under_mirrored(s):
  _train(step=_step_making_a_layer, strategy=_mirrored())


def unknown_model_in_the_step(s):
  _train(step=lambda ctx, x: {"loss": ctx.average(ctx.models["generatr"](x)[:, 0])})


def missing_key_in_a_dict_batch(s):
  x = np.zeros((64, 1), "float32")
  data = tf.data.Dataset.from_tensor_slices({"image": x, "label": x[:, 0]})
  _train(step=lambda ctx, batch: _step(ctx, batch["images"]),
         data=data.repeat().batch(BATCH, drop_remainder=True))


# Evaluation.

def evaluate_endless_data(s):
  _runner().evaluate(lambda ctx, x: {"loss": ctx.average(x[:, 0])}, _data().repeat())


def evaluate_action_with_endless_data(s):
  ctl.Evaluate(lambda ctx, x: {"loss": ctx.average(x[:, 0])}, _data().repeat(),
               ctl.Every(steps=10))


def evaluate_zero_batches(s):
  _runner().evaluate(lambda ctx, x: {"loss": ctx.average(x[:, 0])}, _data(), num_batches=0)


def over_samples_returns_a_tensor(s):
  _runner().over_samples(lambda models, indices: tf.cast(indices, tf.float32), 10)


def over_samples_returns_a_scalar(s):
  _runner().over_samples(lambda models, indices: {"mean": tf.reduce_mean(
      tf.cast(indices, tf.float32))}, 10)


def over_samples_zero_samples(s):
  _runner().over_samples(lambda models, indices: {"index": indices}, 0)


def eval_across_a_bad_layout(s):
  _cli("eval", CONFIG, "--workdir", str(s.path), "--across", "default,mirrored")


# Step counts.

def train_zero_steps(s):
  _runner().train(0)


def train_negative_steps(s):
  _runner().train(-3)


def fit_empty_workdir(s):
  _runner().fit(2, "")


def empty_workdir_on_the_command_line(s):
  _cli("train", CONFIG, "--workdir", "")


def fit_negative_steps(s):
  _runner().fit(-1, str(s.path))


def fit_float_steps(s):
  _runner().fit(1e4, str(s.path))


def steps_per_loop_beyond_the_run(s):
  runner = _runner(steps_per_loop=100)
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # a warning, raised here to be checked
    _steps(runner, runner.fit, 4, None, progress=False)


# Periodic actions and export.

def every_without_a_period(s):
  ctl.Every()


def every_zero_steps(s):
  ctl.Every(steps=0)


def every_negative_seconds(s):
  ctl.Every(seconds=-1)


def action_that_is_a_function(s):
  _runner().fit(2, str(s.path), actions=[lambda loop: None])


def action_every_an_int(s):
  _runner().fit(2, str(s.path), actions=[ctl.Export("model", every=5)])


def summaries_every_an_int(s):
  _runner().fit(2, str(s.path), summaries=ctl.Summaries(5))


def action_that_is_a_class(s):
  _runner().fit(2, str(s.path), actions=[ctl.Export])


def checkpoint_in_actions(s):
  _runner().fit(2, str(s.path), actions=[ctl.Checkpoint(keep=1)])


def checkpoint_without_workdir(s):
  _runner().fit(2, None, checkpoint=ctl.Checkpoint(keep=1))


def writing_actions_without_workdir(s):
  _runner().fit(2, None, actions=[ctl.Samples(lambda models: None, ctl.Every(steps=1))])


def export_of_an_unknown_model(s):
  _runner().export("gen", str(s.path))


def export_action_of_an_unknown_model(s):
  runner = _runner()
  _steps(runner, runner.fit, 3, str(s.path), actions=[ctl.Export("gen")], progress=False)


def profile_from_step_0(s):
  ctl.Profile(start=0, steps=5)


def profile_under_parameter_servers(s):
  strategy = _stand_in(tf.distribute.experimental.ParameterServerStrategy)
  placement = mock.Mock(kind=strategies.kind_of(strategy))
  ctl.Profile(start=10, steps=5).check(mock.Mock(placement=placement, workdir=str(s.path)))


def profile_option_not_start_steps(s):
  err = io.StringIO()
  with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
    cli.main(["train", CONFIG, "--workdir", str(s.path), "--profile", "100"])
  raise CommandFailed(f"exit code {exited.value.code}\n{err.getvalue()}")


# The work directory and its checkpoints.

def second_run_in_the_same_workdir(s):
  held = workdir_lib.Lock(str(s.path))  # as another run holds it (flock is per open file)
  s.values["pid"] = os.getpid()
  try:
    runner = _runner()
    _steps(runner, runner.fit, 3, str(s.path), progress=False)
  finally:
    held.release()


def resume_with_another_batch_size(s):
  _runner(data=_data(batch=8).repeat()).fit(2, str(s.path), progress=False)
  runner = _runner(data=_data(batch=16).repeat())
  _steps(runner, runner.fit, 4, str(s.path), progress=False)


def resume_with_another_data_pipeline(s):
  _runner().fit(2, str(s.path), progress=False)
  shuffled = _data().unbatch().shuffle(64, seed=1).batch(BATCH, drop_remainder=True)
  runner = _runner(data=shuffled.repeat())
  try:
    _steps(runner, runner.fit, 4, str(s.path), progress=False)
  finally:  # the fix the message names resumes from step 2
    fixed = _runner(data=shuffled.repeat())
    fixed.fit(4, str(s.path), checkpoint=ctl.Checkpoint(restore_data=False), progress=False)
    assert int(fixed.global_step.numpy()) == 4


def unwritable_workdir(s):
  blocker = s.path / "a_file"
  blocker.write_text("not a directory")
  s.values["workdir"] = str(blocker / "run")
  runner = _runner()
  _steps(runner, runner.fit, 3, str(blocker / "run"), progress=False)


def data_with_a_py_function(s):
  data = _data(drop_remainder=True).unbatch().map(
      lambda x: tf.py_function(lambda y: y * 2.0, [x], tf.float32))
  data = data.map(lambda x: tf.ensure_shape(x, (1,))).repeat().batch(BATCH)
  runner = _runner(data=data)
  _steps(runner, runner.fit, 3, str(s.path), progress=False)


def data_with_stateful_random_augmentation(s):
  data = _data(drop_remainder=True).unbatch().map(lambda x: x + tf.random.uniform([1]))
  runner = _runner(data=data.repeat().batch(BATCH, drop_remainder=True), strategy=_mirrored())
  _steps(runner, runner.fit, 3, str(s.path), progress=False)


def _saved_run(s, build=_build, steps=2):
  workdir = str(s.path / "run")
  _runner(build=build).fit(steps, workdir, progress=False)
  return workdir


def _resume(workdir, **kwargs):
  runner = _runner(**kwargs)
  _steps(runner, runner.fit, 4, workdir, progress=False)


def _two_models():
  models, optimizers = _build()
  models["encoder"] = _model()
  optimizers["encoder"] = keras.optimizers.SGD()
  return models, optimizers


def checkpoint_of_another_experiment(s):
  _resume(_saved_run(s), build=_two_models)


def checkpoint_with_other_shapes(s):
  workdir = _saved_run(s)  # kernel (1, 1)
  _resume(workdir, build=lambda: ({"model": _model(features=2)},
                                  {"model": keras.optimizers.SGD(0.01)}),
          data=_data(features=2).repeat())


def checkpoint_with_a_model_more(s):
  _resume(_saved_run(s, build=_two_models))  # one model: the encoder is left out


def uint8_images_beside_a_tanh_generator(s):
  def build():
    generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4, activation="tanh")],
                                 name="generator")
    discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    return ({"generator": generator, "discriminator": discriminator},
            {"generator": keras.optimizers.Adam(), "discriminator": keras.optimizers.Adam()})
  images = tf.data.Dataset.from_tensor_slices(np.arange(64, dtype=np.uint8).reshape(16, 4))
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # a warning, raised here to be checked
    _runner(build=build, data=images.repeat().batch(BATCH))


def loss_scaling_switched_on_at_resume(s):
  _resume(_saved_run(s), mixed_precision="mixed_float16")


def float64_checkpoint_resumed_in_float32(s):
  def step(ctx, x):  # float64-clean: the target in the input's dtype
    model = ctx.models["model"]
    with tf.GradientTape() as tape:
      loss = ctx.average(tf.square(model(x)[:, 0] - x[:, 0]))
    ctx.minimize(loss, "model", tape=tape)
    return {"loss": loss}

  workdir = str(s.path / "run64")
  _runner(step=step, mixed_precision="float64").fit(2, workdir, progress=False)
  _resume(workdir, step=step)


def _damaged(s, suffix, damage):
  workdir = _saved_run(s)
  path = os.path.join(workdir, "checkpoints", "ckpt-2" + suffix)
  damage(path)
  _resume(workdir)


def truncated_checkpoint_index(s):
  def truncate(path):
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  _damaged(s, ".index", truncate)


def overwritten_checkpoint_data(s):
  def zero(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
      f.write(b"\0" * size)
  _damaged(s, ".data-00000-of-00001", zero)


def eval_checkpoint_of_a_step_not_kept(s):
  for step in (2, 4):  # what fit keeps; only their names are read before the refusal
    os.makedirs(s.path / "checkpoints", exist_ok=True)
    (s.path / "checkpoints" / f"ckpt-{step}.index").write_bytes(b"")
  _cli("eval", CONFIG, "--workdir", str(s.path), "--checkpoint", "99", *helpers.TINY_GAN)


def restore_of_a_negative_step(s):
  workdir = _saved_run(s)
  assert _runner().restore(workdir, " 2 ") == 2  # a step, blanks around it or not
  _runner().restore(workdir, "-1")


def fit_over_steps_trained_in_memory(s):
  workdir = _saved_run(s)
  runner = _runner()
  runner.train(3)
  runner.fit(6, workdir, progress=False)


def fit_after_restoring_an_older_checkpoint(s):
  workdir = str(s.path / "run")
  _runner().fit(4, workdir, progress=False, checkpoint=ctl.Checkpoint(ctl.Every(steps=2)))
  runner = _runner()
  runner.restore(workdir, 2)  # to look at an older model, in a notebook
  runner.fit(6, workdir, progress=False)


# Configuration (gin) and the command line.

def gin_parameter_typo(s):
  _cli("train", CONFIG, "--workdir", str(s.path), "--gin", "gan.Schedule.total_step = 3")


def gin_configurable_typo(s):
  _cli("train", CONFIG, "--workdir", str(s.path), "--gin", "gan.Schedul.total_steps = 3")


def _train_own_config(s, lines):
  """`ctl train` of mine.gin: the DCGAN config included, then `lines`."""
  config = s.path / "mine.gin"
  config.write_text(f"include {CONFIG!r}\n" + "".join(f"{line}\n" for line in lines))
  s.values["config"] = str(config)
  _cli("train", str(config), "--workdir", str(s.path / "run"))


def gin_unclosed_bracket(s):
  _train_own_config(s, ["gan.Schedule.total_steps = (3"])


def gin_bracket_left_open_before_a_binding(s):
  _train_own_config(s, ["keras.optimizers.Adam.beta_1 = (0.5", "gan.Schedule.total_steps = 3"])


def gin_macro_typo(s):
  _train_own_config(s, ["LEARNING_RATE = 1e-4",
                        "keras.optimizers.Adam.learning_rate = %LERNING_RATE"])


def gin_learning_rate_as_a_string(s):
  _cli("train", CONFIG, "--workdir", str(s.path), "--gin",
       "keras.optimizers.Adam.learning_rate = '2e-4'")


def gin_schedule_rate_as_a_string(s):
  _train_own_config(s, ["keras.optimizers.Adam.learning_rate = "
                        "@keras.optimizers.schedules.CosineDecay()",
                        "generator/keras.optimizers.schedules.CosineDecay.initial_learning_rate"
                        " = '5e-4'",
                        "keras.optimizers.schedules.CosineDecay.decay_steps = 10"])


def gin_keras_2_parameter_name(s):
  _train_own_config(s, ["generator/keras.optimizers.Adam.lr = 2e-4"])


def gin_include_that_two_folders_match(s):
  for folder in ("a", "b"):
    (s.path / folder).mkdir()
    (s.path / folder / "common.gin").write_text("gan.Schedule.total_steps = 3\n")
  (s.path / "a" / "main.gin").write_text(f"include {CONFIG!r}\ninclude 'common.gin'\n"
                                         "include '../b/part.gin'\n")
  (s.path / "b" / "part.gin").write_text("include 'common.gin'\n")
  s.values["b"] = str(s.path / "b")
  _cli("train", str(s.path / "a" / "main.gin"), "--workdir", str(s.path / "run"))


def gin_include_loop(s):
  (s.path / "a.gin").write_text(f"include {CONFIG!r}\ninclude 'b.gin'\n")
  (s.path / "b.gin").write_text("include 'a.gin'\n")  # back to a.gin
  _cli("train", str(s.path / "a.gin"), "--workdir", str(s.path / "run"))


def missing_gin_file(s):
  _cli("train", os.path.join(helpers.ROOT, "examples", "configs", "dcgn.gin"))


# Datasets by name.

def tfds_not_prepared(s):
  import gan  # pylint: disable=import-outside-toplevel
  _within(60, gan.data.tfds_dataset, "mnist", 16, data_dir=str(s.path))


def tfds_download_offline(s):
  import gan  # pylint: disable=import-outside-toplevel
  with mock.patch.object(gan.data, "_reachable", lambda address, timeout=3.0: False):
    _within(60, gan.data.tfds_dataset, "mnist", 16, data_dir=str(s.path), download=True)


# Clusters: TF_CONFIG and the launcher.

def malformed_tf_config(s):
  _command(helpers.python(["-c", "import ctl; ctl.make_strategy('auto')"],
                          env={"TF_CONFIG": "{cluster: nope"}, check=False, timeout=120))


def tf_config_task_outside_the_cluster(s):
  config = '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}'
  ctl.choose_strategy(env={"TF_CONFIG": config}, num_gpus=0, tpu_devices=False)


def launcher_port_in_use(s):
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    s.values["port"] = taken.getsockname()[1]
    _command(helpers.ctl("launch", "--workers", "2", "--port-base", str(s.values["port"]),
                         "--", sys.executable, "-c", "pass", check=False, timeout=60))


def launcher_without_a_command(s):
  _cli("launch", "--workers", "2")


# Worker 1 never starts TensorFlow; worker 0's MultiWorkerMirroredStrategy
# waits for it, which TF would do forever.
_PEER_NEVER_STARTS = """
import json, os, time
if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
  time.sleep(300)
import ctl
ctl.make_strategy("multi_worker")
"""


def startup_timeout_negative(s):
  ctl.make_strategy("multi_worker", startup_timeout=-1)


def startup_timeout_variable_not_a_number(s):
  with mock.patch.dict(os.environ, {"CTL_STARTUP_TIMEOUT": "ten minutes"}):
    ctl.make_strategy("multi_worker")


def heartbeat_timeout_zero(s):
  ctl.make_strategy("multi_worker", heartbeat_timeout=0)


def heartbeat_timeout_for_mirrored(s):
  ctl.make_strategy("mirrored", heartbeat_timeout=120)


def heartbeat_timeout_variable_not_a_number(s):
  with mock.patch.dict(os.environ, {"CTL_HEARTBEAT_TIMEOUT": "1m"}):
    ctl.make_strategy("multi_worker")


def ray_command_as_one_string(s):
  ray_train.train("dcgan --workdir runs/x", num_workers=2)


def ray_command_with_a_strategy(s):
  ray_train.train(["dcgan", "--strategy", "mirrored"], num_workers=2)


def gin_value_of_the_wrong_type(s):
  _cli("train", CONFIG, "--workdir", str(s.path), "--gin", "gan.Experiment.batch_size = 'sixty'")


def multi_worker_peer_never_starts(s):
  # The launcher gives up at its --startup-timeout (10 s), then stops the tasks
  # within --grace (2 s) plus at most 15 s of its own waits: 27 s < 60 s.
  _command(_within(60, helpers.ctl, "launch", "--workers", "2", "--startup-timeout", "10",
                   "--grace", "2", "--", sys.executable, "-c", _PEER_NEVER_STARTS,
                   check=False, timeout=90))


# The table.

CASES = [
    # Strategies.
    Case("unknown-strategy",
         "ValueError from make_strategy: strategy 'mirorred' is not known (did you mean "
         "'mirrored'?); use one of auto, "
         "default, ...",
         unknown_strategy, ValueError,
         ("strategy 'mirorred' is not known (did you mean 'mirrored'?)",
          "use one of auto, default, one_device, mirrored")),
    Case("strategy-name-with-a-space",
         "ValueError from make_strategy: strategy 'Mirrored ' is not known (did you mean "
         "'mirrored'?); use one of auto, default, ...",
         strategy_name_with_a_space, ValueError,
         ("strategy 'Mirrored ' is not known (did you mean 'mirrored'?)", "use one of auto")),
    Case("runner-strategy-misspelt",
         "ValueError from Runner: strategy 'mirored' is not known (did you mean 'mirrored'?); "
         "use one of auto, default, ...",
         runner_strategy_misspelt, ValueError,
         ("strategy 'mirored' is not known (did you mean 'mirrored'?)", "use one of auto")),
    Case("unknown-strategy-on-the-command-line",
         "ctl train exits 2: --strategy 'mirroed' is not a strategy name (did you mean "
         "'mirrored'?)",
         unknown_strategy_on_the_command_line, CommandFailed,
         ("exit code 2", "--strategy 'mirroed' is not a strategy name",
          "did you mean 'mirrored'", "use one of auto")),
    Case("knob-for-another-strategy",
         "ValueError from make_strategy: cross_device_ops ('nccl') only applies to strategy "
         "'mirrored'; drop it",
         knob_for_another_strategy, ValueError,
         ("cross_device_ops ('nccl') only applies to strategy 'mirrored', not 'default'",
          "drop it")),
    Case("logical-cpus-after-the-first-op",
         "RuntimeError from make_strategy: logical_cpus=4 cannot be applied once TF ran an op; "
         "call it at the top",
         logical_cpus_after_the_first_op, RuntimeError,
         ("logical_cpus=4 cannot be applied", "fixed its devices at 2 CPU device(s)",
          "at the top of the program")),
    Case("tpu-not-reachable",
         "RuntimeError from make_strategy, at once: strategy 'tpu' found no TPU; set TPU_NAME or "
         "pick another",
         tpu_that_is_not_there, RuntimeError,
         ("strategy 'tpu' found no TPU (tpu='local')", "pick another strategy",
          *filter(None, [strategies.tpu_version_note()]))),  # with a TF no TPU runs, which do
    # Batches and data.
    Case("batch-not-divisible-by-replicas",
         "ValueError from Runner: global batch size (7) is not divisible by the 2 replicas; use a "
         "multiple of 2, e.g. 6",
         batch_not_divisible, ValueError,
         ("global batch size (7) is not divisible by the 2 replicas in sync",
          "use a multiple of 2, e.g. 6")),
    Case("batch-smaller-than-replicas",
         "ValueError from Runner: global batch size (1) is smaller than the 2 replicas; use a "
         "multiple of 2",
         batch_smaller_than_replicas, ValueError,
         ("global batch size (1) is smaller than the 2 replicas in sync", "use a multiple of 2")),
    Case("dynamic-batch-on-two-replicas",
         "ValueError from Runner: data has no static batch size, which 2 replicas need; "
         "drop_remainder=True",
         dynamic_batch_on_two_replicas, ValueError,
         ("data has no static batch size (its batch dimension is None)",
          "splitting it across 2 replicas", "drop_remainder=True")),
    Case("global-batch-size-disagrees-with-data",
         "ValueError from Runner: global_batch_size (16) differs from the batch size of data (8)",
         global_batch_size_disagrees, ValueError,
         ("global_batch_size (16) differs from the batch size of data (8)",
          "drop global_batch_size or batch the dataset by it")),
    Case("dataset-function-with-a-float-batch-size",
         "TypeError from Runner: global_batch_size must be an int, got 8.0 (float); pass "
         "global_batch_size=8",
         dataset_function_with_a_float_batch_size, TypeError,
         ("global_batch_size must be an int, got 8.0 (float)", "global_batch_size=8")),
    Case("dataset-function-without-global-batch-size",
         "ValueError from Runner: data is a dataset function; pass global_batch_size=...",
         dataset_function_without_batch_size, ValueError,
         ("data is a dataset function", "pass global_batch_size=...")),
    Case("data-shape-does-not-fit-the-model",
         "ValueError from Keras while the step is traced (before step 0), with ctl's note: the "
         "step's first call, on data elements TensorSpec(shape=(8, 3), ...); check that the data "
         "fits the models' inputs (their keras.Input)",
         data_shape_does_not_fit, ValueError,
         ("data elements", "(8, 3)", "keras.Input", "[global step 0]")),
    Case("data-dtype-does-not-fit-the-model",
         "tf.errors.UnimplementedError from the first compiled call (before step 0): Cast string "
         "to float is not supported, with ctl's note naming the data elements (dtype string) "
         "and keras.Input",
         data_dtype_does_not_fit, (ValueError, TypeError, tf.errors.OpError),
         ("data elements", "string", "keras.Input", "[global step 0]")),
    Case("data-not-batched",
         "ValueError from Runner: data elements must be batches ... got TensorSpec(shape=(), "
         "...); call dataset.batch(...)",
         data_not_batched, ValueError,
         ("data elements must be batches", "shape=()", "call dataset.batch(...)")),
    Case("data-of-mixed-batch-sizes",
         "ValueError from Runner: the tensors of one data element have different batch sizes "
         "[4, 8]",
         data_of_mixed_batch_sizes, ValueError,
         ("the tensors of one data element have different batch sizes [4, 8]",
          "batch them together")),
    Case("data-not-a-dataset",
         "TypeError from Runner: data must be a tf.data.Dataset of global batches ..., got ndarray",
         data_not_a_dataset, TypeError,
         ("data must be a tf.data.Dataset of global batches", "got ndarray")),
    Case("empty-dataset",
         "ValueError from Runner: data holds no batch (its cardinality is 0): it is empty, or has "
         "fewer examples than one global batch of 8 ...; give it at least 8 examples",
         empty_dataset, ValueError,
         ("data holds no batch", "empty", "at least 8 examples")),
    Case("dataset-smaller-than-one-batch",
         "ValueError from Runner: data holds no batch ... fewer examples than one global batch "
         "of 8 ...; repeat before batching",
         dataset_smaller_than_a_batch, ValueError,
         ("data holds no batch", "fewer examples than one global batch of 8",
          "dataset.repeat().batch(8, drop_remainder=True)")),
    Case("finite-data-shorter-than-the-run",
         "ValueError from fit, before any step: fit(10) from step 0 needs 10 batches but the "
         "data holds 8 (its cardinality) ...; call .repeat() on the dataset",
         finite_data_shorter_than_the_run, ValueError,
         ("fit(10) from step 0 needs 10 batches but the data holds 8", "Call .repeat()",
          "train at most 8 steps")),
    Case("nan-in-the-data",
         "FloatingPointError from fit: non-finite result at step 2 (ctx.step == 2): loss nan. "
         "Training stopped; ...",
         nan_in_the_data, FloatingPointError,
         ("non-finite result at step 2 (ctx.step == 2)", "loss nan", "Training stopped",
          "change something first")),
    # build().
    Case("step-and-build-swapped",
         "TypeError from Runner: step_fn and build look swapped ...; the order is "
         "Runner(step_fn, build, data)",
         step_and_build_swapped, TypeError,
         ("step_fn and build look swapped", "step_fn '_build' takes no arguments",
          "Runner(step_fn, build, data)")),
    Case("build-returns-the-wrong-thing",
         "TypeError from Runner: build() must return (models, optimizers), two dicts, got list",
         build_returns_a_list, TypeError,
         ("build() must return (models, optimizers), two dicts", "got list")),
    Case("model-without-variables",
         "ValueError from Runner: model 'model' has no variables yet; give it an input shape "
         "(keras.Input)",
         model_without_variables, ValueError,
         ("model 'model' has no variables yet", "give it an input shape (keras.Input)")),
    Case("model-made-outside-the-scope",
         "ValueError from Runner (mirrored): model 'model' was made before build() was called "
         "..., they are outside the strategy's scope ...; construct the model inside build()",
         model_made_outside_the_scope, ValueError,
         ("model 'model' was made before build() was called", "outside the strategy's scope",
          "Construct the model inside build()")),
    Case("model-made-before-build",
         "ValueError from Runner (any strategy): model 'model' was made before build() was "
         "called ..., so Runner(seed=...) does not fix its initial weights ...; construct the "
         "model inside build()",
         model_made_before_build, ValueError,
         ("model 'model' was made before build() was called (its variables existed already)",
          "Runner(seed=...) does not fix its initial weights",
          "Construct the model inside build(), e.g. build = lambda: ({'model': make_model(), "
          "...}, {...})")),
    Case("optimizer-made-outside-the-scope",
         "ValueError from Runner: optimizer 'model' was created outside the strategy's scope; "
         "create it inside build()",
         optimizer_made_outside_the_scope, ValueError,
         ("optimizer 'model' was created outside the strategy's scope", "inside build()")),
    Case("one-optimizer-under-two-names",
         "ValueError from Runner: optimizers['generator'] and optimizers['discriminator'] are the "
         "same Adam object ...; give each model an optimizer of its own",
         one_optimizer_under_two_names, ValueError,
         ("optimizers['generator'] and optimizers['discriminator'] are the same Adam object",
          "those of model 'generator'", "cannot also update model 'discriminator'",
          "Give each model an optimizer of its own")),
    Case("layer-in-two-models-with-two-optimizers",
         "SharedVariableWarning from Runner (it goes on): optimizers 'generator' and "
         "'discriminator' both update the variables of layer(s) 'trunk' ...; build one "
         "optimizer on the rest, or silence it with warnings.filterwarnings",
         layer_in_two_models_with_two_optimizers, UserWarning,
         ("optimizers 'generator' and 'discriminator' both update the variables of "
          "layer(s) 'trunk'", "optimizer.build(rest)", "variables=rest",
          "category=ctl.SharedVariableWarning")),
    Case("model-name-not-a-string",
         "TypeError from Runner: the models dict has key 0 (int); name models and "
         "optimizers with strings",
         model_name_not_a_string, TypeError,
         ("the models dict has key 0 (int)", "name models and optimizers with strings")),
    Case("python-float-of-a-share-on-two-replicas",
         "TypeError from the step's first call: step result 'loss' is a float ..., not a "
         "tensor, on 2 replicas ...; return the tensor itself",
         python_float_of_a_share_on_two_replicas, TypeError,
         ("step result 'loss' is a float", "not a tensor, on 2 replicas",
          "1/2 of the truth", "Return the tensor itself", "[global step 0]")),
    Case("minimize-with-the-name-first",
         "TypeError from the step's first call: minimize: got the name 'model' as the loss; "
         "ctx.minimize(loss, 'model', tape=tape)",
         minimize_with_the_name_first, TypeError,
         ("got the name 'model' as the loss", "ctx.minimize(loss, 'model', tape=tape)",
          "[global step 0]")),
    Case("minimize-twice-from-one-tape",
         "ValueError from the step's first call: minimize('model') was called twice with the "
         "same tape ...; record each update under its own tape",
         minimize_twice_from_one_tape, ValueError,
         ("minimize('model') was called twice with the same tape", "stale",
          "Record each update under its own tape", "ctx.minimize(lambda: ..., 'model')",
          "[global step 0]")),
    Case("loss-computed-outside-the-tape",
         "ValueError from the step's first call: minimize('model'): the loss was not recorded by "
         "the tape passed to ctx.minimize ...; compute the loss inside the `with "
         "tf.GradientTape() as tape:` block",
         loss_computed_outside_the_tape, ValueError,
         ("minimize('model'): the loss was not recorded by the tape passed to ctx.minimize",
          "(the trainable variables of model 'model')", "every gradient is None",
          "Compute the loss inside the `with tf.GradientTape() as tape:` block",
          "ctx.minimize(lambda: ..., 'model')", "[global step 0]")),
    Case("noise-shape-with-the-batch-size",
         "ValueError from the step's first call: ctx.normal(shape): shape must be Python "
         "ints, the shape of one example's draw, got [<tensor>, 1]. ctx adds the batch "
         "dimension itself ...",
         noise_shape_with_the_batch_size, ValueError,
         ("ctx.normal(shape): shape must be Python ints", "got [<tensor>, 1]",
          "ctx.normal(noise_dim) gives [per-replica batch, noise_dim]",
          "leave the batch size (tf.shape(x)[0]) out")),
    Case("loss-of-another-model",
         "ValueError from the step's first call: minimize('discriminator'): the loss does not "
         "depend on any of the 2 variables it updates ...; pass the loss that model "
         "'discriminator' should lower",
         loss_of_another_model, ValueError,
         ("minimize('discriminator'): the loss does not depend on any of the 2 variables",
          "(the trainable variables of model 'discriminator')",
          "Pass the loss that model 'discriminator' should lower", "tf.stop_gradient",
          "[global step 0]")),
    Case("keras-gradient-accumulation-under-mirrored",
         "ValueError from Runner: optimizers['model'] (Adam) has gradient_accumulation_steps=4, "
         "which Keras cannot run under mirrored ...; ctx.minimize(lambda batch: ..., 'model', "
         "batch=real, micro_batches=4)",
         keras_gradient_accumulation_under_mirrored, ValueError,
         ("optimizers['model'] (Adam) has gradient_accumulation_steps=4",
          "cannot run under mirrored", "inside a tf.cond",
          "ctx.minimize(lambda batch: ..., 'model', batch=real, micro_batches=4)")),
    Case("keras-ema-overwrite-under-mirrored",
         "ValueError from Runner: optimizers['model'] (Adam) has use_ema=True with "
         "ema_overwrite_frequency=100, which Keras cannot run under mirrored ...; drop it and "
         "call optimizer.finalize_variable_values(...) once training ends",
         keras_ema_overwrite_under_mirrored, ValueError,
         ("optimizers['model'] (Adam) has use_ema=True with ema_overwrite_frequency=100",
          "cannot run under mirrored", "Drop ema_overwrite_frequency",
          "optimizer.finalize_variable_values(model.trainable_variables)")),
    Case("keras-ema-under-central-storage",
         "ValueError from Runner: optimizers['model'] (Adam): use_ema=True cannot run under "
         "central_storage ...; use mirrored, or keep the average as a model of its own",
         keras_ema_under_central_storage, ValueError,
         ("optimizers['model'] (Adam): use_ema=True cannot run under central_storage",
          "Use mirrored", "keep the average as a model of its own")),
    Case("micro-batches-of-a-loss-tensor",
         "ValueError from the step's first call: minimize('model'): batch= and micro_batches= "
         "need the loss as a function of the batch ...",
         micro_batches_of_a_loss_tensor, ValueError,
         ("minimize('model'): batch= and micro_batches= need the loss as a function",
          "ctx.minimize(lambda batch: ..., 'model', batch=real, micro_batches=2)",
          "[global step 0]")),
    Case("micro-batches-without-the-batch",
         "ValueError from the step's first call: minimize('model', micro_batches=2): say which "
         "batch to slice: pass batch=...",
         micro_batches_without_the_batch, ValueError,
         ("minimize('model', micro_batches=2): say which batch to slice", "pass batch=...",
          "[global step 0]")),
    Case("micro-batches-that-do-not-divide-the-batch",
         "ValueError from the step's first call: minimize('model', micro_batches=3): the "
         "per-replica batch size (8) must be a known multiple of micro_batches",
         micro_batches_that_do_not_divide_the_batch, ValueError,
         ("minimize('model', micro_batches=3)", "per-replica batch size (8)",
          "must be a known multiple of micro_batches", "drop_remainder=True",
          "[global step 0]")),
    Case("micro-batches-with-a-value-of-the-whole-batch",
         "ValueError from the step's first call: ctx.average got 8 per-example values inside a "
         "loss function run on slices of 4 rows (micro_batches) ...; make them inside the "
         "function",
         micro_batches_with_a_value_of_the_whole_batch, ValueError,
         ("ctx.average got 8 per-example values", "slices of 4 rows (micro_batches)",
          "make them inside the function", "[global step 0]")),
    Case("variable-made-in-the-eager-step",
         "ValueError from the step's first call: the step created a variable ('dense_1/kernel', "
         "shape (1, 1)) at test_bad_input.py:N: ...; Create it in build()",
         variable_made_in_the_eager_step, ValueError,
         ("the step created a variable ('dense", "kernel', shape (1, 1)) at",
          "extra(ctx.models[\"model\"](x))", "Create it in build()", "[global step 0]")),
    Case("variable-made-in-the-step-under-mirrored",
         "ValueError while the step is traced (before step 0): the step created a variable "
         "('dense_1/kernel', shape (1, 1)) at test_bad_input.py:N: ...; Create it in build()",
         variable_made_in_the_step_under_mirrored, ValueError,
         ("the step created a variable ('dense", "kernel', shape (1, 1)) at",
          "extra(ctx.models[\"model\"](x))", "Create it in build()", "[global step 0]")),
    Case("unknown-model-in-the-step",
         "KeyError from the step's first call: no model named 'generatr'; build() returned "
         "models ['model']",
         # Autograph turns a KeyError in a step into its own StagingError.
         unknown_model_in_the_step, Exception,
         ("no model named 'generatr'", "build() returned models ['model']",
          "[global step 0]")),
    Case("missing-key-in-a-dict-batch",
         "KeyError from the step's first call, noted: the batch is a dict with keys "
         "['image', 'label']; 'images' is not one of them",
         missing_key_in_a_dict_batch, Exception,
         ("the batch is a dict with keys ['image', 'label']", "'images' is not one of them",
          "[global step 0]")),
    Case("optimizer-named-after-no-model",
         "ValueError from Runner: optimizer 'generator' has no model of the same name (models: "
         "['model']); "
         "call optimizer.build(variables)",
         optimizer_named_after_no_model, ValueError,
         ("optimizer 'generator' has no model of the same name", "(models: ['model'])",
          "call optimizer.build(variables) inside build()")),
    Case("optimizer-not-keras",
         "TypeError from Runner: optimizers['model'] is a str, not a keras.optimizers.Optimizer",
         optimizer_not_keras, TypeError,
         ("optimizers['model'] is a str", "not a keras.optimizers.Optimizer")),
    # Runner arguments and execution modes.
    Case("steps-per-loop-zero",
         "ValueError from Runner: steps_per_loop must be an int >= 1, got 0",
         steps_per_loop_zero, ValueError, ("steps_per_loop must be an int >= 1, got 0",)),
    Case("eager-and-jit-compile",
         "ValueError from Runner: eager=True and jit_compile=True contradict each other; pick one",
         eager_and_jit_compile, ValueError,
         ("eager=True and jit_compile=True contradict each other", "pick one")),
    Case("unknown-mixed-precision",
         "ValueError from Runner: mixed_precision 'float16' is not known; use None, "
         "'mixed_float16', 'mixed_bfloat16' or 'float64'",
         unknown_mixed_precision, ValueError,
         ("mixed_precision 'float16' is not known",
          "use None, 'mixed_float16', 'mixed_bfloat16' or 'float64'")),
    Case("jit-compile-with-a-tape-under-mirrored",
         "ValueError while the step is traced (before step 0): the loss must be given as a "
         "function: "
         "ctx.minimize(lambda: ..., 'model')",
         jit_compile_with_a_tape_under_mirrored, ValueError,
         ("jit_compile=True under this strategy compiles each update on its own",
          "ctx.minimize(lambda: ..., 'model')", "[global step 0]")),
    Case("jit-compile-with-a-dynamic-batch",
         "ValueError from Runner: data has no static batch size, which XLA (jit_compile) needs; "
         "drop_remainder=True",
         jit_compile_with_a_dynamic_batch, ValueError,
         ("data has no static batch size", "XLA (jit_compile)", "drop_remainder=True")),
    Case("eager-under-parameter-servers",
         "ValueError from Runner: eager=True cannot run under ParameterServerStrategy; debug "
         "eagerly under 'default'",
         eager_under_parameter_servers, ValueError,
         ("eager=True cannot run under ParameterServerStrategy",
          "debug eagerly under 'default', then switch the strategy")),
    Case("eager-under-tpu",
         "ValueError from Runner: eager=True cannot run under TPUStrategy; debug eagerly under "
         "'default'",
         eager_under_tpu, ValueError,
         ("eager=True cannot run under TPUStrategy",
          "debug eagerly under 'default', then switch the strategy")),
    # The step.
    Case("step-returns-a-list",
         "TypeError while the step is traced: step must return a dict of scalar values, got list; "
         "e.g. return {'loss': loss}",
         step_returns_a_list, TypeError,
         ("step must return a dict of scalar values, got list", "return {'loss': loss}",
          "[global step 0]")),
    Case("step-result-not-a-tensor",
         "TypeError while the step is traced: step result 'loss' is a object, not a tensor; "
         "return numbers or scalar tensors",
         step_result_not_a_tensor, TypeError,
         ("step result 'loss' is a object, not a tensor", "return numbers or scalar tensors",
          "[global step 0]")),
    Case("step-result-not-a-scalar",
         "ValueError while the step is traced: step result 'loss' has shape (3,), not a scalar; "
         "reduce it in the step",
         step_result_not_a_scalar, ValueError,
         ("step result 'loss' has shape (3,), not a scalar", "reduce it in the step",
          "[global step 0]")),
    Case("integer-step-result",
         "TypeError while the step is traced: step result 'batch' is an int32 tensor: a count "
         "over this replica's rows ... would be averaged over replicas ...; return a float "
         "(was: logged 16 under default, 8 under mirrored:2)",
         integer_step_result, TypeError,
         ("step result 'batch' is an int32 tensor", "would be averaged over replicas",
          "ctx.average(tf.cast(hits, tf.float32))", "ctx.global_batch_size",
          "[global step 0]")),
    Case("integer-step-result-on-two-replicas",
         "TypeError while the step is traced (mirrored), the same as on one replica",
         integer_step_result_on_two_replicas, TypeError,
         ("step result 'batch' is an int32 tensor", "Return a float", "[global step 0]")),
    Case("minimize-an-unknown-optimizer",
         "ValueError while the step is traced: minimize: no optimizer named 'generator'; build() "
         "returned optimizers ['model']",
         minimize_unknown_optimizer, ValueError,
         ("minimize: no optimizer named 'generator'", "build() returned optimizers ['model']",
          "[global step 0]")),
    Case("minimize-a-per-replica-mean",
         "ValueError while the step is traced: minimize('model'): the loss is not an average over "
         "the global batch; "
         "use ctx.average",
         minimize_a_per_replica_mean, ValueError,
         ("minimize('model'): the loss is not an average over the global batch",
          "compute it with ctx.average(per_example_losses)", "[global step 0]")),
    Case("average-of-a-scalar",
         "ValueError while the step is traced: ctx.average got a scalar (shape (), from a "
         "Mean op), not per-example values ...; pass one loss per row (was: Keras' "
         "'Invalid value passed for `per_example_loss`')",
         average_of_a_scalar, ValueError,
         ("ctx.average got a scalar (shape (), from a Mean op), not per-example values",
          "the global batch size (8)", "Pass one loss per row",
          "not ctx.average(tf.reduce_mean(...))", "[global step 0]")),
    Case("result-mixing-shares",
         "ValueError while the step is traced: step result 'rms' is computed from global-batch "
         "averages through a Sqrt op",
         result_mixing_shares, ValueError,
         ("step result 'rms' is computed from global-batch averages", "through a Sqrt op",
          "Return the averages themselves", "[global step 0]")),
    # Step counts.
    Case("train-zero-steps",
         "ValueError from train: num_steps must be an int >= 1, got 0",
         train_zero_steps, ValueError, ("num_steps must be an int >= 1, got 0",)),
    Case("train-negative-steps",
         "ValueError from train: num_steps must be an int >= 1, got -3",
         train_negative_steps, ValueError, ("num_steps must be an int >= 1, got -3",)),
    Case("evaluate-endless-data",
         "ValueError from evaluate: evaluation data is endless ...; pass data.take(100) or "
         "num_batches=100",
         evaluate_endless_data, ValueError,
         ("evaluation data is endless", "infinite cardinality", "data.take(100)",
          "num_batches=100")),
    Case("evaluate-action-with-endless-data",
         "ValueError from ctl.Evaluate (before training): evaluation data is endless ...",
         evaluate_action_with_endless_data, ValueError,
         ("evaluation data is endless", "data.take(100)", "num_batches=100")),
    Case("evaluate-zero-batches",
         "ValueError from evaluate: num_batches must be an int >= 1 (batches to evaluate), "
         "got 0",
         evaluate_zero_batches, ValueError,
         ("num_batches must be an int >= 1 (batches to evaluate), got 0",)),
    Case("over-samples-returns-a-tensor",
         "TypeError from over_samples: fn must return a dict of per-sample tensors "
         "[rows, ...], got SymbolicTensor; e.g. return {'features': features}",
         over_samples_returns_a_tensor, TypeError,
         ("fn must return a dict of per-sample tensors", "return {'features': features}")),
    Case("over-samples-returns-a-scalar",
         "ValueError from over_samples: fn's output 'mean' has shape (); each output must "
         "have one row per sample index",
         over_samples_returns_a_scalar, ValueError,
         ("fn's output 'mean' has shape ()", "one row per sample index")),
    Case("over-samples-zero-samples",
         "ValueError from over_samples: num_samples must be an int >= 1, got 0",
         over_samples_zero_samples, ValueError, ("num_samples must be an int >= 1, got 0",)),
    Case("eval-across-a-bad-layout",
         "ctl eval exits 2: --across: 'mirrored' is not a layout; use default, mirrored:N "
         "... or multi_worker:N",
         eval_across_a_bad_layout, CommandFailed,
         ("exit code 2", "--across: 'mirrored' is not a layout", "mirrored:N (N logical CPUs)",
          "multi_worker:N")),
    Case("fit-empty-workdir",
         "ValueError from fit, before anything is made: workdir is '', an empty path; give "
         "the run's directory, e.g. workdir='runs/x' (was: FileNotFoundError: '')",
         fit_empty_workdir, ValueError,
         ("workdir is '', an empty path", "give the run's directory, e.g. workdir='runs/x'",
          "(or None to write nothing)")),
    Case("empty-workdir-on-the-command-line",
         "ctl train exits 2: --workdir '' is an empty path; give the run's directory, or drop "
         "--workdir for runs/dcgan (was: trained into runs/dcgan)",
         empty_workdir_on_the_command_line, CommandFailed,
         ("exit code 2", "--workdir '' is an empty path", "give the run's directory",
          "drop --workdir for runs/dcgan")),
    Case("fit-negative-steps",
         "ValueError from fit: total_steps must be an int >= 0 (the global step to train "
         "up to), got -1",
         fit_negative_steps, ValueError,
         ("total_steps must be an int >= 0 (the global step to train up to), got -1",)),
    Case("fit-float-steps",
         "TypeError from fit: total_steps must be an int >= 0 (the global step to train "
         "up to), got 10000.0",
         fit_float_steps, TypeError,
         ("total_steps must be an int >= 0", "got 10000.0")),
    Case("steps-per-loop-beyond-the-run",
         "UserWarning from fit, before step 0 (the run goes on, its calls cut to the run): "
         "steps_per_loop (100) is larger than total_steps (4) ...; lower steps_per_loop to "
         "at most 4",
         steps_per_loop_beyond_the_run, UserWarning,
         ("steps_per_loop (100)", "total_steps (4)", "Lower steps_per_loop to at most 4",
          "[global step 0]")),
    # Periodic actions and export.
    Case("every-without-a-period",
         "ValueError from Every: Every needs steps=... or seconds=... (or both); for the end only "
         "pass every=None",
         every_without_a_period, ValueError,
         ("Every needs steps=... or seconds=...", "pass every=None")),
    Case("every-zero-steps",
         "ValueError from Every: Every: steps must be an int >= 1, got 0",
         every_zero_steps, ValueError, ("Every: steps must be an int >= 1, got 0",)),
    Case("every-negative-seconds",
         "ValueError from Every: Every: seconds must be a number > 0, got -1",
         every_negative_seconds, ValueError,
         ("Every: seconds must be a number > 0, got -1",)),
    Case("action-that-is-a-function",
         "TypeError from fit: action <function ...> is not an action: it lacks every, "
         "collective, check. Subclass ctl.Action, set `every` ... and define "
         "__call__(self, context)",
         action_that_is_a_function, TypeError,
         ("is not an action", "it lacks every, collective, check", "Subclass ctl.Action",
          "__call__(self, context)")),
    Case("summaries-every-an-int",
         "TypeError from fit: Summaries.every is 5; use ctl.Every(steps=..., seconds=...) or "
         "None",
         summaries_every_an_int, TypeError,
         ("Summaries.every is 5", "use ctl.Every(steps=..., seconds=...)")),
    Case("action-that-is-a-class",
         "TypeError from fit: action Export is a class; pass an instance of it, e.g. "
         "Export(...)",
         action_that_is_a_class, TypeError,
         ("action Export is a class; pass an instance of it, e.g. Export(...)",)),
    Case("checkpoint-in-actions",
         "TypeError from fit: ctl.Checkpoint goes in fit(checkpoint=...), not in actions",
         checkpoint_in_actions, TypeError,
         ("ctl.Checkpoint goes in fit(checkpoint=...), not in actions",
          "fit(checkpoint=ctl.Checkpoint(...))")),
    Case("checkpoint-without-workdir",
         "ValueError from fit: fit(checkpoint=ctl.Checkpoint(...)) writes files but workdir "
         "is None; pass workdir=... to fit, or checkpoint=False",
         checkpoint_without_workdir, ValueError,
         ("fit(checkpoint=ctl.Checkpoint(...)) writes files but workdir is None",
          "pass workdir=... to fit, or checkpoint=False")),
    Case("action-every-an-int",
         "TypeError from fit: Export.every is 5; use ctl.Every(steps=..., seconds=...) or None",
         action_every_an_int, TypeError,
         ("Export.every is 5", "use ctl.Every(steps=..., seconds=...) or None")),
    Case("writing-actions-without-workdir",
         "ValueError from fit: ctl.Samples writes files but workdir is None; pass "
         "workdir=... to fit, or drop the action",
         writing_actions_without_workdir, ValueError,
         ("ctl.Samples writes files but workdir is None", "pass workdir=... to fit")),
    Case("export-an-unknown-model",
         "ValueError from export: no model named 'gen'; the models are ['model']",
         export_of_an_unknown_model, ValueError,
         ("export: no model named 'gen'", "the models are ['model']")),
    Case("export-action-of-an-unknown-model",
         "ValueError from fit, before step 0: ctl.Export('gen'): the runner has no model of "
         "that name; its models are ['model']",
         export_action_of_an_unknown_model, ValueError,
         ("ctl.Export('gen')", "no model of that name", "['model']", "[global step 0]")),
    Case("profile-from-step-0",
         "ValueError from Profile: ctl.Profile: start must be an int >= 1 (the step after "
         "which the trace starts), got 0. The first call traces and compiles the step; start "
         "at 1 or later",
         profile_from_step_0, ValueError,
         ("ctl.Profile: start must be an int >= 1", "got 0", "start at 1 or later")),
    Case("profile-under-parameter-servers",
         "ValueError from fit, before step 0: ctl.Profile cannot run under parameter_server: "
         "the steps run on the workers ...; capture a worker's trace from TensorBoard's "
         "Profile tab",
         profile_under_parameter_servers, ValueError,
         ("ctl.Profile cannot run under parameter_server", "the steps run on the workers",
          "capture a worker's trace")),
    Case("profile-option-not-start-steps",
         "exit code 2 from ctl train: argument --profile: '100' is not START:STEPS with "
         "START >= 1 and STEPS >= 1; e.g. --profile 100:5",
         profile_option_not_start_steps, CommandFailed,
         ("exit code 2", "--profile: '100' is not START:STEPS", "--profile 100:5")),
    # The work directory and its checkpoints.
    Case("unwritable-workdir",
         "OSError from fit, before step 0: workdir ... cannot be written (Not a directory ...); "
         "fix its permissions or pass another workdir",
         unwritable_workdir, OSError,
         ("<workdir>", "cannot be written", "permissions", "pass another workdir",
          "[global step 0]")),
    Case("data-with-a-py-function",
         "ValueError from fit, before step 0: the position in the data cannot be "
         "checkpointed: EagerPyFunc is stateful ...; use TensorFlow ops, or set the "
         "dataset's experimental_external_state_policy to WARN",
         data_with_a_py_function, ValueError,
         ("position in the data cannot be checkpointed", "EagerPyFunc is stateful",
          "instead of tf.py_function", "ExternalStatePolicy.WARN", "[global step 0]")),
    Case("data-with-stateful-random-augmentation",
         "ValueError from fit (mirrored), before step 0: ... RandomUniform is stateful ...; "
         "use stateless random ops for an exact resume, or set the policy to WARN",
         data_with_stateful_random_augmentation, ValueError,
         ("position in the data cannot be checkpointed", "RandomUniform is stateful",
          "tf.random.stateless_uniform", "ExternalStatePolicy.WARN", "[global step 0]")),
    Case("checkpoint-of-another-experiment",
         "ValueError from fit, before step 0 and before anything is restored: checkpoint ... "
         "does not match this runner: models[...] is in the checkpoint, not in this runner; "
         "use a new work directory",
         checkpoint_of_another_experiment, ValueError,
         ("checkpoint <tmp>/run/checkpoints/ckpt-2 does not match this runner",
          "use a new work directory", "[global step 0]")),
    Case("checkpoint-with-other-shapes",
         "ValueError from fit, before step 0: checkpoint ... does not match this runner: "
         "models['model'] variable 0 has shape [1, 1] in the checkpoint, [2, 1] in this runner",
         checkpoint_with_other_shapes, ValueError,
         ("checkpoint <tmp>/run/checkpoints/ckpt-2 does not match this runner",
          "shape [1, 1] in the checkpoint, [2, 1] in this runner", "use a new work directory",
          "[global step 0]")),
    Case("checkpoint-with-a-model-more",
         "ValueError from fit, before step 0 (never a silent partial restore): checkpoint ... "
         "does not match this runner: models['encoder'] is in the checkpoint, not in this runner",
         checkpoint_with_a_model_more, ValueError,
         ("checkpoint <tmp>/run/checkpoints/ckpt-2 does not match this runner",
          "models['encoder'] is in the checkpoint, not in this runner", "[global step 0]")),
    Case("uint8-images-beside-a-tanh-generator",
         "UserWarning from Runner (it goes on): the first batch (uint8, shaped like the "
         "output of model 'generator') holds values in [0, 31], but 'generator' ends in "
         "tanh, whose output is in [-1, 1] ...; scale it: tf.cast(x, tf.float32) / 127.5 - 1",
         uint8_images_beside_a_tanh_generator, UserWarning,
         ("the first batch (uint8, shaped like the output of model 'generator') holds "
          "values in [0, 31]", "ends in tanh, whose output is in [-1, 1]",
          "tf.cast(x, tf.float32) / 127.5 - 1")),
    Case("loss-scaling-switched-on-at-resume",
         "ValueError from fit, before step 0: checkpoint ... does not match this runner: it "
         "was trained without loss scaling, and this runner wraps its optimizers ('model') "
         "in keras.optimizers.LossScaleOptimizer (mixed_float16) ...; resume with the "
         "precision the run was trained in, or start a new work directory",
         loss_scaling_switched_on_at_resume, ValueError,
         ("checkpoint <tmp>/run/checkpoints/ckpt-2 does not match this runner",
          "trained without loss scaling", "optimizers ('model') in "
          "keras.optimizers.LossScaleOptimizer", "Runner(mixed_precision=None)",
          "new work directory", "[global step 0]")),
    Case("float64-checkpoint-resumed-in-float32",
         "ValueError from fit, before step 0: checkpoint ... does not match this runner: it "
         "holds float64 model variables, this runner builds float32 ones: it was trained in "
         "float64 ...; build this runner in float64 too (was: 'its files are damaged ... "
         "move ckpt-2.* elsewhere', which pointed at a good checkpoint)",
         float64_checkpoint_resumed_in_float32, ValueError,
         ("checkpoint <tmp>/run64/checkpoints/ckpt-2 does not match this runner",
          "it holds float64 model variables, this runner builds float32 ones",
          "gan.Experiment.mixed_precision = 'float64'", "[global step 0]")),
    Case("truncated-checkpoint-index",
         "ValueError from fit, before step 0, nothing deleted: no checkpoint in ... can be "
         "read: ckpt-2: OpError: ...; copy the files again, or move the directory away to "
         "train from step 0 (with an older checkpoint, that one is restored: "
         "tests/test_fault_matrix.py)",
         truncated_checkpoint_index, ValueError,
         ("no checkpoint in <tmp>/run/checkpoints can be read: ckpt-2: OpError",
          "Nothing was deleted", "move the directory away to train from step 0",
          "[global step 0]")),
    Case("overwritten-checkpoint-data",
         "ValueError from fit, before step 0, nothing restored or deleted: no checkpoint in "
         "... can be read: ckpt-2: DataLossError: The checksum ... does not match ...",
         overwritten_checkpoint_data, ValueError,
         ("no checkpoint in <tmp>/run/checkpoints can be read: ckpt-2: DataLossError",
          "does not match", "Nothing was deleted", "[global step 0]")),
    Case("fit-over-steps-trained-in-memory",
         "ValueError from fit: this runner is at step 3 (trained or restored in memory), "
         "but the newest checkpoint is at step 2",
         fit_over_steps_trained_in_memory, ValueError,
         ("this runner is at step 3 (trained or restored in memory)",
          "the newest checkpoint in <tmp>/run/checkpoints is at step 2",
          "Pass another workdir")),
    Case("restore-of-a-negative-step",
         "ValueError: restore(checkpoint='-1'): give 'newest', 'best' ... or a step (>= 0) "
         "(was: taken as the name of a folder of kept checkpoints)",
         restore_of_a_negative_step, ValueError,
         ("restore(checkpoint='-1'): give 'newest', 'best'", "or a step (>= 0)")),
    Case("fit-after-restoring-an-older-checkpoint",
         "ValueError from fit: this runner is at step 2 (...restored...), but the newest "
         "checkpoint is at step 4; to train on from step 2, resume_from=2 (was: 'the "
         "runner has trained to step 2', and no word of going back)",
         fit_after_restoring_an_older_checkpoint, ValueError,
         ("this runner is at step 2 (trained or restored in memory)", "is at step 4",
          "ctl.Checkpoint(resume_from=2)", "set aside, not deleted")),
    Case("eval-checkpoint-of-a-step-not-kept",
         "ctl eval exits 1 before evaluating: no checkpoint of step 99 in .../checkpoints: "
         "the steps saved there are 2, 4 ...; give one of those, or 'newest' (was: "
         "'no kept checkpoint in .../checkpoints/99', 99 taken as a folder)",
         eval_checkpoint_of_a_step_not_kept, CommandFailed,
         ("exit code 1", "no checkpoint of step 99 in <tmp>/checkpoints",
          "the steps saved there are 2, 4", "give one of those, or 'newest'")),
    # Configuration and the command line.
    Case("gin-parameter-typo",
         "ctl train exits 2: binding `gan.Schedule.total_step = 3` (--gin): ... (did you mean "
         "'gan.Schedule.total_steps'?)",
         gin_parameter_typo, CommandFailed,
         ("exit code 2", "gan.Schedule.total_step = 3", "did you mean 'gan.Schedule.total_steps'")),
    Case("gin-configurable-typo",
         "ctl train exits 2: binding `gan.Schedul.total_steps = 3` (--gin): ... (did you mean "
         "'gan.Schedule'?)",
         gin_configurable_typo, CommandFailed,
         ("exit code 2", "gan.Schedul.total_steps = 3", "did you mean 'gan.Schedule'")),
    Case("gin-unclosed-bracket",
         "ctl train exits 2: mine.gin, line 2: `gan.Schedule.total_steps = (3` (column 28): "
         "the bracket opened here never closes (was: exit 1 and a tokenizer traceback)",
         gin_unclosed_bracket, CommandFailed,
         ("exit code 2", "<config>, line 2: `gan.Schedule.total_steps = (3` (column 28)",
          "the bracket opened here never closes")),
    Case("gin-bracket-left-open-before-a-binding",
         "ctl train exits 2: mine.gin, line 3: `gan.Schedule.total_steps = 3`: Expected ',' or "
         "')'. The bracket opened on line 2 (`... = (0.5`) is not closed before this line",
         gin_bracket_left_open_before_a_binding, CommandFailed,
         ("exit code 2", "<config>, line 3: `gan.Schedule.total_steps = 3`",
          "The bracket opened on line 2 (`keras.optimizers.Adam.beta_1 = (0.5`) is not "
          "closed before this line")),
    Case("gin-macro-typo",
         "ctl train exits 2: mine.gin, line 3: `... = %LERNING_RATE`: No bindings specified "
         "for 'LERNING_RATE/gin.macro' (did you mean '%LEARNING_RATE'?)",
         gin_macro_typo, CommandFailed,
         ("exit code 2", "<config>, line 3: `keras.optimizers.Adam.learning_rate = "
          "%LERNING_RATE`", "did you mean '%LEARNING_RATE'")),
    Case("gin-learning-rate-as-a-string",
         "ctl train exits 2 before building: binding `keras.optimizers.Adam.learning_rate = "
         "'2e-4'` (--gin): '2e-4' is a string, but learning_rate takes a number ...; write it "
         "without quotes (was: exit 1, Keras' traceback of 62 lines)",
         gin_learning_rate_as_a_string, CommandFailed,
         ("exit code 2", "binding `keras.optimizers.Adam.learning_rate = '2e-4'` (--gin)",
          "'2e-4' is a string, but learning_rate takes a number",
          "Write it without quotes: keras.optimizers.Adam.learning_rate = 2e-4.")),
    Case("gin-schedule-rate-as-a-string",
         "ctl train exits 2 before building: mine.gin, line 3: `generator/keras.optimizers."
         "schedules.CosineDecay.initial_learning_rate = '5e-4'`: '5e-4' is a string, but "
         "initial_learning_rate takes a number; write it without quotes (was: exit 1, a TF "
         "traceback from the step's first trace)",
         gin_schedule_rate_as_a_string, CommandFailed,
         ("exit code 2", "'5e-4' is a string, but initial_learning_rate takes a number. ",
          "Write it without quotes: generator/keras.optimizers.schedules.CosineDecay."
          "initial_learning_rate = 5e-4.")),
    Case("gin-keras-2-parameter-name",
         "ctl train exits 2 before building: mine.gin, line 2: `generator/"
         "keras.optimizers.Adam.lr = 2e-4`: ... 'lr', which is Keras 2's name: Keras 3 calls "
         "it 'learning_rate' (was: exit 1, Keras' traceback of 62 lines)",
         gin_keras_2_parameter_name, CommandFailed,
         ("exit code 2", "<config>, line 2: `generator/keras.optimizers.Adam.lr = 2e-4`",
          "has no parameter 'lr', which is Keras 2's name",
          "Write generator/keras.optimizers.Adam.learning_rate = 2e-4.")),
    Case("gin-include-that-two-folders-match",
         "ctl train exits 2: b/part.gin, line 1: `include 'common.gin'` means "
         "b/common.gin, but a/common.gin ... has the same relative path; give a path only "
         "one matches (includes are resolved beside the including file first)",
         gin_include_that_two_folders_match, CommandFailed,
         ("exit code 2", "<b>/part.gin, line 1: `include 'common.gin'` means "
          "<b>/common.gin", "has the same relative path", "an absolute path")),
    Case("gin-include-loop",
         "ctl train exits 2 before TensorFlow: b.gin, line 1: `include 'a.gin'` closes an "
         "include loop (a.gin -> b.gin -> a.gin) ...; remove this include (was: exit 1 and "
         "a RecursionError of 3,275 lines)",
         gin_include_loop, CommandFailed,
         ("exit code 2", "<tmp>/b.gin, line 1: `include 'a.gin'` closes an include loop "
          "(a.gin -> b.gin -> a.gin)", "Remove this include")),
    Case("missing-gin-file",
         "ctl train exits 2: config file .../dcgn.gin not found (did you mean 'dcgan.gin'?)",
         missing_gin_file, CommandFailed,
         ("exit code 2", "dcgn.gin not found", "did you mean 'dcgan.gin'",
          "give the path of a .gin file")),
    # Datasets by name.
    Case("tfds-dataset-not-prepared-offline",
         "DatasetNotFoundError at once: TFDS dataset 'mnist' is not prepared in <dir>; tfds build "
         "mnist ... there",
         tfds_not_prepared, FileNotFoundError,
         ("TFDS dataset 'mnist' is not prepared in <tmp>/mnist", "tfds build mnist",
          "gan.mnist_dataset")),
    Case("tfds-download-offline",
         "DatasetNotFoundError at once: ... storage.googleapis.com cannot be reached (no "
         "internet); tfds build ...",
         tfds_download_offline, FileNotFoundError,
         ("TFDS dataset 'mnist' is not prepared in <tmp>/mnist",
          "storage.googleapis.com cannot be reached (no internet)", "tfds build mnist")),
    # Clusters.
    Case("malformed-tf-config",
         "exit 1, ValueError from make_strategy: TF_CONFIG is not valid JSON (...): '{cluster: "
         "nope'. Set it to ...",
         malformed_tf_config, CommandFailed,
         ("exit code 1", "TF_CONFIG is not valid JSON", "'{cluster: nope'",
          "Set it to '{\"cluster\": {\"worker\": [\"host:port\"")),
    Case("tf-config-task-outside-the-cluster",
         "ValueError from make_strategy('auto'): TF_CONFIG task 'worker' index 2 is not in the "
         "cluster ...; use 0 to 1",
         tf_config_task_outside_the_cluster, ValueError,
         ("TF_CONFIG task 'worker' index 2 is not in the cluster", "has 2 'worker' task(s)",
          "use 0 to 1")),
    Case("launcher-port-in-use",
         "ctl launch exits 2 at once: port P on 127.0.0.1 is in use ...; pick another --port-base",
         launcher_port_in_use, CommandFailed,
         ("exit code 2", "port <port> on 127.0.0.1 is in use",
          "Pick another --port-base, or drop --port-base")),
    Case("launcher-without-a-command",
         "ctl launch exits 2: no command to launch; put it after '--'",
         launcher_without_a_command, CommandFailed,
         ("exit code 2", "no command to launch; put it after '--'")),
    Case("second-run-in-the-same-workdir",
         "WorkdirInUse from fit, before restoring: workdir ... is in use by process P on "
         "HOST ...; stop that run first, or pass another workdir",
         second_run_in_the_same_workdir, ctl.WorkdirInUse,
         ("workdir '<tmp>' is in use by process <pid> on", "overwrite each other's checkpoints",
          "Stop that run first", "or pass another workdir", "[global step 0]")),
    Case("resume-with-another-data-pipeline",
         "ValueError from fit, before anything is restored: checkpoint ... holds a position in "
         "other data ...; build the data as that run did, or "
         "ctl.Checkpoint(restore_data=False)",
         resume_with_another_data_pipeline, ValueError,
         ("holds a position in other data", "Failed to restore dataset iterator",
          "Build the data as that run did", "ctl.Checkpoint(restore_data=False)",
          "[global step 0]")),
    Case("resume-with-another-batch-size",
         "ValueError from fit, before restoring: checkpoint ... holds the position in data "
         "batched by 8 ... now ... 16; resume with batches of 8, or "
         "ctl.Checkpoint(restore_data=False)",
         resume_with_another_batch_size, ValueError,
         ("holds the position in data batched by 8", "the data now gives batches of 16",
          "Resume with batches of 8", "ctl.Checkpoint(restore_data=False)",
          "[global step 0]")),
    Case("startup-timeout-negative",
         "ValueError from make_strategy: startup_timeout must be a number >= 0 (seconds; 0 "
         "waits forever), got -1",
         startup_timeout_negative, ValueError,
         ("startup_timeout must be a number >= 0 (seconds; 0 waits forever), got -1",)),
    Case("startup-timeout-variable-not-a-number",
         "ValueError from make_strategy: CTL_STARTUP_TIMEOUT='ten minutes' is not a number of "
         "seconds; set it to e.g. 600",
         startup_timeout_variable_not_a_number, ValueError,
         ("CTL_STARTUP_TIMEOUT='ten minutes' is not a number of seconds", "e.g. 600")),
    Case("heartbeat-timeout-zero",
         "ValueError from make_strategy: heartbeat_timeout must be a number >= 1 (seconds), "
         "got 0",
         heartbeat_timeout_zero, ValueError,
         ("heartbeat_timeout must be a number >= 1 (seconds), got 0",)),
    Case("heartbeat-timeout-for-mirrored",
         "ValueError from make_strategy: heartbeat_timeout (120) only applies to strategy "
         "'multi_worker', not 'mirrored'; drop it",
         heartbeat_timeout_for_mirrored, ValueError,
         ("heartbeat_timeout (120) only applies to strategy 'multi_worker', not 'mirrored'",
          "drop it")),
    Case("heartbeat-timeout-variable-not-a-number",
         "ValueError from make_strategy: CTL_HEARTBEAT_TIMEOUT='1m' is not a number of "
         "seconds; set it to e.g. 60",
         heartbeat_timeout_variable_not_a_number, ValueError,
         ("CTL_HEARTBEAT_TIMEOUT='1m' is not a number of seconds", "e.g. 60")),
    Case("ray-command-as-one-string",
         "TypeError from ray_train.train: command must be ctl train's arguments as a list of "
         "strings (e.g. ['dcgan', '--workdir', 'runs/x']); for a function, "
         "ctl.distribute.ray.train",
         ray_command_as_one_string, TypeError,
         ("command must be ctl train's arguments as a list of strings",
          "got 'dcgan --workdir runs/x'")),
    Case("ray-command-with-a-strategy",
         "ValueError from ray_train.train: command has --strategy: Ray's workers always run "
         "'multi_worker'; drop it",
         ray_command_with_a_strategy, ValueError,
         ("command has --strategy", "always run 'multi_worker'; drop it")),
    Case("gin-value-of-the-wrong-type",
         "ctl train exits 2: TypeError: batch_size must be an int >= 1, got "
         "'sixty'. That value comes from `gan.Experiment.batch_size = 'sixty'` (--gin)",
         gin_value_of_the_wrong_type, CommandFailed,
         ("exit code 2", "got 'sixty'",
          "That value comes from `gan.Experiment.batch_size = 'sixty'` (--gin)",
          "fix the binding")),
    Case("multi-worker-peer-never-starts",
         "ctl launch exits 1 after --startup-timeout: worker ... did not become ready; stopped "
         "all tasks",
         multi_worker_peer_never_starts, CommandFailed,
         ("exit code 1", "worker 1 (pid", "did not become ready within --startup-timeout 10 s",
          "stopped all tasks", "raise --startup-timeout")),
]


# Cases that start processes importing TensorFlow or a cluster (seconds each):
# outside the fast tier.
SLOW_CASES = ("malformed-tf-config", "launcher-port-in-use", "multi-worker-peer-never-starts")


# Cases whose message must be one short line (issue 52: each was a traceback
# of dozens to thousands of lines): the error's own text, or for a command its
# stderr without log lines (`ctl: ...`).
ONE_LINE_CASES = ("gin-include-loop", "gin-learning-rate-as-a-string",
                  "gin-schedule-rate-as-a-string",
                  "gin-keras-2-parameter-name", "average-of-a-scalar", "fit-empty-workdir",
                  "empty-workdir-on-the-command-line", "eval-checkpoint-of-a-step-not-kept",
                  "integer-step-result", "integer-step-result-on-two-replicas")


def _one_line_problems(error):
  """[] if `error`'s message is one line of at most 500 characters."""
  if isinstance(error, CommandFailed):
    lines = [line for line in str(error).splitlines()[1:] if not line.startswith("ctl: ")]
  else:
    lines = str(error).splitlines()
  if len(lines) == 1 and len(lines[0]) <= 500:
    return []
  return [f"the message is not one short line ({len(lines)} lines):\n{_message(error)[:3000]}"]


def _marks(case):
  marks = (pytest.mark.slow,) if case.name in SLOW_CASES else ()
  if case.gap is None:
    return marks
  return marks + (pytest.mark.xfail(strict=True, raises=AssertionError, reason=case.gap),)


class Unexpected(Exception):
  """A gap case did neither what its `today` says nor what it should."""


def _run(trigger, scratch):
  """Runs `trigger`; what it raised (None if nothing)."""
  try:
    trigger(scratch)
  except Exception as e:  # pylint: disable=broad-except
    return e
  return None


def _message(error):
  """The text a case checks: the message and any notes (e.g. `[global step N]`)."""
  return "\n".join([str(error)] + list(getattr(error, "__notes__", ())))


def _problems(error, kind, words, scratch):
  """How `error` differs from `kind` with `words` in its message ([]: it does not)."""
  if kind is None:
    return [] if error is None else [f"raised {type(error).__name__}: {_message(error)[:3000]}"]
  if error is None:
    return [f"nothing was raised; expected {kind}"]
  if not isinstance(error, kind):
    return [f"expected {kind}, got {type(error).__name__}: {_message(error)[:3000]}"]
  missing = [scratch.fill(w) for w in words if scratch.fill(w) not in _message(error)]
  return [f"the message lacks {missing}:\n{_message(error)[:3000]}"] if missing else []


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=_marks(c)) for c in CASES])
def test_bad_input_is_refused_naming_the_fix(case, tmp_path):
  scratch = Scratch(tmp_path)
  error = _run(case.trigger, scratch)
  problems = _problems(error, case.error, case.must_contain, scratch)
  if not problems and case.name in ONE_LINE_CASES:
    problems = _one_line_problems(error)
  if problems and case.gap is not None:
    # Still a gap: it must be the documented one (else this is no xfail).
    today = _problems(error, case.today[0], case.today[1:], scratch)
    if today:
      raise Unexpected(f"{case.name}: not what `today` says: {today}")
  assert not problems, f"{case.name}: {problems[0]}"


def test_a_draw_shape_starting_with_the_batch_size_is_warned_of_once():
  """`ctx.normal([batch, 1])` as for tf.random.normal, the batch a Python int: a
  legal shape (one example's draw may be a matrix), but a model either takes the
  extra dimension silently (a Dense layer without an input shape) or refuses it
  naming shapes only, so ctx warns, once."""
  seen = []

  def step(ctx, x):
    noise = ctx.normal([BATCH, 1])
    seen.append(noise.shape)
    return {"loss": ctx.minimize(lambda: ctx.average(ctx.models["model"](noise[:, 0])[:, 0]),
                                 "model")}

  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    runner = _runner(step=step)
    runner.train(2)
    _runner(step=lambda ctx, x: {"loss": ctx.minimize(
        lambda: ctx.average(ctx.models["model"](ctx.normal(1))[:, 0]), "model")}).train(1)
  assert seen[0] == [BATCH, BATCH, 1]
  messages = [str(w.message) for w in caught if "batch size" in str(w.message)]
  assert messages == [
      f"ctx.normal([{BATCH}, 1]): the first dimension is the batch size ({BATCH}), but ctx "
      f"adds the batch dimension itself, so this draws [per-replica batch, {BATCH}, 1]. For "
      "one draw of [1] per example, call ctx.normal(1)."], messages


def test_the_table_can_be_documented():
  names = [c.name for c in CASES]
  assert len(names) == len(set(names)) >= 28
  assert set(SLOW_CASES) <= set(names), sorted(set(SLOW_CASES) - set(names))
  assert set(ONE_LINE_CASES) <= set(names), sorted(set(ONE_LINE_CASES) - set(names))
  for case in CASES:
    assert case.outcome and "\n" not in case.outcome, case.name
    assert case.must_contain and all(case.must_contain), case.name
    assert case.name.replace("-", "").isalnum() and case.name.islower(), case.name
    assert (case.gap is None) == (case.today is None), case.name


def test_reliability_doc_lists_exactly_these_cases_and_faults():
  import reliability_doc  # pylint: disable=import-outside-toplevel
  with open(reliability_doc.DOC) as f:
    documented = reliability_doc.generated_part(f.read())
  assert documented == reliability_doc.render(), (
      "docs/reliability.md does not match the tests: run "
      "`python tests/reliability_doc.py --write`")


# Every model layout trains and resumes: a run stopped after its checkpoint at
# step 2 and rerun to step 4 ends with exactly the weights, slots and losses of
# a run to step 4 without a stop. The first four are what users build; the
# others are what the GAN kit builds (slow: DCGAN-sized models).

def _dense(name, trunk=None):
  x = keras.Input((1,))
  h = trunk(x) if trunk is not None else keras.layers.Dense(4, name=f"{name}_hidden")(x)
  return keras.Model(x, keras.layers.Dense(1, name=f"{name}_out")(h), name=name)


def _shared_trunk():
  trunk = keras.layers.Dense(4, name="trunk")  # one feature extractor, two heads
  models = {"encoder": _dense("encoder", trunk), "discriminator": _dense("discriminator", trunk)}
  return models, {name: keras.optimizers.Adam(0.01) for name in models}


def _one_model_two_names():
  model = _dense("model")
  return ({"model": model, "same_model": model},
          {"model": keras.optimizers.Adam(0.01), "same_model": keras.optimizers.Adam(0.01)})


def _escaped_names():
  # TF escapes "." and "/" in checkpoint keys; the rest must pass as they are.
  names = ("gen.a", "critic/v1.2", "a..S", "ünï code", ".ATTRIBUTES")
  return ({n: _dense(f"m{i}") for i, n in enumerate(names)},
          {n: keras.optimizers.Adam(0.01) for n in names})


def _nested_models():
  inner = keras.Sequential([keras.Input((1,)), keras.layers.Dense(4)], name="inner")
  outer = keras.Sequential([keras.Input((1,)), inner, keras.layers.Dense(1)], name="outer")
  return {"outer": outer, "inner": inner}, {"outer": keras.optimizers.Adam(0.01)}


def _spectral_norm():
  # The wrapper the GAN kit's spectral_norm=True puts on each layer: a power-
  # iteration vector beside the weights, updated in training.
  model = keras.Sequential([keras.Input((1,)), keras.layers.SpectralNormalization(
      keras.layers.Dense(4)), keras.layers.Dense(1)], name="critic")
  return {"critic": model}, {"critic": keras.optimizers.Adam(0.01)}


def _step_every_optimizer(ctx, x):
  results = {}
  for i, name in enumerate(ctx.optimizers):
    with tf.GradientTape() as tape:
      y = tf.cast(ctx.models[name](x)[:, 0], tf.float32)  # float16 under mixed_float16
      loss = ctx.average(tf.square(y - x[:, 0]))
    results[f"loss_{i}"] = ctx.minimize(loss, name, tape=tape)
  return results


def _user_layout(build, **kwargs):
  return lambda: _runner(step=_step_every_optimizer, build=build,
                         data=_data(n=32).repeat(), **kwargs)


def _gan_layout(**options):
  def make():
    import gan  # pylint: disable=import-outside-toplevel
    from gan import experiment  # pylint: disable=import-outside-toplevel
    kind = dict(options)
    num_classes, encoder = kind.pop("num_classes", None), kind.pop("encoder", False)
    step = experiment.make_step(loss=gan.losses.non_saturating, noise_dim=4,
                                conditional=bool(num_classes), encoder=encoder, **kind)
    discriminator = ((lambda **kw: gan.models.bigan_discriminator(width=4, **kw)) if encoder else
                     (lambda **kw: gan.dcgan_discriminator(4, **kw)))
    build = experiment.make_build(
        generator=lambda **kw: gan.dcgan_generator(width=4, **kw), discriminator=discriminator,
        encoder=(lambda **kw: gan.models.dcgan_encoder(width=4, **kw)) if encoder else None,
        image_shape=(8, 8, 1), noise_dim=4, num_classes=num_classes,
        ema_decay=kind.get("ema_decay"))
    images = np.linspace(-1, 1, 32 * 64, dtype="float32").reshape(32, 8, 8, 1)
    data = tf.data.Dataset.from_tensor_slices(
        (images, np.arange(32, dtype="int32") % 10) if num_classes else images)
    return ctl.Runner(step, build, data.repeat().batch(BATCH, drop_remainder=True))
  return make


LAYOUTS = {
    "shared-trunk": _user_layout(_shared_trunk),
    "one-model-two-names": _user_layout(_one_model_two_names),
    "escaped-names": _user_layout(_escaped_names),
    "nested-models": _user_layout(_nested_models),
    "loss-scale-optimizers": _user_layout(_shared_trunk, mixed_precision="mixed_float16"),
    "spectral-norm": _user_layout(_spectral_norm),
    # The GAN kit's layouts, two runs holding them: an EMA copy, a class-
    # conditional generator and discriminator; the BiGAN's encoder and pair
    # discriminator.
    "gan-conditional-ema": _gan_layout(num_classes=10, ema_decay=0.5),
    "gan-bigan-ema": _gan_layout(encoder=True, ema_decay=0.5),
}


def _state(runner):
  return [np.asarray(v) for v in tf.nest.flatten(runner.state.variables())]


@pytest.mark.parametrize("layout", [
    pytest.param(name, marks=(pytest.mark.slow,) if name.startswith("gan-") else ())
    for name in LAYOUTS])
def test_every_model_layout_saves_and_resumes(layout, tmp_path):
  make = LAYOUTS[layout]
  stopped = make()
  stopped.fit(2, tmp_path, progress=False)  # saves ckpt-2
  expected = stopped.train(2)  # steps 2 and 3 as if it had not stopped
  resumed = make()
  results = resumed.fit(4, tmp_path, progress=False)
  assert int(resumed.global_step.numpy()) == 4
  for key, values in expected.items():
    np.testing.assert_array_equal(results[key], values, err_msg=key)
  for got, want in zip(_state(resumed), _state(stopped), strict=True):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", [
    pytest.param(name, marks=(pytest.mark.slow,) if name.startswith("gan-") else ())
    for name in LAYOUTS])
def test_every_model_layout_saves_in_the_background_and_resumes(layout, tmp_path, caplog):
  make = LAYOUTS[layout]
  stopped = make()
  expected = stopped.fit(4, tmp_path, progress=False, checkpoint=ctl.Checkpoint(
      ctl.Every(steps=2), asynchronous=True))  # ckpt-2 in the background
  assert "cannot be taken ahead" not in caplog.text  # no fall back to saving at once
  resumed = make()
  results = resumed.fit(4, tmp_path, progress=False,
                        checkpoint=ctl.Checkpoint(resume_from=2))
  for key, values in expected.items():
    np.testing.assert_array_equal(results[key], values[2:], err_msg=key)
  for got, want in zip(_state(resumed), _state(stopped), strict=True):
    np.testing.assert_array_equal(got, want)
