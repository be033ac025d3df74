"""Where a run's records go: TensorBoard, `history.jsonl`, MLflow, Weights & Biases.

    runner.fit(10_000, "runs/x", loggers=[ctl.MLflow("sqlite:///runs/mlflow.db")])
    runner.fit(10_000, "runs/x", loggers=[ctl.WandB(project="gans")])   # offline by default
    # ctl train dcgan --logger mlflow --logger wandb

Every logger meets one contract (`Logger`) and is called by the fit's session
(`ctl.loop.session.Session`) on the chief only. `fit` always keeps the work
directory's own loggers when it has one: `TensorBoard` and `JsonLines`. How a
tracker resumes its run and what happens when it fails: docs/workflow.md.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib.util
import json
import logging
import math
import os
import secrets
import string
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
import tensorflow as tf

from ctl.base import constants
from ctl.loop import history as history_lib
from ctl.loop import manifest as manifest_lib
from ctl.loop.checkpoints import write_text_atomically

if TYPE_CHECKING:
  from ctl.loop.schedule import Every

_log = logging.getLogger("ctl")
NOTES_FOLDER = "trackers"  # `<workdir>/trackers/<name>.json`: a tracker's run and last step


@dataclasses.dataclass
class Run:
  """What a logger is told as a fit starts.

  Attributes:
    workdir: the work directory (None: nothing is written there).
    start_step: the step the fit starts from (above 0: it resumes).
    total_steps: the step it trains up to.
    manifest: the fit's record (`ctl.loop.manifest.describe`).
  """
  workdir: str | None
  start_step: int
  total_steps: int
  manifest: dict[str, Any]

  @property
  def params(self) -> dict[str, str]:
    """The manifest as flat name -> text pairs: the seed, the strategy, the
    versions, each gin binding (`gin.<binding>`), ..."""
    return manifest_lib.params(self.manifest)

  @property
  def name(self) -> str:
    """The run's name in a tracker: its work directory's last two parts."""
    if not self.workdir:
      return "ctl"
    parts = os.path.normpath(os.path.abspath(self.workdir)).split(os.sep)
    return "/".join(parts[-2:])


class Logger:
  """What `fit(loggers=[...])` sends a run's records to, on the chief only.
  Subclass it and define the methods you need; the others do nothing."""

  def begin(self, run: Run) -> None:
    """Called as a fit starts, after its checkpoint is restored; an error here
    stops the fit before its first step."""

  def log_steps(self, first_step: int, results: Mapping[str, np.ndarray]) -> None:
    """Every step's results: `results[key][i]` is step `first_step + i`'s value
    (the step as `ctx.step` was while it ran)."""

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    """The metrics actions reported at `step` (the global step reached)."""

  def log_image(self, step: int, name: str, image: np.ndarray) -> None:
    """An image `[height, width, channels]` of uint8 (a sample grid) at `step`."""

  def flush(self) -> None:
    """Writes out what is buffered."""

  def reopen(self) -> None:
    """The work directory was deleted and made again: files in it are new."""

  def end(self, status: str) -> None:
    """Called once as the fit ends: `status` is "finished", "stopped" (a
    signal) or "failed"."""


class EachStep(Logger):
  """A logger that calls `fn(step, values)` for every step, in order, on the chief,
  after each compiled call: a call of `steps_per_loop` steps stays one call.

      runner.fit(10_000, "runs/x", loggers=[
          ctl.EachStep(lambda step, values: print(step, values))])

  `step` is `ctx.step` as the step ran; `values` a dict of floats. An `fn` that
  raises is named in a warning and, as any logger that fails, given nothing more.
  """

  def __init__(self, fn: Callable[[int, dict[str, float]], None]):
    if not callable(fn):
      raise TypeError(f"EachStep fn must be a function (step, values) -> None, got {fn!r}.")
    self.fn = fn

  def log_steps(self, first_step: int, results: Mapping[str, np.ndarray]) -> None:
    steps = history_lib.History()
    steps.append(first_step, results)
    for row in steps.rows():
      step = row.pop("step")
      try:
        self.fn(step, row)
      except Exception as e:
        raise RuntimeError(f"EachStep's fn raised at step {step} (ctx.step): "
                           f"{type(e).__name__}: {e}") from e


class TensorBoard(Logger):
  """TensorBoard event files in `<workdir>/events/<name>` (docs/outer-loop.md,
  "Summaries"): the train scalars on the schedule `every` (None: never) and at
  the fit's last step, with the learning rates of `optimizers` and the speed
  (of `examples_per_step` examples a step; None: unknown).
  """

  def __init__(self, workdir: str, every: Every | None = None, *,
               optimizers: Mapping[str, Any] | None = None,
               examples_per_step: int | None = None):
    self.workdir = workdir
    self.every = every
    self._optimizers = optimizers or {}
    self._examples_per_step = examples_per_step
    self._writers: dict[str, tf.summary.SummaryWriter] = {}
    self._last_step = None  # the fit's total_steps
    self._since = None  # (step, time) of the previous write, or of the fit's start

  def writer(self, name: str) -> tf.summary.SummaryWriter:
    """The summary writer of `<workdir>/events/<name>`, made on first use."""
    if name not in self._writers:
      self._writers[name] = tf.summary.create_file_writer(
          os.path.join(self.workdir, "events", name))
    return self._writers[name]

  @staticmethod
  def scalars(workdir: str, first_step: int, last_step: int, *,
              skip: Sequence[str] = ("train",)) -> dict[int, dict[str, float]]:
    """The scalars of `<workdir>/events/*` (but the writers `skip`) at the steps
    from `first_step` to `last_step`: {step: {tag: value}}, the last written of
    each (float32: as TensorBoard keeps them)."""
    found: dict[int, dict[str, float]] = {}
    pattern = os.path.join(workdir, "events", "*", "events.out.tfevents.*")
    for path in sorted(tf.io.gfile.glob(pattern)):  # named by their start: oldest first
      if os.path.basename(os.path.dirname(path)) in skip:
        continue
      try:
        for record in tf.data.TFRecordDataset(path):  # (summary_iterator logs a deprecation)
          event = tf.compat.v1.Event.FromString(record.numpy())
          if not first_step <= event.step <= last_step:
            continue
          for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name == "scalars":
              found.setdefault(int(event.step), {})[value.tag] = float(
                  tf.make_ndarray(value.tensor))
      except tf.errors.DataLossError:  # its end cut short by a crash
        continue
    return found

  def begin(self, run: Run) -> None:
    with self.writer("train").as_default(step=run.start_step):
      tf.summary.text("manifest", manifest_lib.text(run.manifest))
    self._last_step = run.total_steps
    self._since = (run.start_step, time.perf_counter())
    if self.every is not None:
      self.every.start(run.start_step)

  def log_steps(self, first_step: int, results: Mapping[str, np.ndarray]) -> None:
    step = first_step + len(next(iter(results.values()), ()))
    if self.every is None or not (self.every.due(step) or step >= self._last_step):
      return
    self.every.fired(step)
    now = time.perf_counter()
    since_step, since_time = self._since
    self._since = (step, now)
    with self.writer("train").as_default(step=step):
      for key, values in results.items():
        tf.summary.scalar(key, float(np.mean(values)))
      for name, optimizer in self._optimizers.items():
        tf.summary.scalar(f"learning_rate/{name}", float(np.asarray(optimizer.learning_rate)))
      if step > since_step and now > since_time:
        rate = (step - since_step) / (now - since_time)
        tf.summary.scalar("steps_per_second", rate)
        if self._examples_per_step:  # unknown for a dynamic batch size
          tf.summary.scalar("examples_per_second", rate * self._examples_per_step)

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    with self.writer("eval").as_default(step=step):
      for key, value in metrics.items():
        tf.summary.scalar(key, value)

  def log_image(self, step: int, name: str, image: np.ndarray) -> None:
    with self.writer("train").as_default(step=step):
      tf.summary.image(name, image[None])

  def flush(self) -> None:
    for writer in list(self._writers.values()):
      writer.flush()

  def reopen(self) -> None:
    self.close()  # they would go on writing into deleted files

  def end(self, status: str) -> None:
    self.close()

  def close(self) -> None:
    """Closes the writers; `writer` makes new ones."""
    for writer in self._writers.values():
      writer.close()
    self._writers = {}


class JsonLines(Logger):
  """`history.jsonl` and `metrics.jsonl`, as the fit's session opened them."""

  def __init__(self, history_file: history_lib.HistoryFile | None,
               metrics_file: history_lib.HistoryFile | None):
    self.files = [f for f in (history_file, metrics_file) if f is not None]
    self._history, self._metrics = history_file, metrics_file

  def log_steps(self, first_step: int, results: Mapping[str, np.ndarray]) -> None:
    if self._history is not None:
      self._history.write(first_step, results)

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    if self._metrics is not None:
      self._metrics.write(step, {k: [v] for k, v in metrics.items()})

  def reopen(self) -> None:
    for file in self.files:
      file.reopen()

  def end(self, status: str) -> None:
    for file in self.files:
      file.close()


