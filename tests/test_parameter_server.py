"""Parameter-server training: a local cluster of processes on 127.0.0.1.

`ctl launch --workers 2 --ps 1` starts a coordinator (`chief`), 2 workers
and 1 parameter server, each running tests/ps_task.py; the chief trains a
small GAN through `ctl.Runner.fit` under `parameter_server`, the others
serve, and the launcher stops them when the chief is done.

Updates are asynchronous: which worker runs which step, and on which version
of the variables, changes from run to run, so no loss is compared with
another strategy's. The tests assert what asynchronous training guarantees
(every scheduled step ran and was counted once, the variables moved, a rerun
resumes from the saved step) and a learning check chosen to be immune to the
order: the discriminator's loss on one fixed batch of 8192 examples, before
and after training, instead of the noisy per-step losses of 32-example
batches.
"""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

TASK = os.path.join(helpers.ROOT, "tests", "ps_task.py")


def run_cluster(workdir, steps, *args, workers=2, timeout=240):
  """`ctl launch --workers 2 --ps 1` of ps_task.py; the chief's results and the log."""
  out = os.path.join(workdir, f"out-{steps}.npz")
  proc = helpers.ctl("launch", "--workers", str(workers), "--ps", "1", "--grace", "5", "--",
                     sys.executable, TASK, "--workdir", str(workdir),
                     "--steps", str(steps), "--out", out, *args, timeout=timeout)
  return dict(np.load(out)), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("ps")
  # ckpt-20 is written in the background, the variables read from the parameter server.
  return workdir, run_cluster(workdir, 40, "--asynchronous")


# The learning check's margin. Over 30 runs of this cluster here (issue 19) the
# fixed-batch loss fell from 1.643 by 0.161 to 0.176 (mean 0.167, standard
# deviation 0.004), and by 0.169 trained synchronously under `default`: the
# order of the updates barely moves it. Half the mean is about 20 standard
# deviations from both the runs seen and from no learning at all. (The old
# check, the mean of the last 10 per-step losses against the first 10, fell by
# 0.053 to 0.171 over the same runs, sd 0.027, and failed a CI run at 0.032.)
MIN_LOSS_DROP = 0.08


def test_every_step_runs_once_and_the_discriminator_learns(first_run):
  workdir, (results, _) = first_run
  d_loss = results["loss/discriminator_loss"]
  # Every scheduled step came back with its result, and was counted once (the
  # step counter is a plain tf.Variable on the parameter server).
  assert d_loss.shape == (40,) and np.isfinite(d_loss).all()
  assert int(results["global_step"]) == 40 and int(results["first_step"]) == 0
  assert float(results["weights_moved"]) > 0
  before = float(results["fixed_batch_loss_before"])
  after = float(results["fixed_batch_loss_after"])
  print(f"discriminator loss on the fixed batch: {before:.4f} before, {after:.4f} after; "
        f"per-step, first 10 steps {d_loss[:10].mean():.3f}, last 10 {d_loss[-10:].mean():.3f}")
  assert after < before - MIN_LOSS_DROP
  # Keras 3's optimizer.iterations may lose concurrent increments (TF field
  # notes); reported, not relied on.
  print("optimizer iterations (Keras):", results["iterations"].tolist(), "of 40")
  names = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  assert "ckpt-20.index" in names and "ckpt-40.index" in names
  # ckpt-20, written in the background while training went on, holds step 20's values.
  saved = tf.train.load_checkpoint(os.path.join(workdir, "checkpoints", "ckpt-20"))
  assert int(saved.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 20
  assert os.path.exists(os.path.join(workdir, "export", "generator.keras"))
  assert os.path.exists(os.path.join(workdir, "samples", "samples_00000040.png"))
  # Runner.over_samples on the coordinator: exactly the samples asked for.
  assert results["over_samples_index"].tolist() == list(range(10))
  assert int(results["over_samples_count"]) == 10
  assert float(results["over_samples_difference"]) < 1e-6


def test_a_rerun_on_more_workers_resumes_from_the_last_checkpoint(first_run):
  # The variables live on the parameter server, not the workers: any number of
  # workers resumes (the data starts again, its position is not checkpointed).
  workdir, _ = first_run
  results, log = run_cluster(workdir, 60, workers=3)
  assert "restored" in log and "ckpt-40 (step 40)" in log
  assert int(results["first_step"]) == 40
  assert results["loss/generator_loss"].shape == (20,)
  assert int(results["global_step"]) == 60
