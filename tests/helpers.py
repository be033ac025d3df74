"""Subprocess helpers: TensorFlow fixes devices and collectives per process.

Each strategy runs in its own Python process (see TF field notes: a process
that ran one strategy cannot always start another), and multi-worker runs
start one process per worker with TF_CONFIG on 127.0.0.1.
"""

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import typing

import numpy as np

from ctl.distribute import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = os.path.join(ROOT, "tests", "parity_task.py")
RESUME_TASK = os.path.join(ROOT, "tests", "resume_task.py")
GRACE = 5  # seconds between `ctl launch`'s SIGTERM and SIGKILL in the tests
# resume_task.py under `ctl launch`: without dropout (Keras' Dropout draws per
# replica, so it differs by strategy), 12 steps, a checkpoint every 4.
LAUNCHED_TASK_ARGS = ("--dropout", "0", "--steps", "12", "--checkpoint-every", "4")
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
# `--gin` arguments that shrink examples/configs/dcgan.gin to a 4-step run.
TINY_GAN = []
for _binding in ("gan.dcgan_generator.width = 8", "gan.dcgan_discriminator.width = 8",
                 "gan.Experiment.batch_size = 16", "gan.Schedule.total_steps = 4",
                 "gan.Schedule.fid_every = 0", "gan.Experiment.fid_samples = 200",
                 "gan.Schedule.steps_per_loop = 2", "gan.Schedule.samples_every = 2",
                 "gan.Schedule.checkpoint_every = 2", "gan.Experiment.ema_decay = None",
                 "gan.Experiment.noise_dim = 8"):
  TINY_GAN += ["--gin", _binding]


