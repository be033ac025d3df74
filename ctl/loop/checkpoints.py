"""Checkpoints that resume a run exactly: `Checkpoint` (how `fit` saves) and
`Checkpointer` (the saves and restores).

    runner.fit(10_000, "runs/x", checkpoint=ctl.Checkpoint(ctl.Every(steps=500), keep=5))

    checkpointer = Checkpointer(runner.placement, runner.state, runner.feed,
                                "runs/x/checkpoints", keep=3)
    step = checkpointer.restore()      # 0 when the directory holds no checkpoint
    ...
    checkpointer.save()                # ckpt-<global step>
    checkpointer.save(wait=False)      # asynchronous=True: a thread writes it
    checkpointer.wait()                # ... until here

What a checkpoint holds, and how a damaged folder is restored: docs/outer-loop.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import gin
import tensorflow as tf

from ctl.base import _tf_internal
from ctl.base import arguments
from ctl.loop.schedule import Every
from ctl.loop.schedule import check_every

if TYPE_CHECKING:
  from ctl.distribute.placement import Placement
  from ctl.parts.data import Feed
  from ctl.parts.state import State

_log = logging.getLogger("ctl")
_STEP_KEY = "step/.ATTRIBUTES/VARIABLE_VALUE"  # the global step (`State.variables`)
_BATCH_SIZE = "data_batch_size"  # the global batch size of the saved data position
_BATCH_SIZE_KEY = f"{_BATCH_SIZE}/.ATTRIBUTES/VARIABLE_VALUE"


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be restored into this runner; the
  message names the checkpoint and the fix."""


def is_kept_name(name: object) -> bool:
  """Whether `name` can be a folder of kept checkpoints under `<workdir>/checkpoints`
  (`ctl.BestCheckpoints(directory=...)`): one folder, not `damaged/`."""
  return (isinstance(name, str) and bool(name) and os.sep not in name and "/" not in name
          and name not in (".", "..", "damaged"))


def kept_folders(workdir: str) -> list[str]:
  """The folders under `<workdir>/checkpoints` that hold kept checkpoints, sorted."""
  try:
    names = [e.name for e in os.scandir(os.path.join(workdir, "checkpoints")) if e.is_dir()]
  except OSError:
    return []
  return sorted(n for n in names if is_kept_name(n) and newest(workdir, n) is not None)


def step_named(checkpoint: object) -> int | None:
  """N if `checkpoint` names the checkpoint saved at step N (an int >= 0, or a
  string "N" or "ckpt-N", as `ctl eval --checkpoint N` passes it); else None."""
  if isinstance(checkpoint, int) and not isinstance(checkpoint, bool) and checkpoint >= 0:
    return checkpoint
  match = (re.fullmatch(r"(?:ckpt-)?(\d+)", checkpoint.strip())
           if isinstance(checkpoint, str) else None)
  return int(match[1]) if match else None


def of_step(workdir: str, step: int) -> str:
  """The path prefix of `<workdir>/checkpoints/ckpt-<step>`; FileNotFoundError,
  naming the steps there, if its files are not."""
  directory = os.path.join(workdir, "checkpoints")
  saved = _Listing(directory).on_disk
  if step in saved:
    return saved[step]
  steps = ", ".join(str(s) for s in sorted(saved)) or "none"
  raise FileNotFoundError(
      f"no checkpoint of step {step} in {directory}: the steps saved there are {steps} "
      "(fit keeps the newest few: ctl.Checkpoint(keep=...)); give one of those, or "
      "'newest'.")


def newest(workdir: str, kept: str | None = None) -> str | None:
  """The path prefix of the newest checkpoint in `<workdir>/checkpoints`, or None:
  the one of the highest step whose files are there, whatever the `checkpoint`
  file says. `kept`: a folder of kept checkpoints there to look in instead, where
  the `checkpoint` file decides (`ctl.BestCheckpoints` names its best the newest)."""
  listing = _Listing(os.path.join(workdir, "checkpoints", *([kept] if kept else [])))
  if kept and listing.named:
    return listing.named
  return listing.on_disk[max(listing.on_disk)] if listing.on_disk else None


