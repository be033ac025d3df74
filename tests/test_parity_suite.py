"""`ctl parity` raises no false alarm on steps nobody tuned it for, on any seed.

Five ordinary GAN steps (tests/parity_gans.py: WGAN-GP with an encoder, with and
without a synchronized batch norm and micro-batches, a hinge SN-GAN, a
conditional GAN, a BiGAN with Lion), each with its own mix of the optimizer
options docs/step.md lists (every option in at least two of them), on seeds 0-4,
`STEPS` steps, against `mirrored:2`: every one is called rounding, decided in
float64. (`python bench/parity_suite.py` runs the same matrix at 10 steps, the
figures docs/parity.md quotes; 5 here keep CI's time. Fewer steps amplify rounding
less, so the bench's 10 are the stricter test of false alarms.)
(tests/test_parity_planted.py: the other way, every planted bug is found.)

Each `check` runs the reference and the configuration in processes of their
own, every seed in the same processes. `python bench/parity_suite.py` runs the
same matrix and prints its tables (and float32's verdicts alone, for contrast).
"""

import os

import pytest

from ctl.tools import parity

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

SEEDS = range(5)
STEPS = 5
GANS_MODULE = os.path.join(helpers.ROOT, "tests", "parity_gans.py")
GANS = ("wgan_gp_encoder", "wgan_gp_encoder_bn", "hinge_sn", "conditional", "bigan_lion")
@pytest.mark.parametrize("gan", GANS)
def test_an_ordinary_gan_is_rounding_on_every_seed(gan, monkeypatch):
  monkeypatch.setenv("PARITY_GAN", gan)
  report = parity.check(GANS_MODULE, ["mirrored:2"], steps=STEPS, seeds=SEEDS, jobs=2)
  print(report)
  assert sorted(report.configs) == sorted(f"mirrored:2 seed={s}" for s in SEEDS)
  assert set(report.decided_by.values()) == {"float64"}, report.notes
  assert report.ok, str(report)