class SharedRuns:
  """Runs made once per test session and shared by every module that needs one.

  A run is a directory made by a function; the first caller makes it while
  holding a lock on it, so an xdist worker that needs it meanwhile waits for
  it instead of making it again. Callers must not change what is in it: copy
  it first (`copy`).
  """

  def __init__(self, root):
    self.root = root
    os.makedirs(root, exist_ok=True)

  def get(self, name, make):
    """The directory of run `name`, made by `make(directory)` if not made yet."""
    directory = os.path.join(self.root, name)
    done = os.path.join(directory, ".done")
    with open(os.path.join(self.root, name + ".lock"), "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
      if not os.path.exists(done):  # not made, or its maker failed part-way
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        make(directory)
        open(done, "w").close()
    return directory

  @staticmethod
  def copy(directory, destination):
    shutil.copytree(directory, destination, ignore=shutil.ignore_patterns(".done"))
    return destination


def resume_reference(runs, strategy, *args):
  """tests/resume_task.py run for 12 steps uninterrupted, once per session and
  arguments: what a run that a fault stopped must equal once rerun."""
  name = "resume-" + "-".join((strategy,) + args).replace("--", "")

  def make(directory):
    python([RESUME_TASK, "--workdir", os.path.join(directory, "work"),
            "--out", os.path.join(directory, "out.npz"), "--steps", "12",
            "--strategy", strategy, "--logical-cpus", "2"] + list(args), timeout=240)

  return dict(np.load(os.path.join(runs.get(name, make), "out.npz")))


def tiny_gan_training(runs):
  """`ctl train examples/configs/dcgan.gin` shrunk by TINY_GAN to 4 steps,
  once per session: its workdir and output (`.workdir`, `.stdout`, `.stderr`)."""

  def make(directory):
    proc = ctl("train", os.path.join("examples", "configs", "dcgan.gin"), "--workdir",
               os.path.join(directory, "work"), *TINY_GAN, timeout=300)
    for name in ("stdout", "stderr"):
      with open(os.path.join(directory, name), "w") as f:
        f.write(getattr(proc, name))

  directory = runs.get("ctl-train-tiny-gan", make)
  read = lambda name: open(os.path.join(directory, name)).read()  # noqa: E731
  return types.SimpleNamespace(workdir=os.path.join(directory, "work"),
                               stdout=read("stdout"), stderr=read("stderr"))


# A hang guard for a subprocess, not a speed check: the longest takes about 40 s
# alone on 2 cores, and one took over 180 s in a full run sharing the cores
# with a second suite (test_parity's central_storage_2 task).
SUBPROCESS_TIMEOUT = 600


def generator_runner(make_generator, strategy):
  """A runner that trains nothing, of the model `make_generator()` as "generator"
  (made in the strategy's scope, with Keras' seed 0): for evaluations over samples."""
  import keras  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import ctl  # pylint: disable=import-outside-toplevel

  def build():
    keras.utils.set_random_seed(0)
    return {"generator": make_generator()}, {"generator": keras.optimizers.Adam()}

  data = tf.data.Dataset.from_tensor_slices(np.zeros((8, 1), "float32")).batch(
      4, drop_remainder=True).repeat()
  return ctl.Runner(lambda ctx, batch: {}, build, data, strategy=strategy)


def python(args, *, env=None, timeout=SUBPROCESS_TIMEOUT, check=True):
  """Runs `python args...` from the repo root; returns the CompletedProcess."""
  proc = subprocess.run([sys.executable] + list(args), cwd=ROOT, env=subprocess_env(env),
                        capture_output=True, text=True, timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"{args} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
  return proc


def as_in_a_terminal():
  """A child's `preexec_fn`: Ctrl-C's and SIGHUP's default actions, as in a
  terminal (a shell's background job, such as CI's, starts with SIGINT
  ignored; under nohup SIGHUP is ignored too)."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_python(args, *, env=None):
  """Starts `python args...` from the repo root, as in a terminal (`as_in_a_terminal`)."""
  return subprocess.Popen(
      [sys.executable] + list(args), cwd=ROOT, env=subprocess_env(env), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal)


def communicate_or_dump(proc, timeout):
  """`proc.communicate(timeout=timeout)`. If `proc` (started with PYTHONFAULTHANDLER=1)
  still runs then, it prints each thread's Python stack (SIGABRT) and the test fails
  with them: where a stop hung, seen the first time it does."""
  try:
    return proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.send_signal(signal.SIGABRT)
    _, stderr = proc.communicate(timeout=60)
    raise AssertionError(f"still running after {timeout} s; its threads were at:\n"
                         f"{stderr[-6000:]}") from None


def ctrl_c_once(args, path, *, timeout=120):
  """Starts `python args...`, sends it Ctrl-C once `path` exists (e.g. the first
  sample grid: the run is past its first compiled call); (exit code, stderr)."""
  proc = start_python(args)
  try:
    while not os.path.exists(path) and proc.poll() is None:
      time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=timeout)
  finally:
    proc.kill()
  return proc.returncode, stderr


def ctl(*args, env=None, timeout=SUBPROCESS_TIMEOUT, check=True):
  """Runs the `ctl` command (`python -m ctl.cli args...`); the CompletedProcess."""
  return python(["-m", "ctl.cli"] + list(args), env=env, timeout=timeout, check=check)


def run_task(tmp_path, *args, name="run"):
  """Runs tests/parity_task.py with `args`; returns its results as a dict."""
  out = os.path.join(tmp_path, f"{name}.npz")
  python([TASK, "--out", out] + list(args))
  return dict(np.load(out))


def start_workers(num_workers, task, *args):
  """Starts `task` as `num_workers` multi-worker processes on 127.0.0.1."""
  ports = free_ports(num_workers)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  procs = []
  for i in range(num_workers):
    config = {"cluster": cluster, "task": {"type": "worker", "index": i}}
    procs.append(subprocess.Popen(
        [sys.executable, task, "--strategy", "multi_worker"] + list(args),
        cwd=ROOT, env=subprocess_env({"TF_CONFIG": json.dumps(config)}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  return procs


def finish(procs, timeout):
  """Waits for every process (killing all by PID after `timeout`); their logs."""
  try:
    # A worker whose peer never starts waits forever: bound the wait.
    return [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def run_workers(tmp_path, num_workers, *args, task=TASK, timeout=240):
  """Runs `task` as `num_workers` multi-worker processes; the chief's `--out`."""
  out = os.path.join(tmp_path, "workers.npz")
  procs = start_workers(num_workers, task, "--out", out, *args)
  logs = finish(procs, timeout)
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f"worker {i} exited {p.returncode}:\n{log[-4000:]}"
  return dict(np.load(out))


def launched_task_command(workdir, out, *args, launch_args=()):
  """`ctl launch` of resume_task.py on 2 workers, each writing `<out>.<i>.npz`;
  `launch_args` go to `ctl launch` (e.g. `--max-restarts 1`)."""
  return ([sys.executable, "-m", "ctl.cli", "launch", "--workers", "2",
           "--grace", str(GRACE), "--startup-timeout", "180", *launch_args, "--",
           sys.executable, RESUME_TASK, "--strategy", "multi_worker", "--workdir",
           str(workdir), "--out", str(out), "--out-every-worker"]
          + list(LAUNCHED_TASK_ARGS + args))


def run_launched_task(workdir, out, *args):
  """Runs `launched_task_command` to the end; the results of workers 0 and 1."""
  proc = subprocess.run(launched_task_command(workdir, out, *args), cwd=ROOT,
                        env=subprocess_env(None),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return [dict(np.load(f"{out}.{i}.npz")) for i in range(2)]


def free_ports(count):
  """Ports free on 127.0.0.1 now, all different: what `ctl launch` gives its tasks."""
  return launch.free_ports(count)


def alive(pid):
  """Whether process `pid` runs (Linux; a zombie, exited but not reaped, does not).

  A container's init may never reap orphans, so "gone" must include zombies.
  """
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def max_difference(results, reference):
  """Max absolute difference over every array; the key sets must match."""
  assert sorted(results) == sorted(reference), (sorted(results), sorted(reference))
  return max(float(np.max(np.abs(results[k] - reference[k]))) for k in reference)


def subprocess_env(extra):
  """The environment of a test's subprocess: quiet TF, no cluster (TF_CONFIG,
  CLUSTER_SPEC), this checkout first on the path, then `extra`."""
  env = dict(os.environ, **QUIET)
  env.pop("TF_CONFIG", None)
  env.pop("CLUSTER_SPEC", None)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env.update(extra or {})
  return env


def processes_naming(text):
  """The live processes (not zombies) whose command line contains `text`, from /proc."""
  found = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        named = text in f.read().decode(errors="replace")
      with open(f"/proc/{entry}/stat") as f:
        zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, ValueError, IndexError):
      continue
    if named and not zombie:
      found.append(int(entry))
  return found


# Who can reach a run's ports: the listening TCP sockets of its processes, read
# from /proc (root reads every process's; any user, their own). `ss -ltnp`
# shows the same, but only of its own network namespace.

class Listener(typing.NamedTuple):
  """A listening TCP socket of a process."""
  pid: int
  name: str  # the process's command name
  address: str  # as bound: "0.0.0.0", "::", "127.0.0.1", ...
  port: int
  private: bool  # in a network namespace with loopback as its only interface
  outside: bool  # other machines can reach it: not on loopback, nor private

  def __str__(self):
    where = "private network" if self.private else "this machine's network"
    return f"{self.name} (pid {self.pid}) on {self.address}:{self.port}, {where}"


def descendants(roots):
  """`roots` and every process under them (those alive now)."""
  children = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
      except (OSError, IndexError):
        pass  # gone meanwhile
  found, todo = set(), [r for r in roots if r]
  while todo:
    pid = todo.pop()
    if pid not in found:
      found.add(pid)
      todo += children.get(pid, [])
  return found


def processes_with(marker):
  """PIDs whose command line or environment holds `marker` (bytes): the processes
  of a cluster that runs its jobs outside the test's process tree (daemons)."""
  found = set()
  for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
      for part in ("cmdline", "environ"):
        try:
          with open(f"/proc/{entry}/{part}", "rb") as f:
            if marker in f.read():
              found.add(int(entry))
              break
        except OSError:
          pass
  return found


def listeners(pids):
  """The listening TCP sockets (IPv4 and IPv6) of processes `pids`."""
  found, tables = [], {}
  for pid in pids:
    try:
      inodes = set()
      for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
          target = os.readlink(f"/proc/{pid}/fd/{fd}")
          if target.startswith("socket:["):
            inodes.add(target[8:-1])
      namespace = os.readlink(f"/proc/{pid}/ns/net")
      if namespace not in tables:
        tables[namespace] = _listening_table(pid), only_loopback(pid)
      with open(f"/proc/{pid}/comm") as f:
        name = f.read().strip()
    except OSError:
      continue  # gone meanwhile
    table, private = tables[namespace]
    for inode in inodes & set(table):
      address, port = table[inode]
      loopback = ipaddress.ip_address(address).is_loopback or address.startswith("::ffff:127.")
      found.append(Listener(pid, name, address, port, private, not (loopback or private)))
  return found


def _listening_table(pid):
  """{socket inode: (address, port)} of the sockets listening in `pid`'s network namespace."""
  table = {}
  for kind, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
    try:
      with open(f"/proc/{pid}/net/{kind}") as f:
        rows = f.read().splitlines()[1:]
    except OSError:
      continue  # no IPv6 here
    for row in rows:
      fields = row.split()
      if fields[3] != "0A":  # TCP_LISTEN
        continue
      address, port = fields[1].split(":")
      raw = bytes.fromhex(address)  # 32-bit words in the kernel's (little-endian) order
      raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
      table[fields[9]] = socket.inet_ntop(family, raw), int(port, 16)
  return table


def only_loopback(pid):
  with open(f"/proc/{pid}/net/dev") as f:
    names = [line.split(":")[0].strip() for line in f.read().splitlines()[2:]]
  return names == ["lo"]


class ListenerWatch:
  """Samples the listening sockets of `pids()` (with their descendants) in a thread,
  every `every` seconds while the block runs: `seen`, each listener once (by
  process and address), and `outside`, those other machines could reach.

      with helpers.ListenerWatch(lambda: [proc.pid]) as watch:
        ...   # the run
      assert watch.seen and not watch.outside, watch.report()
  """

  def __init__(self, pids, every=0.2):
    self._pids, self._every = pids, every
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self.seen = {}

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc_info):
    self._stop.set()
    self._thread.join()

  def _sample(self):
    while True:
      self.sample()
      if self._stop.wait(self._every):
        return

  def sample(self):
    """Takes one sample now (also done by the thread); the listeners found."""
    found = listeners(descendants(self._pids()))
    for listener in found:
      self.seen.setdefault((listener.pid, listener.address, listener.port), listener)
    return found

  @property
  def outside(self):
    return [listener for listener in self.seen.values() if listener.outside]

  def report(self):
    return "listening: " + "; ".join(map(str, self.seen.values()))
