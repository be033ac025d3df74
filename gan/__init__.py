"""gan: a GAN kit for ctl: models, losses, penalties, EMA, data, offline evaluation.

    import gan
    generator, discriminator = gan.dcgan_generator(), gan.dcgan_discriminator()
    dataset = gan.mnist_dataset(global_batch_size=64)
    d_loss = ctx.average(gan.hinge_discriminator_loss(real_logits, fake_logits)
                         + gan.wasserstein_gradient_penalty(ctx, discriminator, real, fake))
    fid = gan.classifier_fid(generated_digits, gan.load_mnist("test")[0])
    gan.train("runs/x", num_steps=5000)   # a whole experiment; usually from a .gin file
"""

from gan.data import image_folder_dataset
from gan.data import load_mnist
from gan.data import mnist_dataset
from gan.data import records_dataset
from gan.data import tfds_dataset
from gan.ema import ema_copy
from gan.ema import update_ema
from gan.evaluation import classifier_features
from gan.evaluation import classifier_fid
from gan.evaluation import classifier_kid
from gan.evaluation import classifier_score
from gan.evaluation import frechet_distance
from gan.evaluation import inception_fid
from gan.evaluation import kernel_distance
from gan.experiment import ClassifierFID
from gan.experiment import make_build
from gan.experiment import make_step
from gan.experiment import train
from gan.losses import hinge_discriminator_loss
from gan.losses import hinge_generator_loss
from gan.losses import least_squares_discriminator_loss
from gan.losses import least_squares_generator_loss
from gan.losses import minimax_discriminator_loss
from gan.losses import minimax_generator_loss
from gan.losses import non_saturating_discriminator_loss
from gan.losses import non_saturating_generator_loss
from gan.losses import wasserstein_discriminator_loss
from gan.losses import wasserstein_generator_loss
from gan.models import bigan_discriminator
from gan.models import dcgan_discriminator
from gan.models import dcgan_encoder
from gan.models import dcgan_generator
from gan.penalties import no_penalty
from gan.penalties import r1_penalty
from gan.penalties import wasserstein_gradient_penalty

__all__ = [
    "load_mnist", "mnist_dataset", "tfds_dataset", "image_folder_dataset", "records_dataset",
    "dcgan_generator", "dcgan_discriminator", "dcgan_encoder", "bigan_discriminator",
    "ema_copy", "update_ema",
    "minimax_generator_loss", "minimax_discriminator_loss",
    "non_saturating_generator_loss", "non_saturating_discriminator_loss",
    "wasserstein_generator_loss", "wasserstein_discriminator_loss",
    "hinge_generator_loss", "hinge_discriminator_loss",
    "least_squares_generator_loss", "least_squares_discriminator_loss",
    "wasserstein_gradient_penalty", "r1_penalty", "no_penalty",
    "classifier_features", "frechet_distance", "kernel_distance", "classifier_fid",
    "classifier_kid", "classifier_score", "inception_fid",
    "make_step", "make_build", "train", "ClassifierFID",
]
