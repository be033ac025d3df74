"""Quality run: the DCGAN example on the embedded MNIST digits, scored by classifier FID.

    python bench/gan_quality.py                  # the config's 25,000 steps, ~20 minutes here
    python bench/gan_quality.py --steps 2000 --workdir runs/quality_short

Trains `examples/configs/dcgan.gin` (classifier FID every 1,000 steps, EMA
generator) and reports the FID curve next to two reference points computed
the same way, against the same 5,000 held-out test digits:
  - floor: the 5,000 training digits themselves (real vs real; a generator that
    reproduced its training data exactly would score this);
  - ceiling: the untrained generator (same architecture and seed, step 0).
Writes `docs/quality.md` (the table) and `docs/dcgan_samples.png` (the final
grid). FID here is *classifier* FID: Frechet distance in the feature space of
the small MNIST classifier shipped with `gan.evaluation`, not Inception FID.
"""

import argparse
import os
import shutil
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fid_curve(workdir):
  import tensorflow as tf
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(os.path.join(workdir, "events", "eval"),
                                           size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors("classifier_fid")]


def reference_points(noise_dim, width, num_samples, seed):
  """(floor, ceiling): real-vs-real FID and the untrained generator's FID."""
  import keras

  import gan
  from gan import evaluation
  reference = evaluation.classifier_features(gan.data.load_mnist("test")[0])
  floor = evaluation.frechet_distance(
      evaluation.classifier_features(gan.data.load_mnist("train")[0]), reference)
  keras.utils.set_random_seed(seed)  # as the runner seeds its models
  untrained = {"generator": gan.dcgan_generator(noise_dim, width)}
  action = gan.experiment.ClassifierFID(noise_dim, num_samples=num_samples)
  ceiling = evaluation.frechet_distance(
      evaluation.classifier_features(action.generate(untrained)), reference)
  return float(floor), float(ceiling)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, help="default: the config's total_steps (25,000)")
  p.add_argument("--workdir", default=os.path.join("runs", "quality_dcgan"))
  p.add_argument("--docs", default=os.path.join(ROOT, "docs"))
  p.add_argument("--resume", action="store_true", help="keep an existing --workdir")
  args = p.parse_args(argv)
  if os.path.exists(args.workdir) and not args.resume:
    shutil.rmtree(args.workdir)  # the timing is for a run from scratch

  import dataclasses

  import gin
  import numpy as np
  import tensorflow as tf

  import gan
  from ctl.loop import actions
  gin.parse_config_file(os.path.join(ROOT, "examples", "configs", "dcgan.gin"))
  start = time.monotonic()
  experiment = gan.Experiment()
  steps = args.steps or experiment.schedule.total_steps
  experiment = dataclasses.replace(
      experiment, schedule=dataclasses.replace(experiment.schedule, total_steps=steps))
  runner = experiment.train(args.workdir)
  # Training time of every invocation (a resumed run adds a line), for the total.
  with open(os.path.join(args.workdir, "bench_minutes.txt"), "a") as f:
    f.write(f"{(time.monotonic() - start) / 60:.2f}\n")
  with open(os.path.join(args.workdir, "bench_minutes.txt")) as f:
    times = [float(line) for line in f if line.strip()]
  minutes = sum(times)
  curve = fid_curve(args.workdir)
  noise_dim = experiment.noise_dim
  width = gin.query_parameter("gan.dcgan_generator.width")
  floor, ceiling = reference_points(noise_dim, width, 5000, runner.seed)

  os.makedirs(args.docs, exist_ok=True)
  grid = gan.experiment.fixed_samples(noise_dim, rows=10, model="generator_ema")(runner.models)
  tf.io.write_file(os.path.join(args.docs, "dcgan_samples.png"),
                   tf.io.encode_png(actions.image_grid(np.asarray(grid))))
  best = min(value for _, value in curve)
  lines = [
      "# GAN quality on this CPU: the DCGAN example, classifier FID",
      "",
      f"Command: `python bench/gan_quality.py{f' --steps {steps}' if args.steps else ''}` "
      f"({minutes:.1f} minutes of training on a 2-core CPU, no GPU"
      f"{f', in {len(times)} invocations (resumed)' if len(times) > 1 else ''}; "
      "`examples/configs/dcgan.gin`, batch 64, EMA generator).",
      "",
      "Classifier FID: Frechet distance between 5,000 generated digits and the 5,000",
      "held-out MNIST test digits, in the feature space of the small classifier",
      "shipped in `gan/data` (see `gan.evaluation`). It is not Inception FID and its",
      "values are not comparable with published FIDs. Lower is better.",
      "",
      "| | classifier FID | x floor |",
      "|---|---|---|",
      f"| floor: the 5,000 training digits (real vs real) | {floor:.3f} | 1.0 |",
      f"| ceiling: untrained generator (step 0) | {ceiling:.2f} | {ceiling / floor:.0f} |",
  ]
  lines += [f"| step {step:,} | {value:.3f} | {value / floor:.1f} |" for step, value in curve]
  target = 10 * floor
  lines += [
      "",
      f"Best: {best:.3f} = {best / floor:.1f} x the floor; target: at most 10 x the floor "
      f"({target:.3f}): {'met' if best <= target else 'NOT met'}.",
      "",
      "Samples of the final EMA generator (10 x 10, fixed noise): `dcgan_samples.png`.",
      "",
  ]
  with open(os.path.join(args.docs, "quality.md"), "w") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
