"""Run one command as every task of a local TensorFlow cluster (`ctl launch`).

    from ctl.distribute import launch
    code = launch.launch(["python", "train.py"], workers=2)          # 2 workers
    code = launch.launch(["python", "coordinator.py"], workers=2, ps=1)  # + chief + 1 ps

    ctl launch --workers 2 -- ctl train cfg.gin --strategy multi_worker --workdir runs/x

Each task gets `TF_CONFIG` for a cluster on free ports of `host`, and
`CTL_LAUNCH_READY_DIR`, where `ctl.make_strategy` marks it ready. POSIX only;
TensorFlow is not imported. docs/strategies.md tells the whole behaviour.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import TextIO

from ctl.base import arguments
from ctl.base.constants import GRACE_VARIABLE
from ctl.base.constants import LAUNCHER_PID_VARIABLE
from ctl.base.constants import PREEMPTED_EXIT_CODE
from ctl.base.constants import READY_DIR_VARIABLE
from ctl.base.constants import RESTARTS_VARIABLE
from ctl.base.constants import USAGE_ERROR_EXIT_CODE
from ctl.distribute import private_network

# How long to wait for processes already sent SIGKILL, and for the output of
# exited tasks to drain: both should take milliseconds.
_KILL_WAIT_SECONDS = 10
_DRAIN_SECONDS = 5
_POLL_SECONDS = 0.05
# Between a cluster's end and its restart: time for the ports to be released
# and for whatever killed a task (a full disk, a busy machine) to pass.
RESTART_WAIT_SECONDS = 3.0
NETWORKS = ("auto", "private", "shared")
# The shell's code for a command that cannot run; also when --network private
# cannot be had (nothing started either).
_CANNOT_RUN_EXIT_CODE = 127


def _ports(base, workers, ps):
  """`--port-base`'s ports: one per task, a chief's first if there are parameter servers."""
  return list(range(base, base + workers + ps + (1 if ps else 0)))


def cluster_spec(workers: int, ps: int = 0, host: str = "127.0.0.1",
                 ports: Sequence[int] | None = None) -> dict[str, list[str]]:
  """The `cluster` part of TF_CONFIG for a local cluster.

  Args:
    workers: number of `worker` tasks.
    ps: number of `ps` tasks; with any, the cluster is a parameter-server one
      and gets a `chief` task (the coordinator) too.
    host: the address every task listens on.
    ports: one port per task, in the order `chief`, workers, ps (see `tasks`);
      default: free ports of `host`.

  Returns:
    e.g. `{"worker": ["127.0.0.1:4001", "127.0.0.1:4002"]}`.
  """
  counts = {"chief": 1 if ps else 0, "worker": workers, "ps": ps}
  total = sum(counts.values())
  ports = free_ports(total, host) if ports is None else list(ports)
  if len(ports) != total:
    raise ValueError(f"ports has {len(ports)} entries but the cluster has {total} "
                     f"tasks ({workers} workers, {ps} ps); give one port per task.")
  address = f"[{host}]" if ":" in host else host  # IPv6 literals need brackets
  ports = iter(ports)
  return {job: [f"{address}:{next(ports)}" for _ in range(count)]
          for job, count in counts.items() if count}


def tasks(cluster: Mapping[str, Sequence[str]]) -> list[tuple[str, int]]:
  """`(task type, index)` of every task of `cluster`: chief, workers, then ps."""
  return [(job, index) for job in ("chief", "worker", "ps")
          for index in range(len(cluster.get(job, ())))]


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
  """The TF_CONFIG value (JSON text) of one task of `cluster`."""
  return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
  """`count` different ports of `host` that are free now (held open together, so that the
  kernel hands out different ones; another program could still take one)."""
  family = _family(host)
  sockets = [socket.socket(family) for _ in range(count)]
  try:
    for s in sockets:
      s.bind((host, 0))
    return [s.getsockname()[1] for s in sockets]
  except OSError as e:
    raise ValueError(f"host {host!r} cannot be listened on here ({e.strerror}); use "
                     "an address of this machine, such as 127.0.0.1.") from None
  finally:
    for s in sockets:
      s.close()


def check_ports(ports: Sequence[int], host: str = "127.0.0.1") -> None:
  """Raises ValueError naming the first of `ports` that `host` cannot listen on."""
  family = _family(host)
  for port in ports:
    if not 0 < port < 65536:
      raise ValueError(f"port {port} is out of range; pick a --port-base from 1 to "
                       f"{65536 - len(ports)}.")
    with socket.socket(family) as s:
      # As gRPC does: a port left in TIME_WAIT by an earlier run is free.
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        s.bind((host, port))
      except OSError as e:
        raise ValueError(
            f"port {port} on {host} is in use ({e.strerror}); the cluster needs "
            f"ports {ports[0]}-{ports[-1]}. Pick another --port-base, or drop "
            "--port-base to use free ports.") from None


def describe_exit(code: int | None) -> str:
  """`code 3`, or `code -9 (killed by SIGKILL)` for a task a signal ended."""
  if code is not None and code < 0:
    try:
      name = signal.Signals(-code).name
    except ValueError:
      name = f"signal {-code}"
    return f"code {code} (killed by {name})"
  return f"code {code}"


class Task:
  """One process of the cluster and what is known about it."""

  def __init__(self, task_type: str, index: int):
    self.type = task_type
    self.index = index
    self.name = "chief" if task_type == "chief" else f"{task_type} {index}"  # as messages say
    self.process: subprocess.Popen[bytes] | None = None
    self.code: int | None = None  # exit code, set by the thread that waits for the process
    self.ready = False

  @property
  def running(self) -> bool:
    return self.process is not None and self.code is None

  def __str__(self) -> str:
    return self.name + (f" (pid {self.process.pid})" if self.process else "")


class Launch:
  """Runs `command` as every task of a local cluster; `run()` returns the exit code.

  Exit code: 0 when every task exits 0 (in a parameter-server cluster: when the
  chief does; the workers and parameter servers serve forever and are then
  stopped); 42 (`ctl.PREEMPTED_EXIT_CODE`) when every task was preempted (exited
  with 42, or 0); on a failure the failed task's code if it is from 1 to 125,
  else 1. With restarts, the code of the last cluster started.
  """

  def __init__(self, command: Sequence[str], *, workers: int = 2, ps: int = 0,
               host: str = "127.0.0.1", port_base: int | None = None,
               startup_timeout: float = 120.0, grace: float = 30.0,
               max_restarts: int = 0, restart_wait: float = RESTART_WAIT_SECONDS,
               restart_workers: int | None = None, network: str = "auto",
               env: Mapping[str, str] | None = None,
               stdout: TextIO | None = None,
               stderr: TextIO | None = None):
    """Checks the arguments and picks the ports.

    Args:
      command: the argument list every task runs.
      workers: number of worker tasks.
      ps: number of parameter servers; with any, a chief task is added.
      host: the address the tasks' TF servers listen on.
      port_base: use ports `port_base`, `port_base + 1`, ... (one per task)
        instead of free ones.
      startup_timeout: seconds every task has to become ready (make its
        strategy); 0 waits forever.
      grace: seconds a task has between SIGTERM and SIGKILL.
      max_restarts: how many times to start the whole cluster again after it
        failed (docs/strategies.md, `ctl launch`).
      restart_wait: seconds between the cluster's end and its restart.
      restart_workers: the number of workers of a restarted cluster (fewer, as
        after losing a machine, or more); None: `workers`. A ctl run resumes on
        them as if never stopped (docs/reliability.md, the layout table).
      network: "private" (a network of the tasks' own, loopback only), "shared"
        (this machine's) or "auto" (private where allowed and `host` is loopback).
      env: the tasks' environment before TF_CONFIG is added (default: ours).
      stdout, stderr: where the tasks' prefixed output and the launcher's
        messages go (default: `sys.stdout`, `sys.stderr`).

    Raises:
      ValueError: naming the bad argument, or a port that is in use.
    """
    if not command:
      raise ValueError("no command to launch; put it after '--', as in "
                       "`ctl launch --workers 2 -- ctl train cfg.gin --strategy multi_worker`.")
    arguments.integer("workers", workers, minimum=1)
    arguments.integer("ps", ps, minimum=0)
    arguments.number("startup_timeout", startup_timeout, minimum=0, meaning="seconds")
    self.grace = arguments.number("grace", grace, minimum=0, meaning="seconds")
    self.max_restarts = arguments.integer("max_restarts", max_restarts, minimum=0)
    self.restart_wait = arguments.number("restart_wait", restart_wait, minimum=0,
                                         meaning="seconds")
    self.workers = workers
    self.restart_workers = workers if restart_workers is None else arguments.integer(
        "restart_workers", restart_workers, minimum=1)
    if restart_workers is not None and not max_restarts:
      raise ValueError(f"restart_workers={restart_workers} needs restarts: add "
                       "max_restarts (`--max-restarts N`), or drop it.")
    if network not in NETWORKS:
      raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {network!r}.")
    loopback = private_network.is_loopback(host)
    if network == "private" and not loopback:
      raise ValueError(f"host {host!r} is not a loopback address, and a private network "
                       "has loopback only; use --host 127.0.0.1, or --network shared.")
    ports = None
    if port_base is not None:
      ports = _ports(port_base, workers, ps)
      check_ports(ports, host)
    self.command = list(command)
    self.host = host
    self.port_base = port_base
    self.cluster = cluster_spec(workers, ps, host, ports)
    self.parameter_server = ps > 0
    self.startup_timeout = startup_timeout
    # A host other than loopback: the user wants the tasks on this machine's network.
    self.network = "shared" if network == "auto" and not loopback else network
    self.restarts = 0  # clusters started again so far
    self.causes: list[str] = []  # why each cluster before the last one ended
    self.env = dict(os.environ if env is None else env)
    self.stdout = stdout or sys.stdout
    self.stderr = stderr or sys.stderr
    self.tasks: list[Task] = []  # the current cluster's
    self._lock = threading.Lock()  # one line at a time on our outputs
    self._signal = None  # the signal the launcher got, if any
    self._hurry = False  # a second signal came: stop without a grace period
    self._private = None  # the PrivateNetwork the tasks run in, while they do

  def run(self) -> int:
    """Starts every task and supervises them; returns the launcher's exit code."""
    handlers = self._catch_signals()
    watch_launcher()  # started by `ctl parity` or `ctl eval --across`: stop when it is gone
    try:
      return self._run_clusters() if self._open_network() else _CANNOT_RUN_EXIT_CODE
    finally:
      if self._private is not None:
        self._private.close()
        self._private = None
      for signum, handler in handlers.items():
        signal.signal(signum, handler)

  def _open_network(self):
    """Makes the tasks' private network unless shared; False if refused outright."""
    try:
      if self.network != "shared":
        self._private = private_network.PrivateNetwork()
    except private_network.PrivateNetworkUnavailable as e:
      if self.network == "private":
        self._say(f"error: this system refuses a private network ({e}); use "
                  "--network shared behind a firewall")
        return False
      self.network = "shared"
      self._say(f"warning: this system refuses a private network ({e}), so the tasks "
                "use this machine's network, where TensorFlow's servers listen on every "
                "interface, not only on --host: keep its ports behind a firewall "
                "(--network shared: the same, without this warning)")
    else:
      self._say("the tasks share a private network (loopback only): nothing outside "
                "them reaches their ports, and they reach no other host (--network "
                "shared gives them this machine's network)" if self._private else
                "the tasks use this machine's network, where TensorFlow's servers "
                "listen on every interface (not only --host): keep its ports behind a "
                "firewall")
    return True

  def _run_clusters(self):
    """Runs the cluster, restarting it up to `max_restarts` times; the exit code."""
    while True:
      code = self._run_cluster()
      # Not restarted: success, a usage error (exit 2: a bad argument or config
      # fails the same way again) or a command that cannot run (127).
      if (code in (0, USAGE_ERROR_EXIT_CODE, _CANNOT_RUN_EXIT_CODE) or self._signal is not None
          or self.restarts == self.max_restarts):
        if code == USAGE_ERROR_EXIT_CODE and self.restarts < self.max_restarts:
          self._say(f"not restarting: exit code {USAGE_ERROR_EXIT_CODE} is a usage error, "
                    "which a restart would repeat")
        if self.restarts:
          self._say(f"{self.restarts} restart(s) of {self.max_restarts} used; "
                    "the causes: " + "; ".join(self.causes))
        resized = self.restarts and self.restart_workers != self.workers
        if code == USAGE_ERROR_EXIT_CODE and resized:
          self._say(f"the cluster restarted on {self.restart_workers} worker(s) exited "
                    f"{code}, a usage error: a run may refuse that number (a global batch it "
                    "does not divide, say); rerun with another --restart-workers")
        return code
      self.restarts += 1
      self.causes.append(self._cause)
      workers = len(self.cluster["worker"])
      self._say(f"restart {self.restarts} of {self.max_restarts} in "
                f"{self.restart_wait:g} s: {self._cause}" + (
                    f"; on {self.restart_workers} worker(s), not {workers}"
                    if self.restart_workers != workers else ""))
      self._wait(lambda: self._signal is not None, self.restart_wait)
      if self._signal is not None:
        self._say(f"got {signal.Signals(self._signal).name}; not restarting")
        return code

  def _run_cluster(self):
    """Starts every task once and supervises them; the cluster's exit code."""
    if self.restarts:  # on new free ports: the old ones may be held a while yet
      ps = len(self.cluster.get("ps", ()))
      self.cluster = cluster_spec(self.restart_workers, ps, self.host, None if (
          self.port_base is None) else _ports(self.port_base, self.restart_workers, ps))
    self.tasks = [Task(*t) for t in tasks(self.cluster)]
    self._exits = queue.Queue()  # tasks, in the order they exited
    self._threads = []
    self._cause = ""  # why this cluster ended, once it did
    self._ready_dir = tempfile.mkdtemp(prefix="ctl-launch-")
    try:
      return self._supervise()
    finally:
      self._stop([t for t in self.tasks if t.running], quiet=True)  # never leave any
      deadline = time.monotonic() + _DRAIN_SECONDS
      for thread in self._threads:
        thread.join(max(0.0, deadline - time.monotonic()))
      shutil.rmtree(self._ready_dir, ignore_errors=True)

  def _supervise(self):
    code = self._start()
    if code is not None:
      return code
    deadline = time.monotonic() + (self.startup_timeout or float("inf"))
    announced = False
    while True:
      try:
        exited = self._exits.get(timeout=_POLL_SECONDS)
      except queue.Empty:
        exited = None
      if self._signal is not None:
        return self._forward_signal()
      if exited is not None and (code := self._on_exit(exited)) is not None:
        return code
      if not announced and self._check_ready():
        announced = True
        self._say(f"all {len(self.tasks)} tasks are ready")
      if not announced and time.monotonic() > deadline:
        return self._startup_timed_out()

  def _start(self):
    """Starts every task; None, or the exit code if the command cannot run."""
    try:
      command = self.command
      if self._private is not None:
        # Found here, so a missing program is named before anything starts (inside,
        # the step that enters the network would execute it).
        program = shutil.which(command[0], path=self.env.get("PATH", os.defpath))
        if program is None:
          raise OSError(errno.ENOENT, "not found, or not executable")
        command = self._private.command(command, program)
      for task in self.tasks:
        env = {**self.env, "TF_CONFIG": tf_config(self.cluster, task.type, task.index),
               READY_DIR_VARIABLE: self._ready_dir, RESTARTS_VARIABLE: str(self.restarts),
               **stopped_with_this_process(self.grace)}
        # The tasks write to pipes, which Python would block-buffer: lines would
        # arrive late, and stdout out of step with stderr.
        env.setdefault("PYTHONUNBUFFERED", "1")
        # A session of its own: the task and whatever it starts can be signalled
        # as one process group, and a Ctrl-C at the terminal reaches only the
        # launcher, which stops the tasks in order.
        task.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        prefix = f"[{task.name}] "
        self._thread(_pump, task.process.stdout, prefix, self.stdout, self._lock)
        self._thread(_pump, task.process.stderr, prefix, self.stderr, self._lock)
        self._thread(self._reap, task)
    except OSError as e:
      self._say(f"cannot run {self.command[0]!r} ({e.strerror}); check the command "
                "after '--'.")
      self._stop([t for t in self.tasks if t.running])
      return _CANNOT_RUN_EXIT_CODE
    ports = ", ".join(self.cluster[t.type][t.index].rsplit(":", 1)[1] for t in self.tasks)
    self._say(f"started {', '.join(map(str, self.tasks))}; ports {ports}")
    return None

  def _thread(self, target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    self._threads.append(thread)

  def _reap(self, task):
    task.code = task.process.wait()
    self._exits.put(task)

  def _check_ready(self):
    """Whether every task is ready: its ready file exists, or it exited with 0."""
    for task in self.tasks:
      if not task.ready:
        name = f"{task.type}-{task.index}"  # as strategies.announce_ready writes it
        task.ready = task.code == 0 or os.path.exists(os.path.join(self._ready_dir, name))
    return all(task.ready for task in self.tasks)

  def _on_exit(self, task):
    """Handles a task's exit; returns the launcher's exit code once it is known."""
    if self.parameter_server and task.type == "chief":
      if task.code in (0, PREEMPTED_EXIT_CODE):
        # The workers and parameter servers serve until they are stopped.
        self._stop([t for t in self.tasks if t.running])
        self._say(f"chief exited with code {task.code}; stopped the workers and "
                  "parameter servers")
        self._cause = f"the chief exited with code {task.code} (preempted)"
        return task.code
      return self._failed(task)
    if task.code == 0:
      return 0 if not any(t.running or t.code for t in self.tasks) else None
    if task.code == PREEMPTED_EXIT_CODE and not self.parameter_server:
      return self._preempted(task)
    return self._failed(task)

  def _preempted(self, task):
    """A worker saved and exited with 42: the others should follow on their own."""
    # They all agree on the step to save at, but finish at slightly different times.
    self._wait(lambda: not any(t.running for t in self.tasks), self.grace)
    stragglers = [t for t in self.tasks if t.running]
    if stragglers:
      self._stop(stragglers)
      self._say(f"{task} exited with code {PREEMPTED_EXIT_CODE} (preempted) but "
                f"{_names(stragglers)} did not exit within --grace {self.grace:g} s; "
                "stopped them")
      self._cause = f"{task.name} was preempted and {_names(stragglers)} did not follow"
      return 1
    failed = [t for t in self.tasks if t.code not in (0, PREEMPTED_EXIT_CODE)]
    if failed:
      return self._failed(failed[0])
    rerun = ("the launcher restarts it" if self.restarts < self.max_restarts
             else "rerun the same command to resume")
    self._say(f"every task exited with code 0 or {PREEMPTED_EXIT_CODE} (preempted); {rerun}")
    self._cause = f"every task was preempted (exit {PREEMPTED_EXIT_CODE}), {task.name} first"
    return PREEMPTED_EXIT_CODE

  def _failed(self, task):
    running = [t for t in self.tasks if t.running]
    self._stop(running)
    stopped = "; stopped the others" if running else ""
    self._say(f"{task} exited with {describe_exit(task.code)}{stopped}")
    self._cause = f"{task.name} exited with {describe_exit(task.code)}"
    return task.code if 0 < task.code < 126 else 1

  def _startup_timed_out(self):
    late = [t for t in self.tasks if not t.ready and t.running]
    late = late or [t for t in self.tasks if not t.ready]  # one that just exited
    self._stop([t for t in self.tasks if t.running])
    self._cause = (f"{_names(late)} not ready within --startup-timeout "
                   f"{self.startup_timeout:g} s")
    self._say(
        f"{_names(late)} did not become ready within --startup-timeout "
        f"{self.startup_timeout:g} s; stopped all tasks. A task is ready once it "
        "has made its 'multi_worker' or 'parameter_server' strategy (a multi-worker "
        "task only when every peer has connected): look for an error or a missing "
        "peer in the output above, or raise --startup-timeout (0: no limit).")
    return 1

  def _forward_signal(self):
    name = signal.Signals(self._signal).name
    running = [t for t in self.tasks if t.running]
    self._say(f"got {name}; sending SIGTERM to {_names(running) or 'no task'}")
    self._stop(running)
    self._say("exit codes: " + ", ".join(f"{t.name} {t.code}" for t in self.tasks))
    # In a parameter-server cluster the chief's code: the others were serving.
    codes = [t.code for t in (self.tasks[:1] if self.parameter_server else self.tasks)]
    failed = [c for c in codes if c not in (0, PREEMPTED_EXIT_CODE)]
    if not failed:
      return PREEMPTED_EXIT_CODE if PREEMPTED_EXIT_CODE in codes else 0
    if failed[0] is None:  # not even SIGKILL ended it
      return 1
    return 128 - failed[0] if failed[0] < 0 else min(failed[0], 255)  # the shell's 128 + signal

  def _stop(self, stopping, quiet=False):
    """SIGTERM to each task's process group; SIGKILL after the grace period."""
    if not stopping:
      return
    for task in stopping:
      _signal_group(task, signal.SIGTERM)
    # A second signal (Ctrl-C twice) ends the grace period.
    self._wait(lambda: self._hurry or not any(t.running for t in stopping), self.grace)
    late = [t for t in stopping if t.running]
    if late and not quiet:
      self._say(f"{_names(late)} did not stop within --grace {self.grace:g} s of "
                "SIGTERM; sending SIGKILL")
    # Also the leftovers of tasks that did exit: processes they started.
    for task in stopping:
      _signal_group(task, signal.SIGKILL)
    self._wait(lambda: not any(t.running for t in stopping), _KILL_WAIT_SECONDS)

  def _wait(self, done, seconds):
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
      time.sleep(_POLL_SECONDS)

  def _catch_signals(self):
    """Turns SIGTERM, SIGINT and SIGHUP (a closed terminal) into a stop of every task."""
    if threading.current_thread() is not threading.main_thread():
      return {}  # Python delivers signals to the main thread only

    def handle(signum, frame):
      del frame
      # A second SIGINT or SIGTERM hurries; not a second SIGHUP, which a closed
      # terminal often sends.
      if self._signal is not None and signum != signal.SIGHUP:
        self._hurry = True
      self._signal = self._signal or signum

    # A signal ignored from the start stays ignored: a shell's background job
    # ignores SIGINT, so that a Ctrl-C meant for the foreground spares it, and
    # nohup SIGHUP.
    return {s: signal.signal(s, handle)
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
            if signal.getsignal(s) is not signal.SIG_IGN}

  def _say(self, message):
    _write(self.stderr, self._lock, f"ctl launch: {message}\n")


def launch(command: Sequence[str], **kwargs: Any) -> int:
  """Runs `command` as every task of a local cluster (`Launch`'s arguments); the exit code."""
  return Launch(command, **kwargs).run()


_watching = []  # the thread of `watch_launcher`, once started


def stopped_with_this_process(grace: float = 30) -> dict[str, str]:
  """The environment variables that make a ctl run started by this process stop
  when it is gone (see `watch_launcher`): what `ctl launch` gives its tasks, and
  `ctl sweep`, `ctl parity` and `ctl eval --across` their runs."""
  return {LAUNCHER_PID_VARIABLE: str(os.getpid()), GRACE_VARIABLE: f"{grace:g}"}


def watch_launcher(env: Mapping[str, str] | None = None, *,
                   poll_seconds: float = 1.0) -> None:
  """In a task of `ctl launch` (or `ctl sweep`, `ctl parity`, `ctl eval --across`):
  stop when the launcher is gone, even killed with SIGKILL.

  The tasks run in sessions of their own and would train on unseen. A thread
  checks every `poll_seconds` that the launcher lives; once it is gone the task
  sends itself SIGTERM (ctl saves and exits 42) and exits with code 1 if still
  running after the launcher's `--grace` seconds. Does nothing outside a
  launched task; starts one thread per process.
  """
  env = os.environ if env is None else env
  try:
    launcher = int(env[LAUNCHER_PID_VARIABLE])
    grace = float(env.get(GRACE_VARIABLE, "30"))
  except (KeyError, ValueError):
    return
  if _watching:
    return

  def watch():
    while _alive(launcher):
      time.sleep(poll_seconds)
    _write(sys.stderr, threading.Lock(), f"ctl: the process that started this one (pid "
           f"{launcher}) is gone; stopping (SIGTERM, then exit after {grace:g} s)\n")
    # Output to the launcher's pipes, closed now, would fail the save that SIGTERM
    # starts; output to a file (a sweep's train.log) still says how the run ended.
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
      with contextlib.suppress(OSError):
        if stat.S_IFMT(os.fstat(fd).st_mode) in (stat.S_IFIFO, stat.S_IFSOCK):
          os.dup2(devnull, fd)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    os._exit(1)  # pylint: disable=protected-access

  thread = threading.Thread(target=watch, name="ctl-launcher-watch", daemon=True)
  _watching.append(thread)
  thread.start()


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:  # a zombie (exited, not yet reaped by its parent) is gone too
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return True


def _signal_group(task, signum):
  with contextlib.suppress(ProcessLookupError, PermissionError):  # the group has exited
    os.killpg(task.process.pid, signum)


def _pump(pipe, prefix, stream, lock):
  with pipe:
    for line in iter(pipe.readline, b""):
      text = line.decode("utf-8", "replace")
      _write(stream, lock, prefix + (text if text.endswith("\n") else text + "\n"))


def _write(stream, lock, text):
  # Our output may be gone (a closed pipe): keep reading the task's output anyway,
  # or the task would block on a full pipe.
  with lock, contextlib.suppress(OSError, ValueError):
    stream.write(text)
    stream.flush()


def _names(tasks_):
  names = [str(t) for t in tasks_]
  return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _family(host):
  try:
    return socket.getaddrinfo(host, None)[0][0]
  except socket.gaierror as e:
    raise ValueError(f"host {host!r} cannot be resolved ({e.strerror}); use an "
                     "address of this machine, such as 127.0.0.1.") from None

