"""Stopping and resuming changes nothing: kills, SIGTERM, torn saves and NaNs.

Each run is a subprocess of tests/resume_task.py. An interrupted run, rerun
with the same command, must end with the same per-step losses and the same
weights as a run that was never interrupted.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ctl
from helpers import ROOT, _env, finish, python, run_workers, start_workers

TASK = os.path.join(ROOT, "tests", "resume_task.py")
STEPS = 12


def run(workdir, out, *args, check=True):
  proc = python([TASK, "--workdir", str(workdir), "--out", str(out),
                 "--steps", str(STEPS)] + list(args), check=check, timeout=240)
  return proc


def start(workdir, out, *args):
  return subprocess.Popen(
      [sys.executable, TASK, "--workdir", str(workdir), "--out", str(out),
       "--steps", str(STEPS)] + list(args),
      cwd=ROOT, env=_env(None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)


def wait_for(proc, text, timeout=180):
  """Reads the process's output until a line starts with `text`."""
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.startswith(text):
      return
  proc.wait(timeout=timeout)
  raise AssertionError(f"no {text!r} line; exit {proc.returncode}:\n{''.join(lines)[-4000:]}")


def interrupt(workdir, out, sig, pause_at, *args):
  """Runs the task, sends `sig` when it pauses at `pause_at`; returns the exit code."""
  os.makedirs(workdir, exist_ok=True)
  proc = start(workdir, out, "--pause-at", str(pause_at), *args)
  try:
    wait_for(proc, f"PAUSED {pause_at}")
    proc.send_signal(sig)
    open(os.path.join(workdir, "go"), "w").close()
    rest = proc.communicate(timeout=180)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return proc.returncode, rest


def load(out):
  return dict(np.load(out))


def assert_same_run(resumed, reference, atol=0.0):
  """The resumed run's steps and final weights equal the reference's."""
  first = int(resumed["first_step"])
  assert first > 0, "the rerun did not resume from a checkpoint"
  for key in reference:
    if key.startswith("loss/"):
      np.testing.assert_allclose(resumed[key], reference[key][first:], rtol=0, atol=atol,
                                 err_msg=key)
    elif key != "first_step":
      np.testing.assert_allclose(resumed[key], reference[key], rtol=0, atol=atol,
                                 err_msg=key)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """reference(strategy, *args): the uninterrupted run (made once per arguments)."""
  runs = {}

  def get(strategy, *args):
    key = (strategy,) + args
    if key not in runs:
      d = tmp_path_factory.mktemp("reference")
      run(d / "work", d / "out.npz", "--strategy", strategy, "--logical-cpus", "2", *args)
      runs[key] = load(d / "out.npz")
    return runs[key]

  return get


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_sigkill_then_rerun_equals_uninterrupted(tmp_path, reference, strategy):
  work = tmp_path / "work"
  code, log = interrupt(work, tmp_path / "a.npz", signal.SIGKILL, 7,
                        "--strategy", strategy, "--logical-cpus", "2")
  assert code == -signal.SIGKILL, log
  assert tf.train.latest_checkpoint(str(work / "checkpoints")).endswith("ckpt-4")
  run(work, tmp_path / "b.npz", "--strategy", strategy, "--logical-cpus", "2")
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == 4
  assert_same_run(resumed, reference(strategy))


@pytest.mark.parametrize("first,second", [("mirrored", "default"), ("default", "mirrored")])
def test_checkpoint_resumes_under_another_strategy(tmp_path, reference, first, second):
  work = tmp_path / "work"
  python([TASK, "--workdir", str(work), "--out", str(tmp_path / "a.npz"), "--steps", "8",
          "--strategy", first, "--logical-cpus", "2", "--dropout", "0"], timeout=240)
  run(work, tmp_path / "b.npz", "--strategy", second, "--logical-cpus", "2",
      "--dropout", "0")
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == 8
  # Mirrored sums gradients in another order: agreement to float32 rounding.
  # (Without dropout: Keras' Dropout draws per replica, so it differs by strategy.)
  assert_same_run(resumed, reference(second, "--dropout", "0"), atol=1e-5)


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_sigterm_saves_exits_42_and_rerun_resumes(tmp_path, reference, strategy):
  work = tmp_path / "work"
  # Paused at step 3, after that call's preemption check: the own handler saves
  # after the next call (6), TF's handler one call later (9), to agree on it.
  code, log = interrupt(work, tmp_path / "a.npz", signal.SIGTERM, 3,
                        "--strategy", strategy, "--logical-cpus", "2",
                        "--checkpoint-every", "100")
  assert code == ctl.PREEMPTED_EXIT_CODE == 42, log
  saved = tf.train.latest_checkpoint(str(work / "checkpoints"))
  assert saved is not None, "SIGTERM did not save a checkpoint"
  saved_step = int(saved.rsplit("-", 1)[1])
  assert f"SIGTERM: saved a checkpoint at step {saved_step}; exiting with code 42" in log
  assert saved_step in (6, 9), saved
  run(work, tmp_path / "b.npz", "--strategy", strategy, "--logical-cpus", "2",
      "--checkpoint-every", "100")
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == saved_step
  assert_same_run(resumed, reference(strategy))


