"""`ctl launch` without TensorFlow: tiny Python tasks play the cluster.

Each task runs `CHILD` below, which does what a per-task plan says (become
ready, print, exit with a code, ignore SIGTERM, start a grandchild), so the
tests can make a task fail, hang or never become ready on purpose. The real
multi-worker runs are in tests/test_multi_worker.py.
"""

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ctl.distribute import launch
from ctl.distribute import private_network

import helpers
from helpers import ROOT
from helpers import alive
from helpers import subprocess_env

# A task of the test cluster. argv[1]: {"<type>-<index>": plan} (JSON), where a
# plan may hold: ready (default true), lines (stdout and stderr lines to
# print), ignore_term, grandchild (file to write a sleeping grandchild's pid
# to), dump (directory to write what the task got to), wait_for (files to
# wait for; a relative name is a task's ready file, e.g. "worker-0", written
# after its SIGTERM handling is set), sleep (seconds before exiting), exit
# (code, default 0), kill_self, listen (on a free port of every interface, as
# TensorFlow's server does), then (the plans of the cluster's restarts 1, 2,
# ..., the last one repeated). A task that must act after another has
# done something waits for that instead of sleeping a guess.
CHILD = r"""
import json, os, signal, socket, subprocess, sys, time
config = json.loads(os.environ["TF_CONFIG"])
name = "%s-%d" % (config["task"]["type"], config["task"]["index"])
plan = json.loads(sys.argv[1]).get(name, {})
restarts = int(os.environ["CTL_LAUNCH_RESTARTS"])
if restarts and plan.get("then"):
  plan = plan["then"][min(restarts, len(plan["then"])) - 1]
dump = plan.get("dump")
if dump:
  with open(os.path.join(dump, name + ".json"), "w") as f:
    json.dump({"TF_CONFIG": config, "ready_dir": os.environ["CTL_LAUNCH_READY_DIR"],
               "ready_dir_exists": os.path.isdir(os.environ["CTL_LAUNCH_READY_DIR"]),
               "restarts": restarts}, f)
if plan.get("ignore_term"):
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
if plan.get("grandchild"):
  g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
  with open(plan["grandchild"] + ".tmp", "w") as f:
    f.write(str(g.pid))
  os.replace(plan["grandchild"] + ".tmp", plan["grandchild"])  # whole when it appears
if plan.get("listen"):
  family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
  server = socket.create_server(("", 0), family=family, dualstack_ipv6=family == socket.AF_INET6)
for i in range(plan.get("lines", 0)):
  print("%s out %d %s" % (name, i, "x" * 200))
  print("%s err %d" % (name, i), file=sys.stderr)
if plan.get("partial"):
  sys.stdout.write("no newline at the end")
  sys.stdout.flush()
if plan.get("ready", True):
  open(os.path.join(os.environ["CTL_LAUNCH_READY_DIR"], name), "w").close()
waits = [os.path.join(os.environ["CTL_LAUNCH_READY_DIR"], p) for p in plan.get("wait_for", [])]
deadline = time.monotonic() + 60
while not all(map(os.path.exists, waits)) and time.monotonic() < deadline:
  time.sleep(0.01)
time.sleep(plan.get("sleep", 0))
if plan.get("kill_self"):
  os.kill(os.getpid(), signal.SIGKILL)
sys.exit(plan.get("exit", 0))
"""

# Seconds a task sleeps when the launcher must stop it. A run that ends sooner
# shows that the launcher stopped it: the time bounds below are FOREVER, derived
# from what is checked, not guesses of this machine's speed, and the messages
# tell how the launcher stopped each task (SIGTERM alone, or SIGKILL after --grace).
FOREVER = 300
# Start-up margins. A CHILD task is a bare Python process; from its start to its
# ready file or its exit took at most 0.3 s here with the whole suite running on
# both cores (20 repetitions of this file under tests that train, issue 19), so
# a task given STARTUP seconds for that has a margin of 20x.
STARTUP = 6


def run(plans, **kwargs):
  """Launches CHILD with `plans`; returns (exit code, stdout, stderr, seconds)."""
  out, err = io.StringIO(), io.StringIO()
  kwargs.setdefault("grace", 5)
  kwargs.setdefault("startup_timeout", 30)
  start = time.monotonic()
  code = launch.launch([sys.executable, "-c", CHILD, json.dumps(plans)],
                       stdout=out, stderr=err, **kwargs)
  return code, out.getvalue(), err.getvalue(), time.monotonic() - start


