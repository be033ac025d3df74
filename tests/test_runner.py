"""Runner and StepContext: the reduction rule, the user contract and its errors."""

import functools
import re
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl

GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def mirrored():
  return ctl.make_strategy("mirrored", logical_cpus=2)


def data(n=64):
  # Example i is the number i, so the step can tell which rows it got.
  x = np.arange(n, dtype="float32")[:, None]
  return tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH, drop_remainder=True)


def build():
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  return {"model": model}, {"model": keras.optimizers.SGD(0.01)}


def train_step(ctx, x):
  model = ctx.models["model"]
  with tf.GradientTape() as tape:
    loss = ctx.average(tf.square(model(x)[:, 0] - x[:, 0]))
  ctx.minimize(loss, "model", tape=tape)
  return {"loss": loss}


def run(step, strategy=None, steps=1, **kwargs):
  runner = ctl.Runner(step, kwargs.pop("build", build), kwargs.pop("data", data()),
                      strategy=strategy or tf.distribute.get_strategy(), **kwargs)
  return runner.train(steps)


# The reduction rule.

def reduction_step(ctx, x):
  values = x[:, 0]
  # Replica 0 holds rows 0-3 (mean 1.5), replica 1 rows 4-7 (mean 5.5).
  return {"average": ctx.average(values),             # share of the global mean: summed
          "replica_mean": tf.reduce_mean(values),     # per-replica mean: averaged
          "replicas": ctx.num_replicas,
          "per_replica_batch": ctx.per_replica_batch_size}


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_results_are_global_batch_values(strategy_name, mirrored):
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
  history = run(reduction_step, strategy, steps=2)
  np.testing.assert_allclose(history["average"], [3.5, 11.5])  # mean of 0..7, 8..15
  np.testing.assert_allclose(history["replica_mean"], [3.5, 11.5])
  replicas = strategy.num_replicas_in_sync
  np.testing.assert_array_equal(history["replicas"], [replicas] * 2)
  np.testing.assert_array_equal(history["per_replica_batch"], [8 // replicas] * 2)


def test_minimize_returns_a_global_value(mirrored):
  def step(ctx, x):
    model = ctx.models["model"]
    return {"loss": ctx.minimize(
        lambda: ctx.average(x[:, 0] * model(x)[:, 0] * 0 + x[:, 0]), "model")}
  assert run(step, mirrored)["loss"][0] == pytest.approx(3.5)


def derived_step(ctx, x):
  values = x[:, 0]
  share = ctx.average(values)  # 1.5/2 + 5.5/2 summed: 3.5 at step 0
  return {"sum": share + ctx.average(tf.ones_like(values)),     # 3.5 + 1
          "scaled": 2.0 * share - share / 4.0,                   # 1.75 * 3.5
          "cast": tf.cast(share, tf.float64),                    # 3.5
          "local": tf.reduce_max(values) * 1.0}                  # 3 and 7: mean 5


@pytest.mark.parametrize("eager", [False, True])
def test_sums_and_multiples_of_shares_are_summed(eager, mirrored):
  history = run(derived_step, mirrored, eager=eager)
  assert history["sum"][0] == pytest.approx(4.5)
  assert history["scaled"][0] == pytest.approx(1.75 * 3.5)
  assert history["cast"][0] == pytest.approx(3.5)
  assert history["local"][0] == pytest.approx(5.0)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("make, op", [
    (lambda ctx, x: tf.sqrt(ctx.average(x[:, 0])), "Sqrt"),
    (lambda ctx, x: ctx.average(x[:, 0]) + tf.reduce_mean(x), "AddV2"),
    (lambda ctx, x: 1.0 / ctx.average(x[:, 0]), "RealDiv"),
])
def test_results_mixing_shares_are_refused(make, op, eager, mirrored):
  where = "an operation other than sums" if eager else f"a {op} op"
  with pytest.raises(ValueError, match=rf"step result 'v' is computed from global-batch "
                     rf"averages .* through {where}"):
    run(lambda ctx, x: {"v": make(ctx, x)}, mirrored, eager=eager)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("factor", [
    lambda ctx, x: tf.reduce_mean(x),                                   # of the batch
    lambda ctx, x: tf.reduce_mean(ctx.models["model"](x)),             # of a model
    lambda ctx, x: tf.reduce_mean(ctx.normal([1])),                    # of the noise
], ids=["batch", "model", "noise"])
def test_share_times_a_per_replica_value_is_refused_eagerly_and_compiled(factor, eager, mirrored):
  # Each replica would scale its share differently: the same verdict either way.
  where = "a product with a per-replica value" if eager else "a Mul op"
  with pytest.raises(ValueError, match=f"through {where}"):
    run(lambda ctx, x: {"v": ctx.average(x[:, 0]) * factor(ctx, x)}, mirrored, eager=eager)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("form", ["tape", "function"])
def test_values_derived_from_a_minimized_loss_are_shares(form, eager, mirrored):
  # The loss minimize returns is the share it was given: -loss, 2 * loss and
  # loss + another share are summed like it, eagerly as compiled.
  def step(ctx, x):
    model = ctx.models["model"]
    if form == "tape":
      with tf.GradientTape() as tape:
        loss = ctx.average(tf.square(model(x)[:, 0]))
      loss = ctx.minimize(loss, "model", tape=tape)
    else:
      loss = ctx.minimize(lambda: ctx.average(tf.square(model(x)[:, 0])), "model")
    return {"negative": -loss, "double": 2.0 * loss, "sum": loss + ctx.average(x[:, 0])}

  history = run(step, mirrored, eager=eager)
  assert history["double"][0] == pytest.approx(-2.0 * history["negative"][0])


@pytest.mark.parametrize("eager", [False, True])
def test_shares_times_constants_are_shares_eagerly_and_compiled(eager, mirrored):
  half = tf.constant(0.5)

  def step(ctx, x):
    return {"v": 2.0 * ctx.average(x[:, 0]) - ctx.average(tf.square(x[:, 0])) * half}

  one_device = run(step)["v"]
  assert run(step, mirrored, eager=eager)["v"] == pytest.approx(one_device)


@pytest.mark.parametrize("eager", [False, True])
def test_minimize_refuses_a_per_replica_mean(eager):
  def step(ctx, x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(ctx.models["model"](x)))
    return {"loss": ctx.minimize(loss, "model", tape=tape)}
  with pytest.raises(ValueError, match=r"minimize\('model'\): the loss is not an average over "
                     r"the global batch; compute it with ctx.average"):
    run(step, eager=eager)
  with pytest.raises(ValueError, match="num_replicas times too large"):
    run(lambda ctx, x: {"loss": ctx.minimize(
        lambda: tf.reduce_mean(ctx.models["model"](x)), "model")}, eager=eager)


@pytest.mark.parametrize("eager", [False, True])
def test_minimize_accepts_a_penalised_share(eager):
  def step(ctx, x):
    model = ctx.models["model"]
    loss = ctx.minimize(lambda: ctx.average(tf.square(model(x)[:, 0])) +
                        0.5 * ctx.average_regularization([tf.reduce_sum(model.weights[0] ** 2)]),
                        "model")
    return {"loss": loss}
  assert np.isfinite(run(step, eager=eager)["loss"]).all()


def test_regularization_counts_once_over_replicas(mirrored):
  def step(ctx, x):
    return {"penalty": ctx.average_regularization([tf.constant(2.0), tf.constant(1.0)])}
  assert run(step, mirrored)["penalty"][0] == pytest.approx(3.0)


# Replica-invariant randomness.

def contexts(num_replicas, step=3, seed=11, float_dtype=tf.float32):
  return [ctl.StepContext(models={}, optimizers={}, step=tf.constant(step, tf.int64),
                          seed=tf.constant([seed, 0], tf.int64), global_batch_size=GLOBAL_BATCH,
                          num_replicas=num_replicas, replica_id=tf.constant(r),
                          float_dtype=float_dtype)
          for r in range(num_replicas)]


@pytest.mark.parametrize("draw", ["normal", "uniform"])
def test_draws_for_an_example_do_not_depend_on_the_replica_count(draw):
  whole = getattr(contexts(1)[0], draw)([5]).numpy()
  for n in (2, 4, 8):
    parts = [getattr(c, draw)([5]).numpy() for c in contexts(n)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
  assert whole.shape == (GLOBAL_BATCH, 5)


def test_draw_shape_may_be_an_int():
  assert contexts(1)[0].normal(5).shape == contexts(1)[0].uniform([5]).shape == (GLOBAL_BATCH, 5)


@pytest.mark.parametrize("shape", [(5, 2), np.array([5, 2]), tf.TensorShape([5, 2]), [5.0, 2]],
                         ids=["tuple", "numpy", "TensorShape", "integral-float"])
def test_draw_shape_may_be_any_sequence_of_integers(shape):
  assert contexts(1)[0].normal(shape).shape == (GLOBAL_BATCH, 5, 2)


@pytest.mark.parametrize("shape, shown", [([4.5], "[4.5]"), (["4"], "['4']"), ([None], "[None]"),
                                          ("tensor", "[<tensor>]")])
def test_draw_shape_that_is_not_integers_is_refused(shape, shown):
  shape = tf.constant([4]) if shape == "tensor" else shape  # no TF op at collection
  with pytest.raises(ValueError, match=re.escape(f"shape must be Python ints, the shape of "
                                                 f"one example's draw, got {shown}.")):
    contexts(1)[0].uniform(shape)


def test_draws_differ_by_step_by_draw_and_by_seed():
  ctx = contexts(1)[0]
  first, second = ctx.normal([4]).numpy(), ctx.normal([4]).numpy()
  assert not np.allclose(first, second)
  assert not np.allclose(first, contexts(1, step=4)[0].normal([4]).numpy())
  assert not np.allclose(first, contexts(1, seed=12)[0].normal([4]).numpy())
  np.testing.assert_array_equal(first, contexts(1)[0].normal([4]).numpy())


def test_seeds_differ_by_step_and_draw_and_are_the_same_compiled():
  def seeds(step, seed=11):
    ctx = contexts(1, step=step, seed=seed)[0]
    # (A draw inside a tf.cond branch is refused: see test_a_draw_inside_...)
    return tf.stack([ctx.seed(), ctx.seed(), ctx.seed()])

  drawn = []
  for step in (0, 3, 2**40):
    eager = seeds(step).numpy()
    np.testing.assert_array_equal(tf.function(seeds)(step).numpy(), eager)
    drawn += [tuple(s) for s in eager]
  drawn += [tuple(s) for s in seeds(3, seed=12).numpy()]
  assert len(set(drawn)) == len(drawn) == 12, drawn


def test_draws_have_the_asked_distribution():
  ctx = ctl.StepContext(models={}, optimizers={}, step=tf.constant(0, tf.int64),
                        seed=tf.constant([0, 0], tf.int64), global_batch_size=4096,
                        num_replicas=1, replica_id=0)
  z = ctx.normal([16], stddev=2.0).numpy()
  u = ctx.uniform([16], minval=-1.0, maxval=3.0).numpy()
  assert abs(z.mean()) < 0.02 and abs(z.std() - 2.0) < 0.02
  assert u.min() >= -1.0 and u.max() < 3.0 and abs(u.mean() - 1.0) < 0.02


@pytest.mark.parametrize("float_dtype, atol", [(tf.float32, 1e-6), (tf.float64, 1e-15)])
def test_xla_draws_the_same_numbers(float_dtype, atol):
  """XLA's stateless normal turns the same bits into other numbers: ctl writes
  TF's kernel out in ops there, float32 (within float32 rounding of the sine,
  cosine and logarithm) and float64 (within float64's)."""
  def draw():
    ctx = contexts(2, float_dtype=float_dtype)[1]
    return ctx.normal([3]), ctx.uniform([3])
  for eager, compiled in zip(draw(), tf.function(draw, jit_compile=True)()):
    assert eager.dtype == compiled.dtype == float_dtype
    np.testing.assert_allclose(eager.numpy(), compiled.numpy(), atol=atol)


# Updates: loss scaling, variables, eager mode, loops.

def test_loss_scale_optimizer_gives_the_plain_update():
  def updated(optimizer):
    def build_ones():
      return {"model": keras.Sequential([
          keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="ones")])}, {
              "model": optimizer}
    runner = ctl.Runner(train_step, build_ones, data())
    return runner.train(3), runner.models["model"].get_weights()
  plain_history, plain = updated(keras.optimizers.SGD(0.01))
  scaled_history, scaled = updated(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)))
  np.testing.assert_allclose(scaled_history["loss"], plain_history["loss"], rtol=1e-6)
  for a, b in zip(scaled, plain):
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains(policy):
  def build_mixed():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(4),
                              keras.layers.Dense(1, dtype="float32")])
    return {"model": model}, {"model": keras.optimizers.Adam(0.01)}
  same_batch = data().take(1).repeat()
  runner = ctl.Runner(train_step, build_mixed, same_batch, mixed_precision=policy)
  # float16 starts with a loss scale of 2**15 and halves it while the scaled
  # gradients overflow, skipping those updates; then it learns.
  history = runner.train(12)
  assert keras.mixed_precision.global_policy().name == "float32"  # restored
  assert runner.models["model"].layers[0].compute_dtype == policy.split("_")[1]
  wrapped = isinstance(runner.optimizers["model"], keras.optimizers.LossScaleOptimizer)
  assert wrapped == (policy == "mixed_float16")
  assert np.isfinite(history["loss"]).all() and history["loss"][-1] < history["loss"][0]


