"""A real Slurm: the shipped batch script, and a `ctl sweep --slurm-array` script, on a
one-node cluster this file starts.

The fixture writes a `slurm.conf` for one node, `localhost` (127.0.0.1, free
ports, state and logs under the test's directory, no munge: `auth/none`),
starts `slurmctld` and `slurmd` in the foreground, waits for the node to be
idle, and stops both after the tests, checking that no Slurm process of ours is
left. The whole cluster runs in a private network, a network namespace with
loopback only (`ctl.distribute.private_network`): Slurm's daemons and `srun`
listen on every interface unless told otherwise, and the jobs' TensorFlow
servers always do; the test's `sbatch`, `scontrol`, `sinfo` and `scancel`
enter it too (scripts first on PATH), and the first test checks that no
process of the cluster listens where another machine could reach it.
Debian's `slurmctld`, `slurmd` and `slurm-client` packages provide the
programs (`.ci/run` installs them, and sets CTL_REQUIRE_SLURM=1 so that their
absence fails rather than skips); the daemons run as root, as they do on a
cluster.

    python -m pytest tests/test_slurm.py
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl import cli
from ctl.distribute import private_network

import helpers
from helpers import ROOT
from helpers import alive

pytestmark = pytest.mark.slow  # Slurm daemons, and jobs that train

SCRIPT = os.path.join("examples", "cluster", "slurm.sbatch")
CONFIG = os.path.join("examples", "configs", "dcgan.gin")
# A run of the tiny GAN long enough to be preempted in the middle: its 300
# steps take seconds, the signal is sent once ckpt-100 exists.
STEPS = 300
RUN = [*helpers.TINY_GAN, "--gin", f"gan.Schedule.total_steps = {STEPS}",
       "--gin", "gan.Schedule.checkpoint_every = 100",
       "--gin", "gan.Schedule.samples_every = 300", "--gin", "gan.Schedule.steps_per_loop = 1"]
# One node, both tasks on it (the script asks for 2 nodes of 8 CPUs each).
ONE_NODE = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"]


def _conf(d, ports):
  return f"""\
ClusterName=ctltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
# Also how long a requeued job waits before it may start again (default 120 s),
# and how often the scheduler looks (default 60 s).
AuthInfo=cred_expire=5
SchedulerParameters=sched_interval=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
JobRequeue=1
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  """The environment that reaches the one-node cluster (`SLURM_CONF`)."""
  # Skipped on a machine without Slurm, unless CI asks for it (.ci/run installs it).
  give_up = pytest.fail if os.environ.get("CTL_REQUIRE_SLURM") == "1" else pytest.skip
  missing = [tool for tool in ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel",
                               "nsenter") if not shutil.which(tool)]
  if missing:
    give_up(f"{', '.join(missing)} not found: install Debian's slurmctld, slurmd and "
            "slurm-client packages (as root: apt-get install slurmctld slurmd slurm-client; "
            "nsenter is util-linux's).")
  if os.geteuid() != 0:
    give_up("the one-node Slurm runs its daemons and jobs as root: run the tests as root")
  d = tmp_path_factory.mktemp("slurm")
  for sub in ("state", "spool"):
    os.makedirs(d / sub)
  conf = d / "slurm.conf"
  conf.write_text(_conf(d, helpers.free_ports(2)))
  try:
    network = private_network.PrivateNetwork()
  except private_network.PrivateNetworkUnavailable as e:
    give_up(f"no private network for the cluster: {e}")
  # The clients the tests call enter the cluster's network; nsenter, as these
  # are polled every 0.2 s (the daemons start through ctl's own step).
  tools = d / "bin"
  os.makedirs(tools)
  for tool in ("sbatch", "scontrol", "sinfo", "scancel"):
    (tools / tool).write_text(f"#!/bin/sh\nexec nsenter --net=/proc/{network.pid}/ns/net "
                              f"{shutil.which(tool)} \"$@\"\n")
    os.chmod(tools / tool, 0o755)
  env = helpers.subprocess_env({"SLURM_CONF": str(conf),
                                "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"})
  daemons = [subprocess.Popen(network.command([daemon, "-D", "-f", str(conf), *extra],
                                              shutil.which(daemon)), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                              start_new_session=True)
             for daemon, extra in (("slurmctld", ["-i"]), ("slurmd", ["-N", "localhost"]))]
  try:
    deadline = time.monotonic() + 60
    while _node_state(env) != "idle":
      if time.monotonic() > deadline or any(p.poll() is not None for p in daemons):
        logs = "".join((d / f"{n}.log").read_text() if (d / f"{n}.log").exists() else ""
                       for n in ("slurmctld", "slurmd"))
        pytest.fail(f"the one-node Slurm did not come up: {_node_state(env)!r}\n{logs[-3000:]}")
      time.sleep(0.5)
    yield env
  finally:
    subprocess.run(["scancel", "--full", "--user", "root"], env=env, check=False,
                   capture_output=True)
    for proc in daemons:
      proc.send_signal(signal.SIGTERM)
    for proc in daemons:
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = subprocess.run(["pgrep", "-f", str(conf)], capture_output=True, text=True).stdout
    assert not left.split(), f"Slurm processes left behind: {left}"
    steps = subprocess.run(["pgrep", "-x", "slurmstepd"], capture_output=True, text=True).stdout
    assert not [pid for pid in steps.split() if alive(int(pid))], steps
    network.close()