class Checkpoint:
  """How `fit` checkpoints: `fit(..., checkpoint=ctl.Checkpoint(...))`.

  `fit` restores the newest checkpoint of `<workdir>/checkpoints` before the
  first step, saves on this schedule and at the end, and saves before
  anything else when a signal, a NaN or a failing action stops the run.

  Args:
    every: an `Every`; by default every 1000 steps or 10 minutes.
    keep: how many of the newest checkpoints to keep.
    restore_data: False starts the data again from its beginning on resume
      instead of where the checkpoint left it: needed to resume with another
      batch size (the models and optimizers are restored either way).
    resume_from: go back: resume from the checkpoint of this step although
      newer ones exist, which are set aside, not deleted (`go_back`). Once:
      while their folder is there, a rerun with the same option resumes from
      the newest checkpoint, i.e. what it trained since.
    asynchronous: True writes the scheduled saves in a background thread while
      training goes on: the step waits only for the values to be taken (a
      copy-on-write read). One save at a time: the next save waits for the one
      in flight, and so do the end's, a signal's and `BestCheckpoints`'
      (written at once); a save that failed stops the run at the next. The
      `checkpoint` file names a checkpoint once its files are whole, so a
      crash mid-write leaves the previous checkpoint the one restored.
  """

  def __init__(self, every: Every | None = None, keep: int = 3, *,
               restore_data: bool = True, resume_from: int | None = None,
               asynchronous: bool = False):
    check_every("Checkpoint", every)
    arguments.integer("Checkpoint: keep", keep, minimum=1)
    if resume_from is not None:
      arguments.integer("Checkpoint: resume_from", resume_from, minimum=0,
                        meaning="the step of the checkpoint to go back to")
    if not isinstance(asynchronous, bool):
      raise TypeError(f"Checkpoint(asynchronous={asynchronous!r}): pass True (scheduled "
                      "saves written in the background) or False.")
    self.every = every or Every(steps=1000, seconds=600)
    self.keep = keep
    self.restore_data = restore_data
    self.resume_from = resume_from
    self.asynchronous = asynchronous

  def open(self, placement: Placement, state: State, feed: Feed,
           workdir: str) -> Checkpointer:
    """The checkpointer of `<workdir>/checkpoints`, checked before training."""
    checkpointer = Checkpointer(placement, state, feed, os.path.join(workdir, "checkpoints"),
                                keep=self.keep, restore_data=self.restore_data,
                                asynchronous=self.asynchronous)
    checkpointer.check_data_can_be_saved()
    return checkpointer