def test_float16_wraps_an_optimizer_built_by_the_user():
  def build_prebuilt():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, dtype="float32")])
    other = keras.optimizers.SGD(0.01)
    other.build(model.trainable_variables)
    return {"model": model}, {"other": other}

  def step(ctx, x):
    model = ctx.models["model"]
    return {"loss": ctx.minimize(lambda: ctx.average(tf.square(model(x)[:, 0])), "other",
                                 variables=model.trainable_variables)}

  runner = ctl.Runner(step, build_prebuilt, data(), mixed_precision="mixed_float16")
  assert isinstance(runner.optimizers["other"], keras.optimizers.LossScaleOptimizer)
  assert np.isfinite(runner.train(2)["loss"]).all()


def test_variables_argument_updates_only_those():
  def build_two():
    a = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)], name="a")
    b = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)], name="b")
    joint = keras.optimizers.SGD(0.1)
    joint.build(a.trainable_variables)
    return {"a": a, "b": b}, {"joint": joint}

  def step(ctx, x):
    a, b = ctx.models["a"], ctx.models["b"]
    loss = ctx.minimize(lambda: ctx.average(tf.square(b(a(x))[:, 0])), "joint",
                        variables=a.trainable_variables)
    return {"loss": loss}

  runner = ctl.Runner(step, build_two, data())
  before = [w.copy() for w in runner.models["b"].get_weights()]
  runner.train(2)
  for w, w0 in zip(runner.models["b"].get_weights(), before):
    np.testing.assert_array_equal(w, w0)


