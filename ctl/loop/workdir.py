"""One writer per work directory: `Lock`; what a work directory argument means: `path`.

    workdir = path("~/runs/x")     # /home/me/runs/x; "" is refused
    lock = Lock("runs/x")          # WorkdirInUse if another run holds it
    ...
    if not lock.held():            # the directory was deleted or moved
      lock = Lock("runs/x")
    lock.release()

Two runs in one work directory would overwrite each other's checkpoints: `fit`
takes an advisory `flock` on `<workdir>/.ctl-lock`, which the kernel drops when
the process ends; the file names the holder for the next writer's message. On a
filesystem without `flock` the lock is only the file's contents.
"""

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time

LOCK_NAME = ".ctl-lock"
_log = logging.getLogger("ctl")


def path(workdir: str | os.PathLike | None, name: str = "workdir") -> str | None:
  """The directory `workdir` names: a leading `~` is the user's home, as in a
  shell (Python and TensorFlow would make a folder named `~`); None stays None. An
  empty path is a ValueError (`os.makedirs` says only `FileNotFoundError: ''`)."""
  if workdir is None:
    return None
  text = os.fspath(workdir)
  if not str(text).strip():
    raise ValueError(f"{name} is {text!r}, an empty path; give the run's directory, e.g. "
                     f"{name}='runs/x' (or None to write nothing).")
  return os.path.expanduser(text)


class WorkdirInUse(RuntimeError):
  """Another run holds the work directory's lock."""


class Lock:
  """Holds `<workdir>/.ctl-lock` (the directory made if missing) until `release()`;
  raises `WorkdirInUse`, naming the holder, if another live process holds it."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_NAME)
    os.makedirs(workdir, exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise WorkdirInUse(_in_use(workdir, holder)) from None
      except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
          os.close(fd)
          raise
        holder = _read(fd)  # no flock here: judge by the holder's process
        if holder and _alive(holder):
          os.close(fd)
          raise WorkdirInUse(_in_use(workdir, holder)) from None
      # A holder that released removed the file; the one locked must be at `path`.
      if _same_file(fd, self.path):
        break
      os.close(fd)
    previous = _read(fd)
    if previous and previous.get("pid") != os.getpid():
      _log.warning("workdir %s: taking over the lock file left by %s, which no longer "
                   "holds it (its process ended, or this directory is a copy)",
                   workdir, _describe(previous))
    self._fd = fd
    me = {"host": socket.gethostname(), "pid": os.getpid(),
          "start_time": _start_time(os.getpid()),
          "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode() + b"\n", 0)
    os.fsync(fd)

  def held(self) -> bool:
    """Whether the lock file is still this lock's (the directory was not deleted or moved)."""
    return self._fd is not None and _same_file(self._fd, self.path)

  def release(self) -> None:
    """Removes the lock file (if it is still this one) and unlocks."""
    if self._fd is None:
      return
    if self.held():
      os.remove(self.path)
    os.close(self._fd)  # drops the flock
    self._fd = None


def _read(fd):
  try:
    return json.loads(os.pread(fd, 65536, 0).decode() or "null")
  except (ValueError, UnicodeDecodeError):
    return None


def _same_file(fd, path):
  try:
    here, there = os.fstat(fd), os.stat(path)
  except FileNotFoundError:
    return False
  return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _start_time(pid):
  """The process's start time in clock ticks since boot (Linux), or None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def _alive(holder):
  """Whether the holder's process still runs (unknowable on another host: yes)."""
  if holder.get("host") != socket.gethostname():
    return True
  pid = holder.get("pid")
  if not isinstance(pid, int):
    return False
  start = _start_time(pid)
  # The same PID with another start time is a new process that reused it.
  return start is not None and start == holder.get("start_time", start)


def _describe(holder):
  return (f"process {holder.get('pid')} on {holder.get('host')} (since "
          f"{holder.get('since')}: {holder.get('command')})")


def _in_use(workdir, holder):
  who = _describe(holder) if holder else "another process"
  return (f"workdir {workdir!r} is in use by {who}: two runs writing one work "
          "directory overwrite each other's checkpoints. Stop that run first (it "
          "saves a checkpoint on SIGTERM), or pass another workdir.")