def gone(pid, within=10):
  """Whether process `pid` is gone within `within` seconds.

  A process sent SIGKILL dies once the kernel next schedules it, which on a
  loaded machine can be after the sender has moved on; `within` only bounds a
  wait that takes milliseconds.
  """
  deadline = time.monotonic() + within
  while alive(pid):
    if time.monotonic() > deadline:
      return False
    time.sleep(0.01)
  return True


def pids(err):
  """{task name: pid} from the launcher's "started ..." line."""
  return {name: int(pid) for name, pid in re.findall(r"(\w+(?: \d+)?) \(pid (\d+)\)", err)}


def test_cluster_spec_tasks_and_tf_config():
  assert launch.cluster_spec(2, ports=[4001, 4002]) == {
      "worker": ["127.0.0.1:4001", "127.0.0.1:4002"]}
  cluster = launch.cluster_spec(2, ps=1, host="::1", ports=[1, 2, 3, 4])
  assert cluster == {"chief": ["[::1]:1"], "worker": ["[::1]:2", "[::1]:3"],
                     "ps": ["[::1]:4"]}
  assert launch.tasks(cluster) == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
  assert json.loads(launch.tf_config(cluster, "worker", 1)) == {
      "cluster": cluster, "task": {"type": "worker", "index": 1}}
  free = launch.cluster_spec(3)["worker"]
  assert len(set(free)) == 3 and all(a.startswith("127.0.0.1:") for a in free)
  with pytest.raises(ValueError, match=r"ports has 1 entries but the cluster has 2 tasks"):
    launch.cluster_spec(2, ports=[1])


def test_describe_exit_names_the_signal():
  assert launch.describe_exit(3) == "code 3"
  assert launch.describe_exit(-9) == "code -9 (killed by SIGKILL)"
  assert launch.describe_exit(-15) == "code -15 (killed by SIGTERM)"


@pytest.mark.parametrize("workers,ps", [(2, 0), (2, 1)])
def test_every_task_gets_its_tf_config_and_the_ready_dir(tmp_path, workers, ps):
  names = [f"{t}-{i}" for t, i in launch.tasks(launch.cluster_spec(workers, ps))]
  plans = {name: {"dump": str(tmp_path)} for name in names}
  # A parameter-server cluster ends with its chief: let the others write first.
  plans[names[0]]["wait_for"] = [str(tmp_path / f"{name}.json") for name in names]
  code, _, err, _ = run(plans, workers=workers, ps=ps)
  assert code == 0, err
  seen = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in names}
  cluster = seen[names[0]]["TF_CONFIG"]["cluster"]
  assert sorted(cluster) == (["chief", "ps", "worker"] if ps else ["worker"])
  addresses = [a for job in cluster.values() for a in job]
  assert len(addresses) == workers + ps + (1 if ps else 0)
  assert len(set(addresses)) == len(addresses)  # a port per task
  assert all(a.startswith("127.0.0.1:") for a in addresses)
  for name, got in seen.items():
    task_type, index = name.rsplit("-", 1)
    assert got["TF_CONFIG"] == {"cluster": cluster,
                                "task": {"type": task_type, "index": int(index)}}
    assert got["ready_dir_exists"]
  ready_dirs = {got["ready_dir"] for got in seen.values()}
  assert len(ready_dirs) == 1
  assert not os.path.exists(ready_dirs.pop())  # removed at the end


@pytest.mark.parametrize("network", ["private", "shared"])
def test_in_a_private_network_the_tasks_listen_where_no_one_else_reaches(tmp_path, network):
  # Each task listens on every interface, as TensorFlow's server does whatever
  # TF_CONFIG names, and waits until the test has seen both sockets.
  seen = tmp_path / "seen"
  plans = {f"worker-{i}": {"listen": True, "wait_for": [str(seen)]} for i in (0, 1)}
  found = []

  def look():
    deadline = time.monotonic() + 60
    while len(found) < 2 and time.monotonic() < deadline:
      found[:] = [s for s in helpers.listeners(helpers.descendants([os.getpid()]))
                  if s.pid != os.getpid()]
      time.sleep(0.02)
    seen.touch()

  looking = threading.Thread(target=look)
  looking.start()
  code, _, err, _ = run(plans, network=network)
  looking.join()
  assert code == 0, err
  assert len(found) == 2 and {s.address for s in found} <= {"::", "0.0.0.0"}, found
  if network == "private":
    assert "the tasks share a private network (loopback only)" in err, err
    assert all(s.private and not s.outside for s in found), found
  else:
    assert "the tasks use this machine's network, where TensorFlow's servers listen" in err
    # The check sees what a shared network exposes (if this machine has a network).
    exposed = not helpers.only_loopback(os.getpid())
    assert all(not s.private and s.outside == exposed for s in found), found


