"""The outer loop: `fit` trains to a step count, resumably, with periodic actions.

    history = runner.fit(10_000, "runs/x")   # what `Runner.fit` calls

Each pass runs one compiled call of up to `steps_per_loop` steps (shortened to
land on the next step-based action), checks the results are finite, advances
the progress display, and runs the actions that are due. Training resumes
from the newest checkpoint in `<workdir>/checkpoints`, so rerunning the same
command after a crash, a kill or a preemption continues where it stopped.
One run at a time holds the work directory (`ctl.workdir.Lock`).

SIGTERM and Ctrl-C save a checkpoint and stop (`ctl.stopping`): SIGTERM exits
with `PREEMPTED_EXIT_CODE` (42, TF's restart code), which schedulers that
restart on failure then resume; Ctrl-C raises `ctl.stopping.Interrupted`.
"""

import logging
import os
import tempfile
import time
import warnings

import numpy as np
import tensorflow as tf

from ctl import actions as actions_lib
from ctl import export as export_lib
from ctl import stopping
from ctl import workdir as workdir_lib
from ctl.checkpoints import write_text_atomically
from ctl.progress import Progress
from ctl.strategies import is_parameter_server
from ctl.strategies import num_workers

_log = logging.getLogger("ctl")


class Loop:
  """What an action sees: the runner, the step reached and the latest results.

  Attributes:
    runner: the `ctl.Runner`.
    workdir: the work directory (None: nothing is written).
    step: the global step reached (steps done).
    results: the last compiled call's results, each key an array of per-step values.
    metrics: the latest evaluation's metrics (dict), if any.
    is_chief: whether this worker writes summaries, samples and kept files.
    lock: the work directory's `ctl.workdir.Lock` (None off the chief or
      without a workdir).
  """

  def __init__(self, runner, workdir, step):
    self.runner = runner
    self.workdir = workdir
    self.step = self.start_step = step
    self.start_time = time.perf_counter()
    self.results = {}
    self.metrics = {}
    self.is_chief = runner.strategy.extended.should_checkpoint
    self.lock = None
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

  def flush(self):
    """Writes out what the summary writers hold."""
    for writer in list(self._writers.values()):
      writer.flush()

  def close(self):
    """Closes the summary writers; `writer()` makes new ones."""
    for writer in self._writers.values():
      writer.close()
    self._writers = {}


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
  if is_parameter_server(runner.strategy):
    evaluations = [a for a in actions if isinstance(a, actions_lib.Evaluate)]
    if evaluations:
      raise ValueError("ctl.Evaluate cannot run under parameter_server (the "
                       "coordinator only schedules training steps); drop it and "
                       "evaluate the checkpoints with `ctl eval` in another process.")
  loop = Loop(runner, workdir, int(runner.global_step.numpy()))
  loop.lock = _lock(runner, workdir)  # before restoring: one writer at a time
  try:
    return _train(loop, num_steps, actions, progress)
  finally:
    if loop.lock is not None:
      loop.lock.release()


def _train(loop, num_steps, actions, progress):
  checkpoint = next((a for a in actions if isinstance(a, actions_lib.Checkpoint)), None)
  if checkpoint:
    loop.step = loop.start_step = checkpoint.restore(loop)
  if loop.step >= num_steps:
    _log.info("already at step %d of %d: nothing to train", loop.step, num_steps)
    if checkpoint and not _finished(loop):  # stopped after the last save
      _finish(loop, [a for a in actions if a is not checkpoint], None)
    return {}
  scheduled = [a for a in actions if a.every is not None]
  for action in scheduled:
    action.every.start(loop.step)
  bar = Progress(num_steps, loop.step, enabled=progress and loop.is_chief)
  stopper = stopping.Stopper(loop.runner, checkpoint.checkpointer if checkpoint else None)
  stopper.before_exit = loop.flush  # a signal's thread may end the process
  history = []
  try:
    while loop.step < num_steps:
      n = _call_length(loop, scheduled, num_steps)
      results = loop.runner.run_steps(n)
      _check_finite(results, loop.step, checkpoint)
      history.append(results)
      loop.step, loop.results = loop.step + n, results
      bar.update(loop.step, results)
      if loop.step < num_steps:  # the last step's work is the end's
        due = lambda: _run_due(loop, scheduled, stopper)  # noqa: E731
      else:
        due = lambda: _finish(loop, actions, stopper)  # noqa: E731
      # A signal during the call: save first (a preempted job has little time
      # left), then this step's work, then stop.
      stopper.check(loop.step, then=due)
      _check_workdir(loop, checkpoint)
      if loop.step < num_steps:
        due()
    _finish(loop, actions, stopper)
    stopper.check_after_end(loop.step)
  finally:
    stopper.close()
    bar.close()
    loop.close()
  return {k: np.concatenate([h[k] for h in history]) for k in history[0]}


