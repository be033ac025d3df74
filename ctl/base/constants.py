"""Exit codes and environment variables shared by the library, the launcher
and the command line. TensorFlow-free, so the launcher and `ctl --help` can
import it without importing TensorFlow."""

# Exit code of a run stopped by SIGTERM after saving: TF's restart code, which
# schedulers that restart on failure take as "rerun me" (ctl.Preempted).
PREEMPTED_EXIT_CODE = 42
# What ctl's commands and argparse exit with for a bad argument or config.
USAGE_ERROR_EXIT_CODE = 2
# `ctl train --logger NAME`: the experiment trackers ctl.loop.loggers knows by name.
LOGGER_NAMES = ("mlflow", "wandb")
# What a step does instead of a draw whose numbers depend on the layout
# (`sources.layout_dependent_draws`): the warning's, ctl check's and ctl parity's advice.
STEP_DRAWS_FIX = ("Draw per example with ctx.normal or ctx.uniform, other draws from a "
                  "seed of ctx.seed() (tf.random.stateless_*).")
# The TensorFlow releases a TPU runs (docs/strategies.md): from the newest a Cloud TPU VM
# image has to tensorflow-tpu's last wheel.
TPU_TENSORFLOW = ("2.18", "2.20")
# What a shell reports for a program ended by Ctrl-C: 128 + SIGINT.
INTERRUPTED_EXIT_CODE = 130

# Set by `ctl launch` for every task: a directory where each task marks itself
# ready, so a task can tell a slow peer from a dead one.
READY_DIR_VARIABLE = "CTL_LAUNCH_READY_DIR"
# Also set by `ctl launch`: its PID and --grace, so a task ends with its launcher.
LAUNCHER_PID_VARIABLE = "CTL_LAUNCH_PID"
GRACE_VARIABLE = "CTL_LAUNCH_GRACE"
# Also set by `ctl launch`: how many times it restarted the cluster (0 at first).
RESTARTS_VARIABLE = "CTL_LAUNCH_RESTARTS"
# Seconds a worker waits for its peers to start (0: forever).
STARTUP_TIMEOUT_VARIABLE = "CTL_STARTUP_TIMEOUT"
# Seconds of missed heartbeats after which a multi-worker peer is declared dead.
HEARTBEAT_TIMEOUT_VARIABLE = "CTL_HEARTBEAT_TIMEOUT"
