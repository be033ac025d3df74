"""gan: GAN parts for ctl: models, losses and the embedded default dataset.

    import gan
    generator, discriminator = gan.dcgan_generator(), gan.dcgan_discriminator()
    dataset = gan.mnist_dataset(global_batch_size=64)
    loss = ctx.average(gan.non_saturating_generator_loss(discriminator(fake)))
"""

from gan.data import load_mnist
from gan.data import mnist_dataset
from gan.losses import non_saturating_discriminator_loss
from gan.losses import non_saturating_generator_loss
from gan.models import dcgan_discriminator
from gan.models import dcgan_generator

__all__ = ["load_mnist", "mnist_dataset", "non_saturating_discriminator_loss",
           "non_saturating_generator_loss", "dcgan_discriminator", "dcgan_generator"]
