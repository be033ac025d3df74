"""Stacked MNIST: its data (three independent digits as channels, 1,000 modes),
mode counting with the shipped classifier (right on planted generators, and on
real data), and `ModeCoverage`, the same on any layout."""

import numpy as np
import pytest

import ctl
import gan
from gan import evaluation

import helpers


def _batches(dataset, count):
  return [tuple(np.asarray(x) for x in element) if isinstance(element, tuple)
          else np.asarray(element) for element in dataset.take(count)]


def test_each_channel_is_a_training_digit_and_the_label_is_the_triple():
  digits, labels = gan.data.load_mnist("train")
  by_bytes = {image.tobytes(): int(label) for image, label in zip(digits, labels)}
  [(images, modes)] = _batches(gan.data.stacked_mnist_dataset(32, with_labels=True), 1)
  assert images.shape == (32, 28, 28, 3) and images.dtype == np.float32
  assert images.min() >= -1 and images.max() <= 1 and modes.dtype == np.int32
  for image, mode in zip(images, modes):
    channels = [np.round(image[..., c] * 127.5 + 127.5).astype(np.uint8).tobytes()
                for c in range(3)]
    assert all(c in by_bytes for c in channels)
    assert mode == 100 * by_bytes[channels[0]] + 10 * by_bytes[channels[1]] + by_bytes[channels[2]]


def test_the_draws_follow_the_seed_and_cover_every_mode():
  first = _batches(gan.data.stacked_mnist_dataset(100, seed=3), 2)
  again = _batches(gan.data.stacked_mnist_dataset(100, seed=3), 2)
  other = _batches(gan.data.stacked_mnist_dataset(100, seed=4), 2)
  np.testing.assert_array_equal(np.stack(first), np.stack(again))
  assert not np.array_equal(np.stack(first), np.stack(other))
  # 26,000 draws, PacGAN's count, over five epochs of the 5,000 digits: every
  # triple, in about equal shares.
  modes = np.concatenate([m for _, m in _batches(
      gan.data.stacked_mnist_dataset(1000, with_labels=True), 26)])
  coverage = evaluation.mode_coverage(modes)
  assert coverage["modes"] == 1000 and coverage["mode_kl"] < 0.03, coverage
  channels = modes // 100, modes // 10 % 10, modes % 10
  assert abs(np.corrcoef(channels[0], channels[1])[0, 1]) < 0.02  # drawn independently


def test_mode_coverage_of_planted_distributions():
  assert evaluation.mode_coverage(np.arange(1000)) == {"modes": 1000, "mode_kl": 0.0,
                                                       "mode_samples": 1000}
  ten = np.repeat(np.arange(0, 1000, 100), 7)  # ten modes, equally often
  coverage = evaluation.mode_coverage(ten)
  assert coverage["modes"] == 10 and coverage["mode_kl"] == pytest.approx(np.log(100))
  one = evaluation.mode_coverage(np.full(50, 123))
  assert one["modes"] == 1 and one["mode_kl"] == pytest.approx(np.log(1000))
  # 900 samples of one mode and 100 of another: sum p log(1000 p)
  skewed = evaluation.mode_coverage(np.array([5] * 900 + [6] * 100))
  assert skewed["mode_kl"] == pytest.approx(0.9 * np.log(900) + 0.1 * np.log(100))


@pytest.mark.parametrize("modes, message", [
    (np.array([0, 1000]), r"modes must be in \[0, 1000\), got values in \[0, 1000\]"),
    (np.array([-1, 3]), r"got values in \[-1, 3\]"),
    (np.array([0.5, 2.0]), "1-D array of ints, got shape .2,. and dtype float64"),
    (np.zeros((2, 3), int), "got shape .2, 3."),
    (np.array([], int), "non-empty"),
])
def test_bad_modes_are_refused_naming_the_value(modes, message):
  with pytest.raises(ValueError, match=message):
    evaluation.mode_coverage(modes)


