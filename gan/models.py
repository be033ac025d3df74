"""Reference GAN models (Keras 3), DCGAN-style, sized by arguments.

    generator = gan.dcgan_generator(noise_dim=64, width=32)      # z -> [28, 28, 1] in [-1, 1]
    discriminator = gan.dcgan_discriminator(width=32)            # image -> one logit

Radford et al., "Unsupervised Representation Learning with Deep Convolutional
GANs", 2016 (arXiv:1511.06434): strided (transposed) convolutions, batch norm in
the generator, LeakyReLU(0.2) in the discriminator, tanh output.
"""

import keras
from keras import layers


def dcgan_generator(noise_dim=64, width=64, synchronized_batch_norm=True,
                    name="generator"):
  """Noise `[B, noise_dim]` -> images `[B, 28, 28, 1]` in [-1, 1].

  Args:
    noise_dim: size of the noise vector.
    width: channels of the last hidden layer; earlier layers have 2x.
    synchronized_batch_norm: compute batch-norm statistics over the global
      batch (all replicas), so that results do not depend on the strategy.
      False uses each replica's own batch, which is cheaper and what most
      published multi-GPU runs did.
  """
  norm = lambda: layers.BatchNormalization(synchronized=synchronized_batch_norm)  # noqa: E731
  return keras.Sequential([
      keras.Input((noise_dim,)),
      layers.Dense(7 * 7 * 2 * width, use_bias=False),
      norm(),
      layers.LeakyReLU(0.2),
      layers.Reshape((7, 7, 2 * width)),
      layers.Conv2DTranspose(width, 5, strides=2, padding="same", use_bias=False),
      norm(),
      layers.LeakyReLU(0.2),
      # The output stays float32 under mixed precision, as Keras advises.
      layers.Conv2DTranspose(1, 5, strides=2, padding="same", activation="tanh",
                             dtype="float32"),
  ], name=name)


def dcgan_discriminator(width=64, name="discriminator"):
  """Images `[B, 28, 28, 1]` -> logits `[B, 1]` (no dropout: runs stay deterministic)."""
  return keras.Sequential([
      keras.Input((28, 28, 1)),
      layers.Conv2D(width, 5, strides=2, padding="same"),
      layers.LeakyReLU(0.2),
      layers.Conv2D(2 * width, 5, strides=2, padding="same"),
      layers.LeakyReLU(0.2),
      layers.Flatten(),
      layers.Dense(1, dtype="float32"),
  ], name=name)
