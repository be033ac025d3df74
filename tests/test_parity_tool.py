"""`ctl parity` as a user runs it: docs/parity.md's example, a .gin experiment, a step
that float64 cannot replay, and the mistakes refused before anything runs.

(tests/test_parity_suite.py checks its verdicts on ordinary GANs and planted
bugs, on five seeds each.)
"""

import contextlib
import os
import shutil
import signal
import time

import pytest

from ctl.tools import parity

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

PLANTED = os.path.join(helpers.ROOT, "tests", "parity_planted.py")


def verdicts(stdout):
  """configuration (with its seed, if several) -> (verdict, deciding precision),
  from the table's lines that start a configuration."""
  found = {}
  for line in stdout.splitlines()[1:]:
    words = line.split()
    for i, word in enumerate(words[:3]):
      if word in ("rounding", "DIFFERS", "undecided") and i:
        found[" ".join(words[:i])] = (word, words[i + 1])
  return found


def test_the_command_on_the_wgan_gp_example():
  """docs/parity.md's example: a WGAN-GP with an encoder, 5 critic updates per step,
  Adam, against compiled, mirrored and multi_worker (5 steps, the guide's 10 in
  half the time)."""
  proc = helpers.ctl("parity", os.path.join(helpers.ROOT, "examples", "parity_wgan_gp.py"),
                     "--against", "compiled,mirrored:2,multi_worker:2",
                     "--steps", "5", check=False)
  print(proc.stdout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert verdicts(proc.stdout) == {config: ("rounding", "float64") for config in (
      "compiled", "mirrored:2", "multi_worker:2")}


def test_a_step_that_names_float32_is_decided_in_float64(monkeypatch):
  """A tf.cast to float32 inside the step (as mixed-precision code writes): the
  float64 replay widens it, and float64 decides."""
  monkeypatch.setenv("PLANTED_BUG", "casts_to_float32")
  report = parity.check(PLANTED, ["mirrored:2"], steps=3, jobs=2)
  print(report)
  assert report.ok and report.precision("mirrored:2") == "float64", str(report)


def test_a_step_float64_cannot_run_names_the_line_that_makes_float32_once():
  """tf.image.resize's output is float32 whatever its input: the float64 replay
  fails where it meets float64. The report names the resize's line (not only the
  addition that fails), once for every seed, and float32 decides: the exit code
  is 0 (rounding), or 3 if float32 alone cannot tell."""
  proc = helpers.ctl("parity", PLANTED, "--against", "mirrored:2", "--steps", "3",
                     "--seeds", "0-1", check=False, env={"PLANTED_BUG": "resizes"})
  print(proc.stdout)
  assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
  note = [line for line in proc.stdout.splitlines() if "float64 cannot decide" in line]
  assert len(note) == 1 and note[0].startswith("every configuration: "), note
  assert "parity_planted.py:" in note[0] and "tf.image.resize(" in note[0], note
  assert "(ResizeBilinear)" in note[0] and "(floor of 3 runs)" in note[0]
  assert {v[1] for v in verdicts(proc.stdout).values()} == {"float32"}


def test_the_command_refuses_mistakes_before_running(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def build():\n  pass\n")
  for args, words in [
      ([str(bad)], "does not define train_step, data"),
      ([str(tmp_path / "missing.py")], "no file"),
      ([PLANTED, "--against", "mirored:2"], "'mirored' is not one of"),
      ([PLANTED, "--against", "mirrored"], "needs a count, e.g. 'mirrored:2'"),
      ([PLANTED, "--against", "jit:2"], "'jit' takes no count"),
      ([PLANTED, "--steps", "0"], "--steps 0"),
      ([PLANTED, "--seeds", "4-2"], "--seeds 4-2: give seeds as 0,1,2 or a range 0-4"),
      ([PLANTED, "--seeds", "1,1"], "--seeds 1,1: a seed is given twice"),
      ([PLANTED, "--seeds", "0-1000000"], "give at most 100 seeds"),
      ([PLANTED, "--floor-samples", "0"], "--floor-samples 0"),
      ([PLANTED, "--jobs", "0"], "--jobs 0"),
  ]:
    proc = helpers.ctl("parity", *args, check=False)
    assert proc.returncode == 2, (args, proc.stderr)
    assert words in proc.stderr, (args, proc.stderr)


def test_a_module_with_the_old_step_name_is_told_the_new_one(tmp_path):
  old = tmp_path / "old.py"
  old.write_text("def build():\n  pass\n\ndef step(ctx, batch):\n  pass\n\n"
                 "def data():\n  pass\n")
  with pytest.raises(AttributeError, match=r"does not define train_step: .*its `step` is "
                     r"now called `train_step`: rename it"):
    parity.check_module(str(old))
  other = tmp_path / "other.py"
  other.write_text(old.read_text().replace("def step(", "def wgan_step("))
  with pytest.raises(AttributeError, match="it defines the functions build, wgan_step, data"):
    parity.check_module(str(other))


def test_the_command_on_a_gin_experiment():
  """A .gin file: its experiment's runner, with each configuration's options, in
  float64 too (the GAN kit computes in the run's float type), on another seed
  than the experiment's; with differentiable augmentation on (`gan.augment`:
  its draws are per example, so it keeps parity)."""
  proc = helpers.ctl("parity", os.path.join(helpers.ROOT, "examples", "configs", "dcgan.gin"),
                     *helpers.TINY_GAN, "--gin",
                     "gan.Experiment.augment = ('color', 'translation', 'cutout')",
                     "--against", "mirrored:2", "--steps", "2",
                     "--seeds", "3", "--verbose", check=False)
  print(proc.stdout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert verdicts(proc.stdout) == {"mirrored:2": ("rounding", "float64")}
  lines = proc.stdout.splitlines()
  every = [line for line in lines if line.startswith("mirrored:2, float64, every variable")]
  assert every, "--verbose lists every variable"
  named = [line.split()[-1] for line in lines if line.startswith("    ")]
  assert any(n.startswith("generator/") and not n.split("/")[-1].isdigit() for n in named)


def _children(pid):
  """The processes whose parent is `pid` (from /proc)."""
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
      except (OSError, IndexError, ValueError):
        pass  # gone meanwhile
  return found


def test_a_second_ctrl_c_leaves_no_run_behind(monkeypatch):
  """Two SIGINTs 50 ms apart while the runs train: exit 130, and every process
  group it started is gone. The second used to cut the clean-up short and leave
  a run training at full CPU for 20 s (new-user finding). The clean-up now holds
  SIGINT and SIGTERM until it is done, so where the second lands does not matter."""
  monkeypatch.setenv("PLANTED_BUG", "")
  proc = helpers.start_python(["-m", "ctl.cli", "parity", PLANTED, "--against", "mirrored:2",
                               "--steps", "500"])
  deadline = time.monotonic() + helpers.SUBPROCESS_TIMEOUT
  while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)  # until both runs (the reference and mirrored:2) have started
  runs = _children(proc.pid)
  assert len(runs) == 2, "the runs did not start"
  time.sleep(3)  # into their training
  proc.send_signal(signal.SIGINT)
  time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 130, stderr[-2000:]
  assert "the runs in progress were stopped" in stderr
  # Each run leads a process group of its own. It was stopped and reaped before
  # ctl parity exited; a process it started may linger a moment as a zombie
  # until init reaps it, hence the short wait.
  deadline = time.monotonic() + 10
  while any(_group_exists(run) for run in runs) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(_group_exists(run) for run in runs)


def test_a_closed_terminal_stops_parity_and_the_workers_it_launched(monkeypatch, tmp_path):
  """SIGHUP (a closed terminal) while `--against multi_worker:2` trains: exit 129, and
  no run, launcher or worker is left. It used to end ctl parity at once and leave
  `ctl launch` and both workers training. A copy of the module, so that its path
  names this test's processes only."""
  monkeypatch.setenv("PLANTED_BUG", "")
  for name in ("parity_planted.py", "toy_gan.py"):
    shutil.copy(os.path.join(helpers.ROOT, "tests", name), tmp_path)
  module = str(tmp_path / "parity_planted.py")
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # where ctl parity keeps its runs' logs
  # --jobs 3: the reference run and the two workers at once (2 cores would run them
  # one after the other).
  proc = helpers.start_python(["-m", "ctl.cli", "parity", module, "--against",
                               "multi_worker:2", "--steps", "100000", "--jobs", "3"])
  try:
    deadline = time.monotonic() + helpers.SUBPROCESS_TIMEOUT
    while not _said(tmp_path, "all 2 tasks are ready") and time.monotonic() < deadline:
      time.sleep(0.2)
    # ctl parity, the reference run, ctl launch and its 2 workers
    assert len(helpers.processes_naming(module)) == 5, "the runs did not start"
    time.sleep(3)  # into their training
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, stderr[-2000:]
    assert "ctl parity: SIGHUP; the runs in progress were stopped." in stderr
    deadline = time.monotonic() + 10  # a stopped worker may linger a moment as a zombie
    while helpers.processes_naming(module) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert helpers.processes_naming(module) == []
  finally:  # whatever failed, no run of 100000 steps is left to slow the suite
    for pid in [proc.pid, *helpers.processes_naming(module)]:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    proc.communicate()


def _said(directory, text):
  """Whether a log of a ctl parity run under `directory` has `text`."""
  for log in directory.glob("ctl-parity-*/*.log"):
    with contextlib.suppress(OSError):
      if text in log.read_text():
        return True
  return False


def _group_exists(group):
  try:
    os.killpg(group, 0)
  except ProcessLookupError:
    return False
  return True
