"""gan: a GAN kit for ctl: an experiment, and its parts for hand-written steps.

    import gan
    experiment = gan.Experiment(loss=gan.losses.hinge, schedule=gan.Schedule(total_steps=3000))
    experiment.train("runs/hinge")                  # usually `ctl train CONFIG.gin`

    generator, discriminator = gan.dcgan_generator(), gan.dcgan_discriminator()
    dataset = gan.mnist_dataset(global_batch_size=64)
    d_loss = ctx.average(gan.losses.hinge.discriminator(real_logits, fake_logits)
                         + gan.penalties.r1_penalty(ctx, critic, real, fake))

The everyday names are here; the rest is grouped by kind:

  gan.losses       loss families (non_saturating, minimax, wasserstein, hinge,
                   least_squares) and their functions
  gan.penalties    discriminator penalties, one signature
  gan.models       DCGAN models, the BiGAN encoder and pair discriminator
  gan.data         MNIST (embedded) and stacked MNIST, TFDS, image folders, TFRecords
  gan.ema          an EMA copy of the generator
  gan.augment      differentiable augmentation (DiffAugment) for little data
  gan.evaluation   classifier FID/KID/score, precision/recall, modes, Inception FID
  gan.experiment   the experiment's step, build, sample grids and metric actions

Gin knows each name by its shortest spelling: the everyday names at the top
(`@gan.dcgan_generator`), the others by their module (`@gan.models.dcgan_encoder`),
and a loss family as a value (`%gan.losses.hinge`).
"""

from gan import augment
from gan import data
from gan import ema
from gan import evaluation
from gan import experiment
from gan import losses
from gan import models
from gan import penalties
from gan.data import mnist_dataset
from gan.experiment import Experiment
from gan.experiment import Schedule
from gan.models import dcgan_discriminator
from gan.models import dcgan_generator

__all__ = [
    "Experiment", "Schedule", "mnist_dataset", "dcgan_generator", "dcgan_discriminator",
    "losses", "penalties", "models", "data", "ema", "evaluation", "experiment", "augment",
]
