"""Real clusters: Kubeflow's TF_CONFIG, Slurm job steps, TPU hosts, and the shipped examples.

Environments are faked: `choose_strategy` reads only the dict it is given, and
TF's `SlurmClusterResolver` reads `os.environ` (monkeypatched). One test builds
the Slurm strategy for real, as two local processes.
"""

import json
import os
import random
import socket
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml

import ctl
from ctl.distribute import strategies

import helpers

CLUSTER = os.path.join(helpers.ROOT, "examples", "cluster")


def kubeflow_tf_config(task_type, index, **replicas):
  """TF_CONFIG as Kubeflow's training operator writes it (genTFConfigJSONStr)."""
  cluster = {job: [f"ctl-dcgan-{job}-{i}.default.svc:2222" for i in range(count)]
             for job, count in replicas.items()}
  return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                   "task": {"type": task_type, "index": index},
                                   "environment": "cloud"})}


def choose(env, gpus=0):
  return ctl.choose_strategy(env=env, num_gpus=gpus, tpu_devices=False)


@pytest.mark.parametrize("task_type, index", [("chief", 0), ("worker", 0), ("worker", 1)])
def test_kubeflow_chief_and_two_workers_is_multi_worker(task_type, index):
  name, reason = choose(kubeflow_tf_config(task_type, index, chief=1, worker=2))
  assert name == "multi_worker"
  assert "3 workers (chief + worker tasks)" in reason


@pytest.mark.parametrize("task_type, index", [("chief", 0), ("worker", 1), ("ps", 0)])
def test_kubeflow_with_ps_is_parameter_server(task_type, index):
  env = kubeflow_tf_config(task_type, index, chief=1, worker=2, ps=1)
  assert choose(env)[0] == "parameter_server"


@pytest.mark.parametrize("gpus, expected", [(0, "default"), (1, "one_device"), (2, "mirrored")])
def test_kubeflow_evaluator_does_not_join_training(gpus, expected):
  # Newer operators list the evaluator in the cluster; older ones left it out.
  for env in (kubeflow_tf_config("evaluator", 0, chief=1, worker=2, evaluator=1),
              kubeflow_tf_config("evaluator", 0, chief=1, worker=2, ps=1, evaluator=1),
              kubeflow_tf_config("evaluator", 0, chief=1, worker=2)):
    name, reason = choose(env, gpus)
    assert name == expected
    assert reason.startswith("TF_CONFIG task is an 'evaluator', which does not train")


def test_evaluator_is_not_counted_as_a_worker():
  env = kubeflow_tf_config("chief", 0, chief=1, evaluator=1)
  assert choose(env)[0] == "default"


@pytest.mark.parametrize("config, message", [
    ("{cluster: nope", "TF_CONFIG is not valid JSON"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}}', "names a cluster but not this process's task"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
     r"task 'worker' index 2 is not in the cluster, which has 2 'worker' task\(s\); use 0 to 1"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}',
     "task 'chief' index 0 is not in the cluster"),
    ('{"cluster": {"master": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker"}}',
     "job 'master'; TensorFlow knows only chief, worker, ps, evaluator"),
    ('{"cluster": {"worker": "a:1,b:1"}, "task": {"type": "worker", "index": 0}}',
     "must be a non-empty list of 'host:port' strings"),
    ('{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}',
     "2 'chief' tasks; TensorFlow allows one"),
    ('{"sparseCluster": {"worker": {"0": "a:1"}, "ps": ["c:1"]}, '
     '"task": {"type": "worker", "index": 0}}',
     "enableDynamicWorker: false"),
])
def test_malformed_tf_config_names_the_fix(config, message):
  with pytest.raises(ValueError, match=message):
    choose({"TF_CONFIG": config})


def slurm_env(rank, tasks=2, nodes="node[01-02]", tasks_per_node="1(x2)"):
  """The variables `srun` sets for one task of a step (see `srun(1)`)."""
  return {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": str(tasks),
          "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_PROCID": str(rank),
          "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node}


def test_slurm_step_of_two_tasks_is_multi_worker():
  name, reason = choose(slurm_env(0))
  assert name == "multi_worker"
  assert "Slurm job 4242 runs this step as 2 tasks" in reason


@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ID": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"},
    {"SLURM_STEP_NUM_TASKS": "2"},                  # no job: a leftover variable
    {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"},     # the batch script, not srun
])
def test_slurm_without_a_step_of_several_tasks_is_local(env):
  assert choose(env)[0] == "default"


