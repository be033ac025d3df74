"""PyTorch and PyTorch Lightning rows for bench/run.py: the same GAN update, in torch.

    import torch_rows                      # bench/ on sys.path, as run.py has it
    reason = torch_rows.available()        # None, or why the rows are left out
    variant = torch_rows.torch_variant("tiny")       # or "dcgan"
    variant = torch_rows.lightning_variant("dcgan")
    variant.run(20)                        # trains 20 steps; returns when they are done

This module needs only numpy and torch (and lightning for its rows): it never
imports TensorFlow, and reads the embedded MNIST digits from
gan/data/mnist_train_5k.npz itself (`gan.data` imports TensorFlow).

The step is bench/run.py's hand-written one: a generator forward on fresh
normal noise, the discriminator on the real batch and on the fakes (two
separate calls, as the TF DCGAN tutorial makes), the non-saturating losses via
softplus (run.py's `losses`, averaged over the batch of 256), then the gradient
of the discriminator loss with respect to the discriminator's parameters and of
the generator loss with respect to the generator's, both taken from that one
forward pass (so both against the discriminator's weights before this step's
update), and one Adam step (lr 1e-4) for each network. In torch that is
`d_loss.backward(inputs=D params, retain_graph=True)` then
`g_loss.backward(inputs=G params)`, and only then the two optimizer steps (a
step before the second backward would change weights that backward needs).
`inputs=` prunes each backward as TensorFlow prunes each tape gradient: the
D-loss backward stops at the fakes (no generator work), the G-loss backward
computes the discriminator's input gradients but not its weight gradients. The
usual PyTorch DCGAN idiom (D update on `fake.detach()`, then a third
discriminator pass on the fakes with the updated weights for the G loss) costs
one more discriminator forward and computes a different update, so it is not
used.

Matching Keras' defaults: Adam eps 1e-7 (torch's default is 1e-8);
BatchNorm momentum 0.01 in torch's convention (Keras' 0.99) and eps 1e-3;
LeakyReLU slope 0.3 (keras.layers.LeakyReLU's default negative_slope); weights
glorot-uniform with zero biases. Layout is NCHW (torch's native), so MNIST
batches are [256, 1, 28, 28]; the 'same' paddings are padding=2 for the 5x5
convolutions (TF pads a stride-2 'same' convolution of 28 by 1 and 2, torch by
2 and 2: the same output sizes, shifted by one pixel) and padding=2,
output_padding=1 for the stride-2 transposed ones.

Input: the examples of run.py's `real_data` (the same ring of Gaussians from
seed 0, the same 5,000 digits scaled to [-1, 1]) cut once into whole batches
of 256 held in one tensor, one batch after another, cycling; there is no input
pipeline and no prefetch thread, so these rows compare with run.py's
in-memory rows (`ctl synthetic input`) as much as with its tf.data ones.

Threads: `torch.set_num_threads(os.cpu_count())` when a variant is made
(TensorFlow's intra-op pool also defaults to every logical CPU; torch's own
default is the number of physical cores). The setting is process-wide.

The torch variant is plain eager PyTorch (no torch.compile). The Lightning
variant runs the same step as a LightningModule with manual optimization, by a
new `lightning.Trainer` and one `trainer.fit` per `run(steps)`, as run.py's
Keras rows make one `fit` call per timed repetition: every call pays the
Trainer's construction and fit's setup and teardown (callbacks, loops, data
fetcher, the module put in train mode), a fixed cost that `run(steps)` spreads
over its steps. With two optimizers the Trainer's `global_step` counts two
optimizer steps per training step, so `max_steps` is twice the step count.
The optimizers are made once, in the module, and handed to every Trainer, so
Adam's moments carry over from one `fit` to the next.

`results` keeps, per `run`, each step's losses: {"discriminator_loss": array,
"generator_loss": array}.
"""

import os