def test_eager_mode_runs_the_step_as_python():
  seen = []

  def step(ctx, x):
    seen.append((tf.executing_eagerly(), float(x[0, 0])))
    return train_step(ctx, x)

  run(step, eager=True, steps=2)
  assert seen == [(True, 0.0), (True, 8.0)]


def test_one_step_calls_run_the_step_without_a_loop():
  runner = ctl.Runner(train_step, build, data(256))
  with mock.patch.object(tf, "while_loop", wraps=tf.while_loop) as while_loop:
    history = runner.train(3)
    assert not while_loop.called and runner.compiled_step.trace_count == 1
    assert list(history.steps) == [0, 1, 2] and history["loss"].shape == (3,)
    runner.compiled_step.run(2)  # a loop of 2 calls the step's one trace
    assert while_loop.called
  assert runner.compiled_step.trace_count == 1 and int(runner.global_step.numpy()) == 5


def test_new_runners_and_evaluations_do_not_warn_of_retracing(caplog):
  # TF warns when the same code is traced on 5 calls in a row, as every new
  # runner, and every evaluation of a new dataset, traces it once.
  def evaluation(ctx, x):
    return {"loss": ctx.average(tf.square(ctx.models["model"](x)[:, 0]))}

  with caplog.at_level("WARNING", logger="tensorflow"):
    for _ in range(7):
      runner = ctl.Runner(train_step, build, data(256), steps_per_loop=2)
      runner.train(1)
      runner.train(2)
      runner.evaluate(evaluation, data().take(2))
  assert "retracing" not in caplog.text