class Checkpointer:
  """Saves and restores `state` and `feed`'s position in the data under
  `directory`, keeping the `keep` newest. Every worker takes part in a save
  (TF's collective save needs them all); only the chief's files are kept.
  `restore_data=False` starts the data again (its position is saved either way);
  `asynchronous`: `save(wait=False)` writes in a thread (`Checkpoint`).
  """

  def __init__(self, placement: Placement, state: State, feed: Feed, directory: str,
               keep: int = 3, restore_data: bool = True, asynchronous: bool = False):
    self._state = state
    self._asynchronous = asynchronous
    self._writing: _Writing | None = None  # the save in flight in the background
    self._iterator = feed.iterator if feed.checkpointable else None
    self.directory = directory
    self._saved_step = None
    self.is_chief = placement.is_chief
    self._keep = keep
    if not self.is_chief:
      self._scratch = os.path.join(directory, f"workertemp_{placement.worker.index}")
    state = state.variables()
    if self._iterator is not None:
      state["data"] = self._iterator
      self._batch_size = feed.global_batch_size or 0
      state[_BATCH_SIZE] = tf.Variable(self._batch_size, dtype=tf.int64, trainable=False)
    else:
      _log.warning("the data position is not checkpointed (a dataset function, a "
                   "TPU or parameter-server workers read through TF's distributed "
                   "or per-worker iterators, which TF 2.21 cannot save): a resumed "
                   "run restarts its input pipeline. Pass a dataset of global "
                   "batches to another strategy for an exact resume.")
    for kind in ("models", "optimizers"):
      state[kind] = {_encode(name): values for name, values in state[kind].items()}
    self._saved = state  # what each save writes, as its values are at that save
    self.checkpoint = tf.train.Checkpoint(**state)
    self._restored = self.checkpoint if restore_data or self._iterator is None else (
        tf.train.Checkpoint(**{k: v for k, v in state.items() if k not in ("data", _BATCH_SIZE)}))
    self._open_managers()

  def _open_managers(self):
    """What TF's preemption handler restores through (it restores at creation),
    which reads the directory's `checkpoint` file."""
    self.restore_manager = _manager(self._restored, self.directory, self._keep)
    self._latest = self.restore_manager.latest_checkpoint

  @property
  def latest(self) -> str | None:
    """Path prefix of the newest checkpoint written whole, or None."""
    return self._latest

  def check_data_can_be_saved(self) -> None:
    """Refuses, by a trial write before any step, a data position no save could
    write (a stateful op in the pipeline would fail every save)."""
    if self._iterator is None:
      return
    probe = tempfile.mkdtemp(prefix="ctl-data-position-")
    try:
      tf.train.Checkpoint(data=self._iterator).write(os.path.join(probe, "position"))
    except tf.errors.FailedPreconditionError as e:
      raise CheckpointError(
          f"the position in the data cannot be checkpointed: {_op_message(e)}. TF "
          "saves no state of stateful ops in a tf.data pipeline, so no checkpoint "
          "could be written. For an exact resume, use stateless ops in the pipeline "
          "(tf.random.stateless_uniform, tf.image.stateless_random_flip_left_right, "
          "... with a seed per element, e.g. from Dataset.enumerate) and TensorFlow "
          "ops instead of tf.py_function; or, to save the position without that op's "
          "state (a resumed run then draws other random numbers), set "
          "options.experimental_external_state_policy = "
          "tf.data.experimental.ExternalStatePolicy.WARN on a tf.data.Options() and "
          "pass data.with_options(options).") from None
    finally:
      shutil.rmtree(probe, ignore_errors=True)

  def restore(self, *, repair: bool = False, path: str | None = None) -> int:
    """Restores the newest checkpoint that reads whole (docs/outer-loop.md, "A
    damaged checkpoint folder"); returns the global step. Nothing is deleted.

    Args:
      repair: (the chief of a `fit`, holding the lock) move the skipped ones into
        `damaged/` and name the restored one in the `checkpoint` file, so that
        the next saves neither keep the damaged ones nor delete good ones for them.
      path: the checkpoint to restore instead (`of_step`): an error if it does
        not read whole, nothing else tried or repaired.
    """
    step = int(self._state.global_step.numpy())
    listing = _Listing(self.directory)
    if path is None:
      path = self._readable(listing)
    else:
      why, repair = _unreadable(path), False
      if why is not None:
        raise CheckpointError(f"checkpoint {path} cannot be read: {why}. Give another "
                              "step, or 'newest'.")
    if path is None:  # a new run (or one trained before without a workdir)
      return step
    saved_step = _step_of(path)
    if step not in (0, saved_step):
      back = (f"To train on from step {step} here, go back to its checkpoint: "
              f"fit(..., checkpoint=ctl.Checkpoint(resume_from={step})) (the newer ones "
              "are set aside, not deleted). " if step in listing.on_disk else "")
      raise CheckpointError(
          f"this runner is at step {step} (trained or restored in memory), but the "
          f"newest checkpoint in {self.directory} is at step {saved_step}: restoring it "
          f"would discard this runner's state. {back}Pass another workdir to keep "
          "this runner's state, or make a new Runner to resume from the checkpoint.")
    reader = tf.train.load_checkpoint(path)  # read whole by `_readable`
    saved = _saved_layout(reader)
    self._check_data(path, reader)
    variables = self._state.variables()
    differences = _differences(saved, variables)
    mismatch = _precision_switched(reader, variables) or (differences and (
        _loss_scaling_switched(saved, self._state.optimizers)
        or f"{'; '.join(differences)}. It was written for other models, optimizers or "
        "sizes; use a new work directory for this experiment, or build the runner as "
        "that run did."))
    if mismatch:
      raise CheckpointError(f"checkpoint {path} does not match this runner: {mismatch}")
    state = tf.nest.flatten(variables)
    before = [v.numpy() for v in state]
    try:
      status = self._restored.restore(path).expect_partial()
      status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
      for v, value in zip(state, before):  # never leave a partial restore behind
        v.assign(value)
      if isinstance(e, tf.errors.OpError) and "restore dataset iterator" in str(e):
        raise CheckpointError(
            f"checkpoint {path} holds a position in other data: TF could not take "
            f"it up in this pipeline ({_op_message(e).splitlines()[0]}). The data "
            "pipeline's structure changed since that save (a map, shuffle, batch or "
            "prefetch added, removed or moved). Build the data as that run did, or pass "
            "fit(checkpoint=ctl.Checkpoint(restore_data=False)) (`ctl train "
            "--restart-data`) to restore the models and optimizers and start the data "
            "again from its beginning.") from None
      if isinstance(e, tf.errors.OpError):
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(e).__name__}: {_tf_message(e)}): its "
            "files are damaged, although they read whole a moment ago (changed meanwhile?). "
            f"Move {path}.* elsewhere so that the previous checkpoint is restored, or use a "
            "new work directory.") from None
      raise CheckpointError(
          f"checkpoint {path} does not match this runner (other models, optimizers "
          f"or data?): {str(e)[:500]}. Use a new work directory for a different "
          "experiment.") from None
    step = int(self._state.global_step.numpy())
    self._saved_step = step  # no save writes over the checkpoint just restored
    _log.info("restored %s (step %d)%s", path, step, "" if self._restored is self.checkpoint
              else "; the data starts again from its beginning (restore_data=False)")
    if repair and self.is_chief and (listing.skipped or listing.named != path):
      self._repair(listing, path)
    return step

  def _readable(self, listing):
    """The newest checkpoint of `listing` that reads whole (None: none is
    there); warns of each one passed over."""
    where = f"{self.directory}/checkpoint"
    candidates = [listing.on_disk[s] for s in sorted(listing.on_disk, reverse=True)]
    if listing.named is None:
      if not candidates:
        return None
      _log.warning("%s, which names the newest checkpoint, %s: the checkpoints found "
                   "from their files are %s; restoring the newest that reads whole.",
                   where, "names none (an empty file?)" if listing.pointer_names_none
                   else "cannot be read" if listing.pointer_exists else
                   "is missing (a partial copy, a sync that skipped it, a clean-up?)",
                   ", ".join(os.path.basename(p) for p in reversed(candidates)))
    else:
      # Newest first, whatever the pointer says: the next saves would write
      # over the checkpoints newer than a stale one.
      named_step = _step_of(listing.named)
      newer = sorted(s for s in listing.on_disk if named_step is not None and s > named_step)
      if newer:
        _log.warning(
            "%s names %s as the newest checkpoint, but %s %s newer (a copy or sync that "
            "took the `checkpoint` file before the newest files, a backup put back, or a "
            "save stopped before it named its checkpoint): restoring the newest that "
            "reads whole. To go back to %s, pass --resume-from %s to ctl train, or "
            "fit(checkpoint=ctl.Checkpoint(resume_from=%s)): the newer ones are then "
            "moved aside, not deleted.",
            where, os.path.basename(listing.named),
            ", ".join(f"ckpt-{s}" for s in newer), "is" if len(newer) == 1 else "are",
            os.path.basename(listing.named), named_step, named_step)
      if not tf.io.gfile.exists(listing.named + ".index"):
        listing.skipped.append(
            (listing.named, f"its index file {os.path.basename(listing.named)}.index is "
             "not there"))
        if not candidates:
          raise CheckpointError(
              f"{where} names the checkpoint {listing.named}, but no checkpoint's files "
              f"are in {self.directory} (copied in part?). Copy the ckpt-* files too; "
              f"or, to train from step 0, delete {where}.")
      elif listing.named not in candidates:
        candidates.insert(len(newer), listing.named)
    for path in candidates:
      why = _unreadable(path)
      if why is None:
        break
      listing.skipped.append((path, why))
    else:
      path = None
    for skipped, why in listing.skipped:
      _log.warning("checkpoint %s is skipped: %s.%s", skipped, why,
                   f" Restoring {path} instead." if path else "")
    if path is None:
      raise CheckpointError(
          f"no checkpoint in {self.directory} can be read: " + "; ".join(
              f"{os.path.basename(p)}: {why}" for p, why in listing.skipped) +
          ". Nothing was deleted. Copy the files again from where they were written, "
          "or move the directory away to train from step 0.")
    return path

  def _repair(self, listing, path):
    """Moves the skipped checkpoints into `damaged/`; the `checkpoint` file names
    `path` the newest, after the older ones (for `keep`)."""
    damaged = os.path.join(self.directory, "damaged")
    for skipped, _ in listing.skipped:
      files = tf.io.gfile.glob(skipped + ".*")
      if files:
        os.makedirs(damaged, exist_ok=True)
        for f in files:
          os.replace(f, os.path.join(damaged, os.path.basename(f)))
        _log.warning("moved the files of %s to %s", os.path.basename(skipped), damaged)
    step = _step_of(path)
    known = [listing.on_disk[s] for s in sorted(listing.on_disk)
             if listing.on_disk[s] not in dict(listing.skipped) and (step is None or s < step)]
    write_pointer(self.directory, known + [path])
    _log.warning("%s/checkpoint now names %s as the newest checkpoint", self.directory,
                 os.path.basename(path))
    self._open_managers()

  def _check_data(self, path, reader):
    if self._restored is not self.checkpoint or not reader.has_tensor(_BATCH_SIZE_KEY):
      return
    saved = int(reader.get_tensor(_BATCH_SIZE_KEY))
    if saved != self._batch_size:
      raise CheckpointError(
          f"checkpoint {path} holds the position in data batched by {saved} (global "
          f"batch size), but the data now gives batches of {self._batch_size}: that "
          "position cannot be taken up by this pipeline. Resume with batches of "
          f"{saved}, or pass fit(checkpoint=ctl.Checkpoint(restore_data=False)) "
          "(`ctl train --restart-data`) to restore the models and optimizers and start "
          "the data again from its beginning.")

  def save(self, *, wait: bool = True) -> str | None:
    """Writes `ckpt-<global step>`; returns its path (on the chief). TF replaces
    the `checkpoint` file that names the newest last, atomically, so a crash
    mid-save leaves the previous checkpoint the one restored.

    The save in flight is waited for first (`wait`). With `asynchronous`,
    `wait=False` returns once the values are taken, and a thread writes them.
    """
    self.wait()
    step = int(self._state.global_step.numpy())
    if step == self._saved_step:  # e.g. a stop's save, then the end's
      return self.latest if self.is_chief else None
    directory = self.directory if self.is_chief else self._scratch
    background = self._asynchronous and not wait
    snapshot, frozen = self._snapshot() if background else (self.checkpoint, ())
    manager = _manager(snapshot, directory, self._keep if self.is_chief else 1)
    if not background:
      return self._written(step, _write(manager, step, self.latest, self.is_chief))
    self._writing = _Writing(frozen, manager, step, self.latest, self.is_chief)
    return os.path.join(self.directory, f"ckpt-{step}") if self.is_chief else None

  def _snapshot(self):
    """A checkpoint of the values now, for a thread to write, and its parts
    (`_tf_internal.frozen`)."""
    memo = {}  # a variable two models share is one snapshot, as it is one variable

    def freeze(value):
      if isinstance(value, dict):
        return {k: freeze(v) for k, v in value.items()}
      if isinstance(value, list):
        return [freeze(v) for v in value]
      if id(value) not in memo:
        memo[id(value)] = _tf_internal.frozen(value)
      return memo[id(value)]

    return tf.train.Checkpoint(**freeze(self._saved)), list(memo.values())

  def wait(self) -> None:
    """Waits for the save in flight in the background, if any; raises its OSError."""
    writing = self._writing
    if writing is not None:
      writing.join()  # (a Ctrl-C here leaves it in flight, waited for by the next call)
      self._writing = None
      if writing.error is not None:
        raise writing.error
      self._written(writing.step, writing.path)

  def _written(self, step, path):
    """After the save of `step` is whole: it is the newest; its gin config beside it."""
    self._saved_step = step
    if self.is_chief:
      self._latest = path
      write_text_atomically(os.path.join(self.directory, "operative_config.gin"),
                            gin.operative_config_str() or "# No gin bindings were used: "
                            "this run was configured in Python (its code and command line).\n")
    return path

  def copy_newest(self, into: str) -> str:
    """Copies the newest checkpoint into `<directory>/<into>/`, outside what
    `keep` rotates; returns the copy's path prefix."""
    source = self.latest
    target = os.path.join(self.directory, into)
    os.makedirs(target, exist_ok=True)
    # The index last, each through a temporary name: a checkpoint whose index
    # is there is taken as whole.
    for path in sorted(tf.io.gfile.glob(source + ".*"), key=lambda p: p.endswith(".index")):
      partial = os.path.join(target, ".partial-" + os.path.basename(path))
      shutil.copyfile(path, partial)
      os.replace(partial, os.path.join(target, os.path.basename(path)))
    return os.path.join(target, os.path.basename(source))


