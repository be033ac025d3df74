"""The outer loop: `fit` trains to a step count, resumably, with periodic actions.

    history = fit(runner.compiled_step, runner.history, 10_000, "runs/x")  # `Runner.fit`

It takes the parts it uses (the compiled step, the history it appends to, the
evaluator its actions call), as Orbit's controller takes a trainer. Each pass
runs one compiled call of up to `steps_per_loop` steps (shortened to land on the
next step-based save or action), checks the results are finite, then saves and
runs the actions that are due. Resuming and stopping: docs/outer-loop.md.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from ctl.base import arguments
from ctl.loop import actions as actions_lib
from ctl.loop import checkpoints
from ctl.loop import dry_run as dry_run_lib
from ctl.loop import history as history_lib
from ctl.loop import loggers as loggers_lib
from ctl.loop import manifest as manifest_lib
from ctl.loop import stopping
from ctl.loop import workdir as workdir_lib
from ctl.loop.checkpoints import write_text_atomically
from ctl.loop.progress import Progress
from ctl.loop.schedule import check_every
from ctl.loop.session import Session
from ctl.parts import data as data_lib

if TYPE_CHECKING:
  from ctl.parts.evaluation import Evaluator
  from ctl.parts.steps import TrainStep

_log = logging.getLogger("ctl")
# What a stop abandoned at a step, for the run resuming there to run first.
_ABANDONED = os.path.join("checkpoints", "abandoned_actions.json")


def fit(compiled_step: TrainStep, history: history_lib.History, total_steps: int,
        workdir: str | None = None, *, evaluator: Evaluator | None = None,
        checkpoint: bool | checkpoints.Checkpoint = True,
        summaries: bool | actions_lib.Summaries = True,
        actions: Sequence[actions_lib.Action] = (),
        loggers: Sequence[loggers_lib.Logger] = (),
        progress: bool = True, dry_run: bool = False,
        seed: int | None = None) -> history_lib.History:
  """Trains with `compiled_step` until the global step is `total_steps`; see `Runner.fit`."""
  workdir = workdir_lib.path(workdir)
  total_steps = arguments.integer("total_steps", total_steps, minimum=0,
                                  meaning="the global step to train up to")
  if dry_run not in (True, False):
    raise TypeError(f"fit(dry_run={dry_run!r}): pass True or False.")
  steps_per_loop = compiled_step.steps_per_loop
  if total_steps and steps_per_loop > total_steps and not dry_run:
    # Not an error: the calls are cut to the run, and the numbers are right.
    warnings.warn(
        f"steps_per_loop ({steps_per_loop}) is larger than total_steps "
        f"({total_steps}), the whole run: every compiled call is cut short. Lower "
        f"steps_per_loop to at most {total_steps}, or train for more steps.", stacklevel=3)
  earlier_run = (checkpoint is False and workdir is not None and not dry_run
                 and checkpoints.newest(workdir))
  if earlier_run:
    warnings.warn(
        f"fit(checkpoint=False): {os.path.join(workdir, 'checkpoints')} holds the "
        "checkpoints of an earlier run, which this run neither restores nor replaces "
        f"(nor that run's {history_lib.FILE_NAME}, which this run leaves as it is): it "
        "trains from the runner's state. Pass checkpoint=True to resume that run, or "
        "another workdir.", stacklevel=3)
  loggers = _check_loggers(loggers)
  fit_in = functools.partial(_fit, compiled_step, history, total_steps, evaluator=evaluator,
                             checkpoint=checkpoint, summaries=summaries, actions=actions,
                             seed=seed)
  if dry_run:
    return dry_run_lib.run(
        functools.partial(fit_in, loggers=[], progress=False, earlier_run=False),
        workdir, total_steps, compiled_step, history, skipped_loggers=loggers)
  return fit_in(workdir, loggers=loggers, progress=progress, earlier_run=earlier_run)


def _fit(compiled_step, history, total_steps, workdir, *, evaluator, checkpoint, summaries,
         actions, loggers, progress, seed, earlier_run, dry=None):
  checkpoint = _option("checkpoint", checkpoint, checkpoints.Checkpoint, workdir)
  summaries = _option("summaries", summaries, actions_lib.Summaries, workdir)
  if summaries:
    check_every("Summaries", summaries.every)
  actions = _check_actions(actions)
  session = Session(compiled_step, history, workdir, checkpoint=checkpoint,
                    summaries=summaries and summaries.every, dry=dry,
                    records=not earlier_run)
  context = actions_lib.FitContext(session, evaluator=evaluator, dry_run=dry is not None)
  for action in actions:
    action.check(context)
  with session:
    context.step = session.restore()
    if dry is not None:
      total_steps = dry.begin(context.step)
    run = _describe(session, compiled_step, context.step, total_steps, seed,
                    previous_from=dry.workdir if dry is not None else workdir)
    begun, status = [], "failed"
    try:
      session.begin(run, loggers)
      for action in actions:
        if context.is_chief or action.collective:  # where it runs
          if hasattr(action, "begin"):  # optional for duck-typed actions
            action.begin(context)
          begun.append(action)
      trained = _train(compiled_step, session, context, total_steps, checkpoint, summaries,
                       actions, progress)
      if dry is not None:
        session.read_back()  # the checkpoint the dry run saved
      status = "finished"
      return trained
    except (stopping.Interrupted, stopping.Preempted, KeyboardInterrupt):
      status = "stopped"
      raise
    finally:
      _end(begun, context)
      session.close(status)


def _check_loggers(loggers):
  """The user's loggers, each checked against the `ctl.Logger` contract."""
  if not isinstance(loggers, (list, tuple)):
    raise TypeError(f"fit(loggers={loggers!r}): pass a list of loggers, e.g. "
                    "loggers=[ctl.MLflow()].")
  for logger in loggers:
    if isinstance(logger, str):
      raise TypeError(f"fit(loggers=[{logger!r}]): pass a logger, e.g. "
                      f"ctl.loop.loggers.by_name({logger!r}) or ctl.MLflow(); names are for "
                      "`ctl train --logger`.")
    if isinstance(logger, type):
      raise TypeError(f"logger {logger.__name__} is a class; pass an instance of it, e.g. "
                      f"{logger.__name__}().")
    methods = ("begin", "log_steps", "log_metrics", "log_image", "flush", "end")
    missing = [name for name in methods if not callable(getattr(logger, name, None))]
    if missing:
      raise TypeError(f"logger {logger!r} is not a logger: it lacks {', '.join(missing)}. "
                      "Subclass ctl.Logger and define the methods you need.")
  return list(loggers)