def test_a_command_enters_a_private_network_as_itself():
  # Its PID, its ignored signals (the step that enters, a Python process, ignores
  # SIGPIPE and SIGXFSZ), its network: loopback only, where a lookup with
  # AI_ADDRCONFIG finds an address (glibc's ignores 127.0.0.1: Slurm needs it).
  show = ["sh", "-c", "echo $$; grep SigIgn /proc/self/status; "
          "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '"]
  lookup = [sys.executable, "-c", "import socket as s; print(s.getaddrinfo(None, 1, s.AF_INET, "
            "s.SOCK_STREAM, 0, s.AI_PASSIVE | s.AI_ADDRCONFIG)[0][4][0])"]
  plain = subprocess.run(show, capture_output=True, text=True).stdout.splitlines()
  with private_network.PrivateNetwork() as network:
    proc = subprocess.Popen(network.command(show, shutil.which("sh")), stdout=subprocess.PIPE,
                            text=True)
    inside = proc.communicate()[0].splitlines()
    found = subprocess.run(network.command(lookup), capture_output=True, text=True)
  assert inside[0] == str(proc.pid), inside
  assert inside[1] == plain[1], (inside, plain)  # as without the step
  assert inside[2:] == ["lo"], inside
  assert found.stdout.strip() == "0.0.0.0", found.stderr


def test_a_private_network_needs_a_loopback_host():
  command = [sys.executable, "-c", "pass"]
  with pytest.raises(ValueError, match=r"host '192.0.2.1' is not a loopback address, and a "
                     r"private network has loopback only; use --host 127.0.0.1, or "
                     r"--network shared"):
    launch.Launch(command, host="192.0.2.1", network="private")
  # "auto" takes a host that is not loopback as a wish for this machine's network.
  assert launch.Launch(command, host="0.0.0.0", network="auto").network == "shared"
  assert launch.Launch(command, host="localhost", network="auto").network == "auto"
  with pytest.raises(ValueError, match=r"network must be one of auto, private, shared, got "
                     r"'public'"):
    launch.Launch(command, network="public")


def test_output_is_prefixed_line_by_line_and_complete():
  lines = 3000  # ~600 kB per task: far more than a pipe holds
  plans = {"worker-0": {"lines": lines, "partial": True}, "worker-1": {"lines": lines}}
  code, out, err, _ = run(plans)
  assert code == 0, err[-2000:]
  out_lines, err_lines = out.splitlines(), err.splitlines()
  for i in range(2):
    mine = [line for line in out_lines if line.startswith(f"[worker {i}] ")]
    expected = [f"[worker {i}] worker-{i} out {k} {'x' * 200}" for k in range(lines)]
    assert mine[:lines] == expected
    mine = [line for line in err_lines if line.startswith(f"[worker {i}] ")]
    assert mine == [f"[worker {i}] worker-{i} err {k}" for k in range(lines)]
  assert "[worker 0] no newline at the end" in out_lines
  assert all(line.startswith(("[worker 0] ", "[worker 1] ")) for line in out_lines)
  assert all(line.startswith(("[worker 0] ", "[worker 1] ", "ctl launch: ")) for line in err_lines)


def test_a_failed_task_stops_the_others_and_its_grandchildren(tmp_path):
  grandchild = tmp_path / "grandchild"
  plans = {"worker-0": {"sleep": FOREVER, "grandchild": str(grandchild)},
           "worker-1": {"wait_for": [str(grandchild)], "exit": 3}}
  code, _, err, seconds = run(plans, grace=FOREVER)
  assert code == 3, err
  started = pids(err)
  assert re.search(r"ctl launch: worker 1 \(pid \d+\) exited with code 3; stopped the "
                   r"others\n", err), err
  # Worker 0 obeys SIGTERM: the launcher does not wait out the grace period.
  assert "did not stop within --grace" not in err and seconds < FOREVER
  assert not alive(started["worker 0"])  # the launcher waited for it
  assert gone(int(grandchild.read_text()))


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
  plans = {"worker-0": {"sleep": FOREVER, "ignore_term": True},
           "worker-1": {"wait_for": ["worker-0"], "kill_self": True}}
  code, _, err, seconds = run(plans, grace=1)
  assert code == 1, err  # a signal is no exit code to pass on
  assert re.search(r"worker 1 \(pid \d+\) exited with code -9 \(killed by SIGKILL\); "
                   r"stopped the others", err), err
  assert "worker 0 (pid" in err
  assert "did not stop within --grace 1 s of SIGTERM; sending SIGKILL" in err
  assert 1 <= seconds < FOREVER  # at least the grace period; then SIGKILL
  assert not alive(pids(err)["worker 0"])


