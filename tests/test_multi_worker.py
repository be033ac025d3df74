"""`ctl launch` with TensorFlow: two workers train as one process does.

Each run is `ctl launch --workers 2 -- python tests/resume_task.py --strategy
multi_worker ...`, invoked as a user would, with every worker writing its
final weights (`--out-every-worker`). (A worker killed mid-run, and the
relaunch that resumes, is in tests/test_faults.py.)

    python -m pytest tests/test_multi_worker.py
"""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
from helpers import GRACE
from helpers import LAUNCHED_TASK_ARGS
from helpers import run_launched_task

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train


def assert_results_equal(results, reference, atol):
  """Two runs from step 0: the same losses and weights, within `atol`."""
  assert int(results["first_step"]) == 0
  assert sorted(results) == sorted(reference)
  for key, value in reference.items():
    if key != "first_step":
      np.testing.assert_allclose(results[key], value, rtol=0, atol=atol, err_msg=key)


def assert_identical(results, reference):
  assert sorted(results) == sorted(reference)
  for key, value in reference.items():
    np.testing.assert_array_equal(results[key], value, err_msg=key)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The two workers' results of a run that nothing interrupts."""
  d = tmp_path_factory.mktemp("uninterrupted")
  return run_launched_task(d / "work", d / "out")


def test_two_launched_workers_train_like_one_process(shared_runs, uninterrupted):
  # The launched run's arguments with the strategy `default`: the run the
  # fault tests compare with.
  assert LAUNCHED_TASK_ARGS == ("--dropout", "0", "--steps", "12", "--checkpoint-every", "4")
  single = helpers.resume_reference(shared_runs, "default", "--dropout", "0")
  worker0, worker1 = uninterrupted
  assert_identical(worker1, worker0)  # the workers agree bit for bit
  # The all-reduce sums the two workers' gradients in another order.
  assert_results_equal(worker0, single, atol=1e-5)


def test_ctl_train_through_launch_matches_one_process(tmp_path):
  """The path a user takes: `ctl launch -- ctl train CONFIG --strategy multi_worker`.

  Both runs are in float64 (`gan.Experiment.mixed_precision`): in float32,
  Adam amplifies the all-reduce's other summation order past any fixed
  tolerance within a few steps on some seeds (seed 0 of this config: 2% of a
  generator slot after 2 steps; `ctl parity` calls that rounding because
  float64 agrees), while in float64 a correct run agrees to about 1e-15.
  """
  config = os.path.join("examples", "configs", "dcgan.gin")
  args = [*helpers.TINY_GAN, "--gin", "gan.Experiment.mixed_precision = 'float64'"]
  single = tmp_path / "single"
  helpers.ctl("train", config, "--workdir", str(single), *args, timeout=300)
  work = tmp_path / "workers"
  proc = helpers.ctl("launch", "--workers", "2", "--grace", str(GRACE), "--",
                     sys.executable, "-m", "ctl.cli", "train", config, "--strategy",
                     "multi_worker", "--workdir", str(work), *args, timeout=300)
  assert proc.stdout.count("ctl train: step 4") == 1, proc.stdout  # the chief reports
  for name in ("checkpoints/finished_step", "export/generator.keras",
               "samples/samples_00000004.png"):
    assert os.path.exists(work / name), name
  # Every weight and optimizer slot of the chief's final checkpoint equals
  # the single-process run's within float64 rounding.
  expected = tf.train.load_checkpoint(str(single / "checkpoints"))
  actual = tf.train.load_checkpoint(str(work / "checkpoints"))
  # (TF's preemption handler adds its own entry to the multi-worker one.)
  names = sorted(n for n in expected.get_variable_to_shape_map()
                 if n.startswith(("models/", "optimizers/")))
  assert names == sorted(n for n in actual.get_variable_to_shape_map()
                         if n.startswith(("models/", "optimizers/")))
  compared = 0
  for name in names:
    value = expected.get_tensor(name)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
      assert value.dtype == np.float64, name
      np.testing.assert_allclose(actual.get_tensor(name), value, rtol=0, atol=1e-12,
                                 err_msg=name)
      compared += 1
  assert compared > 20, compared