def test_loop_lengths_do_not_retrace():
  runner = ctl.Runner(train_step, build, data(256), steps_per_loop=4)
  runner.train(4)
  runner.train(3)   # one loop of 3: same traced function, n is a tensor
  runner.compiled_step.run(1)
  assert runner.compiled_step.trace_count == 1
  assert int(runner.global_step.numpy()) == 8


def test_seed_fixes_the_initial_weights():
  def weights(seed):
    runner = ctl.Runner(train_step, build, data(), seed=seed)
    return runner.models["model"].get_weights()[0]
  np.testing.assert_array_equal(weights(3), weights(3))
  assert not np.array_equal(weights(3), weights(4))


def test_the_seed_fixes_the_draws_and_two_calls_differ(mirrored):
  """docs/step.md's Seeds section: the numbers each example draws, by run."""
  def step(ctx, x):
    first, second = ctx.normal([1])[:, 0], ctx.normal([1])[:, 0]
    # Example i's draw, placed in row i of the global batch (a share, summed).
    rows = tf.one_hot(tf.cast(x[:, 0], tf.int32) % GLOBAL_BATCH, GLOBAL_BATCH)
    return {f"{name}_{i}": ctx.average(GLOBAL_BATCH * rows[:, i] * value)
            for name, value in (("first", first), ("second", second))
            for i in range(GLOBAL_BATCH)}

  def draws(seed, strategy=None, eager=False):
    history = run(step, strategy, steps=2, seed=seed, eager=eager)
    return np.array([[history[f"{name}_{i}"] for i in range(GLOBAL_BATCH)]
                     for name in ("first", "second")])

  compiled = draws(3)
  assert not np.allclose(compiled[0], compiled[1])  # two calls, two draws
  np.testing.assert_allclose(draws(3, eager=True), compiled, rtol=1e-6)
  np.testing.assert_allclose(draws(3, mirrored), compiled, rtol=1e-6)
  assert not np.allclose(draws(4), compiled)


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_a_model_made_before_build_is_refused(strategy_name, mirrored):
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
  made_before = build()[0]["model"]
  with pytest.raises(ValueError, match=r"model 'model' was made before build\(\) was called "
                     r".* Construct the model inside build\(\)"):
    ctl.Runner(train_step, lambda: ({"model": made_before}, {"model": keras.optimizers.SGD()}),
               data(), strategy=strategy)


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_models_made_in_build_may_share_layers_and_build_lazily(strategy_name, mirrored):
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()

  def build_shared():
    trunk = keras.layers.Dense(2)  # one layer in two models, built by the first
    lazy = keras.Sequential([trunk, keras.layers.Dense(1)])
    lazy(tf.zeros([1, 1]))  # no keras.Input: built by a call in build()
    other = keras.Sequential([keras.Input((1,)), trunk, keras.layers.Dense(1)])
    return {"model": lazy, "other": other}, {"model": keras.optimizers.SGD(0.01)}

  runner = ctl.Runner(train_step, build_shared, data(), strategy=strategy)
  assert np.isfinite(runner.train(1)["loss"]).all()


def test_history_has_every_step():
  history = ctl.Runner(reduction_step, build, data(), steps_per_loop=3).train(5)
  np.testing.assert_allclose(history["average"], [3.5, 11.5, 19.5, 27.5, 35.5])


# Bad input: clear errors before training.

@pytest.mark.parametrize("kwargs, error, message", [
    ({"steps_per_loop": 2.5}, TypeError, "steps_per_loop must be an int >= 1, got 2.5"),
    ({"batches_per_step": 0}, ValueError, "batches_per_step must be an int >= 1"),
    ({"seed": "x"}, TypeError, "seed must be an int"),
    ({"strategy": "gpu"}, ValueError, "strategy 'gpu' is not known"),
])
def test_bad_arguments(kwargs, error, message):
  with pytest.raises(error, match=message):
    ctl.Runner(train_step, build, data(), **kwargs)