def test_startup_timeout_names_the_task_never_ready_and_stops_all():
  plans = {"worker-0": {"sleep": FOREVER},
           "worker-1": {"sleep": FOREVER, "ready": False, "ignore_term": True}}
  code, _, err, seconds = run(plans, startup_timeout=STARTUP, grace=1)
  assert code == 1
  message = re.search(rf"ctl launch: (.*) did not become ready within --startup-timeout "
                      rf"{STARTUP} s; stopped all tasks", err)
  assert message, err
  assert re.fullmatch(r"worker 1 \(pid \d+\)", message.group(1))  # not worker 0
  assert "raise --startup-timeout" in err
  assert STARTUP <= seconds < FOREVER
  assert not any(alive(pid) for pid in pids(err).values())


def test_a_task_that_exits_0_before_being_ready_is_fine():
  # Worker 0 exits within STARTUP; worker 1 outlives the start-up timeout (it
  # starts after the launcher's clock does): worker 0 must count as ready.
  code, _, err, seconds = run({"worker-0": {"ready": False},
                               "worker-1": {"sleep": STARTUP + 1}},
                              startup_timeout=STARTUP)
  assert code == 0, err
  assert "all 2 tasks are ready" in err
  assert seconds > STARTUP + 1


def test_every_worker_preempted_exits_42():
  # Worker 1 exits 42 a little after worker 0; the grace period the launcher
  # gives it to follow is FOREVER, so how much later does not matter.
  code, _, err, _ = run({"worker-0": {"exit": 42}, "worker-1": {"sleep": 0.5, "exit": 42}},
                        grace=FOREVER)
  assert code == launch.PREEMPTED_EXIT_CODE == 42, err
  assert "rerun the same command to resume" in err


def test_a_worker_that_does_not_follow_a_preemption_is_stopped():
  code, _, err, seconds = run({"worker-0": {"exit": 42}, "worker-1": {"sleep": FOREVER}},
                              grace=1)
  assert code == 1, err
  assert re.search(r"worker 0 \(pid \d+\) exited with code 42 \(preempted\) but worker 1 "
                   r"\(pid \d+\) did not exit within --grace 1 s", err), err
  assert seconds < FOREVER


def test_parameter_server_cluster_succeeds_when_the_chief_exits_0():
  plans = {"chief-0": {"sleep": 0.5}, "worker-0": {"sleep": FOREVER},
           "worker-1": {"sleep": FOREVER}, "ps-0": {"sleep": FOREVER}}
  code, _, err, seconds = run(plans, workers=2, ps=1)
  assert code == 0, err
  assert "chief exited with code 0; stopped the workers and parameter servers" in err
  assert "did not stop within --grace" not in err and seconds < FOREVER
  started = pids(err)
  assert sorted(started) == ["chief", "ps 0", "worker 0", "worker 1"]
  assert not any(alive(pid) for pid in started.values())


def test_parameter_server_cluster_fails_with_the_chief():
  plans = {"chief-0": {"sleep": 0.5, "exit": 5}, "worker-0": {"sleep": FOREVER},
           "ps-0": {"sleep": FOREVER}}
  code, _, err, _ = run(plans, workers=1, ps=1)
  assert code == 5
  assert re.search(r"chief \(pid \d+\) exited with code 5; stopped the others", err), err


