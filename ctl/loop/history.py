"""Every step's results: in memory (`History`) and in a file (`HistoryFile`); a
logger gets them as they come (`ctl.EachStep`, `ctl.Logger.log_steps`).

    history = runner.fit(2000, "runs/x")        # this call's steps: a History
    runner.history["generator_loss"]            # every step this runner trained
    runner.history.plot()                       # the curves, as a matplotlib Figure
    ctl.read_history("runs/x")                  # the whole run, read back from its file
    pandas.read_json("runs/x/history.jsonl", lines=True)   # the same, as a DataFrame

`fit` appends one JSON line per step to `<workdir>/history.jsonl` on the chief,
each step once, in order, across resumes (docs/outer-loop.md, "Every step's numbers").
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import re
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import numpy as np

FILE_NAME = "history.jsonl"
# The metrics actions report (`FitContext.report`): a line per step that had any.
METRICS_FILE_NAME = "metrics.jsonl"

_log = logging.getLogger("ctl")


class History(Mapping):
  """Per-step values: `history[key]` is a numpy array with a value per step,
  `history.steps` the steps they belong to (`ctx.step` as each ran).

  A mapping from result key to values, so `history["generator_loss"]`,
  `dict(history)` and `pandas.DataFrame(dict(history), index=history.steps)`
  work. A key that some steps did not return is NaN there.
  """

  _MERGE = 256  # calls' values kept apart before they are joined into one chunk

  def __init__(self) -> None:
    self._chunks: list[tuple[int, dict[str, np.ndarray]]] = []  # (first step, values)
    # The latest calls' values, contiguous and of the same keys, not yet joined:
    # a million calls of one step each cost a million arrays otherwise.
    self._pending: list[tuple[int, dict[str, np.ndarray]]] = []
    self._cache: tuple[np.ndarray, dict[str, np.ndarray]] | None = None

  def append(self, first_step: int, results: Mapping[str, Any]) -> None:
    """Adds the values of the steps `first_step`, `first_step + 1`, ..."""
    values = {k: np.asarray(v).reshape(-1) for k, v in results.items()}
    lengths = {len(v) for v in values.values()}
    if len(lengths) > 1:
      raise ValueError(f"History.append: the keys have different numbers of steps, "
                       f"{ {k: len(v) for k, v in values.items()} }.")
    if not lengths or lengths == {0}:
      return
    if self._pending:
      first, last = self._pending[-1]
      if (first + len(next(iter(last.values()))) != first_step or last.keys() != values.keys()
          or len(self._pending) >= self._MERGE):
        self._join()
    self._pending.append((int(first_step), values))
    self._cache = None

  def _join(self):
    """Moves the pending calls' values into one chunk."""
    if self._pending:
      first = self._pending[0][0]
      keys = self._pending[0][1].keys()
      self._chunks.append((first, {k: np.concatenate([v[k] for _, v in self._pending])
                                   for k in keys}))
      self._pending = []

  def extend(self, other: History) -> None:
    """Adds every step of `other` (after this history's)."""
    self._join()
    other._join()  # pylint: disable=protected-access
    self._chunks.extend(other._chunks)  # pylint: disable=protected-access
    self._cache = None

  def drop_from(self, step: int) -> None:
    """Forgets the values of `step` and every later step."""
    self._join()
    kept = []
    for first, values in self._chunks:
      n = min(len(next(iter(values.values()))), max(step - first, 0))
      if n:
        kept.append((first, {k: v[:n] for k, v in values.items()}))
    self._chunks, self._cache = kept, None

  def since(self, step: int) -> History:
    """A new History of the values of `step` and every later step."""
    self._join()
    later = History()
    for first, values in self._chunks:
      skip = max(step - first, 0)
      if skip < len(next(iter(values.values()))):
        later._chunks.append((first + skip, {k: v[skip:] for k, v in values.items()}))  # pylint: disable=protected-access
    return later

  @property
  def steps(self) -> np.ndarray:
    """The step of each value (int64)."""
    return self._arrays()[0]

  def __getitem__(self, key: str) -> np.ndarray:
    arrays = self._arrays()[1]
    if key not in arrays:
      raise KeyError(f"{key!r}: the step returned no such value; its keys are "
                     f"{sorted(arrays)}." if arrays else f"{key!r}: this history holds no "
                     "step (a fit that found its work directory at its total_steps trains "
                     "none; ctl.read_history(workdir) reads the steps trained there).")
    return arrays[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._arrays()[1])

  def __len__(self) -> int:
    return len(self._arrays()[1])

  def __repr__(self) -> str:
    steps = self.steps
    span = f"steps {steps[0]}..{steps[-1]}" if len(steps) else "no steps"
    return f"History({span}, keys={list(self)})"

  def rows(self) -> Iterator[dict[str, float]]:
    """One dict per step: `{"step": s, key: value, ...}` (as the file holds them)."""
    self._join()
    for first, values in self._chunks:
      columns = {k: v.astype(np.float64).tolist() for k, v in values.items()}
      for i in range(len(next(iter(columns.values())))):
        yield {"step": first + i, **{k: v[i] for k, v in columns.items()}}

  def plot(self, keys: str | list[str] | None = None, *, smoothing: float = 0.0,
           title: str | None = None) -> Any:
    """Plots each key's values against the step; returns the matplotlib Figure.

    In a notebook the figure shows as the cell's output; elsewhere save it with
    `history.plot().savefig("losses.png")`. Needs matplotlib (`pip install
    'ctl-loops[notebook]'`).

    Args:
      keys: a key or keys to plot (default: all), each in its own panel.
      smoothing: 0 to below 1; each point is drawn as an exponential moving
        average with this weight on the past (as TensorBoard's slider), over
        the raw values drawn faintly.
      title: the figure's title.
    """
    keys = list(self) if keys is None else [keys] if isinstance(keys, str) else list(keys)
    for key in keys:
      self[key]  # KeyError naming the keys there are  # noqa: B018
    if not 0.0 <= smoothing < 1.0:
      raise ValueError(f"plot(smoothing={smoothing!r}): give a number from 0 to below 1, "
                       "e.g. 0.9.")
    if not keys or not len(self.steps):
      raise ValueError("plot: the history has no steps yet; train first.")
    try:
      from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("History.plot needs matplotlib: pip install 'ctl-loops[notebook]' "
                        "(or pip install matplotlib).") from e
    figure, axes = pyplot.subplots(len(keys), 1, sharex=True, squeeze=False,
                                   figsize=(7, 1.2 + 1.8 * len(keys)))
    for axis, key in zip(axes[:, 0], keys):
      values = self[key]
      if smoothing:
        axis.plot(self.steps, values, alpha=0.25, color="C0", linewidth=0.8)
        values = _smooth(values, smoothing)
      axis.plot(self.steps, values, color="C0", linewidth=1.2)
      axis.set_ylabel(key)
      axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    if title:
      figure.suptitle(title)
    figure.tight_layout()
    pyplot.close(figure)  # shown once, as the returned value, not again by pyplot
    return figure

  def _arrays(self):
    if self._cache is None:
      self._join()
      keys = list(dict.fromkeys(k for _, values in self._chunks for k in values))
      steps, columns = [], {k: [] for k in keys}
      for first, values in self._chunks:
        n = len(next(iter(values.values())))
        steps.append(np.arange(first, first + n, dtype=np.int64))
        for k in keys:
          columns[k].append(values[k] if k in values else np.full(n, np.nan, np.float32))
      steps = np.concatenate(steps) if steps else np.zeros([0], np.int64)
      columns = {k: np.concatenate(v) for k, v in columns.items()}
      self._cache = (steps, columns)
      if (len(self._chunks) > 1 and np.all(np.diff(steps) == 1)
          and all(v.keys() == columns.keys() for _, v in self._chunks)):
        # One chunk from now on: a read after every append stays linear.
        self._chunks = [(int(steps[0]), dict(columns))]
    return self._cache