def _node_state(env):
  proc = subprocess.run(["sinfo", "--noheader", "--format=%t"], env=env, capture_output=True,
                        text=True, check=False)
  return proc.stdout.strip() or proc.stderr.strip()


def _job(env, job_id):
  """`scontrol show job` as a dict of its `Key=Value` fields."""
  text = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True,
                        text=True, check=True).stdout
  return dict(re.findall(r"(\w+)=(\S*)", text))


def submit(env, workdir, log, *args, sbatch=()):
  """Submits the shipped script for one node (`sbatch` options after those, which
  they override); the job's id."""
  proc = subprocess.run(
      ["sbatch", "--parsable", *ONE_NODE, *sbatch, f"--output={log}", f"--chdir={ROOT}",
       f"--export=ALL,CONFIG={CONFIG},WORKDIR={workdir},"
       f"CTL_SLURM_PORT_BASE={helpers.free_ports(1)[0]}",
       SCRIPT, *RUN, *args], env=env, capture_output=True, text=True, check=True)
  return proc.stdout.strip().split(";")[0]


def wait_until(condition, what, timeout=300):
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline, f"no {what} within {timeout} s"
    time.sleep(0.2)


def finished(env, job_id, log):
  """Waits for the job's end; its `scontrol` fields."""
  def done():
    return _job(env, job_id)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
  wait_until(done, f"end of job {job_id} (log: {log})")
  return _job(env, job_id)