class TrackerError(RuntimeError):
  """A tracker could not start its run (`Logger.begin`): the fit stops before
  its first step; the message names the tracker and the fix."""


class Tracker(Logger, abc.ABC):
  """A logger that keeps its records in an experiment tracker, one tracker run
  per work directory, resumed with it. Subclasses define the abstract methods."""
  name = "tracker"

  def __init__(self) -> None:
    self._state_path: str | None = None
    self._state: dict[str, Any] = {}

  def begin(self, run: Run) -> None:
    self._state_path = (os.path.join(run.workdir, NOTES_FOLDER, f"{self.name}.json")
                        if run.workdir else None)
    previous, why = self._read_state()
    if why is not None:  # damaged: the run it named is looked for in the tracker
      found = self.find_run(run)
      then = (f"; resuming the {self.name} run {found['run_id']} of this work directory, "
              f"found in {self.where_found()}" if found else f", and no {self.name} run of "
              f"this work directory was found in {self.where_found()}: starting a new run")
      _log.warning("%s: %s cannot be read (%s)%s", self.name, self._state_path, why, then)
      previous = found or {}
    if run.start_step == 0 and previous.get("run_id"):  # a run killed before its first save
      self.abandon(previous["run_id"])
      previous = {}
    try:
      run_id = self.start(run, previous.get("run_id"))
    except Exception as e:  # pylint: disable=broad-except
      raise TrackerError(f"{self.name}: could not start a run ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); fix the tracker's "
                         f"address or drop the logger. Nothing was trained.") from e
    resumed = run_id == previous.get("run_id")
    self._state = {**(previous if resumed else {}), "run_id": run_id}
    for kind in ("steps", "metrics"):
      self._state[kind] = max(self._state.get(kind, -1), self.logged_through(kind))
    self._state.setdefault("images", {})
    self._write_state()
    _log.info("%s: %s run %s in %s%s", self.name, "resumed" if resumed else "started",
              run_id, self.where(), f", logged through step {self._state['steps']}"
              if resumed else "")

  def log_steps(self, first_step: int, results: Mapping[str, np.ndarray]) -> None:
    columns = {k: np.asarray(v, np.float64).reshape(-1) for k, v in results.items()}
    count = max((len(v) for v in columns.values()), default=0)
    rows = [(first_step + i, {k: float(v[i]) for k, v in columns.items() if i < len(v)})
            for i in range(count) if first_step + i > self._state["steps"]]
    if rows:
      self.send_steps(rows)
      self._mark("steps", rows[-1][0])

  def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    if step > self._state["metrics"] and metrics:
      self.send_metrics(step, {k: float(v) for k, v in metrics.items()})
      self._mark("metrics", step)

  def log_image(self, step: int, name: str, image: np.ndarray) -> None:
    images = self._state["images"]  # the last step of each image's name
    if step > images.get(name, -1):
      self.send_image(step, name, image)
      images[name] = step
      self._write_state()

  def end(self, status: str) -> None:
    self.finish(status)

  def logged_through(self, kind: str) -> int:
    """The last step of `kind` ("steps" or "metrics") the run holds (-1: none, or unknown)."""
    return -1

  @abc.abstractmethod
  def start(self, run: Run, run_id: str | None) -> str:
    """Starts the tracker's run, or resumes `run_id`; returns the run's id."""

  def abandon(self, run_id: str) -> None:
    """Ends `run_id`, of a fit killed before its first checkpoint."""

  def find_run(self, run: Run) -> dict[str, Any] | None:
    """The unreadable note of this work directory's run, rebuilt from the
    tracker: at least its "run_id"; None if the tracker cannot tell."""
    return None

  def where_found(self) -> str:  # where `find_run` looks, for the log
    return "the tracker"

  def where(self) -> str:  # where the tracker keeps its runs, for the log
    return "?"

  @abc.abstractmethod
  def send_steps(self, rows: list[tuple[int, dict[str, float]]]) -> None:
    """Stores `rows`, each (step, {result: value}), steps not stored before."""

  @abc.abstractmethod
  def send_metrics(self, step: int, metrics: dict[str, float]) -> None:
    """Stores the metrics reported at `step`."""

  @abc.abstractmethod
  def send_image(self, step: int, name: str, image: np.ndarray) -> None:
    """Stores image `name` ([height, width, channels] of uint8) at `step`."""

  @abc.abstractmethod
  def finish(self, status: str) -> None:
    """Ends the tracker's run with `status` ("finished", "stopped", "failed")."""

  def _mark(self, kind, step):
    self._state[kind] = step
    self._write_state()

  def _read_state(self):
    """(the note, None), or ({}, why) if it cannot be read."""
    if self._state_path is None or not os.path.exists(self._state_path):
      return {}, None
    try:
      with open(self._state_path, encoding="utf-8") as f:
        state = json.load(f)
    except (OSError, ValueError) as e:
      return {}, "empty" if os.path.getsize(self._state_path) == 0 else type(e).__name__
    if not isinstance(state, dict) or not isinstance(state.get("run_id"), str):
      return {}, "it names no run"
    return state, None

  def _write_state(self):
    if self._state_path is not None:
      write_text_atomically(self._state_path, json.dumps(self._state) + "\n")