def _manager(checkpoint, directory, keep):
  """TF's manager of `directory` saving `checkpoint`, which reads its `checkpoint`
  file (one that names no checkpoint, e.g. empty, is taken as missing, as
  `Checkpointer.restore` does)."""
  with _tf_internal.checkpoint_pointer_naming_nothing_as_missing():
    return tf.train.CheckpointManager(checkpoint, directory, max_to_keep=keep)


def _write(manager, step, latest, is_chief):
  """Writes `manager`'s checkpoint as ckpt-`step`; returns its path (on the chief;
  another worker's files are removed). OSError, naming `latest`, if it failed."""
  directory = manager.directory
  try:
    path = manager.save(checkpoint_number=step)
  except (tf.errors.OpError, OSError) as e:
    if _clean_failed_save(os.path.join(directory, f"ckpt-{step}")):
      raise OSError(
          f"checkpoint ckpt-{step} was written whole in {directory}, but the "
          f"`checkpoint` file could not be updated to name it: {_tf_message(e)}. "
          "Free disk space or fix the directory's permissions, then rerun the same "
          f"command: it resumes from ckpt-{step}.") from e
    raise OSError(
        f"could not write checkpoint ckpt-{step} in {directory}: {_tf_message(e)}. "
        "Its partial files were removed. The newest complete checkpoint is "
        f"{latest or 'none (nothing was saved yet)'}; free disk space or fix the "
        "directory's permissions, then rerun the same command to resume from it.") from e
  if is_chief:
    return path
  shutil.rmtree(directory, ignore_errors=True)
  return None