def _finish(loop, actions, stopper):
  """The end: every action once for the final step, the checkpoint first.

  Then a mark that the end ran: a run stopped after its last checkpoint but
  before, say, its export finds no mark when rerun and runs them again.
  """
  ordered = sorted(actions, key=lambda a: not isinstance(a, actions_lib.Checkpoint))
  for i, action in enumerate(ordered):
    _run(action, loop, stopper, after=ordered[i + 1:])
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


def _run_due(loop, scheduled, stopper):
  due = stopping.agree(loop.runner.strategy, [a.every.due(loop.step) for a in scheduled])
  due_now = [a for a, now in zip(scheduled, due) if now]
  for i, action in enumerate(due_now):
    _run(action, loop, stopper, after=due_now[i + 1:])
    action.every.fired(loop.step)
  if any(due):
    stopper.check(loop.step)  # a signal that came during the actions


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


def _lock(runner, workdir):
  """Locks the work directory on the chief; every worker fails if it cannot.

  Also fails now, not at the first save, if the directory cannot be written,
  and removes what an export killed mid-way left (no other run writes here).
  """
  if workdir is None:
    return None
  lock, error = None, None
  if runner.strategy.extended.should_checkpoint:
    try:
      _check_writable(os.path.join(workdir, "checkpoints"), workdir)
      lock = workdir_lib.Lock(workdir)
    except (OSError, workdir_lib.WorkdirInUse) as e:
      error = e
  if stopping.agree(runner.strategy, [error is not None])[0]:
    raise error or workdir_lib.WorkdirInUse(
        f"the chief could not take workdir {workdir!r}; its error says why.")
  if lock is not None:  # no export runs: what is there was left by one that was stopped
    for path in export_lib.remove_scratch(os.path.join(workdir, "export")):
      _log.info("removed %s, left by an export that was stopped", path)
  return lock


def _check_writable(directory, workdir):
  """Raises OSError naming the fix if `directory` cannot be written."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
      pass
  except OSError as e:
    raise OSError(f"workdir {workdir!r} cannot be written ({e.strerror or e}: "
                  f"{e.filename or directory}); fix its permissions or pass another "
                  "workdir.") from e


def _check_workdir(loop, checkpoint):
  """A work directory deleted or moved mid-run is made again, and written again."""
  if loop.lock is None or loop.lock.held():
    return
  loop.lock.release()
  loop.lock = workdir_lib.Lock(loop.workdir)
  loop.close()  # TensorBoard writers would go on writing into deleted files
  saved = ""
  if checkpoint and num_workers(loop.runner.strategy) == 1:
    saved = f"; saved {checkpoint.checkpointer.save()}"
  _log.warning("workdir %s disappeared (deleted or moved), noticed at step %d: made it "
               "again and writing to it from here on%s. What was in it is not there.",
               loop.workdir, loop.step, saved)


def _run(action, loop, stopper, after=()):
  """Runs `action` where it runs; a signal abandons all but a checkpoint at once,
  and with it the actions `after` it at this step."""
  if not (loop.is_chief or getattr(action, "collective", False)):
    return
  if stopper is None or isinstance(action, actions_lib.Checkpoint):
    action(loop)
    return
  name = type(action).__name__
  try:
    with stopper.abandonable(name):
      action(loop)
  except stopping.Abandoned as e:
    abandoned = e
  except Exception as e:  # a full disk, a bug in a sample function, ...
    _save_after_failure(loop, stopper, action, e)
    raise
  else:
    return
  # Outside the `except`: what stops the run does not chain to the Abandoned.
  skipped = sorted({type(a).__name__ for a in after} - {"Checkpoint"})
  _log.warning("%s abandoned at step %d by a signal%s", name, loop.step,
               f"; not run at this step: {', '.join(skipped)}" if skipped else "")
  stopper.check(loop.step)  # saves, and raises Preempted or Interrupted
  raise abandoned


def _save_after_failure(loop, stopper, action, error):
  """An action failed: keep the steps trained since the last checkpoint."""
  if stopper.checkpointer is None or num_workers(loop.runner.strategy) > 1:
    return  # a save is collective: the other workers are not in this one
  try:
    path = stopper.checkpointer.save()
  except Exception:  # pylint: disable=broad-except
    return  # the action's error says more than the save's
  error.add_note(f"ctl: {type(action).__name__} failed at step {loop.step}; the steps "
                 f"trained are saved in {path}. Fix the cause and rerun the same "
                 "command to resume.")


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