def _describe(session, compiled_step, start_step, total_steps, seed, previous_from):
  """This fit's `ctl.loop.loggers.Run`; a resume logs, on the chief, what it changes
  from the newest record in `previous_from` (a dry run's: the real workdir)."""
  feed = compiled_step.feed
  record = manifest_lib.describe(
      session.placement, seed=seed, start_step=start_step, total_steps=total_steps,
      extra={"steps_per_loop": compiled_step.steps_per_loop,
             "global_batch_size": feed.global_batch_size,
             "batches_per_step": feed.batches_per_step})
  if previous_from and session.is_chief and start_step > 0:
    changes = manifest_lib.differences(manifest_lib.last(previous_from), record)
    if changes:
      _log.warning("this fit resumes %s at step %d with other settings than the fit "
                   "before it (%s): %s", previous_from, start_step,
                   manifest_lib.FILE_NAME, "; ".join(changes))
  return loggers_lib.Run(session.workdir, start_step, total_steps, record)


def _option(name, value, kind, workdir):
  """`fit`'s checkpoint= or summaries=: True (the defaults when there is a
  workdir), False, or a configured `kind`."""
  if value is True:
    return kind() if workdir is not None else None
  if value is False or value is None:
    return None
  if not isinstance(value, kind):
    raise TypeError(f"fit({name}={value!r}): pass True (the default), False, or a "
                    f"ctl.{kind.__name__}(...).")
  if workdir is None:
    raise ValueError(f"fit({name}=ctl.{kind.__name__}(...)) writes files but workdir is "
                     f"None; pass workdir=... to fit, or {name}=False.")
  return value