def test_a_cluster_that_failed_is_restarted_whole(tmp_path):
  # First cluster: worker 0 fails once worker 1 is up; the restart succeeds.
  d = str(tmp_path)
  plans = {"worker-0": {"wait_for": ["worker-1"], "exit": 3, "then": [{"dump": d}]},
           "worker-1": {"sleep": FOREVER, "then": [{"dump": d}]}}
  code, _, err, seconds = run(plans, max_restarts=2, restart_wait=0)
  assert code == 0, err
  assert re.search(r"restart 1 of 2 in 0 s: worker 0 exited with code 3\n", err), err
  assert "1 restart(s) of 2 used; the causes: worker 0 exited with code 3" in err
  assert seconds < FOREVER  # worker 1 of the first cluster was stopped, not awaited
  first, second = re.findall(r"started (.*); ports", err)
  assert first != second  # new processes (and new free ports)
  for name in ("worker-0", "worker-1"):
    with open(os.path.join(d, name + ".json")) as f:
      assert json.load(f)["restarts"] == 1
  assert not any(alive(pid) for pid in pids(first).values())


@pytest.mark.parametrize("restart_workers", [1, 3])
def test_a_restart_may_start_fewer_or_more_workers(tmp_path, restart_workers):
  d = str(tmp_path)
  plans = {"worker-0": {"wait_for": ["worker-1"], "exit": 3, "then": [{"dump": d}]},
           "worker-1": {"sleep": FOREVER, "then": [{"dump": d}]},
           "worker-2": {"dump": d}}
  code, _, err, _ = run(plans, max_restarts=1, restart_wait=0, restart_workers=restart_workers)
  assert code == 0, err
  assert (f"restart 1 of 1 in 0 s: worker 0 exited with code 3; on {restart_workers} "
          "worker(s), not 2\n") in err, err
  assert sorted(os.listdir(d)) == [f"worker-{i}.json" for i in range(restart_workers)]
  for i in range(restart_workers):
    with open(os.path.join(d, f"worker-{i}.json")) as f:
      config = json.load(f)["TF_CONFIG"]
    assert len(config["cluster"]["worker"]) == restart_workers and config["task"]["index"] == i


def test_a_restart_on_a_number_of_workers_the_run_refuses_says_so():
  # As a run whose global batch 3 workers do not divide exits 2 on its restart.
  plans = {"worker-0": {"wait_for": ["worker-1"], "exit": 3, "then": [{"exit": 2}]},
           "worker-1": {"sleep": FOREVER, "then": [{"exit": 2}]}, "worker-2": {"exit": 2}}
  code, _, err, _ = run(plans, max_restarts=2, restart_wait=0, restart_workers=3)
  assert code == 2, err
  assert "restart 2" not in err
  assert ("the cluster restarted on 3 worker(s) exited 2, a usage error: a run may refuse "
          "that number (a global batch it does not divide, say); rerun with another "
          "--restart-workers") in err, err


@pytest.mark.parametrize("plan, cause", [
    ({"exit": 3}, "worker 0 exited with code 3"),
    ({"kill_self": True}, r"worker 0 exited with code -9 \(killed by SIGKILL\)"),
    ({"exit": 42}, r"every task was preempted \(exit 42\), worker \d first"),
])
def test_restarts_stop_at_max_restarts_with_the_last_clusters_code(plan, cause):
  plans = {"worker-0": plan, "worker-1": {"exit": 42} if plan.get("exit") == 42 else {}}
  code, _, err, _ = run(plans, max_restarts=2, restart_wait=0)
  assert code == (42 if plan.get("exit") == 42 else 3 if "exit" in plan else 1), err
  assert len(re.findall(r"restart \d of 2 in 0 s: " + cause, err)) == 2, err
  assert "restart 3" not in err
  assert re.search(r"2 restart\(s\) of 2 used; the causes: " + cause + "; " + cause, err)
  assert len(re.findall(r"started ", err)) == 3


def test_a_usage_error_is_not_restarted():
  code, _, err, _ = run({"worker-0": {"exit": 2}}, max_restarts=3, restart_wait=0)
  assert code == 2 and "restart 1" not in err, err
  assert "not restarting: exit code 2 is a usage error, which a restart would repeat" in err
  # Refused by the first cluster, not by a restart's number of workers.
  code, _, err, _ = run({"worker-0": {"exit": 2}}, max_restarts=3, restart_wait=0,
                        restart_workers=1)
  assert code == 2 and "the cluster restarted on" not in err, err


def test_without_max_restarts_nothing_is_restarted():
  code, _, err, _ = run({"worker-0": {"exit": 3}})
  assert code == 3 and "restart" not in err