def _smooth(values, weight):
  out, last = np.empty(len(values)), None
  for i, v in enumerate(values):
    last = v if last is None or not math.isfinite(last) else weight * last + (1 - weight) * v
    out[i] = last
  return out


class HistoryFile:
  """`<workdir>/<file_name>`, one JSON line per step (`every_step=False`: per step
  that had any), appended as training goes; each call's lines reach the OS at once.

  `open(start_step)` keeps the lines of the steps before `start_step`, drops
  later and unreadable ones, marks lost the earlier steps no line holds (in a
  file of every step), and returns what it kept as a `History`.
  """

  def __init__(self, workdir: str, file_name: str = FILE_NAME, *, every_step: bool = True):
    self.path = os.path.join(workdir, file_name)
    self.every_step = every_step
    self.steps: set[int] = set()  # the steps of the lines `open` kept
    self.keys: set[str] = set()  # and their keys
    self._file = None

  def open(self, start_step: int, memory: History | None = None) -> History:
    """`memory`: the steps the runner holds (a `train` in a notebook before
    this fit), which a file of no readable line starts with."""
    reading = _read(self.path, before=start_step)
    if not reading.steps and memory is not None and len(memory.steps):
      self.reopen()  # the file holds every step of the weights it follows
      self.write_history(memory)
      self.close()
      reading = _read(self.path, before=start_step)
    # Steps trained before `start_step` with no line (a file deleted or emptied
    # too) are marked lost: a first run, from step 0, has nothing to mark.
    lost = _missing(reading, start_step) if self.every_step else []
    if reading.later or reading.bad or lost or reading.repeated:
      # Rewritten: the kept lines as written, one of each step repeated.
      lines = [(step, line) for step, line in _read(self.path, start_step, keep=True).lines
               if step not in reading.repeated]
      lines += [(step, _row_line(step, values)) for step, values in reading.repeated.items()]
      lines += [(first, f'{{"step": {first}, "lost_through": {last}}}\n')
                for first, last in lost]
      _write_lines(self.path, lines)
    if reading.later:
      _log.info("%s: dropped %d line(s) of steps from %d on (this run trains them again)",
                self.path, reading.later, start_step)
    _warn_unread(self.path, reading, "dropped", "kept the last value of each, one line a step")
    if lost:
      _log.warning(
          "%s holds no line of %s, trained before step %d, where this run resumes, and "
          "not trained again: marked lost in the file (a "
          '{"step": ..., "lost_through": ...} line; ctl.read_history names them). A '
          "tracker's run may still hold their values.", self.path, _steps(lost), start_step)
    self.steps = reading.steps
    self.keys = set(reading.history)
    self.reopen()
    return reading.history

  def add(self, rows: Mapping[int, Mapping[str, float]]) -> list[int]:
    """Puts back lines of steps before the run's start from another record,
    `{step: {key: value}}`, in step order: of the steps the file lacks, the
    values of keys it has (any key, if it has none). Returns the steps put back."""
    rows = {step: {k: v for k, v in values.items() if k in self.keys or not self.keys}
            for step, values in rows.items() if step not in self.steps}
    rows = {step: values for step, values in rows.items() if values}
    if not rows:
      return []
    _write_lines(self.path, [*_read(self.path, before=None, keep=True).lines,
                             *((step, _row_line(step, values)) for step, values in rows.items())])
    self.steps = self.steps | set(rows)
    self.reopen()
    return sorted(rows)

  def write(self, first_step: int, results: Mapping[str, Any]) -> None:
    """Appends the lines of the steps `first_step`, `first_step + 1`, ..."""
    keys = [json.dumps(k) for k in results]  # once a call, not once a line
    columns = [np.asarray(v, np.float64).reshape(-1).tolist() for v in results.values()]
    self._write("".join(_line(first_step + i, zip(keys, values))
                        for i, values in enumerate(zip(*columns))))

  def write_history(self, history: History) -> None:
    """Appends a line for each step of `history`."""
    self._write("".join(_row_line(row.pop("step"), row) for row in history.rows()))

  def reopen(self) -> None:
    """Appends to the file at `path` from now on (a new one if it went)."""
    if self._file is not None:
      self._file.close()
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

  def _write(self, text):
    self._file.write(text)
    self._file.flush()  # the OS has every line a checkpoint covers, whatever kills us

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def read_history(path: str) -> History:
  """Reads a run's history: `path` is its work directory, its `history.jsonl`
  or its `metrics.jsonl`.

  Warns of the lines it cannot read, of steps with values on more than one
  line (it reads the last), and, in `history.jsonl` (a line for every step),
  of the steps no line holds or that a resume marked lost.

  Raises FileNotFoundError if there is none (`fit` writes it when given a workdir).
  """
  if os.path.isdir(path):
    path = os.path.join(path, FILE_NAME)
  if not os.path.exists(path):
    raise FileNotFoundError(f"no history at {path}: `fit(total_steps, workdir)` writes "
                            f"<workdir>/{FILE_NAME} as it trains; pass a work directory "
                            "it trained in.")
  reading = _read(path, before=None)
  _warn_unread(path, reading, "left out", "the last value of each is read")
  # Only a file of every step says a step is missing (metrics.jsonl has a
  # line per step that had any): there, the lines marked lost say it.
  missing = [] if os.path.basename(path) == METRICS_FILE_NAME else _missing(reading, None)
  if reading.lost or missing:
    _log.warning("%s: no values of %s (%s)", path, _steps(sorted(reading.lost + missing)),
                 "lost in a damaged file, marked when the run resumed" if not missing
                 else "not in the file" if not reading.lost
                 else "lost in a damaged file, or not in it")
  return reading.history