def test_batch_script_without_srun_warns(caplog):
  with caplog.at_level("WARNING", logger="ctl"):
    choose({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"})
  assert "was not started by srun" in caplog.text and "srun ctl train" in caplog.text


def test_tf_config_wins_over_slurm():
  env = dict(slurm_env(0), **kubeflow_tf_config("worker", 0, worker=1))
  assert choose(env, gpus=2)[0] == "mirrored"
  env = dict(slurm_env(0, tasks=4), **kubeflow_tf_config("chief", 0, chief=1, worker=2, ps=1))
  assert choose(env)[0] == "parameter_server"


@pytest.fixture
def no_shell_tools(tmp_path, monkeypatch):
  """`scontrol` and `nvidia-smi` on PATH that leave a mark if anything runs them."""
  marks = tmp_path / "ran"
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in ("scontrol", "nvidia-smi"):
    script = bin_dir / tool
    script.write_text(f"#!/bin/sh\necho {tool} >> '{marks}'\nexit 1\n")
    script.chmod(0o755)
  monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  yield marks
  assert not marks.exists(), f"ran {marks.read_text()}"


@pytest.mark.parametrize("rank, task_id", [(0, 0), (1, 1)])
def test_slurm_resolver_as_multi_worker_builds_it(rank, task_id, monkeypatch, no_shell_tools):
  for key, value in slurm_env(rank).items():
    monkeypatch.setenv(key, value)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  resolver = strategies.slurm_cluster_resolver(num_gpus=0)
  assert resolver.cluster_spec().as_dict() == {"worker": ["node01:23456", "node02:23456"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", task_id)
  assert resolver.num_accelerators() == {}  # CPU replicas, not GPU:0
  assert "CUDA_VISIBLE_DEVICES" not in os.environ
  assert isinstance(resolver, tf.distribute.cluster_resolver.SlurmClusterResolver)


def test_slurm_resolver_with_several_tasks_per_node(monkeypatch, no_shell_tools):
  env = slurm_env(3, tasks=4, nodes="gpu[7,9]", tasks_per_node="2(x2)")
  for key, value in dict(env, CTL_SLURM_PORT_BASE="30000").items():
    monkeypatch.setenv(key, value)
  resolver = strategies.slurm_cluster_resolver(num_gpus=2)
  assert resolver.cluster_spec().as_dict() == {
      "worker": ["gpu7:30000", "gpu7:30001", "gpu9:30000", "gpu9:30001"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 3)
  assert resolver.num_accelerators() == {"GPU": 2}


def test_slurm_resolver_outside_a_step_names_the_fix(monkeypatch):
  monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)
  with pytest.raises(RuntimeError, match="not in a Slurm job step of several tasks.*srun"):
    strategies.slurm_cluster_resolver(num_gpus=0)
  for key, value in dict(slurm_env(0), CTL_SLURM_PORT_BASE="http").items():
    monkeypatch.setenv(key, value)
  with pytest.raises(ValueError, match=r"CTL_SLURM_PORT_BASE \('http'\) must be a port"):
    strategies.slurm_cluster_resolver(num_gpus=0)


def _free_port_pair():
  for _ in range(50):
    base = random.randrange(20000, 60000)
    try:
      with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", base))
        b.bind(("127.0.0.1", base + 1))
      return base
    except OSError:
      continue
  raise RuntimeError("no two consecutive free ports")


_SLURM_TASK = """
import ctl, tensorflow as tf
strategy = ctl.make_strategy("auto")
resolver = strategy.cluster_resolver
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print("RESULT", isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
      strategy.num_replicas_in_sync,
      resolver.task_type, resolver.task_id, strategy.extended.should_checkpoint,
      float(total), flush=True)
"""


@pytest.mark.slow  # two processes that import TensorFlow
def test_slurm_step_trains_as_two_workers(no_shell_tools):
  """Two processes with the variables srun gives two tasks on one node."""
  base = _free_port_pair()
  procs = []
  for rank in range(2):
    env = dict(helpers.subprocess_env(slurm_env(rank, nodes="localhost", tasks_per_node="2")),
               CTL_SLURM_PORT_BASE=str(base), PATH=os.environ["PATH"])
    procs.append(subprocess.Popen([sys.executable, "-c", _SLURM_TASK],
                                  cwd=helpers.ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  logs = helpers.finish(procs, timeout=120)
  results = []
  for proc, log in zip(procs, logs):
    assert proc.returncode == 0, log[-3000:]
    results.append(next(line for line in log.splitlines() if line.startswith("RESULT")).split()[1:])
  assert results == [["True", "2", "worker", "0", "True", "2.0"],
                     ["True", "2", "worker", "1", "False", "2.0"]]


@pytest.mark.parametrize("env, devices", [
    ({"TPU_NAME": "my-tpu"}, False),
    ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, False),
    ({}, True),
    # A TPU VM in a Kubernetes or Slurm job is still a TPU host.
    (dict(slurm_env(0), TPU_NAME="local"), False),
    (dict(kubeflow_tf_config("worker", 0, worker=2), TPU_NAME="local"), False),
])
def test_tpu_is_chosen_first(env, devices):
  name, reason = ctl.choose_strategy(env=env, num_gpus=4, tpu_devices=devices)
  assert name == "tpu"
  assert "TPU" in reason


def test_tpu_devices_are_looked_for_on_disk(monkeypatch):
  looked = []
  monkeypatch.setattr(strategies.os.path, "exists",
                      lambda p: looked.append(p) or p == "/dev/accel0")
  assert ctl.choose_strategy(env={}, num_gpus=0)[0] == "tpu"
  assert "/dev/accel0" in looked


def test_tfjob_manifest():
  with open(os.path.join(CLUSTER, "tfjob.yaml")) as f:
    job = yaml.safe_load(f)
  assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
  replicas = job["spec"]["tfReplicaSpecs"]
  assert set(replicas) == {"Worker"} and replicas["Worker"]["replicas"] == 2
  worker = replicas["Worker"]
  # Exit 42 (saved after SIGTERM) must restart: the operator's ExitCode policy
  # retries only codes >= 128, OnFailure retries any non-zero code.
  assert ctl.PREEMPTED_EXIT_CODE == 42 and worker["restartPolicy"] == "OnFailure"
  assert job["spec"]["runPolicy"]["backoffLimit"] >= 1
  pod = worker["template"]["spec"]
  container, = pod["containers"]
  assert container["name"] == "tensorflow"  # where the operator puts TF_CONFIG
  command = container["command"]
  assert command[:3] == ["ctl", "train", "examples/configs/dcgan.gin"]
  assert os.path.exists(os.path.join(helpers.ROOT, command[2]))
  assert command[command.index("--strategy") + 1] == "auto"
  workdir = command[command.index("--workdir") + 1]
  mount, = container["volumeMounts"]
  assert workdir.startswith(mount["mountPath"] + "/")
  volume, = pod["volumes"]
  assert volume["name"] == mount["name"] and "persistentVolumeClaim" in volume
  assert "REPLACE-ME" in container["image"]


def test_slurm_script():
  path = os.path.join(CLUSTER, "slurm.sbatch")
  subprocess.run(["bash", "-n", path], check=True)
  with open(path) as f:
    text = f.read()
  assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
  srun, = [line for line in text.splitlines() if line.startswith("srun ")]
  assert srun.split()[1:5] == ["ctl", "train", "examples/configs/dcgan.gin", "--strategy"]
  assert "--strategy auto" in srun and "--workdir" in srun
  assert 'if [ "$code" -eq 42 ]' in text and "scontrol requeue" in text


def test_cluster_readme_names_each_file():
  with open(os.path.join(CLUSTER, "README.md")) as f:
    text = f.read()
  for name in ("tfjob.yaml", "slurm.sbatch", "tests/test_cluster.py"):
    assert name in text