def test_shipped_script_trains_on_two_tasks_is_preempted_requeued_and_resumes_equal(
    slurm, tmp_path):
  # Two jobs at once (the node has room for both): one uninterrupted, two tasks
  # of one step, the cluster from Slurm's variables; one preempted by SIGTERM to
  # its tasks (scancel's default: every step, not the batch shell) once ckpt-100
  # exists, which save and exit 42, and which the script requeues to resume.
  # Meanwhile, who can get in: the cluster's processes (daemons, job steps,
  # tasks: each has SLURM_CONF) listen where no other machine reaches them.
  straight, straight_log = tmp_path / "straight", tmp_path / "straight.out"
  work, out = tmp_path / "preempted", tmp_path / "preempted.out"
  ours = os.fsencode(slurm["SLURM_CONF"])
  with helpers.ListenerWatch(lambda: helpers.processes_with(ours), every=0.5) as watch:
    straight_id = submit(slurm, straight, straight_log)
    job_id = submit(slurm, work, out)
    wait_until(lambda: os.path.exists(work / "checkpoints" / "ckpt-100.index"), "ckpt-100")
    subprocess.run(["scancel", "--signal=TERM", job_id], env=slurm, check=True)
    straight_job = finished(slurm, straight_id, straight_log)
    job = finished(slurm, job_id, out)
  names = {s.name for s in watch.seen.values()}
  assert {"slurmctld", "slurmd", "srun"} <= names and len(names) > 3, watch.report()
  assert not watch.outside, watch.report()
  log = straight_log.read_text()
  assert straight_job["JobState"] == "COMPLETED" and straight_job["ExitCode"] == "0:0", (
      log[-4000:])
  assert straight_job["Restarts"] == "0", straight_job
  assert "strategy 'auto' chose 'multi_worker'" in log and "SLURM_STEP_NUM_TASKS" in log, (
      log[-4000:])
  assert log.count(f"ctl train: step {STEPS}") == 1, log[-4000:]  # the chief reports

  log = out.read_text()
  assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", log[-4000:]
  assert job["Restarts"] == "1", job
  saved = re.findall(r"saved a checkpoint at step (\d+)", log)
  assert saved and 100 <= int(saved[0]) < STEPS, log[-4000:]
  assert f"ctl: restored {work / 'checkpoints' / 'ckpt-'}{saved[0]} (step {saved[0]})" in log, (
      log[-4000:])  # the requeued job resumed where the preempted one saved
  assert log.count(f"ctl train: step {STEPS}") == 1, log[-4000:]

  # The same numbers: every weight and slot of the final checkpoints.
  expected = tf.train.load_checkpoint(str(straight / "checkpoints"))
  actual = tf.train.load_checkpoint(str(work / "checkpoints"))
  names = sorted(n for n in expected.get_variable_to_shape_map()
                 if n.startswith(("models/", "optimizers/")))
  assert names and names == sorted(n for n in actual.get_variable_to_shape_map()
                                   if n.startswith(("models/", "optimizers/")))
  for name in names:
    value = expected.get_tensor(name)
    if hasattr(value, "dtype") and value.dtype.kind == "f":
      assert (actual.get_tensor(name) == value).all(), name


def test_a_job_preempted_on_two_tasks_resumes_when_resubmitted_on_one(slurm, tmp_path):
  # A cluster that comes back smaller: the job on two tasks is sent SIGTERM once
  # ckpt-100 exists and, submitted without requeueing, ends there (exit 42);
  # the same script submitted again on one task resumes from its checkpoint.
  # The first steps after the resume equal the uninterrupted two-task run's to
  # float32 rounding (one replica sums in another order than two; over hundreds
  # of steps a GAN amplifies that, docs/reliability.md).
  straight, straight_log = tmp_path / "straight", tmp_path / "straight.out"
  work, out, resumed_out = tmp_path / "resized", tmp_path / "two.out", tmp_path / "one.out"
  straight_id = submit(slurm, straight, straight_log)
  job_id = submit(slurm, work, out, sbatch=["--no-requeue"])
  wait_until(lambda: os.path.exists(work / "checkpoints" / "ckpt-100.index"), "ckpt-100")
  subprocess.run(["scancel", "--signal=TERM", job_id], env=slurm, check=True)
  job = finished(slurm, job_id, out)
  log = out.read_text()
  assert job["ExitCode"] == "42:0" and job["Restarts"] == "0", (job, log[-4000:])
  saved = int(re.findall(r"saved a checkpoint at step (\d+)", log)[0])
  assert 100 <= saved < STEPS, log[-4000:]

  resumed = finished(slurm, submit(slurm, work, resumed_out, sbatch=["--ntasks-per-node=1"]),
                     resumed_out)
  straight_job = finished(slurm, straight_id, straight_log)
  log = resumed_out.read_text()
  assert resumed["JobState"] == "COMPLETED" and resumed["ExitCode"] == "0:0", log[-4000:]
  assert straight_job["JobState"] == "COMPLETED", straight_log.read_text()[-4000:]
  assert "strategy 'auto' chose 'default'" in log, log[-4000:]
  assert "strategy.replicas was 2 and is now 1" in log, log[-4000:]  # said, and allowed
  assert f"ctl: restored {work / 'checkpoints' / 'ckpt-'}{saved} (step {saved})" in log, (
      log[-4000:])
  assert log.count(f"ctl train: step {STEPS}") == 1, log[-4000:]
  expected, actual = (ctl.read_history(str(d)) for d in (straight, work))
  np.testing.assert_array_equal(actual.steps, np.arange(STEPS))
  after = slice(saved, saved + 3)
  for key in ("discriminator_loss", "generator_loss"):
    np.testing.assert_array_equal(actual[key][:saved], expected[key][:saved], err_msg=key)
    np.testing.assert_allclose(actual[key][after], expected[key][after], rtol=1e-4, atol=1e-6,
                               err_msg=key)


