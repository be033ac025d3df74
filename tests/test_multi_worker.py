"""`ctl launch` with TensorFlow: two workers train as one process does, and resume.

Each run is `ctl launch --workers 2 -- python tests/resume_task.py --strategy
multi_worker ...`, invoked as a user would, with every worker writing its
final weights (`--out-every-worker`). A worker killed mid-run must make the
launcher stop the other one, and relaunching the same command must finish the
run as if nothing had happened.
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import helpers
from helpers import ROOT, alive

TASK = os.path.join(ROOT, "tests", "resume_task.py")
STEPS = 12
GRACE = 5  # seconds between the launcher's SIGTERM and SIGKILL
# Without dropout: Keras' Dropout draws per replica, so it differs by strategy.
TASK_ARGS = ("--dropout", "0", "--steps", str(STEPS), "--checkpoint-every", "4")


def launch_command(workdir, out, *args):
  """`ctl launch` running resume_task.py on 2 workers, each writing `<out>.<i>.npz`."""
  return ([sys.executable, "-m", "ctl.cli", "launch", "--workers", "2",
           "--grace", str(GRACE), "--startup-timeout", "180", "--",
           sys.executable, TASK, "--strategy", "multi_worker", "--workdir", str(workdir),
           "--out", str(out), "--out-every-worker"] + list(TASK_ARGS + args))


def launch(workdir, out, *args):
  """Runs the launcher to the end; the results of worker 0 and worker 1."""
  proc = subprocess.run(launch_command(workdir, out, *args), cwd=ROOT, env=helpers._env(None),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return [dict(np.load(f"{out}.{i}.npz")) for i in range(2)]


def assert_results_equal(results, reference, atol, first_step=0):
  """Same weights, and the same losses for the steps from `first_step` on."""
  assert int(results["first_step"]) == first_step
  assert sorted(results) == sorted(reference)
  for key, value in reference.items():
    if key.startswith("loss/"):
      value = value[first_step:]
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
  return launch(d / "work", d / "out")


def test_two_launched_workers_train_like_one_process(tmp_path, uninterrupted):
  helpers.python([TASK, "--strategy", "default", "--workdir", str(tmp_path / "work"),
                  "--out", str(tmp_path / "default.npz")] + list(TASK_ARGS), timeout=240)
  single = dict(np.load(tmp_path / "default.npz"))
  worker0, worker1 = uninterrupted
  assert_identical(worker1, worker0)  # the workers agree bit for bit
  # The all-reduce sums the two workers' gradients in another order.
  assert_results_equal(worker0, single, atol=1e-5)


def test_a_killed_worker_stops_the_launch_and_a_relaunch_resumes(tmp_path, uninterrupted):
  work, out = tmp_path / "work", tmp_path / "out"
  os.makedirs(work)
  command = launch_command(work, out, "--pause-at", "7")
  proc = subprocess.Popen(command, cwd=ROOT, env=helpers._env(None), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  lines = []
  try:
    paused = set()
    for line in proc.stdout:
      lines.append(line)
      paused.update(re.findall(r"^\[worker (\d)\] PAUSED 7$", line))
      if len(paused) == 2:
        break
    assert len(paused) == 2, "".join(lines)[-4000:]
    pids = dict(re.findall(r"(worker \d) \(pid (\d+)\)", "".join(lines)))
    os.kill(int(pids["worker 1"]), signal.SIGKILL)
    killed = time.monotonic()
    open(work / "go", "w").close()  # worker 0 goes on, to a peer that is gone
    lines.append(proc.communicate(timeout=120)[0])
    seconds = time.monotonic() - killed
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  log = "".join(lines)
  assert proc.returncode == 1, log[-4000:]
  assert (f"ctl launch: worker 1 (pid {pids['worker 1']}) exited with code -9 (killed by "
          "SIGKILL); stopped the others") in log, log[-4000:]
  assert seconds < GRACE + 15, seconds  # the launcher's own limit: grace, then SIGKILL
  assert not alive(int(pids["worker 0"]))
  assert tf.train.latest_checkpoint(str(work / "checkpoints")).endswith("ckpt-4")

  # The same command again: it resumes from step 4 and ends as if never stopped.
  worker0, worker1 = launch(work, out, "--pause-at", "7")
  assert_identical(worker1, worker0)
  assert_results_equal(worker0, uninterrupted[0], atol=1e-5, first_step=4)


def test_ctl_train_through_launch_matches_one_process(tmp_path):
  """The path a user takes: `ctl launch -- ctl train CONFIG --strategy multi_worker`."""
  config = os.path.join("examples", "configs", "dcgan.gin")
  single = tmp_path / "single"
  helpers.ctl("train", config, "--workdir", str(single), *helpers.TINY_GAN, timeout=240)
  work = tmp_path / "workers"
  proc = helpers.ctl("launch", "--workers", "2", "--grace", str(GRACE), "--",
                     sys.executable, "-m", "ctl.cli", "train", config, "--strategy",
                     "multi_worker", "--workdir", str(work), *helpers.TINY_GAN, timeout=300)
  assert proc.stdout.count("ctl train: step 4") == 1, proc.stdout  # the chief reports
  for name in ("checkpoints/finished_step", "export/generator.keras",
               "samples/samples_00000004.png"):
    assert os.path.exists(work / name), name
  # Every weight and optimizer slot of the chief's final checkpoint equals
  # the single-process run's within the parity tolerance.
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
      np.testing.assert_allclose(actual.get_tensor(name), value, rtol=0, atol=1e-5,
                                 err_msg=name)
      compared += 1
  assert compared > 20, compared