class _Writing(threading.Thread):
  """`_write` of the snapshot `frozen` in a thread: first its own copy of the
  values (`own`), while the step computes what it will update them with, then
  the write at a low priority (Linux), so that on a busy CPU the training
  threads go first. The interpreter waits for it at exit."""

  def __init__(self, frozen, manager, step, latest, is_chief):
    super().__init__(name=f"ctl-save-ckpt-{step}")
    self.step, self.path, self.error = step, None, None
    self._frozen, self._args = frozen, (manager, step, latest, is_chief)
    self.start()

  def run(self):
    try:
      for part in self._frozen:
        part.own()
      if sys.platform.startswith("linux"):  # a thread's own id: its nice value alone
        with contextlib.suppress(OSError):
          os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
      self.path = _write(*self._args)
    except Exception as e:  # pylint: disable=broad-except
      self.error = e  # raised by `Checkpointer.wait`


def go_back(directory: str, step: int, *, copied: Sequence[str] = (),
            moved: Sequence[str] = ()) -> str | None:
  """Sets aside the checkpoints of `directory` newer than `step`, so that the
  next restore takes ckpt-`step` (`Checkpoint(resume_from=step)`), into
  `<directory>/after-ckpt-<step>/` with `finished_step`, copies of the files
  `copied` (the run's records) and the files or folders `moved` (the trackers'
  notes, which a resumed run must not take up). Returns that folder, or None if
  it was there already or nothing is newer; CheckpointError if ckpt-`step` is
  not whole."""
  folder = os.path.join(directory, f"after-ckpt-{step}")
  if os.path.exists(folder):
    _log.warning("resume_from=%d: this run went back to ckpt-%d before (%s holds what "
                 "was set aside then); resuming from the newest checkpoint. To go back "
                 "to ckpt-%d again, move that folder elsewhere first.", step, step, folder,
                 step)
    return None
  listing = _Listing(directory)
  path = listing.on_disk.get(step)
  why = "it is not there" if path is None else _unreadable(path)
  if why:
    steps = ", ".join(str(s) for s in sorted(listing.on_disk)) or "none"
    raise CheckpointError(f"resume_from={step}: ckpt-{step} of {directory} cannot be "
                          f"restored ({why}); the checkpoints there are of steps {steps}. "
                          "Pass one of them.")
  newer = _newer(directory, step)
  kept = {name: steps for name in kept_folders(os.path.dirname(directory))
          if not name.startswith("after-ckpt-")  # what an earlier going back set aside
          and (steps := _newer(os.path.join(directory, name), step))}
  if not newer and not kept:
    return None
  os.makedirs(folder)
  for record in copied:
    if os.path.exists(record):
      shutil.copy2(record, folder)
  for record in [os.path.join(directory, "finished_step"), *moved]:
    if os.path.exists(record):
      os.replace(record, os.path.join(folder, os.path.basename(record)))
  _move_newer(directory, folder, step)
  # A kept folder's (ctl.BestCheckpoints') copies of those steps go too, with its
  # record as it was: the resumed run drops them from its record, deleting nothing.
  for name in kept:
    os.makedirs(os.path.join(folder, name))
    for record in tf.io.gfile.glob(os.path.join(directory, name, "*.json")):
      shutil.copy2(record, os.path.join(folder, name))
    _move_newer(os.path.join(directory, name), os.path.join(folder, name), step)
  moved = [f"ckpt-{s}" for s in newer] + [f"{name}/ckpt-{s}" for name, steps in kept.items()
                                          for s in steps]
  _log.warning("resume_from=%d: moved %s and the run's records as they were into %s; "
               "resuming from ckpt-%d", step, ", ".join(moved), folder, step)
  return folder


