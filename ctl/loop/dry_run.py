"""`fit(..., dry_run=True)`: every code path of a fit once, tiny, writing nothing
that stays, so a config's mistake shows in seconds rather than an hour in.

    runner.fit(10_000, "runs/x", actions=[...], dry_run=True)   # then the real run
    # ctl train dcgan --dry-run

It runs the fit in a scratch directory, then puts the runner back as it was and
logs what each part took; docs/workflow.md ("The dry run") tells what it runs.
Trackers (`loggers=`) are not started: a dry run would leave a run in them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import TYPE_CHECKING

import tensorflow as tf

if TYPE_CHECKING:
  from ctl.loop.history import History
  from ctl.loop.loggers import Logger
  from ctl.parts.steps import TrainStep

_log = logging.getLogger("ctl")


class DryRun:
  """What a dry run measured: `timings`, a (part, seconds) pair per part run.
  `workdir` and `total_steps` are the real run's (its workdir is left untouched).
  """

  def __init__(self, workdir: str | None = None, total_steps: int = 0) -> None:
    self.timings: list[tuple[str, float]] = []
    self.workdir = workdir
    self.total_steps = total_steps

  def begin(self, step: int) -> int:
    """The step the dry run's fit trains to: one step past `step`, the start."""
    if step >= self.total_steps and self.workdir:
      _log.info("dry run: %s is at step %d, which is total_steps: the real run would "
                "train nothing; the dry run trains one step past it", self.workdir, step)
    return step + 1

  @contextlib.contextmanager
  def timed(self, part: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
      yield
    finally:
      self.timings.append((part, time.perf_counter() - start))


def run(fit_in: Callable[..., History], workdir: str | None, total_steps: int,
        compiled_step: TrainStep, history: History, skipped_loggers: list[Logger]) -> History:
  """Runs `fit_in(scratch_workdir, dry=dry_run)` and puts the runner back; returns
  the history of the step it trained."""
  dry = DryRun(workdir, total_steps)
  started = time.perf_counter()
  scratch = tempfile.mkdtemp(prefix="ctl-dry-run-")
  state, feed = compiled_step.state, compiled_step.feed
  variables = tf.nest.flatten(state.variables())
  values = [v.numpy() for v in variables]
  position = _save_position(feed, scratch)
  first_step = int(state.global_step.numpy())
  try:
    trained = fit_in(os.path.join(scratch, "run"), dry=dry)
  finally:
    for v, value in zip(variables, values):
      v.assign(value)
    if position is not None:
      position.read(os.path.join(scratch, "position")).expect_partial()
    history.drop_from(first_step)
    shutil.rmtree(scratch, ignore_errors=True)
  parts = "; ".join(f"{part} {seconds:.2f} s" for part, seconds in dry.timings)
  skipped = ", ".join(type(logger).__name__ for logger in skipped_loggers)
  _log.info("dry run: every part ran once in %.1f s (%s)%s; the runner is back as it was "
            "before the dry run (step %d) and %s is untouched",
            time.perf_counter() - started, parts,
            f"; not started: {skipped}" if skipped else "", first_step,
            workdir or "no work directory")
  return trained


def _save_position(feed, scratch):
  """The data's position written to `scratch`, a `tf.train.Checkpoint` to read it
  back; None when TF cannot save it (the dry run then moves it)."""
  if not feed.checkpointable:
    _log.warning("dry run: the data's position cannot be saved here (see "
                 "ctl.loop.checkpoints), so it moves on by the step the dry run trains")
    return None
  position = tf.train.Checkpoint(data=feed.iterator)
  try:
    position.write(os.path.join(scratch, "position"))
  except tf.errors.FailedPreconditionError:
    return None  # a stateful op in the pipeline: the fit's checkpoint check says so
  return position
