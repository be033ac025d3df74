"""A parameter-server training run for tests/test_parameter_server.py.

    TF_CONFIG=... python tests/ps_task.py --workdir w --steps 40 --out r.npz

Every task of the cluster runs this same command: on the `chief` it
coordinates the training of a small GAN (`ctl.Runner.fit` under
`parameter_server`); on `worker` and `ps` tasks `ctl.make_strategy` serves
the cluster and never returns. The chief writes the per-step losses, the
first step it ran, the final global step, how far the weights moved, and the
discriminator's loss on one fixed large batch before and after training to
`--out`.
"""

import argparse

import numpy as np

import ctl
from ctl import cli

import toy_gan
from toy_gan import NOISE

GLOBAL_BATCH = 32


def dataset():
  # A ring of 8 Gaussians: a GAN's losses move quickly on it.
  rng = np.random.default_rng(0)
  angles = rng.integers(0, 8, size=2048) * (2 * np.pi / 8)
  points = np.stack([np.cos(angles), np.sin(angles)], 1) * 2
  points += rng.normal(scale=0.05, size=points.shape)
  return toy_gan.batches(points.astype("float32"), GLOBAL_BATCH, shuffle_seed=1, repeat=True)


def fixed_batch():
  """4096 points of the ring and 4096 noise vectors, the same in every run."""
  rng = np.random.default_rng(11)
  angles = rng.integers(0, 8, size=4096) * (2 * np.pi / 8)
  real = np.stack([np.cos(angles), np.sin(angles)], 1) * 2
  noise = rng.normal(size=(4096, NOISE))
  return real.astype("float32"), noise.astype("float32")


def discriminator_loss(models, real, noise):
  """The step's discriminator loss on (real, generator(noise)), computed here."""
  import tensorflow as tf
  real_logits = models["discriminator"](real)[:, 0]
  fake_logits = models["discriminator"](models["generator"](noise))[:, 0]
  return float(tf.reduce_mean(toy_gan.discriminator_loss(real_logits, fake_logits)))


def weights(models):
  return np.concatenate([np.ravel(w.numpy()) for m in models.values() for w in m.weights])


# Unseeded: the runner's seed makes the initial weights.
build = toy_gan.mlp_gan(2, hidden=32, activation="relu", learning_rate=1e-3)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--workdir", required=True)
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--checkpoint-every", type=int, default=20)
  p.add_argument("--steps-per-loop", type=int, default=10)
  p.add_argument("--out", required=True)
  p.add_argument("--asynchronous", action="store_true")  # ctl.Checkpoint(asynchronous=True)
  args = p.parse_args()
  strategy = ctl.make_strategy("parameter_server")  # workers and ps serve here
  assert ctl.worker(strategy) == (0, 1, True), ctl.worker(strategy)  # the coordinator runs this
  runner = ctl.Runner(toy_gan.make_step(NOISE), build, dataset(), strategy=strategy,
                      seed=3, steps_per_loop=args.steps_per_loop)
  noise = np.random.default_rng(1).normal(size=(4, NOISE)).astype("float32")

  def samples(models):  # the coordinator calls the generator: points as 1x2 images
    return np.tanh(np.asarray(models["generator"](noise))).reshape(4, 1, 2, 1)

  actions = [ctl.Samples(samples, ctl.Every(steps=args.checkpoint_every)),
             ctl.Export("generator")]
  real, fixed_noise = fixed_batch()
  loss_before = discriminator_loss(runner.models, real, fixed_noise)
  weights_before = weights(runner.models)
  history = runner.fit(args.steps, args.workdir, actions=actions, progress=False,
                       checkpoint=ctl.Checkpoint(ctl.Every(steps=args.checkpoint_every),
                                                 asynchronous=args.asynchronous))
  results = toy_gan.results(history)
  results["fixed_batch_loss_before"] = np.array(loss_before)
  results["fixed_batch_loss_after"] = np.array(discriminator_loss(runner.models, real, fixed_noise))
  results["weights_moved"] = np.array(np.abs(weights(runner.models) - weights_before).max())
  results["first_step"] = np.array(args.steps - len(next(iter(history.values()), [])))
  results["global_step"] = np.array(int(runner.global_step.numpy()))
  results["iterations"] = np.array(
      [int(o.iterations.numpy()) for o in runner.optimizers.values()])
  # Evaluation over numbered samples runs on the coordinator here.
  from ctl.step.context import normal_by_index

  def generated(models, indices):
    points = models["generator"](normal_by_index(5, indices, NOISE))
    return {"index": indices, "points": points, "points_moments": points}

  evaluated = runner.over_samples(generated, 10, batch_size=4, moments=("points_moments",))
  direct = np.asarray(runner.models["generator"](
      normal_by_index(5, np.arange(10), NOISE)))
  results["over_samples_index"] = evaluated["index"]
  results["over_samples_difference"] = np.array(np.abs(evaluated["points"] - direct).max())
  results["over_samples_count"] = np.array(evaluated["points_moments"].count)
  np.savez(args.out, **results)


if __name__ == "__main__":
  with cli.log_to_stderr():  # ctl's log lines, as the `ctl` command shows them: tests read them
    main()
