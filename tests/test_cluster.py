"""Real clusters: Kubeflow's, AI Platform's and Vertex AI's TF_CONFIG and
CLUSTER_SPEC, Slurm job steps, TPU hosts, and the shipped examples.

Environments are faked: `choose_strategy` reads only the dict it is given, and
TF's `SlurmClusterResolver` reads `os.environ` (monkeypatched). Two tests build
the strategy for real, as two local processes: from Slurm's variables, and from
AI Platform's `master` and Vertex AI's worker pools.
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
from ctl.distribute import cluster as cluster_lib

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
    ('{"cluster": {"trainer": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker"}}',
     "job 'trainer'; TensorFlow knows only chief, worker, ps, evaluator"),
    ('{"cluster": {"master": ["a:1"], "chief": ["b:1"]}, "task": {"type": "chief"}}',
     r"names the 'chief' job twice \(as \['master', 'chief'\]\)"),
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


# Cloud trainers' variables, in the formats their documentation shows
# (cloud.google.com/ai-platform/training/docs/distributed-training-details,
# .../distributed-training-containers, cloud.google.com/vertex-ai/docs/training/
# distributed-training): extra keys, `master` for the chief, and worker pools.
def ai_platform_tf_config(task_type, index, chief="chief"):
  """AI Platform's TF_CONFIG; chief="master" for runtimes before 2.1."""
  cluster = {chief: ["cmle-training-master-0:2222"],
             "worker": ["cmle-training-worker-0:2222", "cmle-training-worker-1:2222"]}
  return {"TF_CONFIG": json.dumps({
      "cluster": cluster, "environment": "cloud",
      "job": {"args": ["--steps", "100"], "jobDir": "gs://bucket/job",
              "hyperparameters": {"goal": "MINIMIZE", "maxTrials": 2}},
      "task": {"cloud": "w5b0b2d2c5f6a7e3e-ml", "index": index, "trial": "1",
               "type": task_type}})}


def vertex_cluster_spec(task_type, index, pools=(1, 2, 0, 0)):
  """Vertex AI's CLUSTER_SPEC (custom containers): worker pools, no TF names."""
  cluster = {f"workerpool{p}": [f"cmle-training-workerpool{p}-ab-{i}:2222" for i in range(n)]
             for p, n in enumerate(pools) if n}
  return {"CLUSTER_SPEC": json.dumps({
      "cluster": cluster, "environment": "cloud", "task": {"type": task_type, "index": index},
      "job": json.dumps({"worker_pool_specs": [{"replica_count": n} for n in pools]})})}


def ai_platform_cluster_spec(task_type, index):
  """AI Platform's CLUSTER_SPEC (custom containers): `master`, evaluators listed."""
  return {"CLUSTER_SPEC": json.dumps({
      "cluster": {"master": ["m-0:2222"], "worker": ["w-0:2222"], "ps": ["p-0:2222"],
                  "evaluator": ["e-0:2222", "e-1:2222"]},
      "environment": "cloud", "task": {"type": task_type, "index": index}, "job": "{}"})}


@pytest.mark.parametrize("env, strategy, task", [
    (ai_platform_tf_config("chief", 0), "multi_worker", ("chief", 0)),
    (ai_platform_tf_config("worker", 1), "multi_worker", ("worker", 1)),
    (ai_platform_tf_config("master", 0, chief="master"), "multi_worker", ("chief", 0)),
    (ai_platform_tf_config("worker", 1, chief="master"), "multi_worker", ("worker", 1)),
    (vertex_cluster_spec("workerpool0", 0), "multi_worker", ("chief", 0)),
    (vertex_cluster_spec("workerpool1", 1), "multi_worker", ("worker", 1)),
    (vertex_cluster_spec("workerpool2", 0, pools=(1, 2, 1, 0)), "parameter_server", ("ps", 0)),
    (vertex_cluster_spec("workerpool3", 0, pools=(1, 2, 0, 1)), "default", ("evaluator", 0)),
    (ai_platform_cluster_spec("master", 0), "parameter_server", ("chief", 0)),
    (ai_platform_cluster_spec("evaluator", 1), "default", ("evaluator", 1)),
])
def test_cloud_trainers_clusters_read_as_tensorflow_names_them(env, strategy, task):
  assert choose(env)[0] == strategy
  config = cluster_lib.parse_tf_config(env)
  assert (config["task"]["type"], config["task"]["index"]) == task
  assert set(config["cluster"]) <= set(cluster_lib.TASK_TYPES) - {"evaluator"}
  assert config["environment"] == "cloud" and "job" in config  # kept as they were