@pytest.mark.parametrize("built, message", [
    (lambda: [1, 2], r"build\(\) must return \(models, optimizers\), two dicts, got list"),
    (lambda: ({"m": keras.Sequential([keras.layers.Dense(1)])}, {}),
     "model 'm' has no variables yet; give it an input shape"),
    (lambda: ({"m": object()}, {}), "models\\['m'\\] is a object, not a keras.Model"),
    (lambda: ({}, {"g": keras.optimizers.Adam()}),
     "optimizer 'g' has no model of the same name to build its slots for"),
    (lambda: ({}, {"g": "adam"}), "optimizers\\['g'\\] is a str"),
])
def test_bad_build(built, message):
  with pytest.raises((TypeError, ValueError), match=message):
    ctl.Runner(train_step, built, data())


@pytest.mark.parametrize("result, error, message", [
    (lambda: [1.0], TypeError, "step must return a dict of scalar values, got list"),
    (lambda: {"v": tf.zeros([3])}, ValueError, r"step result 'v' has shape \(3,\), not a scalar"),
    (lambda: {"v": "high"}, TypeError, "step result 'v' has dtype string"),
    (lambda: {"v": object()}, TypeError, "step result 'v' is a object, not a tensor"),
])
def test_bad_step_results(result, error, message):
  with pytest.raises(error, match=message):
    run(lambda ctx, x: result())


def test_minimize_misuse_names_the_fix():
  def no_tape(ctx, x):
    return {"l": ctx.minimize(ctx.average(x[:, 0]), "model")}
  with pytest.raises(ValueError, match=r"a loss tensor needs the GradientTape that recorded it"):
    run(no_tape)

  def unknown(ctx, x):
    return {"l": ctx.minimize(lambda: ctx.average(x[:, 0]), "generator")}
  with pytest.raises(ValueError, match=r"no optimizer named 'generator'; build\(\) returned "
                     r"optimizers \['model'\]"):
    run(unknown)


def build_pair():
  pair = {n: keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)], name=n)
          for n in ("generator", "discriminator")}
  return pair, {n: keras.optimizers.SGD(0.01) for n in pair}


def loss_outside_the_tape(ctx, x):
  with tf.GradientTape() as tape:
    pass
  d_loss = ctx.average(tf.square(ctx.models["discriminator"](x)[:, 0]))
  return {"d": ctx.minimize(d_loss, "discriminator", tape=tape)}


def another_models_loss(ctx, x):
  generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
  with tf.GradientTape() as tape:
    discriminator(x)  # read under the tape, but not in the loss
    g_loss = ctx.average(tf.square(generator(x)[:, 0]))
  return {"g": ctx.minimize(g_loss, "discriminator", tape=tape)}


def terms_added_after_the_tape(ctx, x):
  discriminator = ctx.models["discriminator"]
  with tf.GradientTape() as tape:
    d_loss = ctx.average(tf.square(discriminator(x)[:, 0]))
    penalty = ctx.average(tf.abs(discriminator(x)[:, 0]))
  return {"d": ctx.minimize(d_loss + penalty, "discriminator", tape=tape)}


def another_models_loss_function(ctx, x):
  generator = ctx.models["generator"]
  return {"g": ctx.minimize(lambda: ctx.average(tf.square(generator(x)[:, 0])),
                            "discriminator")}


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
@pytest.mark.parametrize("step, message", [
    (loss_outside_the_tape,
     r"minimize\('discriminator'\): the loss was not recorded by the tape passed to "
     r"ctx.minimize: none of the 2 variables it updates \(the trainable variables of model "
     r"'discriminator'\) was read under that tape, .* Compute the loss inside the `with "
     r"tf.GradientTape\(\) as tape:` block, or pass it as a function: "
     r"ctx.minimize\(lambda: ..., 'discriminator'\)"),
    (another_models_loss,
     r"minimize\('discriminator'\): the loss does not depend on any of the 2 variables it "
     r"updates .* Pass the loss that model 'discriminator' should lower"),
    (terms_added_after_the_tape,
     r"minimize\('discriminator'\): the loss does not depend on any of the 2 variables it "
     r"updates .* a loss finished after the `with tf.GradientTape\(\)` block \(e.g. "
     r"`minimize\(d_loss \+ penalty, ...\)`\) was not recorded: add the terms inside the "
     r"block."),
    (another_models_loss_function,
     r"minimize\('discriminator'\): the loss function's result does not depend on any of "
     r"the 2 variables"),
], ids=["outside-the-tape", "another-models-loss", "terms-added-after-the-tape",
        "function-form"])
def test_a_loss_with_no_gradient_says_why(step, message, strategy_name, eager, mirrored):
  strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
  with pytest.raises(ValueError, match=message) as raised:
    run(step, strategy, build=build_pair, eager=eager)
  assert "No gradients provided" not in str(raised.value)
  assert not any("ctl: " in n for n in getattr(raised.value, "__notes__", ()))  # no data note


