"""`ctl parity` is right both ways, on steps nobody tuned it for, on every seed.

* Five ordinary GAN steps (tests/parity_gans.py: WGAN-GP with an encoder, with
  and without a synchronized batch norm and micro-batches, a hinge SN-GAN, a
  conditional GAN, a BiGAN with Lion), each with two bundles of optimizer
  options that hold every option README lists, on seeds 0-4, 10 steps, against
  `mirrored:2`: every one is called rounding.
* Every planted bug of tests/parity_planted.py, on seeds 0-4: every one is
  called DIFFERS, with its cause named; and the toy step without a bug is
  called rounding.

Each `check` runs the reference and each configuration in processes of their
own, every seed in the same processes. `python bench/parity_suite.py` runs the
same matrix and prints its tables (and float32's verdicts alone, for contrast).
"""

import os

import pytest

from ctl import parity

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

SEEDS = range(5)
GANS_MODULE = os.path.join(helpers.ROOT, "tests", "parity_gans.py")
PLANTED_MODULE = os.path.join(helpers.ROOT, "tests", "parity_planted.py")
GANS = ("wgan_gp_encoder", "wgan_gp_encoder_bn", "hinge_sn", "conditional", "bigan_lion")
# bug -> (configurations, what one cause says); "" is the step without a bug.
PLANTED = {
    "": (["compiled", "mirrored:2"], None),
    "replica_scaled": (["mirrored:2"], ["scaled by the replica count"]),
    "noise_per_replica": (["mirrored:2"], ["noise drawn without ctx.normal"]),
    "layers": (["mirrored:2"], ["discriminator (Dropout); generator (BatchNormalization)"]),
    "batch_norm": (["mirrored:2"], ["layers that work per replica: generator "
                                    "(BatchNormalization)"]),
    "python_random": (["compiled"], ["np.random"]),
    "penalty_over_batch": (["mirrored:2"], ["a value computed over the replica's batch: ",
                                            "parity_planted.py:", "tf.norm("]),
    "own_micro_batches": (["mirrored:2"], ["batch statistics: discriminator "
                                           "(BatchNormalization synchronized)"]),
}


@pytest.mark.parametrize("optimizers", ["adam", "mixed"])
@pytest.mark.parametrize("gan", GANS)
def test_an_ordinary_gan_is_rounding_on_every_seed(gan, optimizers, monkeypatch):
  monkeypatch.setenv("PARITY_GAN", gan)
  monkeypatch.setenv("PARITY_OPTIMIZERS", optimizers)
  report = parity.check(GANS_MODULE, ["mirrored:2"], steps=10, seeds=SEEDS, jobs=2)
  print(report)
  assert sorted(report.configs) == sorted(f"mirrored:2 seed={s}" for s in SEEDS)
  assert set(report.decided_by.values()) == {"float64"}, report.notes
  assert report.ok, str(report)


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_differs_on_every_seed_and_is_named(bug, monkeypatch):
  configs, words = PLANTED[bug]
  monkeypatch.setenv("PLANTED_BUG", bug)
  report = parity.check(PLANTED_MODULE, configs, steps=3, seeds=SEEDS, jobs=2)
  print(report)
  assert len(report.configs) == len(configs) * len(SEEDS)
  for name in report.configs:
    if words is None:
      assert report.within_rounding(name), str(report)
      continue
    assert not report.within_rounding(name), name
    assert any(all(w in cause for w in words) for cause in report.causes[name]), (
        name, report.causes[name])