# MLflow refuses a longer parameter value, and more metrics in one log_batch call.
_MLFLOW_PARAM_LENGTH = 6000
_MLFLOW_BATCH = 1000


class MLflow(Tracker):
  """Logs to MLflow the parameters, every step's results, the reported metrics,
  the sample grids and each fit's manifest (docs/workflow.md, "Experiment trackers").

  Args:
    tracking_uri: the tracking store, e.g. "sqlite:///runs/mlflow.db" (a local
      file: works offline; `mlflow ui --backend-store-uri` shows it) or an
      MLflow server's address; None: MLflow's own default (the environment
      variable MLFLOW_TRACKING_URI, else its default store).
    experiment: the MLflow experiment's name (made if missing); None: the
      environment variable MLFLOW_EXPERIMENT_NAME, else "ctl".
    run_name: the run's name; None: the work directory's last two parts.
  """
  name = "mlflow"

  def __init__(self, tracking_uri: str | None = None, *, experiment: str | None = None,
               run_name: str | None = None):
    super().__init__()
    _require("MLflow", "mlflow")
    self.tracking_uri = tracking_uri
    self.experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "ctl"
    self.run_name = run_name
    self._client = self._run_id = None

  def start(self, run: Run, run_id: str | None) -> str:
    from mlflow.entities import Param  # pylint: disable=import-outside-toplevel
    from mlflow.exceptions import MlflowException  # pylint: disable=import-outside-toplevel
    self._client = self._new_client()
    uri = self._client.tracking_uri
    known = {}
    if run_id is not None:
      try:
        known = self._client.get_run(run_id).data.params
        self._client.update_run(run_id, status="RUNNING")
      except MlflowException:
        _log.warning("mlflow: run %s of %s is not in %s; starting a new run", run_id,
                     run.workdir, uri)
        run_id = None
    if run_id is None:
      found = self._client.get_experiment_by_name(self.experiment)
      experiment_id = (found.experiment_id if found is not None
                       else self._client.create_experiment(
                           self.experiment, artifact_location=_artifacts_beside(uri)))
      run_id = self._client.create_run(
          experiment_id, run_name=self.run_name or run.name,
          tags={"ctl.workdir": os.path.abspath(run.workdir) if run.workdir else ""},
      ).info.run_id
    self._run_id = run_id
    values = {key: value[:_MLFLOW_PARAM_LENGTH] for key, value in run.params.items()}
    params = [Param(key, value) for key, value in values.items() if key not in known]
    changed = sorted(key for key, value in values.items() if known.get(key, value) != value)
    if changed:  # MLflow's parameters cannot change; the manifest artifact has both
      _log.warning("mlflow: this fit changes parameters the run already holds (%s); they "
                   "keep their first values, the manifest artifact of each fit has its "
                   "own", ", ".join(changed))
    for i in range(0, len(params), 100):  # MLflow takes at most 100 per call
      self._client.log_batch(run_id, params=params[i:i + 100])
    self._client.log_text(run_id, json.dumps(run.manifest, indent=2, default=str),
                          f"manifest/{run.start_step:08d}.json")
    return run_id

  def where(self) -> str:
    return self._client.tracking_uri if self._client is not None else "?"

  def where_found(self) -> str:
    import mlflow  # pylint: disable=import-outside-toplevel
    return f"{self.tracking_uri or mlflow.get_tracking_uri()} (experiment {self.experiment!r})"

  def _new_client(self):
    import mlflow  # pylint: disable=import-outside-toplevel
    return mlflow.MlflowClient(self.tracking_uri or mlflow.get_tracking_uri())

  def find_run(self, run: Run) -> dict[str, Any] | None:
    """The newest run of experiment `experiment` tagged with this work directory."""
    if not run.workdir:
      return None
    client = self._new_client()
    try:
      experiment = client.get_experiment_by_name(self.experiment)
      if experiment is None:
        return None
      workdir = os.path.abspath(run.workdir).replace("'", "\\'")
      found = client.search_runs([experiment.experiment_id],
                                 filter_string=f"tags.`ctl.workdir` = '{workdir}'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    except Exception:  # pylint: disable=broad-except
      return None  # the store unreachable: `start` says so
    if not found:
      return None
    tags = found[0].data.tags
    return {"run_id": found[0].info.run_id,
            **{name: json.loads(tags[f"ctl.{name}"])
               for name in ("steps_keys", "metrics_keys") if f"ctl.{name}" in tags}}

  def abandon(self, run_id: str) -> None:
    client = self._new_client()
    try:
      if client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, status="KILLED")
    except Exception:  # pylint: disable=broad-except
      pass  # gone from the store, or the store unreachable: start says so

  def logged_through(self, kind: str) -> int:
    keys = self._state.get(f"{kind}_keys", [])
    return max((m.step for key in keys
                for m in self._client.get_metric_history(self._run_id, key)), default=-1)

  def send_steps(self, rows: list[tuple[int, dict[str, float]]]) -> None:
    self._send(rows, "steps_keys")

  def send_metrics(self, step: int, metrics: dict[str, float]) -> None:
    self._send([(step, metrics)], "metrics_keys")

  def _send(self, rows, keys_name):
    from mlflow.entities import Metric  # pylint: disable=import-outside-toplevel
    now = int(time.time() * 1000)
    metrics = [Metric(_mlflow_key(key), value, now, step)
               for step, values in rows for key, value in values.items()]
    keys = sorted({m.key for m in metrics} | set(self._state.get(keys_name, [])))
    if keys != self._state.get(keys_name):  # before sending: a resume asks for them
      self._state[keys_name] = keys
      self._write_state()
      # In the run too: a note that cannot be read is rebuilt from it (`find_run`).
      self._client.set_tag(self._run_id, f"ctl.{keys_name}", json.dumps(keys))
    for i in range(0, len(metrics), _MLFLOW_BATCH):
      self._client.log_batch(self._run_id, metrics=metrics[i:i + _MLFLOW_BATCH])

  def send_image(self, step: int, name: str, image: np.ndarray) -> None:
    self._client.log_image(self._run_id, image, key=name, step=step)

  def finish(self, status: str) -> None:
    if self._client is not None and self._run_id is not None:
      self._client.set_terminated(self._run_id, status={
          "finished": "FINISHED", "stopped": "KILLED"}.get(status, "FAILED"))


