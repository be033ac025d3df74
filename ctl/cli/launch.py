"""`ctl launch`: run a command as every task of a local TensorFlow cluster.

    ctl launch --workers 2 -- ctl train cfg.gin --strategy multi_worker --workdir runs/x
    ctl launch --workers 2 --ps 1 -- python coordinator.py   # chief + 2 workers + 1 ps
"""

import argparse
import sys
from typing import Any

# TF-free, like the launcher it drives: the help names its variable.
from ctl.distribute import launch


def add_parser(subparsers: Any) -> None:
  """Adds `ctl launch` to the `ctl` command."""
  parser = subparsers.add_parser(
      "launch", help="run a command as every task of a local TensorFlow cluster",
      formatter_class=argparse.RawDescriptionHelpFormatter,
      description=(
          "Run COMMAND as every task of a TensorFlow cluster on this machine: N workers\n"
          "for 'multi_worker', or with --ps M a parameter-server cluster (a chief, N\n"
          f"workers and M ps). Each task gets TF_CONFIG and {launch.READY_DIR_VARIABLE}, and its\n"
          "output lines are prefixed with its name. When a task fails, or is not ready\n"
          "within --startup-timeout, every task is stopped; SIGTERM, SIGINT and SIGHUP\n"
          "(a closed terminal) are passed on to the tasks as SIGTERM."),
      epilog=(
          "exit code: 0 when every task exits 0 (with --ps: the chief); 42 when\n"
          "every task was preempted (rerun to resume); else the failed task's code\n"
          "(1 if it was killed by a signal); with restarts, the last cluster's; 127\n"
          "when the command cannot run or --network private is refused.\n\n"
          "network: TensorFlow's gRPC servers are unauthenticated (anyone who reaches\n"
          "their ports can run code in the tasks) and listen on every interface,\n"
          "whatever --host says. So the tasks share a private network (see --network),\n"
          "out of reach of other machines and users, and they reach no other host.\n"
          "On this machine's network, keep the ports behind a firewall.\n\n"
          "example:\n  ctl launch --workers 2 -- ctl train cfg.gin --strategy "
          "multi_worker --workdir runs/x"))
  parser.add_argument("--workers", type=int, default=2, metavar="N",
                      help="number of worker tasks (default: %(default)s)")
  parser.add_argument("--ps", type=int, default=0, metavar="M",
                      help="number of parameter servers; with any, a chief task "
                      "(the coordinator) is added (default: %(default)s)")
  parser.add_argument("--host", default="127.0.0.1",
                      help="the tasks' address in TF_CONFIG (TensorFlow's servers "
                      "listen on every interface whatever it is: see --network) "
                      "(default: %(default)s)")
  parser.add_argument("--network", choices=launch.NETWORKS, default="auto",
                      help="private: the tasks share a network of their own, loopback "
                      "only (Linux namespaces); shared: this machine's network; auto: "
                      "private where the system allows it and --host is loopback, else "
                      "shared (default: %(default)s)")
  parser.add_argument("--port-base", type=int, metavar="P",
                      help="use ports P, P+1, ... (one per task) instead of free ones")
  parser.add_argument("--startup-timeout", type=float, default=120.0, metavar="S",
                      help="seconds for every task to make its strategy, or exit 0; "
                      "0: no limit (default: %(default)g)")
  parser.add_argument("--grace", type=float, default=30.0, metavar="S",
                      help="seconds between SIGTERM and SIGKILL when stopping tasks "
                      "(default: %(default)g)")
  parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                      help="start the whole cluster again up to N times after a task "
                      "fails or dies (but exit 2, a usage error), a start-up timeout or "
                      "a preemption: a ctl run resumes from its last checkpoint; each "
                      f"task reads the count from {launch.RESTARTS_VARIABLE} "
                      "(default: %(default)s)")
  parser.add_argument("--restart-workers", type=int, metavar="N",
                      help="workers of a restarted cluster: fewer (a lost machine) or "
                      "more; a ctl run resumes on them as if never stopped "
                      "(default: --workers)")
  parser.add_argument("--restart-wait", type=float, default=launch.RESTART_WAIT_SECONDS,
                      metavar="S", help="seconds between the cluster's end and its "
                      "restart (default: %(default)g)")
  parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                      help="the command every task runs")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  """`ctl launch`: returns the exit code."""
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  try:
    launcher = launch.Launch(command, workers=args.workers, ps=args.ps, host=args.host,
                             port_base=args.port_base, startup_timeout=args.startup_timeout,
                             grace=args.grace, max_restarts=args.max_restarts,
                             restart_wait=args.restart_wait,
                             restart_workers=args.restart_workers, network=args.network)
  except ValueError as e:
    print(f"ctl launch: error: {e}", file=sys.stderr)
    return 2
  return launcher.run()
