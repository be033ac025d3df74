"""The outer loop: `fit` trains to a step count, resumably, with periodic actions.

    history = runner.fit(10_000, "runs/x")   # what `Runner.fit` calls

Each pass runs one compiled call of up to `steps_per_loop` steps (shortened to
land on the next step-based action), checks the results are finite, advances
the progress display, and runs the actions that are due. Training resumes
from the newest checkpoint in `<workdir>/checkpoints`, so rerunning the same
command after a crash, a kill or a preemption continues where it stopped.

On SIGTERM the run finishes the compiled call in flight, saves a checkpoint
and exits with `PREEMPTED_EXIT_CODE` (42, TF's restart code): schedulers
that restart on failure then resume it.
"""

import logging
import os
import signal
import tempfile
import threading
import time
import warnings

import numpy as np
import tensorflow as tf

from ctl import actions as actions_lib
from ctl.checkpoints import write_text_atomically
from ctl.progress import Progress
from ctl.strategies import is_parameter_server

PREEMPTED_EXIT_CODE = 42
_log = logging.getLogger("ctl")


class Preempted(SystemExit):
  """Raised after the checkpoint that follows a SIGTERM; exits the program with 42."""

  def __init__(self, step):
    super().__init__(PREEMPTED_EXIT_CODE)
    self.step = step
    _log.warning("%s", self)

  def __str__(self):
    return (f"SIGTERM: saved a checkpoint at step {self.step}; exiting with code "
            f"{PREEMPTED_EXIT_CODE}. Rerun the same command to resume.")


class Loop:
  """What an action sees: the runner, the step reached and the latest results.

  Attributes:
    runner: the `ctl.Runner`.
    workdir: the work directory (None: nothing is written).
    step: the global step reached (steps done).
    results: the last compiled call's results, each key an array of per-step values.
    metrics: the latest evaluation's metrics (dict), if any.
    is_chief: whether this worker writes summaries, samples and kept files.
  """

  def __init__(self, runner, workdir, step):
    self.runner = runner
    self.workdir = workdir
    self.step = self.start_step = step
    self.start_time = time.perf_counter()
    self.results = {}
    self.metrics = {}
    self.is_chief = runner.strategy.extended.should_checkpoint
    self._writers = {}

  def writer(self, name):
    """The summary writer of `<workdir>/events/<name>` (a no-op off the chief)."""
    if name not in self._writers:
      if self.is_chief and self.workdir:
        self._writers[name] = tf.summary.create_file_writer(
            os.path.join(self.workdir, "events", name))
      else:
        self._writers[name] = tf.summary.create_noop_writer()
    return self._writers[name]

  def close(self):
    for writer in self._writers.values():
      writer.close()


def fit(runner, num_steps, workdir=None, *, actions=None, progress=True):
  """Trains `runner` until its global step is `num_steps`; see `Runner.fit`."""
  if not isinstance(num_steps, (int, np.integer)) or isinstance(num_steps, bool) or num_steps < 0:
    raise ValueError(f"num_steps must be a non-negative int (the step to train up "
                     f"to), got {num_steps!r}.")
  num_steps = int(num_steps)
  if num_steps and runner.steps_per_loop > num_steps:
    # Not an error: the calls are cut to the run, and the numbers are right.
    warnings.warn(
        f"steps_per_loop ({runner.steps_per_loop}) is larger than num_steps "
        f"({num_steps}), the whole run: every compiled call is cut short. Lower "
        f"steps_per_loop to at most {num_steps}, or train for more steps.", stacklevel=3)
  actions = _complete(actions, workdir)
  _check_exports(actions, runner)
  if workdir is not None and runner.strategy.extended.should_checkpoint:
    _check_writable(os.path.join(workdir, "checkpoints"), workdir)
  if is_parameter_server(runner.strategy):
    evaluations = [a for a in actions if isinstance(a, actions_lib.Evaluate)]
    if evaluations:
      raise ValueError("ctl.Evaluate cannot run under parameter_server (the "
                       "coordinator only schedules training steps); drop it and "
                       "evaluate the checkpoints with `ctl eval` in another process.")
  checkpoint = next((a for a in actions if isinstance(a, actions_lib.Checkpoint)), None)
  loop = Loop(runner, workdir, int(runner.global_step.numpy()))
  if checkpoint:
    loop.step = loop.start_step = checkpoint.restore(loop)
  if loop.step >= num_steps:
    _log.info("already at step %d of %d: nothing to train", loop.step, num_steps)
    if checkpoint and not _finished(loop):  # stopped after the last save
      _finish(loop, [a for a in actions if a is not checkpoint])
    return {}
  scheduled = [a for a in actions if a.every is not None]
  for action in scheduled:
    action.every.start(loop.step)
  bar = Progress(num_steps, loop.step, enabled=progress and loop.is_chief)
  preemption = _watch_preemption(runner, checkpoint)
  history = []
  try:
    while loop.step < num_steps:
      n = _call_length(loop, scheduled, num_steps)
      results = runner.run_steps(n)
      _check_finite(results, loop.step, checkpoint)
      history.append(results)
      loop.step, loop.results = loop.step + n, results
      bar.update(loop.step, results)
      preemption.check(loop)  # first: a preempted job has little time left
      if loop.step < num_steps:  # the last step's work is the end's
        _run_due(loop, scheduled)
    _finish(loop, actions)
    preemption.check_after_end(loop)
  finally:
    preemption.stop()
    bar.close()
    loop.close()
  return {k: np.concatenate([h[k] for h in history]) for k in history[0]}


