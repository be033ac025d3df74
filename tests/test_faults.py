"""Injected faults, each in a real subprocess: what survives and what a rerun gives.

Every run is a subprocess of tests/resume_task.py, or `ctl launch` of it on 2
workers. A fault may cost the steps since the last checkpoint, never more:
the run it stops, rerun with the same command, must end with the same per-step
losses and final weights as a run that was never interrupted. `FAULTS` lists
each fault test with its fault, its outcome and the data lost (the table of
docs/reliability.md). The last section holds the resumes without a fault that
these reruns rely on: on another layout (`LAYOUT_CHANGES`, to 1e-12 in float64),
and multi-worker checkpoints.

    python -m pytest tests/test_faults.py
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import ctl

from helpers import GRACE
from helpers import RESUME_TASK
from helpers import ROOT
from helpers import alive
from helpers import finish
from helpers import launched_task_command
from helpers import python
from helpers import resume_reference
from helpers import run_launched_task
from helpers import run_workers
from helpers import start_workers
from helpers import subprocess_env

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

TASK = RESUME_TASK
STEPS = 12  # resume_task.py checkpoints every 4 steps: ckpt-4, ckpt-8, ckpt-12

# (test function, fault, outcome, data lost). "Equal" means every per-step loss
# and final weight of the rerun equals the uninterrupted run's: exactly in one
# process, within 1e-5 across processes (float32 rounding of the all-reduce).
FAULTS = [
    ("test_sigkill_then_rerun_equals_uninterrupted",
     "SIGKILL at step 7 (default and mirrored)",
     "ckpt-4 is the newest checkpoint; the rerun resumes from it and is equal",
     "steps 5-7 (since ckpt-4), trained again by the rerun"),
    ("test_crash_during_checkpoint_write_leaves_previous_restorable",
     "SIGKILL inside the save of ckpt-8, after its files are written and before "
     "the `checkpoint` file names it; its data file then cut to half",
     "ckpt-4 stays the newest and is restored; the rerun is equal",
     "steps 5-8 (since ckpt-4), trained again by the rerun"),
    ("test_sigkill_during_a_background_save_leaves_the_previous_restorable",
     "SIGKILL while ckpt-8 is written in the background (ctl.Checkpoint(asynchronous="
     "True)), its data under ckpt-8_temp/, training gone on to the end (default and "
     "mirrored)",
     "ckpt-4 stays the newest and is restored; the rerun writes ckpt-8 again and is "
     "equal",
     "steps 5-12 (since ckpt-4), trained again by the rerun"),
    ("test_sigterm_waits_for_the_background_save",
     "SIGTERM while ckpt-4 is written in the background and the step-8 save waits "
     "for it",
     "ckpt-4 is finished, then the step reached (8, or 7 on a slow machine) is saved; "
     "exit 42; the rerun resumes from it and is equal",
     "none"),
    ("test_sigterm_saves_exits_42_and_rerun_resumes",
     "SIGTERM at step 3 (default and mirrored)",
     "the paused action is abandoned and a checkpoint saved at step 3 at once, "
     "exit code 42; the rerun resumes from it and is equal",
     "none"),
    ("test_multi_worker_sigterm_to_one_worker_saves_on_all_and_exits_42",
     "SIGTERM to the non-chief of 2 multi_worker processes at step 3",
     "both workers take part in the save of ckpt-6 (the chief's copy is kept) and "
     "exit 42; the rerun on 2 workers resumes from it and is equal",
     "none"),
    ("test_failed_checkpoint_write_reports_and_keeps_the_previous",
     "the write of ckpt-8 fails with EFBIG (a file-size limit set after ckpt-4, "
     "as a full disk fails it), at once and in the background",
     "exit code 1 with an OSError naming ckpt-8, the directory, TF's message, "
     "ckpt-4 and the fix (in the background: at the next save, the end's); the "
     "`checkpoint` file still names ckpt-4, no ckpt-8_temp is left; the rerun "
     "resumes from ckpt-4 and is equal",
     "steps 5-8 (5-12 in the background: since ckpt-4), trained again by the rerun"),
    ("test_a_killed_worker_stops_the_launch_and_a_relaunch_resumes",
     "SIGKILL to worker 1 of 2 under `ctl launch`, at step 7",
     f"the launcher stops worker 0 within {GRACE + 15} s ({GRACE} s of grace, then "
     "SIGKILL) and exits 1; the relaunch resumes from ckpt-4 and is equal",
     "steps 5-7 (since ckpt-4), trained again by the relaunch"),
    ("test_a_killed_worker_is_restarted_by_the_launcher_and_resumes",
     "SIGKILL to worker 1 of 2 under `ctl launch --max-restarts 1`, at step 7; "
     "`--restart-workers` 2, 1 or 4",
     "the launcher stops worker 0, logs the restart and its cause, and starts the "
     "cluster again on 2, 1 or 4 workers; they resume from ckpt-4, the launcher exits "
     "0, and the run is equal",
     "steps 5-7 (since ckpt-4), trained again after the restart"),
    ("test_a_peer_frozen_past_tfs_heartbeat_timeout_is_waited_for",
     "worker 1 of 2 frozen (SIGSTOP) for 15 s at step 7, as a loaded machine can "
     "starve a process; TensorFlow alone declares a peer dead after 10 s without "
     "heartbeats",
     "ctl's heartbeat timeout (60 s) waits: the run goes on when it is resumed and "
     "is equal; with CTL_HEARTBEAT_TIMEOUT=3 and an 8 s freeze, both workers stop "
     "with TensorFlow's error naming the silent task",
     "none (with the short timeout: steps 5-7, since ckpt-4)"),
    ("test_nan_stops_naming_the_step_and_keeps_the_checkpoint",
     "a NaN in the batch of step 9 (default and mirrored)",
     "exit code 1 with a FloatingPointError naming step 9 and every result; "
     "ckpt-8 is the newest checkpoint, nothing later is saved",
     "step 9 (since ckpt-8); a rerun replays it and meets the same NaN, so change "
     "something first"),
]
# The resumes without a fault, in the last section.
NOT_FAULTS = ("test_a_run_resumes_on_another_layout_as_if_never_stopped",
              "test_multi_worker_keeps_the_chiefs_checkpoints_and_resumes",
              "test_faults_lists_every_fault_test")


def run(workdir, out, *args, check=True):
  proc = python([TASK, "--workdir", str(workdir), "--out", str(out),
                 "--steps", str(STEPS)] + list(args), check=check, timeout=240)
  return proc


def start(workdir, out, *args):
  return subprocess.Popen(
      [sys.executable, TASK, "--workdir", str(workdir), "--out", str(out),
       "--steps", str(STEPS)] + list(args),
      cwd=ROOT, env=subprocess_env(None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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
def reference(shared_runs):
  """reference(strategy, *args): the uninterrupted run (made once per session and
  arguments; tests/test_multi_worker.py compares with one of them too)."""
  assert STEPS == 12  # what helpers.resume_reference runs

  def get(strategy, *args):
    return resume_reference(shared_runs, strategy, *args)

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
  # The history file: steps 4 to 6, written before the kill, were dropped and
  # trained again; each step is there once, with the uninterrupted run's values.
  history = ctl.read_history(str(work))
  np.testing.assert_array_equal(history.steps, np.arange(STEPS))
  for key, values in reference(strategy).items():
    if key.startswith("loss/"):
      np.testing.assert_array_equal(history[key[len("loss/"):]], values, err_msg=key)


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
def test_sigkill_during_a_background_save_leaves_the_previous_restorable(tmp_path, reference,
                                                                         strategy):
  work, checkpoints = tmp_path / "work", tmp_path / "work" / "checkpoints"
  layout = ("--strategy", strategy, "--logical-cpus", "2", "--asynchronous")
  os.makedirs(work)
  proc = start(work, tmp_path / "a.npz", "--pause-at", "8", "--pause-in", "merge", *layout)
  with killed_if_left(proc):
    wait_for(proc, "PAUSED merge 8")  # in the save's thread; training goes on to the end
    left = sorted(os.listdir(checkpoints))
    proc.kill()
    proc.wait()
  assert "ckpt-8_temp" in left and not [n for n in left if n.startswith("ckpt-8.")], left
  assert tf.train.latest_checkpoint(str(checkpoints)).endswith("ckpt-4")
  run(work, tmp_path / "b.npz", *layout)
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == 4
  assert_same_run(resumed, reference(strategy))
  assert not [n for n in os.listdir(checkpoints) if n.endswith("_temp")]


def test_sigterm_waits_for_the_background_save(tmp_path, reference):
  work, checkpoints = tmp_path / "work", tmp_path / "work" / "checkpoints"
  os.makedirs(work)
  proc = start(work, tmp_path / "a.npz", "--asynchronous", "--pause-at", "4",
               "--pause-in", "merge")
  with killed_if_left(proc):
    wait_for(proc, "PAUSED merge 4")
    time.sleep(1)  # the main thread trains on (to step 8, whose save waits for ckpt-4's)
    proc.send_signal(signal.SIGTERM)
    open(work / "go", "w").close()
    log = proc.communicate(timeout=180)[0]
  assert proc.returncode == ctl.PREEMPTED_EXIT_CODE, log[-4000:]
  # At step 8 if the signal came once there; at 7 (the call before) on a slow machine.
  saved = re.search(r"saved a checkpoint at step (\d+); exiting with code 42", log)
  assert saved and int(saved[1]) in (7, 8), log[-4000:]
  state = tf.train.get_checkpoint_state(str(checkpoints))
  assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
      "ckpt-4", f"ckpt-{saved[1]}"]
  run(work, tmp_path / "b.npz", "--asynchronous")
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == int(saved[1])
  assert_same_run(resumed, reference("default"))


# Paused at step 3 inside an action: a one-process run abandons the action at
# the signal and saves at once, at step 3 (no step lost). This does not depend
# on timing: Python runs the signal handler in the main thread, inside the
# paused action, before the action could see the `go` file that the test
# writes after the signal.
SIGTERM_SAVES_AT = 3


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_sigterm_saves_exits_42_and_rerun_resumes(tmp_path, reference, strategy):
  work = tmp_path / "work"
  code, log = interrupt(work, tmp_path / "a.npz", signal.SIGTERM, 3,
                        "--strategy", strategy, "--logical-cpus", "2",
                        "--checkpoint-every", "100")
  assert code == ctl.PREEMPTED_EXIT_CODE == 42, log
  saved = tf.train.latest_checkpoint(str(work / "checkpoints"))
  assert saved is not None, "SIGTERM did not save a checkpoint"
  saved_step = int(saved.rsplit("-", 1)[1])
  assert f"SIGTERM: saved a checkpoint at step {saved_step}; exiting with code 42" in log
  assert saved_step == SIGTERM_SAVES_AT, saved
  run(work, tmp_path / "b.npz", "--strategy", strategy, "--logical-cpus", "2",
      "--checkpoint-every", "100")
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == saved_step
  assert_same_run(resumed, reference(strategy))


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
  # TF's handler: at the check after the paused action (step 3), the signalled
  # worker names the step after its next call (6) and waits until every worker
  # has acknowledged it before going on, so the chief cannot pass that step
  # unaware. (The action is collective, so it is not abandoned.)
  assert saved_step == 6
  assert not [p for p in os.listdir(work / "checkpoints") if p.startswith("workertemp")]
  os.remove(work / "go")
  resumed = run_workers(tmp_path, 2, "--workdir", str(work), "--dropout", "0",
                        "--checkpoint-every", "100", "--steps", str(STEPS), task=TASK)
  assert int(resumed["first_step"]) == saved_step
  assert_same_run(resumed, reference("default", "--dropout", "0"), atol=1e-5)


@pytest.mark.parametrize("saves", ["synchronous", "asynchronous"])
def test_failed_checkpoint_write_reports_and_keeps_the_previous(tmp_path, reference, saves):
  work = tmp_path / "work"
  checkpoints = work / "checkpoints"
  # After ckpt-4, a file-size limit makes the kernel fail the write of ckpt-8 (in
  # the background: the run stops at the next save, the end's, as it would at 8).
  proc = run(work, tmp_path / "a.npz", "--fail-save-after-step", "4",
             *(["--asynchronous"] if saves == "asynchronous" else []), check=False)
  log = proc.stdout + proc.stderr
  assert "FILE SIZE LIMIT" in proc.stdout, log[-4000:]
  assert proc.returncode == 1, log[-4000:]
  assert f"OSError: could not write checkpoint ckpt-8 in {checkpoints}: " in proc.stderr, (
      proc.stderr[-4000:])
  assert "File too large" in proc.stderr, proc.stderr[-4000:]  # TF's message: EFBIG
  assert (f"The newest complete checkpoint is {checkpoints / 'ckpt-4'}; free disk space "
          "or fix the directory's permissions, then rerun the same command") in proc.stderr
  state = tf.train.get_checkpoint_state(str(checkpoints))  # the `checkpoint` file
  assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-4"]
  assert os.path.basename(state.model_checkpoint_path) == "ckpt-4"
  left = sorted(os.listdir(checkpoints))
  assert not [n for n in left if n.startswith("ckpt-8") or n.endswith("_temp")], left
  run(work, tmp_path / "b.npz")  # the same command, without the limit
  resumed = load(tmp_path / "b.npz")
  assert int(resumed["first_step"]) == 4
  assert_same_run(resumed, reference("default"))


@contextlib.contextmanager
def killed_if_left(proc):
  """Kills `proc` on the way out if it still runs (a failed assertion, a timeout)."""
  try:
    yield
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def launched_and_paused(work, out, *, launch_args=(), env=None):
  """`ctl launch` of 2 workers that pause at step 7: (process, its output so
  far, {"worker i": pid}) once both have paused."""
  os.makedirs(work, exist_ok=True)
  proc = subprocess.Popen(
      launched_task_command(work, out, "--pause-at", "7", launch_args=launch_args),
      cwd=ROOT, env=subprocess_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)
  lines, paused = [], set()
  for line in proc.stdout:
    lines.append(line)
    paused.update(re.findall(r"^\[worker (\d)\] PAUSED 7$", line))
    if len(paused) == 2:
      break
  if len(paused) < 2:
    proc.kill()
    proc.wait()
    raise AssertionError("".join(lines)[-4000:])
  return proc, lines, {name: int(pid) for name, pid in
                       re.findall(r"(worker \d) \(pid (\d+)\)", "".join(lines))}


def test_a_killed_worker_stops_the_launch_and_a_relaunch_resumes(tmp_path, reference):
  work, out = tmp_path / "work", tmp_path / "out"
  proc, lines, pids = launched_and_paused(work, out)
  with killed_if_left(proc):
    os.kill(pids["worker 1"], signal.SIGKILL)
    killed = time.monotonic()
    open(work / "go", "w").close()  # worker 0 goes on, to a peer that is gone
    lines.append(proc.communicate(timeout=120)[0])
    seconds = time.monotonic() - killed
  log = "".join(lines)
  assert proc.returncode == 1, log[-4000:]
  assert (f"ctl launch: worker 1 (pid {pids['worker 1']}) exited with code -9 (killed by "
          "SIGKILL); stopped the others") in log, log[-4000:]
  # The launcher's own limit is GRACE + 15 s (the grace period, then at most 10 s
  # for SIGKILL to take effect and 5 s for output to drain); 60 s leaves room
  # for a loaded machine and still catches a launcher that leaves worker 0 to
  # wait on its dead peer.
  assert seconds < 60, seconds
  assert not alive(int(pids["worker 0"]))
  assert tf.train.latest_checkpoint(str(work / "checkpoints")).endswith("ckpt-4")

  # The same command again: it resumes from step 4 and ends as if never stopped.
  worker0, worker1 = run_launched_task(work, out, "--pause-at", "7")
  for key, value in worker0.items():  # the workers agree bit for bit
    np.testing.assert_array_equal(worker1[key], value, err_msg=key)
  assert int(worker0["first_step"]) == 4
  assert_same_run(worker0, reference("default", "--dropout", "0"), atol=1e-5)


@pytest.mark.parametrize("restart_workers", [2, 1, 4])
def test_a_killed_worker_is_restarted_by_the_launcher_and_resumes(tmp_path, reference,
                                                                  restart_workers):
  # Restarted on as many workers, on fewer (a machine lost) or on more.
  work, out = tmp_path / "work", tmp_path / "out"
  proc, lines, pids = launched_and_paused(
      work, out, launch_args=("--max-restarts", "1", "--restart-wait", "1",
                              "--restart-workers", str(restart_workers)))
  with killed_if_left(proc):
    os.kill(pids["worker 1"], signal.SIGKILL)
    # With `go` there, the restarted workers pass step 7 without pausing.
    open(work / "go", "w").close()
    lines.append(proc.communicate(timeout=300)[0])
  log = "".join(lines)
  assert proc.returncode == 0, log[-4000:]
  resized = "" if restart_workers == 2 else f"; on {restart_workers} worker(s), not 2"
  assert ("ctl launch: restart 1 of 1 in 1 s: worker 1 exited with code -9 (killed by "
          f"SIGKILL){resized}\n") in log, log[-4000:]
  assert ("ctl launch: 1 restart(s) of 1 used; the causes: worker 1 exited with code -9 "
          "(killed by SIGKILL)") in log, log[-4000:]
  assert not any(alive(int(pid)) for pid in pids.values())
  first, *others = [dict(np.load(f"{out}.{i}.npz")) for i in range(restart_workers)]
  for worker in others:  # the workers agree bit for bit
    for key, value in first.items():
      np.testing.assert_array_equal(worker[key], value, err_msg=key)
  assert int(first["first_step"]) == 4  # the restarted cluster resumed from ckpt-4
  assert_same_run(first, reference("default", "--dropout", "0"), atol=1e-5)


def freeze_worker_1(work, out, seconds, env=None):
  """Launches 2 workers, freezes worker 1 for `seconds` at step 7; (exit code, log)."""
  proc, lines, pids = launched_and_paused(work, out, env=env)
  with killed_if_left(proc):
    os.kill(pids["worker 1"], signal.SIGSTOP)  # its heartbeat thread stops too
    time.sleep(seconds)
    os.kill(pids["worker 1"], signal.SIGCONT)
    open(work / "go", "w").close()
    lines.append(proc.communicate(timeout=300)[0])
  return proc.returncode, "".join(lines)


def test_a_peer_frozen_past_tfs_heartbeat_timeout_is_waited_for(tmp_path, reference):
  code, log = freeze_worker_1(tmp_path / "work", tmp_path / "out", 15)
  assert code == 0, log[-4000:]
  worker0, worker1 = [dict(np.load(f"{tmp_path / 'out'}.{i}.npz")) for i in range(2)]
  for key, value in worker0.items():
    np.testing.assert_array_equal(worker1[key], value, err_msg=key)
  assert_results_equal_from_start(worker0, reference("default", "--dropout", "0"))
  # The timeout is ours, not TensorFlow's: a short one declares the frozen peer dead.
  code, log = freeze_worker_1(tmp_path / "short", tmp_path / "short_out", 8,
                              {"CTL_HEARTBEAT_TIMEOUT": "3"})
  assert code == 1, log[-4000:]
  assert "stopped sending heartbeats" in log and "/job:worker/replica:0/task:1" in log, (
      log[-4000:])
  assert tf.train.latest_checkpoint(str(tmp_path / "short" / "checkpoints")).endswith("ckpt-4")


def assert_results_equal_from_start(results, reference, atol=1e-5):
  """A run from step 0 equals the reference: every loss and weight, within `atol`."""
  assert int(results["first_step"]) == 0 and sorted(results) == sorted(reference)
  for key, value in reference.items():
    np.testing.assert_allclose(results[key], value, rtol=0, atol=atol, err_msg=key)


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


# Resuming without a fault: on another layout, and from multi-worker checkpoints.

# The layouts a run resumes across: resume_task.py's arguments ("multi_worker:2":
# 2 processes of it, one device each, `helpers.run_workers`).
LAYOUTS = {
    "default": ("--strategy", "default"),
    "mirrored:2": ("--strategy", "mirrored", "--logical-cpus", "2"),
    "mirrored:4": ("--strategy", "mirrored", "--logical-cpus", "4"),
    "multi_worker:2": (),
    "default, steps_per_loop 1": ("--strategy", "default", "--steps-per-loop", "1"),
}
# (first layout, second layout, float type): trained 8 steps under the first (ckpt-8
# at its end), then rerun to 12 under the second, the run equals the uninterrupted
# one under `default` (steps_per_loop 3): each step's losses, in what fit returns and
# in history.jsonl, the final weights and every optimizer variable (slots, iteration
# count). Within `RESUMED_ON_ANOTHER_LAYOUT`: a layout sums over replicas in its
# own order, which float32 rounds and float64 hardly. (Without dropout: Keras'
# Dropout draws per replica.) docs/reliability.md's table lists these.
LAYOUT_CHANGES = [
    ("default", "mirrored:2", "float32"),
    ("mirrored:2", "default", "float32"),
    ("default", "mirrored:2", "float64"),
    ("mirrored:2", "default", "float64"),
    ("mirrored:2", "mirrored:4", "float64"),
    ("multi_worker:2", "default", "float64"),
    ("multi_worker:2", "mirrored:4", "float64"),
    ("default", "multi_worker:2", "float64"),
    ("default", "default, steps_per_loop 1", "float64"),
]
RESUMED_ON_ANOTHER_LAYOUT = {"float32": 1e-5, "float64": 1e-12}


def train_on(layout, tmp_path, work, steps, *args):
  """resume_task.py for `steps` steps in `work` under `layout`; the chief's output."""
  if layout == "multi_worker:2":
    return run_workers(tmp_path, 2, "--workdir", str(work), "--steps", str(steps), *args,
                       task=TASK)
  out = tmp_path / "one.npz"
  python([TASK, "--workdir", str(work), "--out", str(out), "--steps", str(steps),
          *LAYOUTS[layout], *args], timeout=240)
  return load(out)


