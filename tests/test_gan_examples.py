"""Each GAN example trains a few steps from its .gin file, as its header says to run it.

The configs are used as written, with bindings that shrink only the run (steps,
batch, widths, sample counts); each run must leave checkpoints, a sample grid,
an exported generator and, on MNIST, a classifier FID in its event files.
"""

import glob
import os

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from tests.helpers import ROOT
from tests.helpers import python

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

CONFIGS = sorted(os.path.basename(p)
                 for p in glob.glob(os.path.join(ROOT, "examples", "configs", "*.gin")))
SMALL = [
    "gan.Schedule.total_steps = 4", "gan.Schedule.steps_per_loop = 2",
    "gan.Experiment.batch_size = 16", "gan.Schedule.samples_every = 2",
    "gan.Schedule.fid_every = 2", "gan.Experiment.fid_samples = 200",
    "gan.Experiment.noise_dim = 8", "gan.Experiment.ema_start_step = 2",
    "gan.dcgan_generator.width = 4", "gan.dcgan_discriminator.width = 4",
    "gan.models.dcgan_encoder.width = 4", "gan.models.bigan_discriminator.width = 4",
]


def test_all_seven_examples_exist():
  assert CONFIGS == ["bigan.gin", "conditional_dcgan.gin", "dcgan.gin", "hinge_sn.gin",
                     "stacked_mnist.gin", "tfgan_mnist.gin", "wgan_gp.gin"]


def _scalars(directory, tag):
  acc = event_accumulator.EventAccumulator(directory, size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


@pytest.mark.parametrize("config", CONFIGS)
def test_example_trains_from_its_config(config, tmp_path):
  workdir = str(tmp_path / "run")
  args = [os.path.join("examples", "train_gan.py"), os.path.join("examples", "configs", config),
          "--workdir", workdir]
  for binding in SMALL:
    args += ["--gin", binding]
  if config == "conditional_dcgan.gin":  # one example under mirrored, as a user would switch
    args += ["--strategy", "mirrored", "--logical-cpus", "2"]
  python(args, timeout=300)
  assert os.path.exists(os.path.join(workdir, "checkpoints", "finished_step"))
  operative = open(os.path.join(workdir, "checkpoints", "operative_config.gin")).read()
  assert "gan.Experiment" in operative or "Experiment." in operative
  assert sorted(os.listdir(os.path.join(workdir, "samples"))) == [
      "samples_00000002.png", "samples_00000004.png"]
  exported = os.listdir(os.path.join(workdir, "export"))
  assert any(name.endswith(".keras") for name in exported), exported
  fid = _scalars(os.path.join(workdir, "events", "eval"), "classifier_fid")
  assert [step for step, _ in fid] == [2, 4]
  assert all(value > 0 for _, value in fid)