def test_bad_arguments_name_the_fix():
  command = [sys.executable, "-c", "pass"]
  with pytest.raises(ValueError, match="no command to launch; put it after '--'"):
    launch.Launch([])
  with pytest.raises(ValueError, match=r"workers must be an int >= 1, got 0"):
    launch.Launch(command, workers=0)
  with pytest.raises(ValueError, match=r"grace must be a number >= 0 \(seconds\), got -1"):
    launch.Launch(command, grace=-1)
  with pytest.raises(ValueError, match=r"max_restarts must be an int >= 0, got -1"):
    launch.Launch(command, max_restarts=-1)
  with pytest.raises(ValueError, match=r"restart_workers must be an int >= 1, got 0"):
    launch.Launch(command, max_restarts=1, restart_workers=0)
  with pytest.raises(ValueError, match=r"restart_workers=1 needs restarts: add max_restarts "
                                       r"\(`--max-restarts N`\), or drop it"):
    launch.Launch(command, restart_workers=1)
  with pytest.raises(ValueError, match=r"port 70000 is out of range"):
    launch.Launch(command, workers=1, port_base=70000)


def test_a_command_that_cannot_run_exits_127():
  err = io.StringIO()
  code = launch.launch(["/nonexistent/program"], stdout=io.StringIO(), stderr=err)
  assert code == 127
  assert "cannot run '/nonexistent/program'" in err.getvalue()


# Through the `ctl` command, in a process of its own.

def ctl_launch(*args):
  return helpers.ctl("launch", *args, check=False, timeout=60)


def test_cli_runs_the_command_after_the_double_dash():
  code = "import json, os; print(json.loads(os.environ['TF_CONFIG'])['task'])"
  proc = ctl_launch("--workers", "2", "--", sys.executable, "-c", code)
  assert proc.returncode == 0, proc.stderr
  assert "[worker 0] {'type': 'worker', 'index': 0}" in proc.stdout.splitlines()
  assert "[worker 1] {'type': 'worker', 'index': 1}" in proc.stdout.splitlines()


def test_cli_port_in_use_is_an_error_at_once():
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    proc = ctl_launch("--workers", "2", "--port-base", str(port), "--",
                      sys.executable, "-c", "pass")
  assert proc.returncode == 2
  assert f"ctl launch: error: port {port} on 127.0.0.1 is in use" in proc.stderr
  assert "Pick another --port-base, or drop --port-base" in proc.stderr


def test_cli_help():
  proc = ctl_launch("--help")
  assert proc.returncode == 0
  for text in ("--workers", "--ps", "--host", "--network", "--port-base", "--startup-timeout",
               "--grace", "--max-restarts", "--restart-wait", "--restart-workers",
               "CTL_LAUNCH_RESTARTS",
               "unauthenticated", "ctl launch --workers 2 -- ctl train"):
    assert text in proc.stdout, text


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_cli_forwards_sigterm_and_exits_with_the_tasks_code(signum):
  """SIGTERM, or SIGHUP twice (a closed terminal: it used to kill the launcher
  at once, exit 129, with no word and its tasks left to notice it gone)."""
  # Each task saves on SIGTERM and exits 42, as a preempted ctl run does.
  task = ("import json, os, signal, sys, time\n"
          "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
          "t = json.loads(os.environ['TF_CONFIG'])['task']\n"
          "open(os.path.join(os.environ['CTL_LAUNCH_READY_DIR'], "
          "'%s-%d' % (t['type'], t['index'])), 'w').close()\n"
          "time.sleep(300)\n")
  # Stopped by its own signal, the launcher does not restart the cluster.
  proc = subprocess.Popen([sys.executable, "-m", "ctl.cli", "launch", "--workers", "2",
                           "--max-restarts", "3", "--", sys.executable, "-c", task],
                          cwd=ROOT, env=subprocess_env(None),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=helpers.as_in_a_terminal)  # SIGHUP not ignored
  try:
    lines = []
    for line in proc.stdout:
      lines.append(line)
      if "tasks are ready" in line:
        break
    proc.send_signal(signum)
    if signum == signal.SIGHUP:
      time.sleep(0.1)
      proc.send_signal(signum)
    rest = proc.communicate(timeout=30)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  log = "".join(lines) + rest
  assert proc.returncode == 42, log
  assert f"got {signal.Signals(signum).name}; sending SIGTERM to worker 0 (pid" in log
  assert "restart" not in log
  assert not any(alive(pid) for pid in pids(log).values())
