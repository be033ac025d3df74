"""Evaluation over numbered samples gives the same numbers on any layout.

`Runner.over_samples` runs exactly N samples whatever the replica count and
batch size (the last batch padded, the padding masked), sample i's noise is a
function of (seed, i) alone, the moments it sums match those of the gathered
rows, and the GAN kit's classifier metrics computed that way equal the
host-side ones. The same checkpoint across processes and strategies
(mirrored:4, multi_worker:2 through `ctl launch`) is `test_eval_parity`'s.
"""

import functools
import os
import signal
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
import gan
from ctl.parts.evaluation import Moments
from ctl.step.context import normal_by_index
from ctl.tools import eval_parity
from gan import evaluation

import helpers

NOISE = 8


def _build():
  generator = keras.Sequential([keras.Input((NOISE,)), keras.layers.Dense(6)])
  return {"generator": generator}, {"generator": keras.optimizers.Adam()}


def _runner(strategy):
  data = tf.data.Dataset.from_tensor_slices(np.zeros((16, NOISE), "float32"))
  return ctl.Runner(lambda ctx, batch: {}, _build,
                    data.batch(4, drop_remainder=True).repeat(), strategy=strategy)


def _samples(models, indices):
  z = normal_by_index(7, indices, NOISE)
  outputs = models["generator"](z)
  return {"index": indices, "z": z, "outputs": outputs, "outputs_moments": outputs}