@pytest.mark.parametrize("eager", [False, True])
def test_a_gradient_missing_for_some_variables_still_trains(eager, mirrored):
  """A variable the loss does not reach (an unused layer) keeps its value, as before."""
  def build_joint():
    models, optimizers = build_pair()
    optimizers["discriminator"].build(models["discriminator"].trainable_variables +
                                      models["generator"].trainable_variables)
    return models, optimizers

  def step(ctx, x):
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
    with tf.GradientTape() as tape:
      loss = ctx.average(tf.square(discriminator(x)[:, 0]))
    variables = discriminator.trainable_variables + generator.trainable_variables
    return {"loss": ctx.minimize(loss, "discriminator", tape=tape, variables=variables)}

  runner = ctl.Runner(step, build_joint, data(), strategy=mirrored, eager=eager)
  before = [w.numpy().copy() for w in runner.models["generator"].weights]
  assert np.isfinite(runner.train(2)["loss"]).all()
  for w, w0 in zip(runner.models["generator"].weights, before):
    np.testing.assert_array_equal(w.numpy(), w0)


@pytest.mark.parametrize("eager", [False, True])
def test_data_running_out_says_so(eager):
  # Of unknown length (a filter): found out where it ends.
  unknown = data().filter(lambda x: True)
  with pytest.raises(ValueError, match=r"data ran out at step 8: .* call .repeat\(\)"):
    run(train_step, steps=10, eager=eager, data=unknown)


def test_train_keeps_the_calls_made_before_an_error():
  # Of unknown length (a filter), 8 batches: the fifth call of 2 steps runs out.
  runner = ctl.Runner(train_step, build, data().filter(lambda x: True), steps_per_loop=2)
  with pytest.raises(ValueError, match="data ran out at step 8"):
    runner.train(10)
  assert list(runner.history.steps) == list(range(8))


@pytest.mark.parametrize("batches_per_step", [1, 2])
def test_finite_data_too_short_for_the_run_is_refused_before_any_step(batches_per_step):
  runner = ctl.Runner(train_step if batches_per_step == 1 else
                      lambda ctx, batches: train_step(ctx, batches[0]), build, data(),
                      batches_per_step=batches_per_step)
  fits = 8 // batches_per_step
  needs = (fits + 1) * batches_per_step
  with pytest.raises(ValueError, match=rf"train\({fits + 1}\) needs {needs} batches.* "
                     rf"holds 8 .* train at most {fits} steps"):
    runner.train(fits + 1)
  assert int(runner.global_step.numpy()) == 0
  assert len(runner.train(fits).steps) == fits  # what fits trains


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("steps", [0, -1])
def test_compiled_step_run_needs_a_positive_count(eager, steps):
  runner = ctl.Runner(train_step, build, data(), eager=eager)
  with pytest.raises(ValueError, match=f"num_steps must be an int >= 1, got {steps}"):
    runner.compiled_step.run(steps)


@pytest.mark.parametrize("eager", [False, True])
def test_result_keys_must_stay_the_same(eager):
  extra = []  # non-empty: the step returns one more key

  def step(ctx, x):
    return dict(train_step(ctx, x), **({"extra": 1.0} if extra else {}))
  runner = ctl.Runner(step, build, data(), eager=eager)
  runner.train(1)
  extra.append(True)
  with pytest.raises(ValueError, match=r"step results changed keys from \['loss'\] to "
                     r"\['extra', 'loss'\]"):
    if eager:
      runner.train(1)
    else:  # the compiled loop never retraces; a new trace of the replica step
      batch = runner.feed.next(runner.feed.make_iterator())
      tf.function(lambda: runner.strategy.run(
          runner.compiled_step.replica_step, args=(batch, runner.global_step.read_value())))()


# Optimizer options and gradient accumulation: the one-device update.

def weights_after(step, strategy, optimizer, steps=3, **kwargs):
  def build_with():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    return {"model": model}, {"model": optimizer()}
  runner = ctl.Runner(step, build_with, data().repeat(), strategy=strategy, **kwargs)
  history = runner.train(steps)
  return history["loss"], [w.numpy() for w in runner.models["model"].weights]


@pytest.mark.parametrize("option", [{"clipnorm": 0.5}, {"global_clipnorm": 0.5},
                                    {"clipvalue": 0.5}])
def test_clipping_acts_on_the_global_batch_gradient(option, mirrored):
  """Keras clips before its own sum over replicas; ctl sums first. The gradient
  here is hundreds of times the clip, so a per-replica clip would double the step."""
  optimizer = lambda: keras.optimizers.SGD(0.01, **option)  # noqa: E731
  one_device = weights_after(train_step, tf.distribute.get_strategy(), optimizer)
  two_replicas = weights_after(train_step, mirrored, optimizer)
  for a, b in zip(one_device[1], two_replicas[1]):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def sliced_step(micro_batches):
  def step(ctx, x):
    model = ctx.models["model"]

    def loss(x):
      noise = ctx.normal([1])  # each slice gets its rows of the whole batch's draws
      return ctx.average(tf.square(model(x)[:, 0] - x[:, 0] - noise[:, 0]))

    return {"loss": ctx.minimize(loss, "model", batch=x, micro_batches=micro_batches)}
  return step


