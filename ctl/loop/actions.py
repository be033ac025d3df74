"""Work the outer loop runs between compiled calls: the `Action` contract,
the `FitContext` an action is given, and the built-in actions.

    runner.fit(10_000, "runs/x",
               checkpoint=ctl.Checkpoint(ctl.Every(steps=1000, seconds=600)),
               summaries=ctl.Summaries(ctl.Every(steps=100)),
               actions=[
                   ctl.Samples(lambda models: models["generator"](z), ctl.Every(steps=500)),
                   ctl.Evaluate(eval_step, eval_data, ctl.Every(steps=2000)),
                   ctl.Export("generator"),          # every=None: at the end only
                   ctl.Profile(start=100, steps=5),  # a profiler trace of steps 100-105
               ])

Actions run in the order given, so one reads the metrics an earlier one
reported at the same step (`context.metrics`). Checkpoints and TensorBoard's
train scalars are `fit`'s own arguments (`checkpoint=`, `summaries=`), not actions.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

import numpy as np
import tensorflow as tf

from ctl.base import arguments
from ctl.loop import notebook
from ctl.loop import stopping
from ctl.loop.checkpoints import is_kept_name
from ctl.loop.checkpoints import write_pointer
from ctl.loop.checkpoints import write_text_atomically
from ctl.loop.schedule import Every
from ctl.parts import export as export_lib
from ctl.parts.data import check_evaluation_data

if TYPE_CHECKING:
  import keras
  import numpy.typing as npt

  from ctl.loop.session import Session
  from ctl.parts.data import Data
  from ctl.parts.evaluation import Evaluator
  from ctl.step.context import StepFn

_log = logging.getLogger("ctl")

# What `fit(dry_run=True)` measures over: a handful of batches and samples.
DRY_RUN_BATCHES = 2
DRY_RUN_SAMPLES = 16


class FitContext:
  """One `fit` call as its actions see it.

  Attributes:
    models, optimizers: name -> `keras.Model` / optimizer, as `build` returned them.
    step: the global step reached (steps done).
    results: the last compiled call's results, each key an array of per-step values.
    history: every step's results so far (`ctl.History`).
    workdir: the work directory (None: nothing is written).
    is_chief: whether this worker writes records, samples and kept files.
    examples_per_step: the examples one step reads over all replicas (None: unknown).

  In `fit(dry_run=True)`, `evaluate` and `over_samples` measure over a handful.
  """

  def __init__(self, session: Session, *, evaluator: Evaluator | None = None,
               dry_run: bool = False):
    self._session = session
    self._placement = session.placement
    self._evaluator = evaluator
    self._dry_run = dry_run
    self.models: dict[str, keras.Model] = session.state.models
    self.optimizers: dict[str, keras.optimizers.Optimizer] = session.state.optimizers
    self.history = session.history
    self.workdir = session.workdir
    self.is_chief: bool = session.is_chief
    self.examples_per_step = session.examples_per_step
    self.step = int(session.state.global_step.numpy())
    self.results: dict[str, np.ndarray] = {}
    self._metrics, self._metrics_step = {}, self.step  # reported at that step

  def __getattr__(self, name: str) -> Any:
    fix = _GONE.get(name)
    raise AttributeError(f"FitContext has no {name}: " + (fix or (
        "an action reads what it needs from the context's names: "
        f"{', '.join(CONTEXT_NAMES)} (see ctl.FitContext)")) + ".")

  @property
  def can_evaluate(self) -> bool:
    """Whether the fit has an evaluator (`Runner.fit` always does) and a synchronous strategy."""
    return self._evaluator is not None and not self._placement.kind.asynchronous

  def evaluate(self, step_fn: StepFn, data: Data, *, global_batch_size: int | None = None,
               num_batches: int | None = None) -> dict[str, float]:
    """Runs an evaluation step over `data`; see `Runner.evaluate`."""
    if self._dry_run:
      num_batches = min(num_batches or DRY_RUN_BATCHES, DRY_RUN_BATCHES)
    return self._evaluator_or_error().evaluate(
        step_fn, data, global_batch_size=global_batch_size, num_batches=num_batches)

  def over_samples(self, fn: Callable[[dict, tf.Tensor], dict[str, tf.Tensor]],
                   num_samples: int, *, batch_size: int = 500,
                   moments: Sequence[str] = ()) -> dict[str, Any]:
    """Runs `fn(models, indices)` over numbered samples on every replica; see
    `Runner.over_samples`. An action calling it is `collective`."""
    if self._dry_run:
      num_samples = min(num_samples, DRY_RUN_SAMPLES)
      batch_size = min(batch_size, num_samples)
    return self._evaluator_or_error().over_samples(fn, num_samples, batch_size=batch_size,
                                                   moments=moments)

  def _evaluator_or_error(self):
    if self._evaluator is None:
      raise ValueError("this fit has no evaluator: ctl.loop.fit.fit was called without "
                       "evaluator=...; Runner.fit passes its own.")
    return self._evaluator

  def export(self, name: str, directory: str) -> tuple[str, str]:
    """Exports model `name` to `directory`; see `Runner.export`."""
    return export_lib.export(self.models, name, directory, is_chief=self.is_chief)

  def report(self, metrics: Mapping[str, float] | None = None, *,
             images: Mapping[str, npt.ArrayLike] | None = None) -> None:
    """Records `metrics` (name -> number) at this step: later actions read them
    in `context.metrics`, and every logger gets them once the step's actions
    have run. `images` (name -> `[height, width, channels]` uint8, e.g. a sample
    grid) go to the loggers at once."""
    if self._metrics_step != self.step:
      self._metrics, self._metrics_step = {}, self.step
    images = {name: _image(name, image) for name, image in (images or {}).items()}
    self._metrics.update({k: float(v) for k, v in (metrics or {}).items()})
    for name, image in images.items():
      self._session.log_image(self.step, name, image)

  @property
  def metrics(self) -> dict[str, float]:
    """The metrics reported at this step, by name ({} once the loop moves on)."""
    return self._metrics if self._metrics_step == self.step else {}

  def agree(self, flag: bool) -> bool:
    """True on every worker if `flag` is True on any (one process: `flag`):
    what collective work decides from one worker's view (the chief's metric)."""
    return stopping.agree(self._placement, [flag])[0]

  def keep(self, into: str) -> str | None:
    """Copies this step's checkpoint (saved first if need be, on every worker)
    into `<workdir>/checkpoints/<into>/`; returns the copy's path prefix on the
    chief (None elsewhere). Only its keeper deletes it (`ctl.BestCheckpoints`)."""
    return self._session.keep(into)


# What an action may rely on: every public name of `FitContext`.
CONTEXT_NAMES = ("models", "optimizers", "step", "results", "history", "workdir", "is_chief",
                 "examples_per_step", "metrics", "report", "evaluate", "over_samples",
                 "can_evaluate", "export", "agree", "keep")
# Names other loops' callbacks read, and what to use instead.
_GONE = {
    "runner": "the loop is given the runner's parts; use context.models, "
              "context.optimizers, context.evaluate(step_fn, data), context.export(name, "
              "directory)",
    "publish": "use context.report(metrics): it reaches TensorBoard, metrics.jsonl and "
               "every logger",
    "writer": "use context.report(metrics) or context.report(images={name: image}): the "
              "TensorBoard logger writes them",
    "log_image": "use context.report(images={name: image})",
    "metric": "use context.metrics.get(name)",
    "checkpointer": "use context.keep(folder) to keep this step's checkpoint; saves belong "
                    "to fit (fit(checkpoint=ctl.Checkpoint(...)))",
    "dry_run": "context.evaluate and context.over_samples measure over a handful in a dry run",
}


def _image(name, image):
  """`image` as `[height, width, channels]` uint8 (floats taken in [0, 1])."""
  pixels = np.asarray(image)
  if pixels.ndim != 3 or pixels.shape[-1] not in (1, 3, 4):
    raise ValueError(f"context.report(images={{{name!r}: ...}}): an image is [height, "
                     f"width, channels] with 1, 3 or 4 channels, got shape {pixels.shape}; "
                     "e.g. image[..., None] for a grey [height, width] one.")
  if pixels.dtype != np.uint8:
    pixels = np.clip(np.asarray(pixels, np.float32) * 255.0 + 0.5, 0, 255).astype(np.uint8)
  return pixels


class Action(Protocol):
  """What `fit(actions=[...])` runs. Subclass it to take its defaults.

      class LogNorms(ctl.Action):
        def __init__(self, every):
          self.every = every          # an Every keeps its own count: one per action

        def __call__(self, context):
          for name, model in context.models.items():
            print(context.step, name, float(tf.linalg.global_norm(model.weights)))

  Attributes:
    every: when it runs (an `Every`), besides once at the end; None: at the end only.
    collective: True if calling it runs collective ops (a `strategy.run`, a
      save), so every worker must call it; False runs it on the chief only.
  """
  every: Every | None = None
  collective: bool = False

  def check(self, context: FitContext) -> None:
    """Raises, before the first step, if the action cannot run in this fit
    (`context` is the fit's, before any checkpoint is restored)."""

  def begin(self, context: FitContext) -> None:
    """Called once as a `fit` starts, after it restored its checkpoint and
    before its first step (where the action runs): reset what a fit measures."""

  def __call__(self, context: FitContext) -> None:
    """Does the work at `context.step`."""

  def end(self, context: FitContext) -> None:
    """Called once as the `fit` ends, however it ends (finished, stopped by a
    signal, failed), after its last call: end what the action started."""


def _needs_workdir(action, workdir):
  if workdir is None:
    raise ValueError(f"ctl.{type(action).__name__} writes files but workdir is None; "
                     "pass workdir=... to fit, or drop the action.")


class Summaries:
  """When `fit` writes TensorBoard's train scalars to `<workdir>/events/train`,
  on the chief: at each step of `every` (`fit` lands a compiled call there) and
  at the fit's last step. `fit(summaries=ctl.Summaries(ctl.Every(steps=100)))`.
  """

  def __init__(self, every: Every | None = None):
    self.every = every or Every(steps=100)


class Samples(Action):
  """Writes a grid of generated images: a PNG in `<workdir>/samples` and an
  image summary, on the chief.

  Args:
    fn: function of the models dict returning images `[n, height, width,
      channels]` (1 or 3 channels); use fixed inputs so grids are comparable.
    every: an `Every`, or None for the end only.
    name: file prefix and summary tag.
    value_range: the (low, high) of `fn`'s pixels; tanh outputs are (-1, 1).
    show: show the newest grid under the running cell, replaced in place as
      training goes; None (the default): when running in a Jupyter notebook.
  """

  def __init__(self, fn: Callable[[dict], object], every: Every | None = None, *,
               name: str = "samples", value_range: tuple[float, float] = (-1.0, 1.0),
               show: bool | None = None):
    if not callable(fn):
      raise TypeError(f"Samples fn must be a function of the models dict, got {fn!r}.")
    if show not in (None, True, False):
      raise TypeError(f"Samples(show={show!r}): pass True, False, or None (in a notebook).")
    self.fn = fn
    self.every = every
    self.name = name
    self.value_range = value_range
    self.show = show
    self._shown = None  # the notebook display of this fit's grids

  def check(self, context: FitContext) -> None:
    _needs_workdir(self, context.workdir)
    if self.show and not notebook.in_notebook():
      raise ValueError("Samples(show=True) shows the grids under a Jupyter cell, and this "
                       "process is no Jupyter kernel; pass show=None (the default: in a "
                       "notebook only) or False. The grids are in <workdir>/samples.")

  def begin(self, context: FitContext) -> None:
    self._shown = None  # each fit (each cell) shows its own

  def __call__(self, context: FitContext) -> None:
    grid = image_grid(self.fn(context.models), self.value_range)
    path = os.path.join(context.workdir, "samples", f"{self.name}_{context.step:08d}.png")
    png = tf.io.encode_png(grid)
    tf.io.write_file(path, png)  # makes the folder
    if self.show or (self.show is None and notebook.in_notebook()):
      width = max(grid.shape[1], 256)  # small grids (28x28 digits) drawn larger
      self._shown = notebook.show_png(png.numpy(), self._shown, width=width)
    context.report(images={self.name: grid})
    _log.debug("wrote %s", path)


class Evaluate(Action):
  """Runs `context.evaluate(step_fn, data)`; writes the metrics to `<workdir>/events/eval`.

  Later actions at this step (e.g. `BestCheckpoints`) read the metrics in
  `context.metrics`. `data` must be finite (e.g. `dataset.take(100)`) or
  bounded by `num_batches`: an endless dataset is refused before training.
  """
  collective = True  # runs strategy.run: every worker takes part

  def __init__(self, step_fn: StepFn, data: Data, every: Every | None = None, *,
               global_batch_size: int | None = None, num_batches: int | None = None):
    check_evaluation_data(data, num_batches)
    self.step_fn = step_fn
    self.data = data
    self.every = every
    self.global_batch_size = global_batch_size  # for a dataset function
    self.num_batches = num_batches

  def check(self, context: FitContext) -> None:
    if context._placement.kind.asynchronous:  # pylint: disable=protected-access
      raise ValueError("ctl.Evaluate cannot run under parameter_server (the "
                       "coordinator only schedules training steps); drop it and "
                       "evaluate the checkpoints with `ctl eval` in another process.")
    if not context.can_evaluate:
      raise ValueError("ctl.Evaluate needs a fit with an evaluator: call runner.fit, or "
                       "pass evaluator=... to ctl.loop.fit.fit.")

  def __call__(self, context: FitContext) -> None:
    metrics = context.evaluate(self.step_fn, self.data,
                               global_batch_size=self.global_batch_size,
                               num_batches=self.num_batches)
    context.report(metrics)
    _log.info("eval at step %d: %s", context.step,
              "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()))


class Export(Action):
  """Exports a model to `<workdir>/export/<model>` (SavedModel) and `<model>.keras`.

  Args:
    model: the name of the model in the runner's models dict.
    every: an `Every`, or None (the default) for the end only.
  """
  collective = True  # saving may run collectives under multi-worker strategies

  def __init__(self, model: str = "generator", every: Every | None = None):
    self.model = model
    self.every = every

  def check(self, context: FitContext) -> None:
    _needs_workdir(self, context.workdir)
    if self.model not in context.models:
      raise ValueError(f"ctl.Export({self.model!r}): the runner has no model of that "
                       f"name; its models are {sorted(context.models)}.")

  def __call__(self, context: FitContext) -> None:
    context.export(self.model, os.path.join(context.workdir, "export"))


class BestCheckpoints(Action):
  """Keeps the `keep` checkpoints with the best value of a metric, in
  `<workdir>/checkpoints/<directory>/`, where the rotation of `ctl.Checkpoint`'s
  `keep` never deletes them.

      runner.fit(20_000, "runs/x", actions=[
          ctl.Evaluate(eval_step, eval_data, ctl.Every(steps=2000)),
          ctl.BestCheckpoints("fid", ctl.Every(steps=2000), keep=3)])

  List it after the action that reports `metric`, on the same schedule. At a
  step where the value is among the best `keep` so far, that step's checkpoint
  is copied there (saved first if need be) and one that dropped out is deleted.
  `best.json` beside them lists the kept ones, best first; their `checkpoint`
  file names the best as the newest (`tf.train.latest_checkpoint` finds it). A
  resumed fit goes on from `best.json`; a fit that never saw `metric` says so.

  Args:
    metric: the name of the metric, as the reporting action reports it.
    every: an `Every` (the reporting action's), or None for the end only.
    keep: how many checkpoints to keep.
    mode: "min" (lower is better, e.g. FID) or "max" (e.g. accuracy).
    directory: the folder under `<workdir>/checkpoints`.
  """
  collective = True  # may save, and a save runs on every worker

  def __init__(self, metric: str, every: Every | None = None, *, keep: int = 3,
               mode: str = "min", directory: str = "best"):
    if not isinstance(metric, str) or not metric:
      raise TypeError(f"ctl.BestCheckpoints: metric must be a metric's name, got {metric!r}.")
    keep = arguments.integer("ctl.BestCheckpoints: keep", keep, minimum=1,
                             meaning="how many checkpoints to keep")
    if mode not in ("min", "max"):
      raise ValueError(f"ctl.BestCheckpoints(mode={mode!r}): use 'min' (lower is "
                       "better, e.g. FID) or 'max' (higher is better, e.g. accuracy).")
    if not is_kept_name(directory):
      raise ValueError(f"ctl.BestCheckpoints(directory={directory!r}): give a folder "
                       "name for under <workdir>/checkpoints, e.g. 'best'.")
    self.metric, self.every, self.keep, self.mode = metric, every, keep, mode
    self._sign = 1 if mode == "min" else -1  # sign * value: lower is better
    self.directory = directory
    self.kept: list[dict] = []  # {"step", "value", "checkpoint"}, best first
    self._seen = False

  def check(self, context: FitContext) -> None:
    _needs_workdir(self, context.workdir)

  def begin(self, context: FitContext) -> None:
    if not context._session.saves:  # pylint: disable=protected-access
      raise ValueError(f"ctl.BestCheckpoints({self.metric!r}) keeps checkpoints, and this "
                       "fit saves none (checkpoint=False); drop checkpoint=False.")
    self._seen = self._said = False
    self.kept = []
    self._start = context.step
    self._folder = os.path.join(context.workdir, "checkpoints", self.directory)
    self._record = os.path.join(self._folder, "best.json")
    if context.is_chief:
      try:
        with open(self._record) as f:
          self.kept = json.load(f)["kept"]
      except FileNotFoundError:
        pass
      except (OSError, ValueError, KeyError) as e:
        _log.warning("ctl.BestCheckpoints: %s could not be read (%s); starting a new "
                     "record (the checkpoints in it stay).", self._record, e)
      # Steps after the one resumed from were undone: they leave the record (their
      # copies stay), as do earlier ones whose files are gone.
      undone = [k for k in self.kept if k["step"] > context.step]
      left = [k["checkpoint"] for k in undone if self._whole(k)]
      if left:
        _log.warning("ctl.BestCheckpoints: %s in %s %s of later steps than this run "
                     "resumed from (%d): left there, no longer ranked (a copy of the same "
                     "step kept again replaces it).", ", ".join(left), self._folder,
                     "is" if len(left) == 1 else "are", context.step)
      missing = [k for k in self.kept if k not in undone and not self._whole(k)]
      if missing:
        _log.warning("ctl.BestCheckpoints: %s in %s %s files; dropped from %s.",
                     ", ".join(k["checkpoint"] for k in missing), self._folder,
                     "lacks its" if len(missing) == 1 else "lack their", self._record)
      self._drop(missing, forget=undone)

  def __call__(self, context: FitContext) -> None:
    value = context.metrics.get(self.metric)
    self._seen |= value is not None
    if value is None and context.metrics and not self._said and context.is_chief:
      self._said = True  # other metrics came at this step, not this one: a typo?
      _log.warning("ctl.BestCheckpoints(%r): not among the metrics reported at step %d "
                   "(%s)%s; nothing is kept until it is reported.", self.metric,
                   context.step, ", ".join(sorted(context.metrics)),
                   arguments.did_you_mean(self.metric, sorted(context.metrics)))
    better = value is not None and np.isfinite(value) and self._ranks(context.step, value)
    if not context.agree(bool(better)):  # the chief's metric decides for every worker
      return
    path = context.keep(self.directory)
    if not context.is_chief:
      return
    self.kept = [k for k in self.kept if k["step"] != context.step]
    self.kept.append({"step": context.step, "value": float(value),
                      "checkpoint": os.path.basename(path)})
    self.kept.sort(key=lambda k: self._sign * k["value"])
    self._drop(self.kept[self.keep:])  # writes the record
    _log.info("ctl.BestCheckpoints: kept %s (%s %.6g)", path, self.metric, value)

  def end(self, context: FitContext) -> None:
    failing = sys.exc_info()[1] is not None  # its own error says why nothing was kept
    if self._seen or context.step == self._start or not context.is_chief or failing:
      return
    if context.metrics.get(self.metric) is not None:  # reported, after this action ran
      _log.warning("ctl.BestCheckpoints(%r): the metric was reported only after this "
                   "action ran at each step, so no checkpoint was kept for it. List "
                   "ctl.BestCheckpoints after the action that reports it.", self.metric)
    else:
      _log.warning("ctl.BestCheckpoints(%r): no action reported that metric in this fit, "
                   "so no checkpoint was kept for it; the metrics reported were %s. List "
                   "it after the action that reports it, on the same schedule.",
                   self.metric, sorted(context.metrics) or "none")

  def _whole(self, record):
    path = os.path.join(self._folder, record.get("checkpoint", ""))
    return os.path.exists(path + ".index") and bool(tf.io.gfile.glob(path + ".data-*"))

  def _ranks(self, step, value):
    others = [self._sign * k["value"] for k in self.kept if k["step"] != step]
    return len(others) < self.keep or self._sign * value < max(others)

  def _drop(self, dropped, forget=()):
    """Deletes the copies of `dropped`; rewrites the record without them and `forget`."""
    for record in dropped:
      for path in tf.io.gfile.glob(os.path.join(self._folder, record["checkpoint"]) + ".*"):
        tf.io.gfile.remove(path)
    steps = {k["step"] for k in [*dropped, *forget]}
    self.kept = [k for k in self.kept if k["step"] not in steps]
    os.makedirs(self._folder, exist_ok=True)
    write_text_atomically(self._record, json.dumps(
        {"metric": self.metric, "mode": self.mode, "kept": self.kept}, indent=1) + "\n")
    pointer = os.path.join(self._folder, "checkpoint")
    if self.kept:  # the best last: TF's newest
      write_pointer(self._folder, [os.path.join(self._folder, k["checkpoint"])
                                   for k in reversed(self.kept)])
    elif os.path.exists(pointer):
      os.remove(pointer)


class Profile(Action):
  """Captures a TensorFlow profiler trace of steps `start` to `start + steps`, on the chief.

      runner.fit(1000, "runs/x", actions=[ctl.Profile(start=100, steps=5)])
      # tensorboard --logdir runs/x/events: the Profile tab (pip install 'ctl-loops[profile]')

  The trace holds what runs between steps `start` and `start + steps`, the outer
  loop's work included; where it goes, how a fit that ends mid-trace or resumes past
  `start` is handled: docs/outer-loop.md ("Profiling a few steps").

  Args:
    start: the step after which tracing starts, at least 1: the first call
      also traces and compiles the step, which would swamp the trace.
    steps: how many steps to trace, at least 1.
  """

  def __init__(self, start: int, steps: int):
    start = arguments.integer(
        "ctl.Profile: start", start, minimum=1, meaning="the step after which the trace "
        "starts", fix="the first call traces and compiles the step; start at 1 or later, "
        "e.g. past the warm-up")
    steps = arguments.integer("ctl.Profile: steps", steps, minimum=1,
                              meaning="how many steps to trace", fix="e.g. steps=5")
    self.every = _Window(start, start + steps)
    self._stop_trace = None  # while tracing: the function that stops it

  def check(self, context: FitContext) -> None:
    _needs_workdir(self, context.workdir)
    if context._placement.kind.asynchronous:  # pylint: disable=protected-access
      raise ValueError("ctl.Profile cannot run under parameter_server: the steps run "
                       "on the workers, and it traces this process, the coordinator. "
                       "Drop it and capture a worker's trace from TensorBoard's Profile "
                       "tab (CAPTURE PROFILE, the worker's address).")

  def __call__(self, context: FitContext) -> None:
    window = self.every
    if self._stop_trace is not None:  # its last step, or the end of the fit
      self._stop_trace()
    elif window.due_at == context.step == window.first:  # not at the end of a fit
      self._start(context)
    elif not window.passed and context.step <= window.first:  # the end, short of start
      _log.info("ctl.Profile: the fit ended at step %d, not past step %d where the trace "
                "starts; nothing traced. Train further, or pass a smaller start.",
                context.step, window.first)

  def _start(self, context):
    logdir = os.path.join(context.workdir, "events", "train")
    try:
      tf.profiler.experimental.start(logdir)
    except tf.errors.AlreadyExistsError:
      _log.warning("ctl.Profile: another profiler is running in this process (a "
                   "tf.profiler.experimental.start elsewhere); not profiling steps %d to %d.",
                   self.every.first, self.every.last)
      return
    first = context.step

    def stop():
      self._stop_trace = None
      try:
        tf.profiler.experimental.stop()
      except tf.errors.UnavailableError:  # stopped elsewhere: nothing of ours to write
        return
      except (tf.errors.OpError, OSError) as e:  # it must not hide why fit is ending
        _log.warning("ctl.Profile: the trace of steps %d to %d could not be written to "
                     "%s: %s", first, context.step, logdir, e)
        return
      short = (f" (the fit ended {self.every.last - context.step} steps early)"
               if context.step < self.every.last else "")
      _log.info("ctl.Profile: traced steps %d to %d%s into %s; open it in TensorBoard's "
                "Profile tab", first, context.step, short,
                os.path.join(logdir, "plugins", "profile"))

    self._stop_trace = stop

  def end(self, context: FitContext) -> None:
    if self._stop_trace is not None:  # the fit ended (or was stopped) mid-trace
      self._stop_trace()


class _Window(Every):
  """`ctl.Profile`'s schedule: due where the trace starts and where it stops,
  unless the fit starts at or past the first."""

  def __init__(self, first: int, last: int):  # pylint: disable=super-init-not-called
    self.first, self.last = first, last
    self.passed = False  # this fit started at or past `first`: no trace in it
    self.due_at = None  # the step `due` last said yes at

  def start(self, step: int) -> None:
    self.passed = step >= self.first
    if self.passed:
      _log.info("ctl.Profile: this fit starts at step %d, not before step %d where its "
                "trace starts; not profiling. Pass a later start to profile this run.",
                step, self.first)

  def due(self, step: int) -> bool:
    if not self.passed and step in (self.first, self.last):
      self.due_at = step
      return True
    return False

  def fired(self, step: int) -> None:
    del step

  def steps_to_next(self, step: int) -> int | None:
    ahead = [s - step for s in (self.first, self.last) if s > step and not self.passed]
    return min(ahead, default=None)

  def __repr__(self) -> str:
    return f"ctl.Profile's window (steps {self.first} to {self.last})"


def image_grid(images: npt.ArrayLike, value_range: tuple[float, float] = (-1.0, 1.0),
               columns: int | None = None) -> np.ndarray:
  """Tiles `[n, h, w, c]` images into one `[rows*h, columns*w, c]` uint8 image."""
  images = np.asarray(images, dtype=np.float32)
  if images.ndim != 4 or images.shape[-1] not in (1, 3):
    raise ValueError(f"samples must be images [n, height, width, 1 or 3], got shape "
                     f"{images.shape}.")
  if not len(images):
    raise ValueError("samples: the function returned no images.")
  n, h, w, c = images.shape
  columns = columns or int(np.ceil(np.sqrt(n)))
  rows = -(-n // columns)
  low, high = value_range
  pixels = np.clip((images - low) / (high - low) * 255.0 + 0.5, 0, 255).astype(np.uint8)
  pixels = np.concatenate([pixels, np.zeros((rows * columns - n, h, w, c), np.uint8)])
  return pixels.reshape(rows, columns, h, w, c).transpose(0, 2, 1, 3, 4).reshape(
      rows * h, columns * w, c)