def test_crash_during_checkpoint_write_leaves_previous_restorable(tmp_path, reference):
  work = tmp_path / "work"
  proc = run(work, tmp_path / "a.npz", "--crash-in-save-at", "8", check=False)
  assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
  checkpoints = work / "checkpoints"
  # The save at step 8 wrote its files but not the pointer to them.
  assert tf.train.latest_checkpoint(str(checkpoints)).endswith("ckpt-4")
  torn = [p for p in os.listdir(checkpoints) if p.startswith("ckpt-8.data")]
  assert torn, sorted(os.listdir(checkpoints))
  for name in torn:  # as if the crash came halfway through writing the data
    path = checkpoints / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  run(work, tmp_path / "b.npz")
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == 4
  assert_same_run(resumed, reference("default"))


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_nan_stops_naming_the_step_and_keeps_the_checkpoint(tmp_path, strategy):
  proc = run(tmp_path / "work", tmp_path / "a.npz", "--nan-at", "9",
             "--strategy", strategy, "--logical-cpus", "2", check=False)
  assert proc.returncode == 1
  assert "FloatingPointError: non-finite result at step 9" in proc.stderr
  assert "discriminator_loss nan" in proc.stderr
  assert "ckpt-8, is intact" in proc.stderr
  checkpoints = tmp_path / "work" / "checkpoints"
  assert tf.train.latest_checkpoint(str(checkpoints)).endswith("ckpt-8")
  assert not [p for p in os.listdir(checkpoints) if p.startswith(("ckpt-9", "ckpt-1"))]


# Multi-worker: every worker saves, only the chief's copy is kept.

def test_multi_worker_keeps_the_chiefs_checkpoints_and_resumes(tmp_path, reference):
  work = tmp_path / "work"
  args = ("--workdir", str(work), "--dropout", "0")
  run_workers(tmp_path, 2, *args, "--steps", "8", task=TASK)
  assert sorted(os.listdir(work / "checkpoints")) == [
      "checkpoint", "ckpt-4.data-00000-of-00001", "ckpt-4.index",
      "ckpt-8.data-00000-of-00001", "ckpt-8.index", "finished_step",
      "operative_config.gin"]
  assert sorted(os.listdir(work / "events" / "train"))  # the chief's events only:
  assert len(os.listdir(work / "events" / "train")) == 1
  resumed = run_workers(tmp_path, 2, *args, "--steps", str(STEPS), task=TASK)
  assert int(resumed["first_step"]) == 8
  assert_same_run(resumed, reference("default", "--dropout", "0"), atol=1e-5)


def test_multi_worker_sigterm_to_one_worker_saves_on_all_and_exits_42(tmp_path, reference):
  work = tmp_path / "work"
  os.makedirs(work)
  args = ("--workdir", str(work), "--dropout", "0", "--checkpoint-every", "100",
          "--steps", str(STEPS), "--pause-at", "3")
  procs = start_workers(2, TASK, "--out", str(tmp_path / "a.npz"), *args)
  try:
    for proc in procs:
      wait_for(proc, "PAUSED 3")
    procs[1].send_signal(signal.SIGTERM)  # the non-chief: the chief must learn of it
    open(work / "go", "w").close()
  finally:
    logs = finish(procs, 180)
  for proc, log in zip(procs, logs):
    assert proc.returncode == ctl.PREEMPTED_EXIT_CODE, log[-4000:]
  saved = tf.train.latest_checkpoint(str(work / "checkpoints"))
  saved_step = int(saved.rsplit("-", 1)[1])
  assert saved_step == 9  # TF's handler: one more call to agree on the step
  assert not [p for p in os.listdir(work / "checkpoints") if p.startswith("workertemp")]
  os.remove(work / "go")
  resumed = run_workers(tmp_path, 2, "--workdir", str(work), "--dropout", "0",
                        "--checkpoint-every", "100", "--steps", str(STEPS), task=TASK)
  assert int(resumed["first_step"]) == saved_step
  assert_same_run(resumed, reference("default", "--dropout", "0"), atol=1e-5)