def _newer(directory, step):
  return sorted(s for s in _Listing(directory).on_disk if s > step)


def _move_newer(directory, into, step):
  """Moves the checkpoints of `directory` newer than `step` into `into`,
  rewriting both `checkpoint` files."""
  on_disk = _Listing(directory).on_disk
  newer = sorted(s for s in on_disk if s > step)
  for s in newer:
    for f in tf.io.gfile.glob(on_disk[s] + ".*"):
      os.replace(f, os.path.join(into, os.path.basename(f)))
  if newer:
    write_pointer(into, [os.path.join(into, f"ckpt-{s}") for s in newer])
  older = [on_disk[s] for s in sorted(on_disk) if s <= step]
  if older:
    write_pointer(directory, older)
  elif os.path.exists(os.path.join(directory, "checkpoint")):
    os.remove(os.path.join(directory, "checkpoint"))


class _Listing:
  """What a checkpoint directory holds: `named`, the checkpoint its `checkpoint`
  file names newest (or None); `on_disk`, {step: path} of each `ckpt-<step>` whose
  index is there; `skipped`, [(path, why)] of those `Checkpointer` passed over."""

  def __init__(self, directory):
    self.pointer_exists = tf.io.gfile.exists(os.path.join(directory, "checkpoint"))
    self.pointer_names_none = False
    try:
      state = tf.train.get_checkpoint_state(directory)  # None if unreadable
    except ValueError:  # a `checkpoint` file that names no checkpoint
      state, self.pointer_names_none = None, True
    self.named = state.model_checkpoint_path if state else None
    prefixes = [index[:-len(".index")]
                for index in tf.io.gfile.glob(os.path.join(directory, "ckpt-*.index"))]
    self.on_disk = {_step_of(p): p for p in prefixes if _step_of(p) is not None}
    self.skipped = []


