"""A real Ray cluster: `ctl train` on 2 Ray Train workers (`ctl.cli.ray_train`), one killed mid-run.

The fixture starts a one-node Ray cluster (`ray start --head` on 127.0.0.1, 4
logical CPUs, no dashboard, its files under the test's directory) and stops it
after (`ray stop --force`), checking that none of its processes is left. The
run is driven from a process of its own, as a user's script would be. The
cluster and the driver run in a private network, a network namespace with
loopback only (`ctl.distribute.private_network`): Ray's GCS and raylet listen on
every interface, its runtime-env agent and client server on this machine's
address, whatever `--node-ip-address` says, and TensorFlow's servers in its
workers on every interface too. The test checks that no process of the run,
nor of the `ctl launch` run it compares with, listens where another machine
could reach it.

    python -m pytest tests/test_ray.py
"""

import os
import re
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from ctl.distribute import private_network

import helpers
from helpers import ROOT

pytestmark = pytest.mark.slow  # a Ray cluster, and TensorFlow workers that train

CONFIG = os.path.join("examples", "configs", "dcgan.gin")
STEPS = 300
# The tiny GAN in float64, where two runs with another launcher agree to rounding.
RUN = [*helpers.TINY_GAN, "--gin", f"gan.Schedule.total_steps = {STEPS}",
       "--gin", "gan.Schedule.checkpoint_every = 100", "--gin", "gan.Schedule.samples_every = 300",
       "--gin", "gan.Schedule.steps_per_loop = 1",
       "--gin", "gan.Experiment.mixed_precision = 'float64'"]

DRIVER = """
import sys
from ctl.cli import ray_train
result = ray_train.train(sys.argv[2:], num_workers=2, max_failures=1, storage_path=sys.argv[1],
                         name="run")
print("RAY RESULT error:", result.error, flush=True)
"""


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
  """A one-node Ray cluster on 127.0.0.1 of a private network: its `address`,
  that `network`, and its `temp` directory (in every one of its processes'
  command lines, or their parents')."""
  ray = os.path.join(os.path.dirname(sys.executable), "ray")
  give_up = pytest.fail if os.environ.get("CTL_REQUIRE_RAY") == "1" else pytest.skip
  if not os.path.exists(ray):
    give_up("Ray is not installed: pip install 'ctl-loops[ray]' (the test extra has it).")
  try:
    network = private_network.PrivateNetwork()
  except private_network.PrivateNetworkUnavailable as e:
    give_up(f"no private network for the cluster: {e}")
  temp = tmp_path_factory.mktemp("ray")
  port = helpers.free_ports(1)[0]
  env = ray_env()
  start = subprocess.run(network.command(
      [ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
       "--num-cpus=4", "--include-dashboard=false", f"--temp-dir={temp}",
       "--disable-usage-stats"]), env=env, capture_output=True, text=True, timeout=180)
  try:
    assert start.returncode == 0, start.stdout + start.stderr
    yield types.SimpleNamespace(address=f"127.0.0.1:{port}", network=network, temp=temp)
  finally:
    subprocess.run(network.command([ray, "stop", "--force"]), env=env, capture_output=True,
                   timeout=120)
    deadline = time.monotonic() + 30
    while _ray_processes(temp) and time.monotonic() < deadline:
      time.sleep(0.5)
    assert not _ray_processes(temp), _ray_processes(temp)
    network.close()


def ray_env(extra=None):
  """The environment of the cluster's processes and of the driver: no usage
  reports, and no token (Ray's default since 2.5x, kept in ~/.ray): no other
  machine reaches the cluster, in its private network."""
  return helpers.subprocess_env(dict({"RAY_USAGE_STATS_ENABLED": "0",
                                      "RAY_AUTH_MODE": "disabled"}, **(extra or {})))


def _ray_processes(temp):
  """Processes of the cluster started in `temp` (its raylet, GCS and workers)."""
  found = subprocess.run(["pgrep", "-af", str(temp)], capture_output=True, text=True).stdout
  return [line for line in found.splitlines() if "pgrep" not in line]


def _weights(workdir):
  reader = tf.train.load_checkpoint(str(workdir / "checkpoints"))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if name.startswith(("models/", "optimizers/"))}


def test_ray_workers_train_as_ctl_launch_does_and_a_killed_worker_loses_nothing(
    ray_cluster, tmp_path):
  # The uninterrupted run, by ctl's own launcher, its tasks' sockets watched.
  launched = tmp_path / "launched"
  with helpers.ListenerWatch(lambda: [os.getpid()]) as watch:
    helpers.ctl("launch", "--workers", "2", "--grace", str(helpers.GRACE), "--",
                sys.executable, "-m", "ctl.cli", "train", CONFIG, "--strategy", "multi_worker",
                "--workdir", str(launched), *RUN, timeout=600)
  # Each task's TensorFlow server, on every interface of the tasks' private network.
  servers = [s for s in watch.seen.values() if s.address in ("::", "0.0.0.0")]
  assert len({s.pid for s in servers}) == 2 and all(s.private for s in servers), watch.report()
  assert not watch.outside, watch.report()

  # The same on Ray, one of its workers killed (SIGKILL) after ckpt-100.
  work = tmp_path / "ray"
  driver = subprocess.Popen(
      ray_cluster.network.command(
          [sys.executable, "-c", DRIVER, str(tmp_path / "storage"), CONFIG, "--workdir",
           str(work), *RUN]), cwd=ROOT, env=ray_env({"RAY_ADDRESS": ray_cluster.address}),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  ours = os.fsencode(ray_cluster.temp)
  watch = helpers.ListenerWatch(lambda: helpers.processes_with(ours) | {driver.pid}, every=0.5)
  try:
    with watch:
      deadline = time.monotonic() + 600
      while not (work / "checkpoints" / "ckpt-100.index").exists():
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()[0]
        time.sleep(0.2)
      workers = subprocess.run(["pgrep", "-f", "RayTrainWorker"], capture_output=True,
                               text=True).stdout.split()
      assert len(workers) == 2, workers
      os.kill(int(workers[-1]), signal.SIGKILL)
      log = driver.communicate(timeout=900)[0]
  finally:
    if driver.poll() is None:
      driver.kill()
      driver.wait()
  assert driver.returncode == 0 and "RAY RESULT error: None" in log, log[-5000:]
  # Who could get in: Ray's own servers and the workers' TensorFlow servers
  # (on every interface: 2 workers, then 2 more after the kill) listened, all
  # in the private network.
  names = {s.name for s in watch.seen.values()}
  servers = [s for s in watch.seen.values() if s.address in ("::", "0.0.0.0")]
  assert {"gcs_server", "raylet"} <= names and len(servers) >= 2, watch.report()
  assert not watch.outside, watch.report()
  restored = re.findall(r"ctl: restored \S+ckpt-(\d+) \(step (\d+)\)", log)
  assert restored and all(int(step) >= 100 for _, step in restored), log[-5000:]

  # Nothing lost: the final weights and optimizer slots are the launched run's.
  expected, actual = _weights(launched), _weights(work)
  assert sorted(expected) == sorted(actual) and len(expected) > 20
  for name, value in expected.items():
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
      np.testing.assert_allclose(actual[name], value, rtol=0, atol=1e-12, err_msg=name)