@pytest.mark.parametrize("num_samples", [1, 5, 23])
def test_exactly_n_samples_in_order_on_any_layout(num_samples):
  results = []
  for strategy in ("default", "mirrored"):
    runner = _runner(strategy)
    for batch_size in (1, 3, 8, 500):
      out = runner.over_samples(_samples, num_samples, batch_size=batch_size,
                                moments=("outputs_moments",))
      np.testing.assert_array_equal(out["index"], np.arange(num_samples))
      assert out["outputs_moments"].count == num_samples
      results.append(out)
  first = results[0]
  for out in results[1:]:
    np.testing.assert_array_equal(out["z"], first["z"])  # noise keyed by sample index
    np.testing.assert_allclose(out["outputs"], first["outputs"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["outputs_moments"].outer, first["outputs_moments"].outer,
                               rtol=1e-12, atol=1e-12)
  # The moments summed on the replicas are those of the gathered rows.
  expected = Moments.of(first["outputs"])
  np.testing.assert_allclose(first["outputs_moments"].total, expected.total, rtol=1e-12,
                             atol=1e-12)
  np.testing.assert_allclose(first["outputs_moments"].outer, expected.outer, rtol=1e-12,
                             atol=1e-12)


def test_noise_of_a_sample_depends_on_its_index_and_seed_only():
  whole = normal_by_index(3, tf.range(10, dtype=tf.int64), [2, 3]).numpy()
  assert whole.shape == (10, 2, 3)
  part = normal_by_index(3, tf.range(4, 7, dtype=tf.int64), [2, 3]).numpy()
  np.testing.assert_array_equal(part, whole[4:7])
  other_seed = normal_by_index(4, tf.range(10, dtype=tf.int64), [2, 3]).numpy()
  assert not np.allclose(other_seed, whole)
  assert abs(whole.mean()) < 0.5 and 0.5 < whole.std() < 1.5


def test_over_samples_names_a_bad_function_or_argument():
  runner = _runner("default")
  with pytest.raises(TypeError, match="dict of per-sample tensors"):
    runner.over_samples(lambda models, indices: indices, 4)
  with pytest.raises(ValueError, match="'total' has shape"):
    runner.over_samples(lambda models, indices: {"total": tf.reduce_sum(indices)}, 4)
  with pytest.raises(ValueError, match="moments names \\['features'\\]"):
    runner.over_samples(_samples, 4, moments=("features",))
  with pytest.raises(ValueError, match="num_samples must be an int >= 1"):
    runner.over_samples(_samples, 0)
  with pytest.raises(TypeError, match="got the string 'outputs_moments'"):
    runner.over_samples(_samples, 4, moments="outputs_moments")
  # A batch far larger than the samples is cut to them, not padded in full.
  assert runner.over_samples(_samples, 3, batch_size=10**9)["index"].tolist() == [0, 1, 2]
  with pytest.raises(tf.errors.InvalidArgumentError, match="indices must be consecutive"):
    normal_by_index(3, tf.constant([0, 2, 1], tf.int32), 4)


def test_moments_merge_exactly_and_give_the_features_fid():
  rng = np.random.default_rng(0)
  a = rng.normal(size=(300, 5)) @ rng.normal(size=(5, 5))
  b = rng.normal(size=(200, 5)) + 1.0
  merged = Moments.of(a[:120]) + Moments.of(a[120:])
  np.testing.assert_allclose(merged.covariance, np.cov(a, rowvar=False), rtol=1e-10)
  assert evaluation.frechet_distance_from_moments(merged, Moments.of(b)) == pytest.approx(
      evaluation.frechet_distance(a, b), rel=1e-10)
  # Singular covariances (features that never fire) as the classifier's.
  a_singular = np.concatenate([a, np.zeros((300, 3))], axis=1)
  b_singular = np.concatenate([b, np.zeros((200, 3))], axis=1)
  assert evaluation.frechet_distance_from_moments(
      Moments.of(a_singular), Moments.of(b_singular)) == pytest.approx(
          evaluation.frechet_distance(a_singular, b_singular), rel=1e-10)
  assert abs(evaluation.frechet_distance_from_moments(Moments.of(a_singular),
                                                      Moments.of(a_singular))) < 1e-10
  with pytest.raises(ValueError, match="moments_b must be the Moments of >= 2"):
    evaluation.frechet_distance_from_moments(merged, Moments.of(b[:1]))


def test_reference_outputs_are_cached_by_split_count_and_classifier(tmp_path, monkeypatch):
  cache = str(tmp_path / "eval_cache")
  first = evaluation.reference_outputs("test", 300, cache_dir=cache)
  name = f"mnist_test_300_classifier_v{evaluation.VERSION}_"
  assert [f.startswith(name) for f in os.listdir(cache)] == [True]
  assert first["num_samples"] == 300 and first["moments"].count == 300

  def no_classifier(*args, **kwargs):
    raise AssertionError("recomputed although cached")

  with monkeypatch.context() as patch:
    patch.setattr(evaluation, "_outputs", no_classifier)
    again = evaluation.reference_outputs("test", 300, cache_dir=cache)
  np.testing.assert_array_equal(again["features"], first["features"])
  # Another count or split is another file; a file that is not what its name
  # says (here: cut short) is computed anew and rewritten.
  evaluation.reference_outputs("test", 200, cache_dir=cache)
  evaluation.reference_outputs("train", 200, cache_dir=cache)
  assert len(os.listdir(cache)) == 3
  path = os.path.join(cache, sorted(f for f in os.listdir(cache) if "_300_" in f)[0])
  with open(path, "r+b") as f:
    f.truncate(100)
  np.testing.assert_array_equal(
      evaluation.reference_outputs("test", 300, cache_dir=cache)["features"],
      first["features"])
  assert os.path.getsize(path) > 100
  # Empty, changed after it was written (same shapes, other values), or a
  # directory in the way: computed again, and the run goes on.
  for damage in ("empty", "changed", "directory"):
    os.remove(path)
    if damage == "empty":
      open(path, "w").close()
    elif damage == "changed":
      with open(path, "wb") as f:
        np.savez(f, name=os.path.basename(path), digest="0" * 64,
                 features=first["features"] * 1.5, logits=first["logits"])
    else:
      os.makedirs(path)
    again = evaluation.reference_outputs("test", 300, cache_dir=cache)
    np.testing.assert_array_equal(again["features"], first["features"])
    if damage == "directory":
      os.rmdir(path)
      evaluation.reference_outputs("test", 300, cache_dir=cache)
  assert not [f for f in os.listdir(cache) if ".partial" in f]
  # Off the chief nothing is written.
  evaluation.reference_outputs("test", 100, cache_dir=cache, write=False)
  assert len(os.listdir(cache)) == 3
  with pytest.raises(ValueError, match="num_samples=6000, but the 'test' split has 5000"):
    evaluation.reference_outputs("test", 6000)


def test_classifier_metrics_match_the_host_side_ones_on_any_layout(tmp_path):
  keras.utils.set_random_seed(0)
  action = gan.experiment.ClassifierFID(16, num_samples=70, batch_size=32)
  measured = []
  for strategy in ("default", "mirrored"):
    runner = helpers.generator_runner(lambda: gan.dcgan_generator(16, 4), strategy)
    measured.append(action.measure(runner.over_samples, str(tmp_path)))
  default, mirrored = measured
  assert default["num_samples"] == 70 and default["reference_samples"] == 5000
  for key in default:
    assert mirrored[key] == pytest.approx(default[key], rel=1e-5), key
  # The same samples scored on the host, the old way, give the same numbers.
  images = action.generate(runner.models)
  assert images.shape == (70, 28, 28, 1)
  reference = evaluation.reference_outputs("test", cache_dir=str(tmp_path / "eval_cache"))
  host = evaluation.frechet_distance(evaluation.classifier_features(images),
                                     reference["features"])
  assert default["classifier_fid"] == pytest.approx(host, rel=1e-5)
  assert default["classifier_score"] == pytest.approx(
      evaluation.classifier_score(images), rel=1e-5)


def test_score_in_batches_of_32():
  logits = evaluation.reference_outputs("test")["logits"]
  order = np.random.default_rng(0).permutation(len(logits))
  whole = evaluation.score_of_logits(logits)
  in_batches = evaluation.score_in_batches(logits[order])
  assert 7 < in_batches < whole < 10  # p(y) of 32 digits is noisy
  assert evaluation.score_in_batches(logits[np.argsort(np.argmax(logits, 1))]) < 1.5
  with pytest.raises(ValueError, match="16 samples make no batch of 32"):
    evaluation.score_in_batches(logits[:16])


def test_a_layout_dependent_evaluation_is_caught():
  """A planted bug, noise drawn per batch rather than per sample, changes the
  metrics with the layout, and the comparison `ctl eval --across` makes says so."""
  def per_batch_noise(models, indices):
    z = tf.random.stateless_normal([tf.size(indices), NOISE], seed=[7, indices[0]])
    return {"outputs": models["generator"](z)}

  results = {}
  for strategy in ("default", "mirrored"):
    out = _runner(strategy).over_samples(per_batch_noise, 40, batch_size=8)
    results[strategy] = {"mean": float(out["outputs"].mean()), "count": len(out["outputs"])}
  rows, agree = eval_parity.compare(results)
  assert not agree
  report = eval_parity.table(rows, list(results)).splitlines()
  mean = {line.split()[1]: line for line in report if line.split()[0] == "mean"}
  assert list(mean) == ["default", "mirrored"], report  # every layout, a line each
  assert mean["default"].endswith("reference") and "over 1e-06" in mean["mirrored"], report
  # The same values, or a value missing from one layout, as the tool judges them.
  same = {"default": {"fid": 1.5, "n": 10}, "mirrored:2": {"fid": 1.5 * (1 + 1e-9), "n": 10}}
  assert eval_parity.compare(same)[1]
  assert not eval_parity.compare({"default": {"fid": 1.5}, "mirrored:2": {}})[1]


def test_the_across_report_has_every_layouts_value_and_difference():
  """Each layout's value of each metric on a line of its own, with its
  difference from the reference, not only the layout that differs most."""
  results = {"default": {"fid": 2.0, "n": 10}, "mirrored:2": {"fid": 2.0, "n": 10},
             "mirrored:4": {"fid": 2.0 * (1 + 1e-9), "n": 10},
             "multi_worker:2": {"fid": 2.5}}
  rows, agree = eval_parity.compare(results)
  assert not agree  # multi_worker:2's fid is off and its n missing
  header, *lines = eval_parity.table(rows, list(results)).splitlines()
  assert header.split() == ["metric", "layout", "value", "difference", "from", "default",
                            "(relative)"]
  cells = {tuple(line.split()[:2]): line.split()[2:] for line in lines}
  assert len(lines) == len(cells) == 8, lines
  assert cells == {
      ("fid", "default"): ["2", "reference"],
      ("fid", "mirrored:2"): ["2", "0"],
      ("fid", "mirrored:4"): ["2.000000002", "1.0e-09"],
      ("fid", "multi_worker:2"): ["2.5", "2.0e-01", "over", "1e-06"],
      ("n", "default"): ["10", "reference"],
      ("n", "mirrored:2"): ["10", "0"],
      ("n", "mirrored:4"): ["10", "0"],
      ("n", "multi_worker:2"): ["missing", "missing"]}, lines


@pytest.mark.parametrize("text, message", [
    ("default", "at least two layouts"),
    ("default,mirrored", "'mirrored' is not a layout"),
    ("default,gpu:2", "'gpu:2' is not a layout"),
    ("default:2,mirrored:2", "'default:2' is not a layout"),
    ("default,mirrored:0", "'mirrored:0': N must be at least 1"),
])
def test_across_names_a_bad_layout(text, message):
  with pytest.raises(ValueError, match=message):
    eval_parity.parse_layouts(text)


def test_across_reads_the_first_workers_metrics_from_ctl_launch():
  layouts = eval_parity.parse_layouts("default, mirrored:4,multi_worker:2")
  assert layouts == [("default", 1), ("mirrored", 4), ("multi_worker", 2)]
  printed = ('[worker 1] {"fid": 2.0}\n[worker 0] {"fid": 1.0}\n'
             "ctl launch: exit codes: worker 0 0, worker 1 0\n")
  assert eval_parity.result_of(("multi_worker", 2), printed) == {"fid": 1.0}
  assert eval_parity.result_of(("default", 1), 'log line\n{"fid": 3.0}\n') == {"fid": 3.0}
  with pytest.raises(ValueError, match="mirrored:2: printed no metrics"):
    eval_parity.result_of(("mirrored", 2), "Traceback ...")
  assert eval_parity.command(("multi_worker", 2), ["dcgan"])[2:6] == [
      "ctl.cli", "launch", "--workers", "2"]


@pytest.mark.slow
def test_ctl_eval_across_layouts_agrees_on_a_trained_checkpoint(shared_runs, tmp_path):
  """Evaluation parity end to end: one checkpoint, four layouts, four processes."""
  run = helpers.tiny_gan_training(shared_runs)
  workdir = helpers.SharedRuns.copy(run.workdir, str(tmp_path / "work"))
  proc = helpers.ctl("eval", os.path.join("examples", "configs", "dcgan.gin"), "--workdir",
                     workdir, *helpers.TINY_GAN, "--across",
                     "default,mirrored:2,mirrored:4,multi_worker:2", check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert "SAME: every value within" in proc.stdout
  layouts = ["default", "mirrored:2", "mirrored:4", "multi_worker:2"]
  lines = [line.split() for line in proc.stdout.splitlines() if line.strip()]
  for metric in ("classifier_fid", "classifier_kid", "classifier_score", "num_samples"):
    mine = [line for line in lines if line[0] == metric]
    assert [line[1] for line in mine] == layouts, proc.stdout  # every layout, a line each
    assert mine[0][3] == "reference", proc.stdout
    assert all(float(line[3]) <= eval_parity.TOLERANCE for line in mine[1:]), proc.stdout
  assert os.listdir(os.path.join(workdir, "eval_cache"))  # the real digits' outputs kept
  bad = helpers.ctl("eval", "dcgan", "--across", "default,gpu:2", check=False)
  assert bad.returncode == 2 and "'gpu:2' is not a layout" in bad.stderr


def _tiny(tmp_path, **kwargs):
  """A 2-step run of a width-4 experiment in `tmp_path`, and the experiment."""
  experiment = gan.Experiment(
      generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
      discriminator=kwargs.pop("discriminator",
                               lambda **kw: gan.dcgan_discriminator(4, **kw)),
      batch_size=8, noise_dim=8, fid_samples=100,
      schedule=gan.Schedule(total_steps=2, steps_per_loop=1, samples_every=2,
                            checkpoint_every=2, fid_every=0), **kwargs)
  experiment.train(str(tmp_path), progress=False)
  return experiment


def test_a_conditional_generator_is_scored_on_the_classes_it_was_asked_for(tmp_path):
  experiment = _tiny(tmp_path, num_classes=10,
                     dataset=functools.partial(gan.mnist_dataset, with_labels=True))
  default = experiment.evaluate(str(tmp_path))
  mirrored = experiment.evaluate(str(tmp_path), "mirrored")
  assert 0 <= default["label_accuracy"] <= 1 and default["intra_class_fid"] > 0
  assert default["num_samples"] == 100  # 10 of each class: enough for its FID
  for key in default:
    assert mirrored[key] == pytest.approx(default[key], rel=1e-6), key


@pytest.mark.slow  # 10,000 digits encoded twice
def test_an_encoder_is_judged_against_pixels_and_a_random_encoder(tmp_path):
  experiment = _tiny(tmp_path, encoder=lambda **kw: gan.models.dcgan_encoder(width=4, **kw),
                     discriminator=lambda **kw: gan.models.bigan_discriminator(width=4, **kw))
  default = experiment.evaluate(str(tmp_path))
  mirrored = experiment.evaluate(str(tmp_path), "mirrored")
  assert default["pixels_1nn_accuracy"] == pytest.approx(0.933)
  for key in ("encoder_1nn_accuracy", "random_encoder_1nn_accuracy"):
    assert 0.1 < default[key] <= 1, default  # codes of digits: better than chance
  assert 0 < default["reconstruction_ratio"] < 3 and default["encoder_samples"] == 5000
  for key in default:
    assert mirrored[key] == pytest.approx(default[key], rel=1e-6), key
  # The random encoder is seeded: the same copy every time.
  assert experiment.evaluate(str(tmp_path))["random_encoder_1nn_accuracy"] == default[
      "random_encoder_1nn_accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                          (signal.SIGHUP, 129)])
def test_ctl_eval_across_stopped_leaves_no_process_behind(shared_runs, tmp_path, signum, code):
  run = helpers.tiny_gan_training(shared_runs)
  workdir = helpers.SharedRuns.copy(run.workdir, str(tmp_path / "work"))
  proc = helpers.start_python(["-m", "ctl.cli", "eval", "dcgan", "--workdir", workdir,
                               *helpers.TINY_GAN, "--across", "multi_worker:2,default"],
                              env={"PYTHONFAULTHANDLER": "1"})
  deadline = time.monotonic() + 120
  while len(helpers.processes_naming(workdir)) < 3 and time.monotonic() < deadline:
    time.sleep(0.2)  # the launcher and its workers have started
  proc.send_signal(signum)
  # Once in CI (SIGINT) it had not exited after 120 s; it never has since, alone or loaded.
  _, stderr = helpers.communicate_or_dump(proc, 120)
  assert proc.returncode == code, stderr[-3000:]
  assert "the evaluation in progress was stopped" in stderr
  assert "Traceback" not in stderr
  time.sleep(1)
  assert helpers.processes_naming(workdir) == []