BATCH = 256
NOISE_DIM = {"tiny": 2, "dcgan": 100}
_MNIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "gan", "data", "mnist_train_5k.npz")
_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def available(lightning=True):
  """None if torch (and, with `lightning`, lightning) imports; else a one-line reason."""
  try:
    import torch  # noqa: F401
  except ImportError as e:
    return f"torch is not installed ({e}): {_INSTALL} adds these rows"
  if lightning:
    try:
      import lightning  # noqa: F401
    except ImportError as e:
      return f"lightning is not installed ({e}): pip install lightning adds its rows"
  return None


class Variant:
  """bench/run.py's `Variant` interface: `run(steps)`, `traces()`, `results`, `concrete`.

  Eager torch has no compiled step to retrace, so `traces()` is always 0, and
  no concrete function to count FLOPs in (`concrete` is None).
  """

  def __init__(self, run):
    self._run, self.concrete = run, None
    self.results = []

  def traces(self):
    return 0

  def run(self, steps):
    out = self._run(steps)
    if out is not None:
      self.results.append(out)


def _examples(workload):
  """run.py's `real_data` examples as float32 [batches, 256, ...] (NCHW for MNIST)."""
  import numpy as np
  rng = np.random.default_rng(0)
  if workload == "tiny":
    angle = rng.integers(0, 8, 8192) * (2 * np.pi / 8)
    x = np.stack([np.cos(angle), np.sin(angle)], 1) * 2 + rng.normal(0, 0.05, (8192, 2))
  elif workload == "dcgan":
    with np.load(_MNIST) as archive:
      x = (archive["images"][:, None].astype("float32") - 127.5) / 127.5
  else:
    raise ValueError(f"workload must be 'tiny' or 'dcgan', got {workload!r}")
  x = x.astype("float32")
  batches = len(x) // BATCH
  return x[:batches * BATCH].reshape(batches, BATCH, *x.shape[1:])