@pytest.mark.parametrize("eager", [False, True])
def test_micro_batches_equal_the_whole_batch(eager, mirrored):
  optimizer = lambda: keras.optimizers.Adam(0.1)  # noqa: E731
  whole = weights_after(sliced_step(1), tf.distribute.get_strategy(), optimizer, eager=eager)
  for strategy, slices in ((tf.distribute.get_strategy(), 4), (mirrored, 2)):
    sliced = weights_after(sliced_step(slices), strategy, optimizer, eager=eager)
    np.testing.assert_allclose(whole[0], sliced[0], rtol=1e-6)
    for a, b in zip(whole[1], sliced[1]):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def batch_norm_step(micro_batches):
  """A loss through a synchronized BatchNormalization, accumulated over micro-batches."""
  def step(ctx, x):
    model = ctx.models["model"]

    def loss(x):
      return ctx.average(tf.square(model(x + ctx.normal([1]), training=True)[:, 0]))

    return {"loss": ctx.minimize(loss, "model", batch=x, micro_batches=micro_batches)}
  return step


def build_batch_norm():
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(4),
                            keras.layers.BatchNormalization(synchronized=True),
                            keras.layers.Dense(1)], name="model")
  # SGD, not Adam: Adam would turn the rounding in the bias before the batch
  # norm (its gradient is 0 but for rounding) into steps of the learning rate.
  return {"model": model}, {"model": keras.optimizers.SGD(0.01, momentum=0.9)}


@pytest.mark.parametrize("eager", [False, True])
def test_micro_batches_see_the_same_examples_on_any_replica_count(eager, mirrored):
  """Slice i holds the global rows i, i+k, ...: a synchronized BatchNormalization
  over two replicas' slices averages the rows it averages on one device
  (contiguous slices mixed rows [0, 4) and [8, 12) on 2 replicas, where one
  device saw [0, 8)). In float64, so that a real difference cannot hide in rounding."""
  def run(strategy):
    runner = ctl.Runner(batch_norm_step(2), build_batch_norm, data().repeat(),
                        strategy=strategy, eager=eager, mixed_precision="float64")
    loss = runner.train(3)["loss"]
    return loss, [w.numpy() for w in runner.models["model"].weights]

  one_device, two_replicas = run(tf.distribute.get_strategy()), run(mirrored)
  np.testing.assert_allclose(one_device[0], two_replicas[0], rtol=1e-9)
  for a, b in zip(one_device[1], two_replicas[1]):
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_micro_batch_slices_are_strided():
  seen = []

  def step(ctx, x):
    def loss(x):
      seen.append(x[:, 0].numpy().tolist())
      return ctx.average(tf.square(ctx.models["model"](x)[:, 0]))

    return {"loss": ctx.minimize(loss, "model", batch=x, micro_batches=4)}

  ctl.Runner(step, build, data().repeat(), eager=True).train(1)
  assert seen == [[0.0, 4.0], [1.0, 5.0], [2.0, 6.0], [3.0, 7.0]]


def test_float64_runs_everything_in_float64():
  """mixed_precision="float64": variables, data, draws and results, where ctl.tools.parity
  replays a run; Keras' floatx is float64 while the step runs (a learning-rate
  schedule computes in it), and float32 again afterwards."""
  draws, floatx = {}, []

  def step(ctx, x):
    draws[x.dtype] = (ctx.normal([3]), ctx.uniform([2]))
    floatx.append(keras.config.floatx())
    return train_step(ctx, x)

  runner = ctl.Runner(step, build_batch_norm, data().repeat(), eager=True,
                      mixed_precision="float64")
  history = runner.train(2)
  assert history["loss"].dtype == np.float64
  assert {w.dtype for w in runner.models["model"].weights} == {"float64"}
  assert {v.dtype for v in runner.optimizers["model"].variables
          if "iteration" not in v.path and "learning_rate" not in v.path} == {"float64"}
  assert keras.config.floatx() == "float32" and floatx == ["float64"] * 2
  ctl.Runner(step, build, data().repeat(), eager=True).train(2)
  assert floatx[-1] == "float32"
  assert [d.dtype for d in draws[tf.float64]] == [tf.float64, tf.float64]
  # float64 normals come from TF's float64 kernel; the uniforms are the float32 ones.
  np.testing.assert_allclose(draws[tf.float64][0].numpy().std(), 1, atol=0.6)
  np.testing.assert_array_equal(draws[tf.float64][1].numpy(), draws[tf.float32][1].numpy())


def test_with_options_runs_the_same_step_another_way():
  runner = ctl.Runner(train_step, build, data().repeat(), seed=3)
  eager = runner.with_options(eager=True)
  assert eager.eager and not runner.eager and eager.seed == 3
  for a, b in zip(runner.models["model"].weights, eager.models["model"].weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())  # the same initial weights
  np.testing.assert_allclose(runner.train(3)["loss"], eager.train(3)["loss"], rtol=1e-6)
  with pytest.raises(TypeError, match=r"\['stepz'\] are not options it changes; give any "
                                      r"of \['batches_per_step', "):
    runner.with_options(stepz=2)


# Autograph converts the user's step and loss functions (not ctl's own code).

