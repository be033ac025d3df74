"""`ctl parity` raises no false alarm on steps nobody tuned it for, on any seed.

Nine ordinary GAN steps (tests/parity_gans.py: WGAN-GP with an encoder, with and
without a synchronized batch norm and micro-batches, a hinge SN-GAN, a
conditional GAN, a BiGAN with Lion, lazy R1, a plain GAN under SGD with
momentum, a least-squares GAN clipped under loss scaling, DiffAugment-style
augmentation), the first five each with its own mix of the optimizer options
docs/step.md lists (every option in at least two of them), each in two dtype
variants ($PARITY_DTYPE): "following", naming no float type, on seeds 0-4, and
"explicit", naming float32 where ordinary TF code does (casts, draws, constants,
layers), on seeds 0-1, which the float64 replay must promote. `STEPS` steps,
against `mirrored:2`: every one is called rounding, decided in float64.
(`python bench/parity_suite.py` runs the same matrix at 10 steps, every variant on
seeds 0-4, and on 2 seeds against `multi_worker:2`, the figures docs/parity.md
quotes; 5 steps here keep CI's time. Fewer steps amplify rounding less, so the
bench's 10 are the stricter test of false alarms.)
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

STEPS = 5
# Each dtype variant's seeds: "explicit" on fewer, for CI's time; the steps'
# arithmetic is the same in both, only how they name float32 differs.
SEEDS = {"following": range(5), "explicit": range(2)}
GANS_MODULE = os.path.join(helpers.ROOT, "tests", "parity_gans.py")
# parity_gans.GANS, written out: importing the module would import TensorFlow here.
GANS = ("wgan_gp_encoder", "wgan_gp_encoder_bn", "hinge_sn", "conditional", "bigan_lion",
        "lazy_r1", "sgd_momentum", "lso_clip", "augment")
DTYPES = tuple(SEEDS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gan", GANS)
def test_an_ordinary_gan_is_rounding_on_every_seed(gan, dtype, monkeypatch):
  monkeypatch.setenv("PARITY_GAN", gan)
  monkeypatch.setenv("PARITY_DTYPE", dtype)
  seeds = SEEDS[dtype]
  report = parity.check(GANS_MODULE, ["mirrored:2"], steps=STEPS, seeds=seeds, jobs=2)
  print(report)
  assert sorted(report.configs) == sorted(f"mirrored:2 seed={s}" for s in seeds)
  assert set(report.decided_by.values()) == {"float64"}, report.notes
  assert report.ok, str(report)