def write_pointer(directory: str, paths: list[str]) -> None:
  """Writes the `checkpoint` file of `directory` naming `paths` (oldest first) as
  TF's CheckpointManager would, with each file's time: TF's manager deletes
  (for `keep`) only the checkpoints written after `last_preserved_timestamp`."""
  times = [os.path.getmtime(p + ".index") for p in paths]
  lines = [f'model_checkpoint_path: "{os.path.basename(paths[-1])}"']
  lines += [f'all_model_checkpoint_paths: "{os.path.basename(p)}"' for p in paths]
  lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in times]
  lines.append(f"last_preserved_timestamp: {min(times) - 1.0!r}")
  write_text_atomically(os.path.join(directory, "checkpoint"), "\n".join(lines) + "\n")


def _clean_failed_save(prefix):
  """After a failed save of `prefix`: whether its files read whole (only the
  `checkpoint` file's update failed); else removes them, e.g. the data file a
  failed merge of `<prefix>_temp` leaves, which would fill the disk again."""
  shutil.rmtree(prefix + "_temp", ignore_errors=True)
  for partial in tf.io.gfile.glob(os.path.join(os.path.dirname(prefix), "checkpoint.tmp*")):
    tf.io.gfile.remove(partial)  # TF's own temporary `checkpoint` file
  if tf.io.gfile.exists(prefix + ".index") and _unreadable(prefix) is None:
    return True
  for partial in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.remove(partial)
  return False


def _step_of(path):  # N of `.../ckpt-N`, or None
  match = re.fullmatch(r"ckpt-(\d+)", os.path.basename(path))
  return int(match.group(1)) if match else None


def _unreadable(path):
  """Why the checkpoint at `path` cannot be read whole (every tensor, each
  checksummed, and the object graph), or None if it can."""
  try:
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    keys = sorted(dtypes)
    with tf.device("/cpu:0"):  # the data position is a variant: only an op reads it
      tf.raw_ops.RestoreV2(prefix=path, tensor_names=keys, shape_and_slices=[""] * len(keys),
                           dtypes=[dtypes[k] for k in keys])
    _saved_layout(reader)
    held = int(reader.get_tensor(_STEP_KEY)) if _STEP_KEY in dtypes else None
  except (tf.errors.OpError, IndexError, KeyError, RuntimeError, ValueError) as e:
    return f"{type(e).__name__}: {_op_message(e).strip()}"
  named = _step_of(path)
  if named is not None and held is not None and held != named:
    # Restoring it would train over the newer checkpoints' names with older weights.
    return f"it holds step {held}, not {named} (renamed, or copied over by hand?)"
  return None