def _models(workload):
  """(generator, discriminator), as run.py's `tiny_models` / `dcgan_models`."""
  from torch import nn
  if workload == "tiny":
    generator = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 2))
    discriminator = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                  nn.Linear(64, 1))
  else:
    def bn(cls, n):
      return cls(n, eps=1e-3, momentum=0.01)  # Keras' BatchNormalization defaults
    slope = 0.3  # keras.layers.LeakyReLU's default negative_slope
    generator = nn.Sequential(
        nn.Linear(100, 7 * 7 * 256, bias=False), bn(nn.BatchNorm1d, 7 * 7 * 256),
        nn.LeakyReLU(slope), nn.Unflatten(1, (256, 7, 7)),
        nn.ConvTranspose2d(256, 128, 5, stride=1, padding=2, bias=False),
        bn(nn.BatchNorm2d, 128), nn.LeakyReLU(slope),
        nn.ConvTranspose2d(128, 64, 5, stride=2, padding=2, output_padding=1, bias=False),
        bn(nn.BatchNorm2d, 64), nn.LeakyReLU(slope),
        nn.ConvTranspose2d(64, 1, 5, stride=2, padding=2, output_padding=1, bias=False),
        nn.Tanh())
    discriminator = nn.Sequential(
        nn.Conv2d(1, 64, 5, stride=2, padding=2), nn.LeakyReLU(slope), nn.Dropout(0.3),
        nn.Conv2d(64, 128, 5, stride=2, padding=2), nn.LeakyReLU(slope), nn.Dropout(0.3),
        nn.Flatten(), nn.Linear(128 * 7 * 7, 1))
  for module in list(generator.modules()) + list(discriminator.modules()):
    if isinstance(module, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
      nn.init.xavier_uniform_(module.weight)  # Keras' glorot_uniform, zero biases
      if module.bias is not None:
        nn.init.zeros_(module.bias)
  return generator.train(), discriminator.train()


class _Parts:
  """Models, optimizers, batches and the step's forward and backward, shared by both variants."""

  def __init__(self, workload):
    import torch
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    self.noise_dim = NOISE_DIM[workload]
    self.generator, self.discriminator = _models(workload)
    self.g_opt = torch.optim.Adam(self.generator.parameters(), lr=1e-4, eps=1e-7)
    self.d_opt = torch.optim.Adam(self.discriminator.parameters(), lr=1e-4, eps=1e-7)
    self.g_params = list(self.generator.parameters())
    self.d_params = list(self.discriminator.parameters())
    self.batches = torch.from_numpy(_examples(workload))
    self.cursor = 0

  def next_batch(self):
    batch = self.batches[self.cursor]
    self.cursor = (self.cursor + 1) % len(self.batches)
    return batch

  def losses_and_gradients(self, real, backward):
    """One G forward, two D forwards, both losses, both gradients (into `.grad`)."""
    import torch
    import torch.nn.functional as F
    fake = self.generator(torch.randn(real.shape[0], self.noise_dim))
    real_logits, fake_logits = self.discriminator(real), self.discriminator(fake)
    d_loss = (F.softplus(-real_logits[:, 0]) + F.softplus(fake_logits[:, 0])).mean()
    g_loss = F.softplus(-fake_logits[:, 0]).mean()
    self.d_opt.zero_grad(set_to_none=True)
    self.g_opt.zero_grad(set_to_none=True)
    backward(d_loss, inputs=self.d_params, retain_graph=True)
    backward(g_loss, inputs=self.g_params)
    return d_loss.detach(), g_loss.detach()


def _history(d_losses, g_losses):
  import torch
  return {"discriminator_loss": torch.stack(d_losses).numpy(),
          "generator_loss": torch.stack(g_losses).numpy()}


def torch_variant(workload):
  """The step in eager PyTorch, a plain Python loop over `steps`."""
  parts = _Parts(workload)

  def backward(loss, **kwargs):
    loss.backward(**kwargs)

  def run(steps):
    d_losses, g_losses = [], []
    for _ in range(steps):
      d_loss, g_loss = parts.losses_and_gradients(parts.next_batch(), backward)
      parts.d_opt.step()
      parts.g_opt.step()
      d_losses.append(d_loss)
      g_losses.append(g_loss)
    # Eager CPU ops are synchronous: the last step is done when its step() returns.
    return _history(d_losses, g_losses)

  return Variant(run)


def lightning_variant(workload):
  """The step as a manual-optimization LightningModule; one new Trainer and `fit` per run."""
  import logging
  import warnings

  import lightning
  import torch

  parts = _Parts(workload)
  # Trainer's banner ("GPU available: ...") and its advice about DataLoader
  # workers would print on every run.
  logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
  logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
  warnings.filterwarnings("ignore", module="lightning")

  class Batches(torch.utils.data.IterableDataset):
    """Endless whole batches, going on from where the previous fit stopped."""

    def __iter__(self):
      while True:
        yield parts.next_batch()

  class GAN(lightning.LightningModule):
    def __init__(self):
      super().__init__()
      self.automatic_optimization = False
      self.generator, self.discriminator = parts.generator, parts.discriminator
      self.d_losses, self.g_losses = [], []

    def configure_optimizers(self):
      # The same optimizer objects for every Trainer: Adam's state persists.
      return [parts.d_opt, parts.g_opt]

    def training_step(self, real, batch_idx):
      d_opt, g_opt = self.optimizers()
      d_loss, g_loss = parts.losses_and_gradients(real, self.manual_backward)
      d_opt.step()
      g_opt.step()
      self.d_losses.append(d_loss)
      self.g_losses.append(g_loss)

  module = GAN()
  loader = torch.utils.data.DataLoader(Batches(), batch_size=None)

  def run(steps):
    trainer = lightning.Trainer(
        max_steps=2 * steps,  # global_step counts both optimizers' steps
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    module.d_losses, module.g_losses = [], []
    trainer.fit(module, train_dataloaders=loader)
    if len(module.d_losses) != steps:
      raise RuntimeError(f"Lightning ran {len(module.d_losses)} steps, not {steps}")
    return _history(module.d_losses, module.g_losses)

  return Variant(run)