def _finish(loop, actions):
  """The end: every action once for the final step, the checkpoint first.

  Then a mark that the end ran: a run stopped after its last checkpoint but
  before, say, its export finds no mark when rerun and runs them again.
  """
  for action in sorted(actions, key=lambda a: not isinstance(a, actions_lib.Checkpoint)):
    _run(action, loop)
  if loop.workdir and loop.is_chief:
    write_text_atomically(_finished_path(loop), f"{loop.step}\n")


def _finished(loop):
  try:
    with open(_finished_path(loop)) as f:
      return int(f.read()) == loop.step
  except (OSError, ValueError):
    return False


def _finished_path(loop):
  return os.path.join(loop.workdir, "checkpoints", "finished_step")


def _call_length(loop, scheduled, num_steps):
  """Steps for the next compiled call: stop at the next step-based action."""
  ends = [loop.runner.steps_per_loop, num_steps - loop.step]
  ends += [a.every.steps_to_next(loop.step) for a in scheduled if a.every.steps]
  return min(ends)


def _run_due(loop, scheduled):
  due = _agree(loop.runner.strategy, [a.every.due(loop.step) for a in scheduled])
  for action, now in zip(scheduled, due):
    if now:
      _run(action, loop)
      action.every.fired(loop.step)


def _complete(actions, workdir):
  """The actions to run: the defaults, or the user's with the defaults added."""
  actions = list(actions or [])
  for action in actions:
    if not (hasattr(action, "every") and callable(action)):
      raise TypeError(f"action {action!r} is not an action: give it an `every` "
                      "(a ctl.Every, or None for the end only) and a __call__(loop).")
    if action.every is not None and not isinstance(action.every, actions_lib.Every):
      raise TypeError(f"{type(action).__name__}.every is {action.every!r}; use "
                      "ctl.Every(steps=..., seconds=...) or None.")
  if workdir is None:
    writers = (actions_lib.Checkpoint, actions_lib.Summaries, actions_lib.Samples,
               actions_lib.Export)
    writes = [a for a in actions if isinstance(a, writers)]
    if writes:
      raise ValueError(f"actions {[type(a).__name__ for a in writes]} write files "
                       "but workdir is None; pass workdir=... to fit.")
    return actions
  if sum(isinstance(a, actions_lib.Checkpoint) for a in actions) > 1:
    raise ValueError("give at most one ctl.Checkpoint action.")
  for kind in (actions_lib.Checkpoint, actions_lib.Summaries):
    if not any(isinstance(a, kind) for a in actions):
      actions.insert(0, kind())
  return actions


def _check_exports(actions, runner):
  """Refuses, before training, an Export of a model the runner does not have."""
  for action in actions:
    if isinstance(action, actions_lib.Export) and action.model not in runner.models:
      raise ValueError(f"ctl.Export({action.model!r}): the runner has no model of that "
                       f"name; its models are {sorted(runner.models)}.")