def test_stacked_modes_refuses_single_channel_digits():
  with pytest.raises(ValueError, match=r"images must have shape \[N, 28, 28, C\] with C in "
                                       r"\(3,\), got \(4, 28, 28, 1\)"):
    evaluation.stacked_modes(np.zeros((4, 28, 28, 1), np.uint8))


def test_the_classifier_counts_real_data_as_covering_and_a_ten_mode_generator_as_ten():
  images, labels = (np.concatenate(x) for x in zip(*_batches(
      gan.data.stacked_mnist_dataset(1000, with_labels=True, split="test"), 26)))
  modes = evaluation.stacked_modes(images)
  assert np.mean(modes == labels) > 0.9  # three digits right at 0.98 each
  real = evaluation.mode_coverage(modes)
  assert real["modes"] >= 995 and real["mode_kl"] < 0.05, real
  # A generator that makes only ten triples, each as often: ten modes, KL log(100).
  right = np.flatnonzero(modes == labels)
  chosen = right[np.unique(labels[right], return_index=True)[1][:10]]
  fake = np.repeat(images[chosen], 30, axis=0)
  coverage = evaluation.mode_coverage(evaluation.stacked_modes(fake))
  assert coverage["modes"] == 10 and coverage["mode_kl"] == pytest.approx(np.log(100))


def test_mode_coverage_is_the_same_on_any_layout_and_matches_the_host(tmp_path):
  action = gan.experiment.ModeCoverage(16, num_samples=70, batch_size=32)
  measured = []
  for strategy in ("default", "mirrored"):
    runner = helpers.generator_runner(
        lambda: gan.dcgan_generator(16, 4, image_shape=(28, 28, 3)), strategy)
    measured.append(action.measure(runner.over_samples, str(tmp_path)))
  default, mirrored = measured
  assert set(default) == {"modes", "mode_kl", "mode_samples", "classifier_fid", "num_samples"}
  assert default["num_samples"] == default["mode_samples"] == 70
  assert mirrored["modes"] == default["modes"] and mirrored["mode_kl"] == default["mode_kl"]
  assert mirrored["classifier_fid"] == pytest.approx(default["classifier_fid"], rel=1e-5)
  # The same samples classified on the host, channel by channel, give the same.
  images = action.generate(runner.models)
  assert images.shape == (70, 28, 28, 3)
  host = evaluation.mode_coverage(evaluation.stacked_modes(images))
  assert (host["modes"], host["mode_kl"]) == (default["modes"], pytest.approx(default["mode_kl"]))
  reference = evaluation.reference_outputs("test", cache_dir=str(tmp_path / "eval_cache"))
  digits = np.concatenate([images[..., c] for c in range(3)])
  assert default["classifier_fid"] == pytest.approx(evaluation.frechet_distance(
      evaluation.classifier_features(digits), reference["features"]), rel=1e-4)


def test_an_experiment_on_stacked_mnist_measures_its_modes(tmp_path):
  experiment = gan.Experiment(
      dataset=gan.data.stacked_mnist_dataset, batch_size=8, noise_dim=8,
      generator=lambda noise_dim, image_shape: gan.dcgan_generator(noise_dim, 4,
                                                                   image_shape=image_shape),
      discriminator=lambda image_shape: gan.dcgan_discriminator(4, image_shape=image_shape),
      fid_samples=40, schedule=gan.Schedule(total_steps=2, steps_per_loop=1, fid_every=2,
                                            samples_every=2, checkpoint_every=2))
  experiment.train(str(tmp_path), progress=False)
  metrics = experiment.evaluate(str(tmp_path))
  assert metrics["step"] == 2 and metrics["mode_samples"] == 40 and 1 <= metrics["modes"] <= 40
  rows = list(ctl.read_history(str(tmp_path / "metrics.jsonl")).rows())
  assert rows[-1]["modes"] == metrics["modes"], rows
