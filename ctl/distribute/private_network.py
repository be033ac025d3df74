"""A private network for a local cluster: a Linux network namespace with loopback only.

    from ctl.distribute import private_network
    with private_network.PrivateNetwork() as network:   # PrivateNetworkUnavailable if refused
      subprocess.Popen(network.command(["ctl", "train", ...]))   # runs inside it

TensorFlow's gRPC servers listen on every interface whatever address TF_CONFIG
gives them, and run any graph sent to them. In this namespace, whose only
interface is loopback, the tasks reach one another on 127.0.0.1 and nothing else
reaches them, nor they anything else (docs/strategies.md: "Who can reach a cluster").

A holder process makes the namespace (a user other than root inside a user
namespace of their own, as `unshare --user --net` does) and keeps it until
closed; each command enters it through a small Python step that then executes
the command, so the process started keeps the command's PID and process group.
Linux only.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import subprocess
import sys
from collections.abc import Sequence

# Seconds for the holder to make the namespace: a Python start-up and a few system calls.
_HOLDER_SECONDS = 30

# The holder: makes the namespace, brings loopback up, says "ready", then holds
# the namespace until its stdin closes (the owner closed it, or died).
_HOLD = r"""
import ctypes, errno, fcntl, os, socket, struct, sys
NEWUSER, NEWNET = 0x10000000, 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
def fail(step, code=None):
  code = ctypes.get_errno() if code is None else code
  sys.stderr.write("%s: %s" % (step, os.strerror(code)))
  sys.exit(1)
uid, gid = os.geteuid(), os.getegid()
# Root makes a network namespace only (a user namespace would take its rights to
# other users' files); a container's root may lack that right, as does any
# other user, who makes a user namespace to hold the network namespace.
tries = [NEWNET, NEWUSER | NEWNET] if uid == 0 else [NEWUSER | NEWNET]
for flags in tries:
  if libc.unshare(flags) == 0:
    break
else:  # the last try is always the user namespace's
  fail("unshare(CLONE_NEWUSER | CLONE_NEWNET)")
if flags & NEWUSER:
  # Only this user and group, as themselves: files keep their owners.
  try:
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                       ("gid_map", "%d %d 1" % (gid, gid))):
      with open("/proc/self/" + name, "w") as f:
        f.write(text)
  except OSError as e:
    fail("writing /proc/self/" + name, e.errno)
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, IFF_UP = 0x8913, 0x8914, 0x8916, 0x1
IFREQ_FLAGS, IFREQ_ADDRESS = "16sh22x", "16sH2s4s16x"
try:
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack(IFREQ_FLAGS, fcntl.ioctl(s, SIOCGIFFLAGS,
                                                   struct.pack(IFREQ_FLAGS, b"lo", 0)))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ_FLAGS, b"lo", flags | IFF_UP))
    # A second loopback address, 127.0.0.2 (as the alias lo:1): glibc's
    # getaddrinfo with AI_ADDRCONFIG and AF_INET finds no address where
    # 127.0.0.1 is the only one, which fails e.g. Slurm's daemons and srun.
    fcntl.ioctl(s, SIOCSIFADDR, struct.pack(IFREQ_ADDRESS, b"lo:1", socket.AF_INET, b"",
                                            socket.inet_aton("127.0.0.2")))
except OSError as e:
  fail("bringing up loopback", e.errno)
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.read()
"""

# A command's way in: argv[1] the holder's PID, argv[2] the program's path, the
# rest its argv. Joins the holder's namespaces, then becomes the program.
_ENTER = r"""
import ctypes, os, signal, sys
NEWUSER, NEWNET = 0x10000000, 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
holder, program, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
for kind, flag in (("user", NEWUSER), ("net", NEWNET)):  # the user namespace first
  path = "/proc/%s/ns/%s" % (holder, kind)
  try:
    if os.readlink(path) == os.readlink("/proc/self/ns/" + kind):
      continue
    fd = os.open(path, os.O_RDONLY)
  except OSError as e:
    code = e.errno
  else:
    code = 0 if libc.setns(fd, flag) == 0 else ctypes.get_errno()
    os.close(fd)
  if code:
    sys.stderr.write("ctl: cannot enter the cluster's private network (%s namespace of "
                     "pid %s: %s); not running %s\n" % (kind, holder, os.strerror(code), program))
    sys.exit(126)
# Python ignores these two; an ignored signal stays ignored across exec, and the
# program must start as it would without this step (as subprocess leaves it).
for name in ("SIGPIPE", "SIGXFSZ"):
  signal.signal(getattr(signal, name), signal.SIG_DFL)
os.execv(program, argv)
"""


class PrivateNetworkUnavailable(OSError):
  """This system refuses a private network namespace; the message says which step."""


class PrivateNetwork:
  """A network namespace with loopback only, for as long as this object is open.

  Raises:
    PrivateNetworkUnavailable: naming the refused step (e.g. `unshare(CLONE_NEWUSER
      | CLONE_NEWNET): Operation not permitted`) where namespaces are disabled.
  """

  def __init__(self) -> None:
    if not sys.platform.startswith("linux"):
      raise PrivateNetworkUnavailable("network namespaces are Linux's")
    # This interpreter, isolated and without site-packages: the standard library will do.
    try:
      self._holder = subprocess.Popen(
          [sys.executable, "-I", "-S", "-c", _HOLD], stdin=subprocess.PIPE,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          start_new_session=True)  # a Ctrl-C at the terminal spares it
    except OSError as e:
      raise PrivateNetworkUnavailable(f"cannot start {sys.executable}: {e.strerror}") from None
    ready = select.select([self._holder.stdout], [], [], _HOLDER_SECONDS)[0]
    if ready and self._holder.stdout.readline() == b"ready\n":
      return
    self._holder.kill()
    _, error = self._holder.communicate()
    reason = error.decode("utf-8", "replace").strip().splitlines()
    raise PrivateNetworkUnavailable(reason[-1] if reason else "its holder process "
                                    f"did not start within {_HOLDER_SECONDS} s")

  @property
  def pid(self) -> int:
    """The holder's PID: `/proc/<pid>/ns/net` is the namespace."""
    return self._holder.pid

  def command(self, argv: Sequence[str], program: str | None = None) -> list[str]:
    """The argv that runs `argv` inside the namespace; `program`, the path to execute, is
    `argv[0]` by default: look it up first, to report a missing one before anything starts."""
    return [sys.executable, "-I", "-S", "-c", _ENTER, str(self.pid), program or argv[0], *argv]

  def close(self) -> None:
    """Lets the holder go; the namespace ends with the last process in it."""
    if self._holder.poll() is None:
      self._holder.stdin.close()
      self._holder.wait()
    for pipe in (self._holder.stdin, self._holder.stdout, self._holder.stderr):
      pipe.close()

  def __enter__(self) -> PrivateNetwork:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()


def is_loopback(host: str) -> bool:
  """Whether `host` (an address or a name) means this machine's loopback only."""
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    pass
  try:
    addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
  except socket.gaierror:
    return False
  return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                                 for a in addresses)