def _check_writable(directory, workdir):
  """Fails now, not at the first save, if the work directory cannot be written."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
      pass
  except OSError as e:
    raise OSError(f"workdir {workdir!r} cannot be written ({e.strerror or e}: "
                  f"{e.filename or directory}); fix its permissions or pass another "
                  "workdir.") from e


def _run(action, loop):
  if loop.is_chief or getattr(action, "collective", False):
    action(loop)


def _check_finite(results, first_step, checkpoint):
  """Raises FloatingPointError at the first step with a NaN or Inf result."""
  bad = [i for values in results.values() for i in np.flatnonzero(~np.isfinite(values))]
  if not bad:
    return
  i = min(bad)
  values = ", ".join(f"{k} {v[i]:.6g}" for k, v in results.items())
  last = checkpoint.checkpointer.latest if checkpoint else None
  kept = (f"the last checkpoint, {last}, is intact (nothing later was saved)" if last
          else "no checkpoint was saved")
  raise FloatingPointError(
      f"non-finite result at step {first_step + i} (ctx.step == {first_step + i}): "
      f"{values}. Training stopped; {kept}. Rerunning replays the same steps "
      "exactly, so change something first: a lower learning rate, gradient "
      "clipping, or a penalty on the discriminator.")


def _agree(strategy, flags):
  """Under multi-worker strategies, each flag is True if it is on any worker.

  Time-based schedules differ between workers' clocks, but collective work
  (a checkpoint, an evaluation) must run on all of them or none.
  """
  if (not flags or getattr(strategy.extended, "_num_workers", 1) <= 1 or  # pylint: disable=protected-access
      is_parameter_server(strategy)):
    return flags  # one process decides (with parameter servers, the coordinator)
  votes = tf.constant([int(f) for f in flags], tf.int32)
  values = strategy.experimental_distribute_values_from_function(lambda _: votes)
  return list(strategy.reduce("SUM", values, axis=None).numpy() > 0)


def _watch_preemption(runner, checkpoint):
  if checkpoint is None or threading.current_thread() is not threading.main_thread():
    return _NoPreemption()
  if _handler_applies(runner.strategy):
    return _HandlerPreemption(runner, checkpoint)
  return _SignalPreemption(runner, checkpoint)


_cluster_handler_made = False  # TF's handler works once per cluster and process


def _handler_applies(strategy):
  """Whether TF's PreemptionCheckpointHandler serves this strategy here.

  It supports Mirrored, MultiWorkerMirrored and OneDevice strategies. On GCE
  it watches the metadata server instead of SIGTERM (GPU VMs) or nothing (CPU,
  TPU VMs), and a second handler in a multi-worker process finds its
  coordination keys already set by the first; there we catch SIGTERM ourselves.
  """
  from tensorflow.python.distribute.failure_handling import failure_handling_util  # pylint: disable=import-outside-toplevel
  if not isinstance(strategy, (tf.distribute.MirroredStrategy,
                               tf.distribute.MultiWorkerMirroredStrategy,
                               tf.distribute.OneDeviceStrategy)):
    return False
  if failure_handling_util.detect_platform() not in (
      failure_handling_util.PlatformDevice.INTERNAL_CPU,
      failure_handling_util.PlatformDevice.INTERNAL_GPU):
    return False
  return not (_in_cluster(strategy) and _cluster_handler_made)


def _in_cluster(strategy):
  resolver = strategy.cluster_resolver
  return bool(resolver and resolver.cluster_spec().jobs)


class _NoPreemption:

  def check(self, loop):
    pass

  def check_after_end(self, loop):
    pass

  def stop(self):
    pass


class _SignalPreemption:
  """SIGTERM sets a flag; after the call in flight, all workers save and exit."""

  def __init__(self, runner, checkpoint):
    self._runner = runner
    self._checkpoint = checkpoint
    self._received = False
    self._previous = signal.signal(signal.SIGTERM, self._on_signal)

  def _on_signal(self, signum, frame):
    del signum, frame
    self._received = True

  def check(self, loop):
    # Workers must save together: a signal to any of them stops them all.
    if _agree(self._runner.strategy, [self._received])[0]:
      self._checkpoint.checkpointer.save()
      raise Preempted(loop.step)

  def check_after_end(self, loop):
    if self._received:  # during the last call or the end: the end saved
      raise Preempted(loop.step)

  def stop(self):
    signal.signal(signal.SIGTERM, self._previous)


class _HandlerPreemption:
  """TF's PreemptionCheckpointHandler: workers agree on the step to save at."""

  def __init__(self, runner, checkpoint):
    global _cluster_handler_made
    self._previous = signal.getsignal(signal.SIGTERM)
    checkpointer = checkpoint.checkpointer
    self._step = None

    def exit_fn():
      raise Preempted(self._step)

    def save_fn():
      self._step = int(runner.global_step.numpy())
      checkpointer.save()

    config = tf.distribute.experimental.TerminationConfig(exit_fn=exit_fn,
                                                         save_fn=save_fn)
    # The handler restores from the manager it is given: on every worker that
    # is the chief's directory, so all workers restore the same run count.
    self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        runner.strategy.cluster_resolver, checkpointer.manager,
        termination_config=config)
    _cluster_handler_made = _cluster_handler_made or _in_cluster(runner.strategy)

  def check(self, loop):
    del loop
    self._handler.save_checkpoint_if_preempted()

  def check_after_end(self, loop):
    received = getattr(self._handler, "_received_own_sigterm", None)
    if received is not None and received.is_set():  # the end saved
      raise Preempted(loop.step)

  def stop(self):
    signal.signal(signal.SIGTERM, self._previous)
    # Its watcher threads otherwise live until garbage collection.
    for stop in ("_stop_poll_termination_signal_thread",
                 "_stop_cluster_wise_termination_watcher_thread"):
      try:
        getattr(self._handler, stop)()
      except Exception:  # pylint: disable=broad-except
        pass