def _check_actions(actions):
  """The user's actions, each checked against the `ctl.Action` contract."""
  if not isinstance(actions, (list, tuple)):
    raise TypeError(f"fit(actions={actions!r}): pass a list of actions, e.g. "
                    "actions=[ctl.Samples(...)].")
  for action in actions:
    name = type(action).__name__
    if isinstance(action, (checkpoints.Checkpoint, actions_lib.Summaries)):
      option = "checkpoint" if isinstance(action, checkpoints.Checkpoint) else "summaries"
      raise TypeError(f"ctl.{name} goes in fit({option}=...), not in actions: "
                      f"fit({option}=ctl.{name}(...)).")
    if isinstance(action, loggers_lib.Logger):
      raise TypeError(f"ctl.{name} is a logger: fit(loggers=[...]), not actions.")
    if isinstance(action, type):
      raise TypeError(f"action {action.__name__} is a class; pass an instance of it, e.g. "
                      f"{action.__name__}(...).")
    missing = [a for a in ("every", "collective", "check") if not hasattr(action, a)]
    if missing or not callable(action):
      lacks = ", ".join(missing + ["__call__(context)"] * (not callable(action)))
      raise TypeError(f"action {action!r} is not an action: it lacks {lacks}. Subclass "
                      "ctl.Action, set `every` (a ctl.Every, or None for the end only) "
                      "and define __call__(self, context).")
    check_every(name, action.every)
    if not isinstance(action.collective, bool):
      raise TypeError(f"{name}.collective is {action.collective!r}; use True (runs on "
                      "every worker) or False (the chief only).")
    for method in ("check", "begin", "__call__", "end"):
      _check_takes_the_context(action, method)
  return list(actions)


def _check_takes_the_context(action, method):
  """Raises TypeError if `action.<method>` (if any) cannot take the context alone."""
  try:
    signature = inspect.signature(getattr(action, method, None))
  except (TypeError, ValueError):  # none, or a builtin or C callable: it cannot tell
    return
  try:
    signature.bind(None)
  except TypeError:
    name = type(action).__name__
    raise TypeError(
        f"{name}.{method}{signature} does not take the fit's context: the contract is "
        f"{method}(self, context), with a ctl.FitContext (context.models, "
        "context.workdir, context.step, ...); see ctl.Action.") from None