def _line(step, items):
  """The file's line of `step`: `items` are (JSON-quoted key, value) pairs.
  Formatted here rather than by json.dumps: it runs after every compiled call."""
  return f'{{"step": {step}' + "".join(f", {k}: {_token(v)}" for k, v in items) + "}\n"


def _row_line(step, values):
  return _line(step, ((json.dumps(k), v) for k, v in values.items()))


def _token(value):
  """9 significant digits (a float32 exactly), or NaN, Infinity, -Infinity as
  Python's json writes them (it and pandas read them)."""
  if math.isfinite(value):
    return format(value, ".9g")
  return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


@dataclasses.dataclass
class _Reading:
  """What `_read` found in a history file."""
  history: History  # the lines whose step is below `before`
  steps: set[int]  # the steps of those lines, lost ones included
  lost: list[tuple[int, int]]  # the ranges marked lost, (first, last)
  later: int = 0  # lines of `before` or later
  repeated: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
  # the steps with a value on more than one line: {step: its values, the last of each}
  bad: list[tuple[int, str, int | None]] = dataclasses.field(default_factory=list)
  # the unreadable lines: (line number, its start, the step it names if it does)
  lines: list[tuple[int, str]] = dataclasses.field(default_factory=list)
  # (step, the line as written) of the lines read whose step is below `before`


