"""Waiting for a cluster's peers: bounded in time, and stopped by SIGTERM or Ctrl-C.

    peers, me = cluster_peers(cluster, "worker", 0)   # [("worker 1", "host:port")], "host:port"
    wait_for_peers(peers, me, timeout=600)    # SystemExit naming the missing ones
    with watchdog(remaining_seconds, message):
      strategy = tf.distribute.MultiWorkerMirroredStrategy()

TensorFlow's multi-worker strategy waits in its constructor until every peer
has joined, forever if one never starts, holding Python's interpreter lock: only
SIGKILL ends it. So ctl first waits in Python, where SIGTERM and Ctrl-C work,
until every peer listens on its port (listening on its own meanwhile), then
builds the strategy under a watchdog process that kills this one, with a
message, if the constructor still hangs (a peer that died after it was seen).

The limits are `make_strategy`'s `startup_timeout` and `heartbeat_timeout`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence

from ctl.base import arguments
from ctl.base.constants import HEARTBEAT_TIMEOUT_VARIABLE
from ctl.base.constants import STARTUP_TIMEOUT_VARIABLE

DEFAULT_STARTUP_TIMEOUT = 600.0  # pods of one job may start minutes apart
# TF's own 10 s fails runs on a loaded machine, where a busy peer can be silent
# longer (tests/test_faults.py); JAX, XLA's other user of this service, waits 100 s.
DEFAULT_HEARTBEAT_TIMEOUT = 60.0
STARTUP_FAILED_EXIT_CODE = 1
_POLL_SECONDS = 0.5


def startup_timeout(value: float | None = None,
                    env: Mapping[str, str] | None = None) -> float:
  """The start-up time limit in seconds: `value`, the variable, or the default."""
  return _seconds("startup_timeout", value, STARTUP_TIMEOUT_VARIABLE, DEFAULT_STARTUP_TIMEOUT,
                  env, minimum=0, example="600 (0 waits forever)")


def heartbeat_timeout(value: float | None = None,
                      env: Mapping[str, str] | None = None) -> float:
  """Seconds without heartbeats before a peer is dead: `value`, the variable, or 60."""
  return _seconds("heartbeat_timeout", value, HEARTBEAT_TIMEOUT_VARIABLE,
                  DEFAULT_HEARTBEAT_TIMEOUT, env, minimum=1, example="60")


def _seconds(name, value, variable, default, env, *, minimum, example):
  meaning = "seconds; 0 waits forever" if minimum == 0 else "seconds"
  if value is not None:
    return arguments.number(name, value, minimum=minimum, meaning=meaning)
  text = (os.environ if env is None else env).get(variable, "")
  if not text.strip():
    return default
  try:
    seconds = float(text)
  except ValueError:
    raise arguments.VariableError(f"{variable}={text!r} is not a number of seconds; "
                                  f"set it to e.g. {example}.") from None
  try:
    return arguments.number(variable, seconds, minimum=minimum, meaning=meaning)
  except ValueError as e:  # out of range
    raise arguments.VariableError(str(e)) from None


def cluster_peers(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int
                  ) -> tuple[list[tuple[str, str]], str | None]:
  """([(name, address)] of the other tasks of `cluster`, this task's address)."""
  others = [(f"{job} {i}", address) for job, addresses in cluster.items()
            for i, address in enumerate(addresses) if (job, i) != (task_type, task_index)]
  return others, cluster.get(task_type, [None] * (task_index + 1))[task_index]


def wait_for_peers(peers: Sequence[tuple[str, str]], address: str | None, timeout: float, *,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> float:
  """Returns once every peer accepts a connection; seconds left of `timeout`.

  Meanwhile this task listens on its own `address` (its TF server is not up
  yet), so that peers waiting here for it find it.

  Raises:
    SystemExit: with a message naming the peers that never answered, after
      `timeout` seconds (none if 0), or at SIGTERM or Ctrl-C (128 + signal).
  """
  deadline = clock() + timeout if timeout else float("inf")
  waiting = list(peers)
  with _signals_exit(waiting), _listening(address):
    for attempt in itertools.count():
      waiting[:] = [(name, address) for name, address in waiting if not _listens(address)]
      if not waiting:
        return max(0.0, deadline - clock()) if timeout else 0.0
      if not attempt:
        limit = f"up to {timeout:g} s" if timeout else "with no time limit"
        _write(f"ctl: waiting {limit} for the cluster's other tasks: {_names(waiting)}")
      if clock() >= deadline:
        _write(f"ctl: gave up after waiting {timeout:g} s for the cluster's other "
               f"tasks: {_names(waiting)} never answered. Start every task of the "
               "cluster (TF_CONFIG), check the addresses and the network between "
               f"them, or raise the limit ({STARTUP_TIMEOUT_VARIABLE} or "
               "make_strategy(startup_timeout=...); 0 waits forever).")
        raise SystemExit(STARTUP_FAILED_EXIT_CODE)
      sleep(_POLL_SECONDS)


@contextlib.contextmanager
def watchdog(seconds: float | None, message: str) -> Iterator[None]:
  """Kills this process after `seconds` (with `message`) unless the block ends (None or 0:
  never). A separate process watches the clock: the call holds the interpreter lock."""
  if not seconds:
    yield
    return
  process = subprocess.Popen(
      [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(seconds), message],
      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
  try:
    yield
  finally:
    process.stdin.close()  # the watchdog reads end-of-file and leaves
    process.wait()


# The watchdog process: waits for its stdin to close, or for the time to pass.
_WATCHDOG = """
import os, select, signal, sys
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if not select.select([sys.stdin], [], [], seconds)[0]:
  sys.stderr.write(message + "\\n"); sys.stderr.flush()
  os.kill(pid, signal.SIGKILL)
"""


@contextlib.contextmanager
def _signals_exit(waiting):
  """SIGTERM or SIGINT meanwhile: a line naming the peers waited for, then exit."""

  def leave(signum, frame):
    del frame
    name = signal.Signals(signum).name
    _write(f"ctl: {name} while waiting for the cluster's other tasks "
           f"({_names(waiting)} not there yet); nothing was trained, exiting.")
    raise SystemExit(128 + signum)

  previous = {}
  with contextlib.suppress(ValueError):  # not the main thread: signals keep their handlers
    for signum in (signal.SIGTERM, signal.SIGINT):
      if signal.getsignal(signum) is not signal.SIG_IGN:
        previous[signum] = signal.signal(signum, leave)
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def _listening(address):
  """A placeholder listener on `address` while TF's server is not up: on its host only,
  or on every interface if the host is no address here (a name not yet in DNS). A port
  taken or missing: nothing listens (the peers name this task, TF the port)."""
  host, _, port = (address or "").rpartition(":")
  if not port.isdigit():
    return contextlib.nullcontext()
  host, port = host.strip("[]"), int(port)
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  try:
    return socket.create_server((host, port), family=family)
  except socket.gaierror:
    pass  # a name this machine cannot resolve (yet)
  except OSError as e:
    if e.errno != errno.EADDRNOTAVAIL:
      return contextlib.nullcontext()
  try:
    return socket.create_server(("", port), family=family,
                                dualstack_ipv6=family == socket.AF_INET6)
  except OSError:
    return contextlib.nullcontext()


def _listens(address):
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
      return True
  except (OSError, ValueError):
    return False


def _names(peers):
  return ", ".join(f"{name} at {address}" for name, address in peers)


def _write(line):
  sys.stderr.write(line + "\n")
  sys.stderr.flush()