def _train(compiled_step, session, context, total_steps, checkpoint, summaries, actions,
           progress):
  if context.step >= total_steps:
    _log.info("already at step %d of %d: nothing to train", context.step, total_steps)
    if session.saves and not session.ended(context.step):  # stopped after the last save
      _finish(session, context, actions, None)
    return history_lib.History()
  data_lib.check_data_lasts(compiled_step.feed, total_steps - context.step,
                            f"fit({total_steps}) from step {context.step}")
  start_step = context.step
  scheduled = [a for a in actions if a.every is not None]
  timers = _timers(checkpoint, scheduled)
  for every in timers:
    every.start(context.step)
  # Calls land on these steps: the saves', the actions' and the summaries'.
  landings = timers + ([summaries.every] if summaries else [])
  bar = Progress(total_steps, context.step, enabled=progress and context.is_chief)
  stopper = stopping.Stopper(session.placement, session if session.saves else None,
                             steps_per_loop=compiled_step.steps_per_loop)
  # A signal's thread may end the process: what is written goes out, the lock goes.
  stopper.before_exit = lambda: (session.flush(), session.release_lock())
  try:
    _run_abandoned(session, context, scheduled, stopper)
    while context.step < total_steps:
      n = min(compiled_step.steps_per_call, total_steps - context.step,
              *filter(None, (every.steps_to_next(context.step) for every in landings)))
      # A step marker per compiled call for the profiler (`ctl.Profile`; else a no-op).
      with stopper.in_call(n), tf.profiler.experimental.Trace(
          "train", step_num=context.step, _r=1), session.timed(
              f"compiled call of {n} step{'s' if n > 1 else ''}"):
        results = compiled_step.run(n)
      # Kept before the NaN check: the steps up to a NaN, and its own, not the
      # steps after it in the call (they ran on non-finite weights).
      bad = _first_non_finite(results)
      kept = results if bad is None else {k: v[:bad + 1] for k, v in results.items()}
      context.history.append(context.step, kept)
      session.check_workdir(context.step + n, save=bad is None)
      with session.timed("Summaries and history"):
        session.log_steps(context.step, kept)
      _check_finite(results, context.step, session, bad)
      context.step, context.results = context.step + n, results
      bar.update(context.step, results)
      # A signal during the call: save first (a preempted job has little time
      # left), then this step's work, then stop.
      if context.step >= total_steps:  # the last step's work is the end's
        stopper.check(context.step, then=lambda: _finish(session, context, actions, stopper))
      else:
        due = lambda: _run_due(session, context, checkpoint, scheduled, stopper)  # noqa: E731
        stopper.check(context.step, then=due)
        due()
    _finish(session, context, actions, stopper)
    stopper.check_after_end(context.step)
  finally:
    stopper.close()
    bar.close()
  return context.history.since(start_step)  # the steps this fit trained


def _finish(session, context, actions, stopper):
  """The end: a save, then every action once for the final step, then a note
  that the end ran (`Session.mark_ended`)."""
  session.save("end")
  for i, action in enumerate(actions):
    with session.timed(type(action).__name__):
      _run(action, session, context, stopper, after=actions[i + 1:])
  session.log_metrics(context.step, context.metrics)
  session.mark_ended(context.step)


def _run_due(session, context, checkpoint, scheduled, stopper):
  """Saves if due, then runs the due actions in order. The workers agree on what
  is due: a save or an evaluation is collective, and each worker has its clock."""
  timers = _timers(checkpoint, scheduled)
  flags = stopping.agree(session.placement, [e.due(context.step) for e in timers])
  if checkpoint and flags[0]:
    session.save("schedule", wait=False)
    checkpoint.every.fired(context.step)
  due = flags[1:] if checkpoint else flags
  due_now = [a for a, now in zip(scheduled, due) if now]
  for i, action in enumerate(due_now):
    _run(action, session, context, stopper, after=due_now[i + 1:], scheduled=scheduled)
    action.every.fired(context.step)
  session.log_metrics(context.step, context.metrics)
  if any(flags):
    stopper.check(context.step)  # a signal that came during the work


def _note_abandoned(context, scheduled, remaining):
  if context.workdir is None or not context.is_chief:
    return
  write_text_atomically(os.path.join(context.workdir, _ABANDONED), json.dumps({
      "step": context.step,
      "actions": [[scheduled.index(a), type(a).__name__] for a in remaining]}) + "\n")


def _run_abandoned(session, context, scheduled, stopper):
  """Runs first the scheduled actions a stop abandoned at the step this run
  starts from (every worker agrees, from the chief's note); the note is used up."""
  wanted = set()
  if context.workdir is not None and context.is_chief:
    path = os.path.join(context.workdir, _ABANDONED)
    try:
      with open(path) as f:
        note = json.load(f)
      os.remove(path)  # another step's: this run trains through it (or went past it)
      if note["step"] == context.step:
        wanted = {i for i, name in note["actions"]
                  if i < len(scheduled) and type(scheduled[i]).__name__ == name}
    except FileNotFoundError:
      pass
    except (OSError, ValueError, KeyError, TypeError) as e:
      _log.warning("%s could not be read (%s); no action is run again.", path, e)
  flags = stopping.agree(session.placement, [i in wanted for i in range(len(scheduled))])
  abandoned = [a for a, again in zip(scheduled, flags) if again]
  if not abandoned:
    return
  if context.is_chief:
    _log.warning("running again at step %d what a stop abandoned there: %s", context.step,
                 ", ".join(type(a).__name__ for a in abandoned))
  for i, action in enumerate(abandoned):
    _run(action, session, context, stopper, after=abandoned[i + 1:], scheduled=scheduled)
  session.log_metrics(context.step, context.metrics)