def test_a_sweeps_array_trains_a_run_per_task_requeues_a_preempted_one_then_the_table(
    slurm, tmp_path, monkeypatch, capsys):
  # `ctl sweep --slurm-array` (tests/test_sweep.py has the rest of ctl sweep): 2
  # generator widths, a task each; task 0 is sent SIGTERM after its step-100
  # checkpoint, which the sweep passes on to its `ctl train`.
  monkeypatch.chdir(ROOT)  # CONFIG is relative; so is it in the tasks (sbatch --chdir)
  directory, script = tmp_path / "sweep", tmp_path / "sweep.sbatch"
  args = [CONFIG, "--grid", "gan.dcgan_generator.width=[8, 16]", "--sweep-dir",
          str(directory), *RUN, "--gin", f"gan.Schedule.fid_every = {STEPS}"]
  assert cli.main(["sweep", *args, "--slurm-array", str(script)]) == 0
  # `ctl` as the tasks find it: this interpreter's, running this checkout (PYTHONPATH).
  env = dict(slurm, PATH=os.path.dirname(sys.executable) + os.pathsep + slurm["PATH"])
  job = subprocess.run(["sbatch", "--parsable", f"--chdir={ROOT}", str(script)], env=env,
                       capture_output=True, text=True, check=True).stdout.strip()
  first = directory / "width=8" / "seed-0"
  wait_until(lambda: (first / "checkpoints" / "ckpt-100.index").exists(), "ckpt-100")
  subprocess.run(["scancel", "--signal=TERM", f"{job}_0"], env=env, check=True)
  tasks = [finished(env, f"{job}_{i}", directory / f"slurm-{job}_{i}.out") for i in (0, 1)]
  logs = [(directory / f"slurm-{job}_{i}.out").read_text() for i in (0, 1)]
  for task, log in zip(tasks, logs):
    assert task["JobState"] == "COMPLETED" and task["ExitCode"] == "0:0", log[-3000:]
  assert tasks[0]["Restarts"] == "1" and tasks[1]["Restarts"] == "0", tasks
  assert "SIGTERM: width=8/seed-0 stopped (exit code 42, saved)" in logs[0], logs[0][-3000:]
  assert "run 0: width=8/seed-0: resuming" in logs[0]
  assert "run 1: width=16/seed-0: finished in" in logs[1]
  assert "SIGTERM: saved a checkpoint at step" in (first / "train.log").read_text()
  # The table of what the array trained.
  capsys.readouterr()
  assert cli.main(["sweep", *args, "--table-only"]) == 0
  table = capsys.readouterr().out
  assert "| classifier_fid | 8 |" in table and "| classifier_fid | 16 |" in table
  assert table.count(" | 1/1 |") == len(table.splitlines()) - 4  # header, rule, blank, note