def control_flow_step(ctx, x):
  model = ctx.models["model"]
  mean = tf.reduce_mean(x)
  if mean > 30.0:  # a Python `if` on a tensor: autograph makes it a tf.cond
    scale = 2.0
  else:
    scale = 1.0
  total = tf.constant(0.0)
  for i in tf.range(3):  # and a Python loop over a tensor range a tf.while_loop
    total += tf.cast(i, tf.float32)

  def loss_fn():
    error = tf.square(model(x)[:, 0] - x[:, 0])
    if tf.reduce_max(error) < 0.0:  # never; autograph in a loss function given to minimize
      error = tf.zeros_like(error)
    return ctx.average(error)

  loss = ctx.minimize(loss_fn, "model")
  return {"loss": loss, "scale": scale * tf.ones([]), "total": total}


@pytest.mark.parametrize("eager", [True, False])
def test_python_control_flow_on_tensors_in_the_step_and_loss_function(eager, mirrored):
  for strategy in (tf.distribute.get_strategy(), mirrored):
    history = run(control_flow_step, strategy, steps=8, eager=eager)
    # Batches of rows 0-7, 8-15, ...: the mean passes 30 from the fifth batch on.
    np.testing.assert_array_equal(history["scale"], [1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(history["total"], [3.0] * 8)
    assert np.isfinite(history["loss"]).all()


@pytest.mark.parametrize("where", ["if", "for"])
def test_a_draw_inside_a_tensor_if_or_loop_is_refused_when_compiled(where):
  # Eagerly one branch runs (and the body each time); compiled, both branches
  # are traced (the body once): the draws' numbering would differ.
  def step(ctx, x):
    noise = tf.zeros([ctx.per_replica_batch_size, 1])
    if where == "if":
      if tf.reduce_mean(x) > 30.0:
        noise = ctx.normal([1])
    else:
      for _ in tf.range(2):
        noise += ctx.normal([1])
    return train_step(ctx, x + noise)

  with pytest.raises(ValueError, match=r"inside a Python `if` or `for` on a tensor .* "
                                       r"Draw before the `if` or the loop"):
    run(step, steps=1)
  assert np.isfinite(run(step, steps=1, eager=True)["loss"]).all()


class ControlFlowStep:
  """The same step as an object: its method and its __call__."""

  def __call__(self, ctx, x):
    return control_flow_step(ctx, x)

  def method(self, ctx, x):
    return control_flow_step(ctx, x)


@pytest.mark.parametrize("make", [
    lambda: functools.partial(control_flow_step), lambda: ControlFlowStep(),
    lambda: ControlFlowStep().method], ids=["partial", "callable-object", "bound-method"])
def test_autograph_converts_any_callable_step(make):
  history = run(make(), steps=8)  # each failed with OperatorNotAllowedInGraphError
  np.testing.assert_array_equal(history["scale"], [1, 1, 1, 1, 2, 2, 2, 2])


def test_a_weighted_average_keeps_a_float64_runs_precision():
  """ctx.average(..., sample_weight=w) in a float64 run: the weights apply in float64
  (tf.nn.compute_average_loss would weigh in float32, rounding to 1e-8)."""
  rows = np.random.default_rng(0).normal(size=(8, 1)) / 3

  def build():
    model = keras.Sequential([keras.Input([1]), keras.layers.Dense(1, use_bias=False)])
    return {"model": model}, {"model": keras.optimizers.SGD(0.0)}

  def step(ctx, batch):
    weights = tf.range(1, 5, dtype=batch.dtype) / 3
    with tf.GradientTape() as tape:
      value = ctx.average(ctx.models["model"](batch)[:, 0], sample_weight=weights)
    ctx.minimize(value, "model", tape=tape)
    return {"loss": value}

  runner = ctl.Runner(step, build, tf.data.Dataset.from_tensor_slices(rows).batch(4),
                      mixed_precision="float64", eager=True)
  kernel = float(runner.models["model"].weights[0].numpy()[0, 0])
  loss = runner.train(1)["loss"][0]
  expected = np.sum(kernel * rows[:4, 0] * np.arange(1, 5) / 3) / 4
  assert loss.dtype == np.float64 and abs(loss - expected) < 1e-15 * abs(expected) * 10


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_a_loss_made_of_averages_is_a_share_eagerly_too(eager):
  """A critic loop that minimizes 2 * ctx.average(...) and returns half their sum:
  sums and constant factors of shares, accepted compiled and, as well, eagerly
  (where minimize's loss, itself made of a share, was counted twice)."""
  rows = np.random.default_rng(0).normal(size=(16, 1)).astype("float32")

  def build():
    model = keras.Sequential([keras.Input([1]), keras.layers.Dense(1)])
    return {"model": model}, {"model": keras.optimizers.SGD(0.01)}

  def step(ctx, batches):
    losses = []
    for batch in batches:
      with tf.GradientTape() as tape:
        loss = ctx.average(tf.square(ctx.models["model"](batch)[:, 0])) * 2
      ctx.minimize(loss, "model", tape=tape)
      losses.append(loss)
    return {"loss": tf.add_n(losses) * tf.constant(0.5)}

  runner = ctl.Runner(step, build, tf.data.Dataset.from_tensor_slices(rows).batch(4),
                      batches_per_step=2, eager=eager)
  assert np.isfinite(runner.train(2)["loss"]).all()