@pytest.mark.parametrize("first,second,dtype", LAYOUT_CHANGES)
def test_a_run_resumes_on_another_layout_as_if_never_stopped(tmp_path, reference, first,
                                                             second, dtype):
  work, atol = tmp_path / "work", RESUMED_ON_ANOTHER_LAYOUT[dtype]
  args = ("--dropout", "0") + (("--float64",) if dtype == "float64" else ())
  train_on(first, tmp_path, work, 8, *args)
  resumed = train_on(second, tmp_path, work, STEPS, *args)
  assert int(resumed["first_step"]) == 8
  expected = reference("default", *args)
  assert any(".optimizer/" in key for key in expected)  # the slots are compared too
  assert_same_run(resumed, expected, atol=atol)
  history = ctl.read_history(str(work))  # values as a float32 holds them (9 digits)
  np.testing.assert_array_equal(history.steps, np.arange(STEPS))
  for key, values in expected.items():
    if key.startswith("loss/"):  # within atol, or one float32 step of rounding apart
      np.testing.assert_allclose(history[key[len("loss/"):]], values.astype(np.float32),
                                 rtol=2**-23, atol=atol, err_msg=key)


@pytest.mark.parametrize("saves", ["synchronous", "asynchronous"])
def test_multi_worker_keeps_the_chiefs_checkpoints_and_resumes(tmp_path, reference, saves):
  work = tmp_path / "work"
  args = ("--workdir", str(work), "--dropout", "0") + (
      ("--asynchronous",) if saves == "asynchronous" else ())
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


def test_faults_lists_every_fault_test():
  """FAULTS, which docs/reliability.md follows, names each fault test once."""
  listed = [name for name, *_ in FAULTS]
  assert len(listed) == len(set(listed)), listed
  tests = {name for name in globals() if name.startswith("test_")}
  assert set(listed) == tests - set(NOT_FAULTS), sorted(tests - set(NOT_FAULTS))
  assert all(len(entry) == 4 and all(entry) for entry in FAULTS)