_STEP = re.compile(r'"step"\s*:\s*(\d+)')


def _read(path, before, keep=False):
  """A `_Reading` of the lines of `path` whose step is below `before` (None: all);
  with `keep`, also those lines as written (only a rewrite needs them)."""
  reading = _Reading(History(), set(), [])
  rows = {}
  for number, line in enumerate(_readlines(path), 1):
    try:
      row = json.loads(line)
      step = int(row.pop("step"))
      lost_through = row.pop("lost_through", None)
      values = {k: math.nan if v is None else float(v) for k, v in row.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
      named = _STEP.match(line.lstrip("{ "))
      reading.bad.append((number, line.strip()[:40], int(named.group(1)) if named else None))
      continue
    if before is not None and step >= before:
      reading.later += 1
      continue
    if keep:
      reading.lines.append((step, line if line.endswith("\n") else line + "\n"))
    if lost_through is not None:
      reading.lost.append((step, int(lost_through)))
      reading.steps.update(range(step, int(lost_through) + 1))
      continue
    reading.steps.add(step)
    if step in rows and set(values) & set(rows[step]):  # a file joined to a copy?
      reading.repeated[step] = rows[step]
    rows.setdefault(step, {}).update(values)  # a metrics line in two: one step
  # One `append` per run of consecutive steps with the same keys.
  runs = itertools.groupby(enumerate(sorted(rows.items())),
                           lambda item: (item[1][0] - item[0], item[1][1].keys()))
  for _, run in runs:
    steps, rows = zip(*(row for _, row in run))
    reading.history.append(steps[0], {k: np.array([r[k] for r in rows], np.float32)
                                      for k in rows[0]})
  return reading


def _missing(reading, before):
  """The ranges (first, last) of the steps from 0 to before `before` (None: the
  last step read) that no line of a file of every step holds."""
  end = before if before is not None else max(reading.steps, default=-1) + 1
  missing = [step for step in range(end) if step not in reading.steps]
  # Consecutive steps have the same step - index.
  runs = [[s for _, s in run] for _, run in
          itertools.groupby(enumerate(missing), lambda item: item[1] - item[0])]
  return [(run[0], run[-1]) for run in runs]


def _steps(ranges):
  """"step 3", "steps 6 to 11", "steps 3, 6 to 11": the steps of (first, last) ranges."""
  plural = len(ranges) > 1 or ranges[0][0] != ranges[0][1]
  return ("steps " if plural else "step ") + ", ".join(
      str(a) if a == b else f"{a} to {b}" for a, b in ranges)


def _warn_unread(path, reading, dropped, kept):
  """Warns of the unreadable lines of `reading` and of its steps on more than one
  line; `dropped` and `kept` say what was done."""
  bad = reading.bad
  if bad:
    said = [f"line {number} ({'step ' + str(step) if step is not None else 'no step'}), "
            f"cut short or unreadable: {start!r}" for number, start, step in bad[:3]]
    _log.warning("%s: %s %s%s", path, dropped, "; ".join(said),
                 f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
  steps = sorted(reading.repeated)
  if steps:
    listed = ", ".join(map(str, steps[:5])) + (f" and {len(steps) - 5} more"
                                               if len(steps) > 5 else "")
    _log.warning("%s: step%s %s %s on more than one line (a file joined to a copy of "
                 "itself, or edited by hand?); %s", path, "s" if len(steps) > 1 else "",
                 listed, "have values" if len(steps) > 1 else "has a value", kept)


def _readlines(path):
  try:
    with open(path, encoding="utf-8") as f:
      return f.readlines()
  except FileNotFoundError:
    return []


def _write_lines(path, lines):
  """Writes the lines of (step, line) pairs `lines` in step order, atomically."""
  temporary = path + ".tmp"
  with open(temporary, "w", encoding="utf-8") as f:
    f.write("".join(line for _, line in sorted(lines, key=lambda x: x[0])))
    f.flush()
    os.fsync(f.fileno())
  os.replace(temporary, path)