def _saved_layout(reader):
  """{(kind, name): [(node, shape), ...]} of the checkpoint `reader` reads, from
  its object graph: a variable reached from two owners (a layer shared by two
  models, one model under two names) is one node seen from both."""
  graph = _tf_internal.trackable_object_graph(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  shapes = reader.get_variable_to_shape_map()

  def children(node):
    return {c.local_name: c.node_id for c in graph.nodes[node].children}

  def shape(node):
    keys = [a.checkpoint_key for a in graph.nodes[node].attributes
            if a.name == "VARIABLE_VALUE"]
    return list(shapes[keys[0]]) if keys else None

  root, layout = children(0), {}
  for kind in ("models", "optimizers"):
    for name, owner in (children(root[kind]).items() if kind in root else ()):
      listed = children(owner)
      layout[(kind, _decode(name))] = [(listed[str(i)], shape(listed[str(i)]))
                              for i in range(len(listed))]
  return layout


# Model and optimizer names are the keys of the checkpoint's `models` and
# `optimizers`. TF escapes "." and "/" in checkpoint keys and fails to restore
# some names (".ATTRIBUTES", its own attribute marker), so every character
# outside this set is written as "~" and its code point: "gen.a" -> "gen~2e~a".
_PLAIN = re.compile(r"[A-Za-z0-9_-]")


def _encode(name):
  return "".join(c if _PLAIN.fullmatch(c) else f"~{ord(c):x}~" for c in name)


def _decode(key):
  return re.sub(r"~([0-9a-f]+)~", lambda m: chr(int(m.group(1), 16)), key)


def _differences(saved, state):
  """How a checkpoint's `_saved_layout` differs from `state`'s models and
  optimizers: names, counts, shapes, and which variables are one and the same
  (two copies where this runner shares one variable cannot be restored)."""
  ours = {(kind, name): values for kind in ("models", "optimizers")
          for name, values in state[kind].items()}
  differences = []
  first_owner = {}  # variable or checkpoint node -> where it was seen first
  for kind, name in sorted(saved.keys() | ours.keys()):
    where = f"{kind}[{name!r}]"
    mine, theirs = ours.get((kind, name)), saved.get((kind, name))
    if mine is None or theirs is None:
      has = "the checkpoint, not in this runner" if mine is None else (
          "this runner, not in the checkpoint")
      differences.append(f"{where} is in {has}")
    elif len(mine) != len(theirs):
      differences.append(f"{where} has {len(theirs)} variables in the checkpoint, "
                         f"{len(mine)} in this runner")
    else:
      for i, (variable, (node, shape)) in enumerate(zip(mine, theirs)):
        if list(variable.shape) != shape:
          differences.append(f"{where} variable {i} has shape {shape} in the "
                             f"checkpoint, {list(variable.shape)} in this runner")
        here = f"{where} variable {i}"
        mine_first = first_owner.setdefault(("ours", id(variable)), here)
        theirs_first = first_owner.setdefault(("saved", node), here)
        if mine_first != theirs_first:
          differences.append(f"{here} is " + " and ".join(
              f"one variable with {first} in {side}" if first != here else
              f"a variable of its own in {side}"
              for first, side in ((mine_first, "this runner"),
                                  (theirs_first, "the checkpoint"))))
  return differences[:6] + ([f"and {len(differences) - 6} more"] if len(differences) > 6 else [])


# A Keras 3 LossScaleOptimizer's own variables, beside its inner optimizer's:
# iteration, learning_rate, step_counter, dynamic_scale.
_LOSS_SCALE_VARIABLES = 4


def _precision_switched(reader, state):
  """What to say when the checkpoint's model variables are of another float type
  than this runner's (a float64 run resumed in float32, or the reverse), or None."""
  saved = {dtype.name for key, dtype in reader.get_variable_to_dtype_map().items()
           if key.startswith("models/") and dtype.is_floating}
  ours = {tf.as_dtype(v.dtype).name for values in state["models"].values() for v in values
          if tf.as_dtype(v.dtype).is_floating}
  if not saved or not ours or saved == ours:
    return None
  held = f"it holds {' and '.join(sorted(saved))} model variables, this runner builds " + (
      f"{' and '.join(sorted(ours))} ones: ")
  if "float64" in saved:
    return held + (
        "it was trained in float64 (mixed_precision='float64'; in a GAN config, "
        "gan.Experiment.mixed_precision = 'float64'). Build this runner in float64 too "
        "to resume or evaluate it.")
  return held + ("it was trained in float32 (or mixed precision, whose variables are "
                 "float32). Build this runner without mixed_precision='float64' to resume "
                 "or evaluate it; a run cannot change its variables' type midway: start "
                 "it in a new work directory.")


def _loss_scaling_switched(saved, optimizers):
  """What to say when the only difference is loss scaling (mixed_float16) turned
  on or off since the checkpoint was written, or None."""
  import keras  # pylint: disable=import-outside-toplevel
  scaled = {isinstance(o, keras.optimizers.LossScaleOptimizer) for o in optimizers.values()}
  if len(scaled) != 1:  # none, or some of each
    return None
  now_scaled = scaled.pop()
  for name, optimizer in optimizers.items():
    theirs = saved.get(("optimizers", name))
    expected = (len(optimizer.inner_optimizer.variables) if now_scaled
                else len(optimizer.variables) + _LOSS_SCALE_VARIABLES)
    if theirs is None or len(theirs) != expected:
      return None
  names = ", ".join(repr(n) for n in optimizers)
  if now_scaled:
    return (
        "it was trained without loss scaling, and this runner wraps its optimizers "
        f"({names}) in keras.optimizers.LossScaleOptimizer (mixed_precision="
        "'mixed_float16'), whose loss scale and counters the checkpoint does not hold. "
        "Resume with the precision the run was trained in (Runner(mixed_precision=None), "
        "or mixed_bfloat16, which needs no loss scaling); a run cannot switch to "
        "mixed_float16 midway: start it in a new work directory.")
  return (
      f"it was trained with mixed_float16, its optimizers ({names}) wrapped in "
      "keras.optimizers.LossScaleOptimizer, whose loss scale and counters this runner "
      "has no place for. Resume with mixed_precision='mixed_float16' as that run did; a "
      "run cannot leave loss scaling midway: start it in a new work directory.")


def _tf_message(error):
  """A TF error's message without its `{{function_node ...}}` prefix."""
  return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", getattr(error, "message", None)
                or str(error))


def _op_message(error):
  """`_tf_message` without TF's trailing `[Op:...] name: ...`."""
  return re.sub(r"\.?\s*\[Op:[^\]]*\].*$", "", _tf_message(error), flags=re.S)


def write_text_atomically(path: str, text: str) -> None:
  """Writes `text` to `path` through a temporary file and a rename."""
  directory = os.path.dirname(path) or "."
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
  try:
    os.fchmod(fd, 0o644)  # mkstemp makes it private; like TF's files, it is not
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())  # on disk before the rename: a crash leaves the old or the new
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