def test_tf_config_wins_over_cluster_spec():
  env = dict(vertex_cluster_spec("workerpool1", 0), **ai_platform_tf_config("worker", 1))
  assert cluster_lib.parse_tf_config(env)["task"] == json.loads(env["TF_CONFIG"])["task"]


def test_export_tf_config_writes_what_tensorflow_reads_only_when_it_differs(caplog):
  env = ai_platform_tf_config("master", 0, chief="master")
  with caplog.at_level("INFO", logger="ctl"):
    cluster_lib.export_tf_config(env)
  config = json.loads(env["TF_CONFIG"])
  assert config["task"]["type"] == "chief" and "master" not in config["cluster"]
  assert "this task is chief 0 of {'chief': 1, 'worker': 2}" in caplog.text
  env = vertex_cluster_spec("workerpool1", 1)
  cluster_lib.export_tf_config(env)
  assert json.loads(env["TF_CONFIG"])["cluster"]["chief"] == [
      "cmle-training-workerpool0-ab-0:2222"]
  for env in (kubeflow_tf_config("worker", 1, chief=1, worker=2), {}):
    before = dict(env)
    cluster_lib.export_tf_config(env)
    assert env == before  # nothing renamed: TF_CONFIG left byte for byte


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
  resolver = cluster_lib.slurm_cluster_resolver(num_gpus=0)
  assert resolver.cluster_spec().as_dict() == {"worker": ["node01:23456", "node02:23456"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", task_id)
  assert resolver.num_accelerators() == {}  # CPU replicas, not GPU:0
  assert "CUDA_VISIBLE_DEVICES" not in os.environ
  assert isinstance(resolver, tf.distribute.cluster_resolver.SlurmClusterResolver)


def test_slurm_resolver_with_several_tasks_per_node(monkeypatch, no_shell_tools):
  env = slurm_env(3, tasks=4, nodes="gpu[7,9]", tasks_per_node="2(x2)")
  for key, value in dict(env, CTL_SLURM_PORT_BASE="30000").items():
    monkeypatch.setenv(key, value)
  resolver = cluster_lib.slurm_cluster_resolver(num_gpus=2)
  assert resolver.cluster_spec().as_dict() == {
      "worker": ["gpu7:30000", "gpu7:30001", "gpu9:30000", "gpu9:30001"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 3)
  assert resolver.num_accelerators() == {"GPU": 2}


def test_slurm_resolver_outside_a_step_names_the_fix(monkeypatch):
  monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)
  with pytest.raises(RuntimeError, match="not in a Slurm job step of several tasks.*srun"):
    cluster_lib.slurm_cluster_resolver(num_gpus=0)
  for key, value in dict(slurm_env(0), CTL_SLURM_PORT_BASE="http").items():
    monkeypatch.setenv(key, value)
  with pytest.raises(ValueError, match=r"CTL_SLURM_PORT_BASE \('http'\) must be a port"):
    cluster_lib.slurm_cluster_resolver(num_gpus=0)


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


def two_tasks(envs):
  """Runs _SLURM_TASK once per environment, together; each one's RESULT fields."""
  procs = [subprocess.Popen([sys.executable, "-c", _SLURM_TASK], cwd=helpers.ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for env in envs]
  results = []
  for proc, log in zip(procs, helpers.finish(procs, timeout=120)):
    assert proc.returncode == 0, log[-3000:]
    results.append(next(line for line in log.splitlines() if line.startswith("RESULT")).split()[1:])
  return results


@pytest.mark.slow  # two processes that import TensorFlow
def test_slurm_step_trains_as_two_workers(no_shell_tools):
  """Two processes with the variables srun gives two tasks on one node."""
  base = _free_port_pair()
  results = two_tasks([dict(helpers.subprocess_env(
      slurm_env(rank, nodes="localhost", tasks_per_node="2")),
      CTL_SLURM_PORT_BASE=str(base), PATH=os.environ["PATH"]) for rank in range(2)])
  assert results == [["True", "2", "worker", "0", "True", "2.0"],
                     ["True", "2", "worker", "1", "False", "2.0"]]


@pytest.mark.slow  # two processes that import TensorFlow
def test_ai_platform_master_and_vertex_worker_pool_train_as_two_workers():
  """One task told it is AI Platform's `master`, the other only Vertex's pools.

  TensorFlow knows neither name; `make_strategy` sets TF_CONFIG so that it
  reads the cluster ctl does.
  """
  base = _free_port_pair()
  chief, worker = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
  envs = [{"TF_CONFIG": json.dumps({"cluster": {"master": [chief], "worker": [worker]},
                                    "task": {"type": "master", "index": 0, "trial": "1"},
                                    "environment": "cloud", "job": {"jobDir": "gs://b"}})},
          {"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": [chief],
                                                   "workerpool1": [worker]},
                                       "task": {"type": "workerpool1", "index": 0},
                                       "environment": "cloud", "job": "{}"})}]
  results = two_tasks([helpers.subprocess_env(env) for env in envs])
  assert results == [["True", "2", "chief", "0", "True", "2.0"],
                     ["True", "2", "worker", "0", "False", "2.0"]]


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
  monkeypatch.setattr(cluster_lib.os.path, "exists",
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


def test_trainjob_manifest():
  """Kubeflow Trainer v2: a plain runtime, and a TrainJob whose env is TF_CONFIG."""
  with open(os.path.join(CLUSTER, "trainjob.yaml")) as f:
    runtime, job = yaml.safe_load_all(f)
  assert runtime["apiVersion"] == job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
  assert (runtime["kind"], job["kind"]) == ("TrainingRuntime", "TrainJob")
  assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                       "kind": "TrainingRuntime",
                                       "name": runtime["metadata"]["name"]}
  policy = runtime["spec"]["mlPolicy"]
  assert set(policy) == {"numNodes"}  # no framework: Trainer's PlainML plugin
  jobset = runtime["spec"]["template"]["spec"]
  # Any failure (exit 42 after a preemption's save) restarts every worker.
  assert ctl.PREEMPTED_EXIT_CODE == 42 and jobset["failurePolicy"]["maxRestarts"] >= 1
  node, = jobset["replicatedJobs"]
  assert node["name"] == "node"
  assert node["template"]["metadata"]["labels"] == {
      "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
  assert node["template"]["spec"]["backoffLimit"] == 0
  pod = node["template"]["spec"]["template"]["spec"]
  assert pod["restartPolicy"] == "Never"
  container, = pod["containers"]
  assert container["name"] == "node"  # where Trainer puts the TrainJob's env
  assert "REPLACE-ME" in container["image"]
  mount, = container["volumeMounts"]
  volume, = pod["volumes"]
  assert volume["name"] == mount["name"] and "persistentVolumeClaim" in volume
  trainer = job["spec"]["trainer"]
  command = trainer["command"]
  assert command[:3] == ["ctl", "train", "examples/configs/dcgan.gin"]
  assert os.path.exists(os.path.join(helpers.ROOT, command[2]))
  assert command[command.index("--strategy") + 1] == "auto"
  assert command[command.index("--workdir") + 1].startswith(mount["mountPath"] + "/")
  names = [variable["name"] for variable in trainer["env"]]
  # Kubernetes expands $(TASK_INDEX) only from variables listed before it.
  assert names.index("TASK_INDEX") < names.index("TF_CONFIG")
  index, = [v for v in trainer["env"] if v["name"] == "TASK_INDEX"]
  assert index["valueFrom"]["fieldRef"]["fieldPath"] == (
      "metadata.annotations['batch.kubernetes.io/job-completion-index']")
  tf_config, = [v["value"] for v in trainer["env"] if v["name"] == "TF_CONFIG"]
  name, nodes = job["metadata"]["name"], trainer["numNodes"]
  for i in range(nodes):  # each pod's TF_CONFIG, as Kubernetes expands it
    env = {"TF_CONFIG": tf_config.replace("$(TASK_INDEX)", str(i))}
    assert choose(env) == ("multi_worker", f"TF_CONFIG names {nodes} workers "
                                           "(chief + worker tasks)")
    config = cluster_lib.parse_tf_config(env)
    # JobSet's pod hostnames: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>
    assert config["cluster"]["worker"][i] == f"{name}-node-0-{i}.{name}:2222"
    assert config["task"] == {"type": "worker", "index": i}


def test_slurm_script():
  path = os.path.join(CLUSTER, "slurm.sbatch")
  subprocess.run(["bash", "-n", path], check=True)
  with open(path) as f:
    text = f.read()
  assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
  srun, = [line for line in text.replace("\\\n", "").splitlines() if line.startswith("srun ")]
  assert srun.split()[1:5] == ["ctl", "train", '"${CONFIG:-examples/configs/dcgan.gin}"',
                               "--strategy"]
  assert "--strategy auto" in srun and '--workdir "${WORKDIR:-runs/dcgan-slurm}"' in srun
  assert srun.endswith('"$@"')  # arguments after the script's name reach ctl train
  assert "#SBATCH --open-mode=append" in text  # a requeued job keeps the first run's log
  assert 'if [ "$code" -eq 42 ]' in text and "scontrol requeue" in text


def test_cluster_readme_names_each_file():
  with open(os.path.join(CLUSTER, "README.md")) as f:
    text = f.read()
  for name in ("tfjob.yaml", "trainjob.yaml", "slurm.sbatch", "tests/test_cluster.py"):
    assert name in text
