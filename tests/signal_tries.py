"""Many runs of tests/resume_task.py, each stopped by a signal: does each exit, with its code?

    python tests/signal_tries.py --tries SIGTERM,SIGINT,SIGHUP --repeat 10 --dir D \
        [--again SIGTERM,SIGHUP] -- --pause-in eval-python --pause-at 1

TensorFlow is imported once, here; each try is a child forked from this
process that runs resume_task's `main` with the arguments after `--` and then
exits as a script does, through the interpreter's own exit. A try waits for
the child's "PAUSED" line, sends its signal after 0 to 300 ms (seeded by the
try's number), and, for the signals named by `--again`, the same once more 0.5 s after the
child's "exiting with code" line or its Ctrl-C line (while it exits). Two children run at a
time. A child still running 90 s after its signal is a hang: it is killed.
Prints one JSON line per try: its signal, exit code (None for a hang), the
seconds from the signal to the exit, and the end of its output.
"""

import argparse
import json
import os
import random
import select
import signal
import sys
import time

import keras  # noqa: F401  (imported once, here, for every child)
import resume_task
import tensorflow  # noqa: F401

from ctl import cli

HANG_SECONDS = 90


def parse_args():
  p = argparse.ArgumentParser()
  p.add_argument("--tries", required=True, help="signal names, comma-separated")
  p.add_argument("--repeat", type=int, default=1)
  p.add_argument("--dir", required=True)
  p.add_argument("--again", default="", help="the signals sent twice, comma-separated")
  p.add_argument("task_args", nargs=argparse.REMAINDER)
  args = p.parse_args()
  args.task_args = [a for a in args.task_args if a != "--"]
  return args


class Try:
  """One forked child: its output, its signals, its end."""

  def __init__(self, number, name, args, again):
    self.number, self.name, self.again = number, name, again
    self.signum = getattr(signal, name)
    self.delay = random.Random(number).uniform(0, 0.3)
    workdir = os.path.join(args.dir, f"try-{number}")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: resume_task, then the interpreter's own exit
      os.close(read)
      os.dup2(write, 1)
      os.dup2(write, 2)
      signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, even under nohup
      sys.argv = ["resume_task.py", "--workdir", workdir, "--out",
                  os.path.join(workdir, "out.npz")] + args.task_args
      with cli.log_to_stderr():
        resume_task.main()
      sys.exit(0)
    os.close(write)
    self.pid, self.fd = pid, read
    self.output, self.sent, self.sent_again, self.code, self.seconds = "", None, False, None, None
    self.paused_at = self.stopping_at = None

  def read(self):
    data = os.read(self.fd, 65536).decode(errors="replace")
    self.output += data
    return bool(data)

  def step(self, now):
    """Sends what is due; returns True when the child has ended."""
    if self.paused_at is None and "PAUSED" in self.output:
      self.paused_at = now
    if self.sent is None and self.paused_at is not None and now >= self.paused_at + self.delay:
      os.kill(self.pid, self.signum)
      self.sent = now
    if self.stopping_at is None and ("exiting with code" in self.output
                                     or "Ctrl-C: saved" in self.output):
      self.stopping_at = now
    if (self.again and not self.sent_again and self.stopping_at is not None
        and now >= self.stopping_at + 0.5):
      os.kill(self.pid, self.signum)
      self.sent_again = True
    pid, status = os.waitpid(self.pid, os.WNOHANG)
    if pid:
      self.code = os.waitstatus_to_exitcode(status)
      self.seconds = None if self.sent is None else now - self.sent
      return True
    if self.sent is not None and now - self.sent > HANG_SECONDS:
      os.kill(self.pid, signal.SIGKILL)
      os.waitpid(self.pid, 0)
      self.seconds = now - self.sent
      return True
    return False

  def record(self):
    return {"try": self.number, "signal": self.name, "again": self.sent_again,
            "exit": self.code, "seconds": self.seconds, "tail": self.output[-1500:]}


def main():
  args = parse_args()
  plan = [name for _ in range(args.repeat) for name in args.tries.split(",")]
  running, number = [], 0
  while plan or running:
    while plan and len(running) < 2:
      name = plan.pop(0)
      running.append(Try(number, name, args, name in args.again.split(",")))
      number += 1
    ready, _, _ = select.select([t.fd for t in running], [], [], 0.02)
    now = time.monotonic()
    for t in list(running):
      if t.fd in ready:
        t.read()
      if t.step(now):
        while t.read():  # what is left in the pipe
          pass
        os.close(t.fd)
        running.remove(t)
        print(json.dumps(t.record()), flush=True)


if __name__ == "__main__":
  main()