def _timers(checkpoint, scheduled):
  """The schedules `fit` follows: the checkpoint's first, then the actions'."""
  return ([checkpoint.every] if checkpoint else []) + [a.every for a in scheduled]


def _end(begun, context):
  """Each begun action's `end`, however `fit` ends; an `end` that fails does
  not keep the others from ending, nor hide why `fit` is ending."""
  failed = None
  for action in reversed(begun):
    try:
      if hasattr(action, "end"):
        action.end(context)
    except Exception as e:  # pylint: disable=broad-except
      _log.warning("%s.end failed: %s: %s", type(action).__name__, type(e).__name__, e)
      failed = failed or e
  if failed is not None and sys.exc_info()[1] is None:
    raise failed


def _run(action, session, context, stopper, after=(), scheduled=None):
  """Runs `action` where it runs; a signal abandons it at once, and with it
  the actions `after` it at this step (of `scheduled`, if given: noted, for
  the run that resumes from this step to run them)."""
  if not (context.is_chief or action.collective):
    return
  if stopper is None:
    action(context)
    return
  name = type(action).__name__
  try:
    with stopper.abandonable(name):
      action(context)
    return
  except stopping.Abandoned as e:
    abandoned = e
  except Exception as e:  # a full disk, a bug in a sample function, ...
    if scheduled is not None:  # the rerun runs them first
      _note_abandoned(context, scheduled, [action, *after])
    _save_after_failure(session, context, action, e)
    raise
  # Outside the `except`: what stops the run does not chain to the Abandoned.
  skipped = sorted({type(a).__name__ for a in after})
  again = scheduled is not None and context.workdir is not None
  _log.warning("%s abandoned at step %d by a signal%s%s", name, context.step,
               f"; not run at this step: {', '.join(skipped)}" if skipped else "",
               f" (a run resumed from step {context.step} runs {'them' if skipped else 'it'} "
               "first)" if again else "")
  if again:
    _note_abandoned(context, scheduled, [action, *after])
  stopper.check(context.step)  # saves, and raises Preempted or Interrupted
  raise abandoned


def _save_after_failure(session, context, action, error):
  """An action failed: keep the steps trained since the last checkpoint."""
  if not session.saves or session.placement.workers > 1:
    return  # a save is collective: the other workers are not in this one
  try:
    path = session.save(f"{type(action).__name__} failed")
  except Exception:  # pylint: disable=broad-except
    return  # the action's error says more than the save's
  error.add_note(f"ctl: {type(action).__name__} failed at step {context.step}; the steps "
                 f"trained are saved in {path}. Fix the cause and rerun the same "
                 f"command to resume: it runs {type(action).__name__} at step "
                 f"{context.step} first.")


def _first_non_finite(results):
  """The index of the first step with a NaN or Inf result, or None."""
  bad = [i for values in results.values() for i in np.flatnonzero(~np.isfinite(values))]
  return min(bad) if bad else None


def _check_finite(results, first_step, session, i):
  """Raises FloatingPointError at step `i` of `results`, unless `i` is None."""
  if i is None:
    return
  values = ", ".join(f"{k} {v[i]:.6g}" for k, v in results.items())
  last = session.latest
  kept = (f"the last checkpoint, {last}, is intact (nothing later was saved)" if last
          else "no checkpoint was saved")
  raise FloatingPointError(
      f"non-finite result at step {first_step + i} (ctx.step == {first_step + i}): "
      f"{values}. Training stopped; {kept}. Rerunning replays the same steps "
      "exactly, so change something first: a lower learning rate, gradient "
      "clipping, or a penalty on the discriminator.")
