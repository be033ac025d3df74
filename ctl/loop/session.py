"""One `fit`'s resources and the only place they are used: `Session`.

    with Session(compiled_step, history, "runs/x", checkpoint=ctl.Checkpoint()) as session:
      step = session.restore()             # the one restore of a fit
      session.begin(run, loggers)          # history.jsonl, metrics.jsonl, manifest, loggers
      ...
      session.save("schedule")             # the one save: the loop, a signal, BestCheckpoints
      session.close("finished")

Nothing else in ctl saves or restores during a fit. A logger of the work
directory's own stops the run by an error; a user's tracker is dropped with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ctl.loop import checkpoints
from ctl.loop import dry_run as dry_run_lib
from ctl.loop import history as history_lib
from ctl.loop import loggers as loggers_lib
from ctl.loop import manifest as manifest_lib
from ctl.loop import stopping
from ctl.loop import workdir as workdir_lib
from ctl.loop.checkpoints import write_text_atomically
from ctl.parts import export as export_lib

if TYPE_CHECKING:
  import tensorflow as tf

  from ctl.loop.schedule import Every
  from ctl.parts.steps import TrainStep

_log = logging.getLogger("ctl")


class Session:
  """One fit's lock, checkpointer, records and loggers. `summaries`: the `every`
  of the fit's `ctl.Summaries`; `dry`: the `ctl.loop.dry_run.DryRun` this fit is;
  `records=False` leaves history.jsonl and metrics.jsonl as they are (a fit with
  checkpoint=False over an earlier run's).
  """

  def __init__(self, compiled_step: TrainStep, history: history_lib.History,
               workdir: str | None, *, checkpoint: checkpoints.Checkpoint | None,
               summaries: Every | None = None, dry: dry_run_lib.DryRun | None = None,
               records: bool = True):
    self.placement = compiled_step.placement
    self.is_chief = self.placement.is_chief
    self.workdir = workdir
    self.history = history
    self.checkpoint = checkpoint
    self.state, self._feed = compiled_step.state, compiled_step.feed
    self._summaries = summaries
    self._dry = dry
    self._records = records
    self._lock: workdir_lib.Lock | None = None
    self._checkpointer: checkpoints.Checkpointer | None = None
    self._loggers: list[loggers_lib.Logger] = []
    self._own: list[loggers_lib.Logger] = []  # the work directory's: errors stop the run
    feed = self._feed
    self.examples_per_step = (None if feed.global_batch_size is None
                              else feed.global_batch_size * feed.batches_per_step)

  # The work directory and the checkpointer.

  def __enter__(self) -> Session:
    """Takes the work directory (one writer at a time; a dry run goes back
    nowhere: it writes nothing) and opens the checkpointer."""
    resume_from = (self.checkpoint.resume_from if self.checkpoint and self._dry is None
                   else None)
    self._lock = _lock(self.placement, self.workdir, resume_from)
    try:
      if self.checkpoint:
        self._checkpointer = self.checkpoint.open(self.placement, self.state, self._feed,
                                                  self.workdir)
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.release_lock()
    self._lock = None

  @property
  def saves(self) -> bool:
    return self._checkpointer is not None

  @property
  def latest(self) -> str | None:
    return self._checkpointer.latest if self._checkpointer else None

  @property
  def restore_manager(self) -> tf.train.CheckpointManager:
    """The manager TF's preemption handler restores through (`ctl.loop.stopping`)."""
    return self._checkpointer.restore_manager

  def restore(self) -> int:
    """Restores the newest checkpoint that reads whole, repairing the directory
    (a dry run: what the real run would resume from, read only); returns the step."""
    dry = self._dry
    newest = checkpoints.newest(dry.workdir) if dry is not None and dry.workdir else None
    if newest:
      with self.timed(f"restore {newest}"):
        checkpoints.Checkpointer(self.placement, self.state, self._feed,
                                 os.path.join(dry.workdir, "checkpoints")).restore()
    if self._checkpointer is None:
      return int(self.state.global_step.numpy())
    return self._checkpointer.restore(repair=True)

  def read_back(self) -> None:
    """Restores the checkpoint this fit saved last (a dry run's check that it reads)."""
    if self._checkpointer is not None:
      with self.timed(f"restore {os.path.basename(self.latest or '')}".strip()):
        self._checkpointer.restore()

  def save(self, why: str, *, wait: bool = True) -> str | None:
    """Saves the current step if not saved, on every worker (a save is collective);
    returns its path on the chief. `why` goes in the log line. `wait=False`: in
    the background, if the fit's `ctl.Checkpoint` is asynchronous."""
    if self._checkpointer is None:
      return None
    with self.timed("checkpoint save"):
      path = self._checkpointer.save(wait=wait)
    if path:
      _log.debug("saved %s (%s)", path, why)
    return path

  def keep(self, into: str) -> str | None:
    """Saves the current step if it is not saved, and copies its checkpoint
    into `<workdir>/checkpoints/<into>/` (see `Checkpointer.copy_newest`)."""
    if self._checkpointer is None:
      raise ValueError("this fit saves no checkpoints (checkpoint=False): there is none "
                       "to keep; drop checkpoint=False.")
    self.save(f"kept in {into}")
    return self._checkpointer.copy_newest(into) if self.is_chief else None

  def check_workdir(self, step: int, *, save: bool = True) -> None:
    """A work directory deleted or moved mid-run is made again, written again
    and, if `save` (the weights are finite), saved into at once."""
    if self._lock is None or self._lock.held():
      return
    self._lock.release()
    self._lock = workdir_lib.Lock(self.workdir)
    if self._checkpointer is not None:  # a save in flight wrote into what went
      with contextlib.suppress(Exception):
        self._checkpointer.wait()
    for logger in self._loggers:  # the files in it are new
      if callable(getattr(logger, "reopen", None)):  # optional outside ctl.Logger
        logger.reopen()
    saved = ""
    if self._checkpointer and self.placement.workers == 1 and save:
      saved = f"; saved {self.save('workdir made again')}"
    _log.warning("workdir %s disappeared (deleted or moved), noticed at step %d: made it "
                 "again and writing to it from here on%s. What was in it is not there.",
                 self.workdir, step, saved)

  def release_lock(self) -> None:
    if self._lock is not None:
      self._lock.release()

  def timed(self, part: str) -> contextlib.AbstractContextManager[None]:
    return self._dry.timed(part) if self._dry is not None else contextlib.nullcontext()

  # The records and the loggers.

  def begin(self, run: loggers_lib.Run, loggers: Sequence[loggers_lib.Logger]) -> None:
    """Opens the chief's records and begins its loggers: the work directory's,
    then `loggers`; appends the fit's manifest."""
    history_file, metrics_file = self._open_records()
    if not self.is_chief:
      return
    if self.workdir is not None:
      self._own = [loggers_lib.TensorBoard(self.workdir, self._summaries,
                                           optimizers=self.state.optimizers,
                                           examples_per_step=self.examples_per_step),
                   loggers_lib.JsonLines(history_file, metrics_file)]
    for logger in [*self._own, *loggers]:
      logger.begin(run)  # an error here stops the fit before its first step
      self._loggers.append(logger)
    if self.workdir is not None:  # once the trackers took the fit
      manifest_lib.append(self.workdir, run.manifest)

  def log_steps(self, first_step: int, results: Mapping[str, np.ndarray]) -> None:
    self._each(first_step, lambda logger: logger.log_steps(first_step, results))

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    if metrics:
      self._each(step, lambda logger: logger.log_metrics(step, dict(metrics)))

  def log_image(self, step: int, name: str, image: np.ndarray) -> None:
    self._each(step, lambda logger: logger.log_image(step, name, image))

  def flush(self) -> None:
    self._each(None, lambda logger: logger.flush())

  def _each(self, step: int | None, call: Callable[[loggers_lib.Logger], None]) -> None:
    """`call(logger)` for every logger; a tracker that fails is dropped."""
    for logger in list(self._loggers):
      try:
        call(logger)
      except Exception as e:  # pylint: disable=broad-except
        if logger in self._own:
          raise
        self._loggers.remove(logger)
        _log.warning("logger %s failed%s (%s: %s); it gets nothing more from this fit, "
                     "the work directory keeps every record.", type(logger).__name__,
                     "" if step is None else f" at step {step}", type(e).__name__, e)

  def close(self, status: str) -> None:
    """Waits for the save in flight; each begun logger's `end`, however the fit
    ends; one that fails is named."""
    if self._checkpointer is not None:
      try:
        self._checkpointer.wait()
      except Exception as e:  # pylint: disable=broad-except
        _log.warning("%s; the fit is %s.", e, status)
    for logger in reversed(self._loggers):
      try:
        logger.end(status)
      except Exception as e:  # pylint: disable=broad-except
        _log.warning("%s.end failed: %s: %s", type(logger).__name__, type(e).__name__, e)
    self._loggers, self._own = [], []

  def _open_records(self):
    """The chief's `history.jsonl` and `metrics.jsonl` (else None, None), without the
    lines from this run's start on, the runner's history taking the earlier ones."""
    step = int(self.state.global_step.numpy())
    self.history.drop_from(step)  # restored from a checkpoint: later steps are undone
    if self.workdir is None or not self.is_chief or not self._records:
      return None, None
    # (A dry run's scratch file lacks the real run's steps: none is lost.)
    history_file = history_lib.HistoryFile(self.workdir, every_step=self._dry is None)
    earlier = history_file.open(step, memory=self.history)
    if len(earlier.steps):
      self.history.drop_from(int(earlier.steps[0]))
      self.history.extend(earlier)
    metrics_file = history_lib.HistoryFile(self.workdir, history_lib.METRICS_FILE_NAME,
                                           every_step=False)
    metrics_file.open(step + 1)
    # Lines lost to damage (a cut, a garbage line, a deletion) that TensorBoard holds.
    put_back = metrics_file.add(loggers_lib.TensorBoard.scalars(self.workdir, 0, step))
    if put_back:
      _log.warning("%s: put back the metrics of step%s %s from TensorBoard's events (as "
                   "float32 values); the file had lost them", metrics_file.path,
                   "s" if len(put_back) > 1 else "", ", ".join(map(str, put_back)))
    return history_file, metrics_file

  # The end of a fit.

  def ended(self, step: int) -> bool:
    """Whether the end of a fit (its save and actions) ran at `step`."""
    try:
      with open(self._finished_path()) as f:
        return int(f.read()) == step
    except (OSError, TypeError, ValueError):
      return False

  def mark_ended(self, step: int) -> None:
    """Notes that the end ran at `step`: a run stopped after its last checkpoint
    but before, say, its export finds no note when rerun and runs them again."""
    if self.workdir and self.is_chief:
      write_text_atomically(self._finished_path(), f"{step}\n")

  def _finished_path(self):
    return os.path.join(self.workdir, "checkpoints", "finished_step")


def _lock(placement, workdir, resume_from):
  """Locks the work directory on the chief (every worker fails if it cannot, or
  cannot write it), goes back to `resume_from` and removes a stopped export's scratch."""
  if workdir is None:
    return None
  lock, error = None, None
  if placement.is_chief:
    try:
      _check_writable(os.path.join(workdir, "checkpoints"), workdir)
      lock = workdir_lib.Lock(workdir)
      if resume_from is not None:
        checkpoints.go_back(
            os.path.join(workdir, "checkpoints"), resume_from,
            copied=[os.path.join(workdir, name) for name in (
                history_lib.FILE_NAME, history_lib.METRICS_FILE_NAME)],
            moved=[os.path.join(workdir, loggers_lib.NOTES_FOLDER)])
    except (OSError, workdir_lib.WorkdirInUse, checkpoints.CheckpointError) as e:
      if lock is not None:
        lock.release()
        lock = None
      error = e
  if stopping.agree(placement, [error is not None])[0]:
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