def _artifacts_beside(uri):
  """For a SQLite store, `mlartifacts/` beside its file (MLflow's default is
  `./mlruns` in whatever directory the run starts in); else MLflow's default."""
  prefix = "sqlite:///"
  if not uri.startswith(prefix):
    return None
  folder = os.path.dirname(os.path.abspath(uri[len(prefix):]))
  return "file://" + os.path.join(folder, "mlartifacts")


def _mlflow_key(key):
  """MLflow's metric names allow letters, digits and `_-. /` only."""
  return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key)


class WandB(Tracker):
  """Logs to Weights & Biases the config (the parameters), every step's results,
  the reported metrics and the sample grids (docs/workflow.md, "Experiment trackers").

  Args:
    project: the W&B project; None: the environment variable WANDB_PROJECT, else "ctl".
    mode: "offline" (the default: files only, in `<dir>/wandb/`, uploaded
      later with `wandb sync`), "online" (needs `wandb login`), or "disabled".
    dir: where W&B writes its files; None: the work directory.
    entity, name, tags: as `wandb.init`'s (name: the work directory's last two
      parts by default).
  """
  name = "wandb"

  def __init__(self, project: str | None = None, *, mode: str = "offline",
               dir: str | None = None, entity: str | None = None,  # noqa: A002 (wandb's)
               name: str | None = None, tags: list[str] | None = None):
    super().__init__()
    _require("WandB", "wandb")
    if mode not in ("offline", "online", "disabled"):
      raise ValueError(f"ctl.WandB(mode={mode!r}): pass 'offline' (the default), 'online' "
                       "or 'disabled'.")
    self.project = project or os.environ.get("WANDB_PROJECT") or "ctl"
    self.mode, self.dir, self.entity = mode, dir, entity
    self.run_name, self.tags = name, tags
    self._run = None

  def start(self, run: Run, run_id: str | None) -> str:
    import wandb  # pylint: disable=import-outside-toplevel
    directory = self.dir or run.workdir or "."
    os.makedirs(directory, exist_ok=True)
    self._run = wandb.init(
        project=self.project, entity=self.entity, mode=self.mode, dir=directory,
        id=run_id or _new_id(), resume="allow",
        name=self.run_name or run.name, tags=self.tags, reinit="create_new",
        settings=wandb.Settings(silent=True, console="off"))
    self._run.config.update(run.params, allow_val_change=True)
    return self._run.id

  def where(self) -> str:
    return self._run.dir if self._run is not None else "?"

  def where_found(self) -> str:
    return "the W&B folder of the work directory"

  def find_run(self, run: Run) -> dict[str, Any] | None:
    """The newest W&B run whose files are in this work directory's W&B folder
    (`<dir>/wandb/[offline-]run-<time>-<id>`); its steps logged are not known."""
    folder = os.path.join(self.dir or run.workdir or ".", "wandb")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    newest = max((name.rsplit("-", 2)[1:] for name in names  # [time, id]
                  if name.startswith(("run-", "offline-run-")) and name.count("-") >= 2),
                 default=None)
    return {"run_id": newest[1]} if newest else None

  def send_steps(self, rows: list[tuple[int, dict[str, float]]]) -> None:
    for step, values in rows:
      self._run.log({k: v for k, v in values.items() if math.isfinite(v)} or values,
                    step=step)

  def send_metrics(self, step: int, metrics: dict[str, float]) -> None:
    self._run.log(metrics, step=step)

  def send_image(self, step: int, name: str, image: np.ndarray) -> None:
    import wandb  # pylint: disable=import-outside-toplevel
    self._run.log({name: wandb.Image(image[..., 0] if image.shape[-1] == 1 else image)},
                  step=step)

  def finish(self, status: str) -> None:
    if self._run is not None:
      self._run.finish(exit_code=0 if status == "finished" else 1)
      self._run = None


def _new_id():  # as W&B makes them
  alphabet = string.ascii_lowercase + string.digits
  return "".join(secrets.choice(alphabet) for _ in range(8))


def by_name(name: str) -> Logger:
  """`ctl train --logger NAME`'s tracker, which reads its own environment
  variables (MLFLOW_TRACKING_URI, WANDB_PROJECT, WANDB_MODE, ...); raises
  ValueError naming the choices, ImportError naming the extra to install."""
  if name == "mlflow":
    return MLflow()
  if name == "wandb":
    return WandB(mode=os.environ.get("WANDB_MODE", "offline"))
  raise ValueError(f"--logger {name!r}: choose from {', '.join(constants.LOGGER_NAMES)} "
                   "(TensorBoard and history.jsonl are always written).")


def _require(owner, module):
  if importlib.util.find_spec(module) is None:
    raise ImportError(f"ctl.{owner} needs the {module} package: pip install "
                      f"'ctl-loops[{module}]'.")
