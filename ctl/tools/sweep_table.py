"""The results of a sweep: each combination's final and best metrics, mean ± std over seeds.

    from ctl.tools import sweep, sweep_table
    runs = sweep.plan(axes, [0, 1, 2], "runs/sweeps/dcgan", "gan.Experiment.seed")
    table = sweep_table.summarize(runs, best_modes={"reconstruction_ratio": "min"})
    print(table.markdown())
    table.write_csv("runs/sweeps/dcgan/results.csv")
    sweep_table.write_hparams("runs/sweeps/dcgan", axes, table)   # TensorBoard's HParams tab

Only finished runs count. From a run's `metrics.jsonl`, each metric's final value
(its last evaluation) and best (`best_mode`); from its `history.jsonl`, each
training result's mean over the last `last_steps` steps (a GAN's losses swing),
as `train/<key>`. Each is then the mean ± std (n - 1) over the finished seeds.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import glob
import json
import math
import os
import re
import statistics
from collections.abc import Mapping
from collections.abc import Sequence

from ctl.loop import history as history_lib
from ctl.tools import sweep

MINIMIZED = ("fid", "kid", "loss", "distance", "error")
MAXIMIZED = ("accuracy", "score", "precision", "recall", "density", "coverage")
# The end of the names of the event files `write_hparams` writes: it replaces its own only.
HPARAMS_SUFFIX = ".ctl-sweep"
LAST_STEPS = 100  # the steps a training result is averaged over, by default


def best_mode(metric: str, overrides: Mapping[str, str] | None = None) -> str | None:
  """"min", "max" or None (no best value) for `metric`, unless `overrides` says.

  A name with a word (split at `_`) in MINIMIZED is minimised, in MAXIMIZED
  maximised; one ending in `_std` (a spread) or with neither has no best.
  """
  if overrides and metric in overrides:
    return overrides[metric]
  if metric.endswith("_std"):
    return None
  words = set(re.split(r"[^a-z0-9]+", metric.lower().rpartition("/")[2]))
  if words & set(MINIMIZED):
    return "min"
  if words & set(MAXIMIZED):
    return "max"
  return None


@dataclasses.dataclass(frozen=True)
class Stat:
  """Mean and standard deviation (None for one value) over `n` seeds; n 0: none."""
  mean: float
  std: float | None
  n: int

  @classmethod
  def of(cls, values: Sequence[float]) -> Stat:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
      return cls(math.nan, None, 0)
    std = statistics.stdev(values) if len(values) > 1 else None
    return cls(statistics.fmean(values), std, len(values))

  def __str__(self) -> str:
    if not self.n:
      return "–"
    mean = f"{self.mean:.4g}"
    return mean if self.std is None else f"{mean} ± {self.std:.2g}"


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One finished run's numbers: `final[metric]`, `best[metric]` (metrics with a
  best mode only) and the step it finished at."""
  run: sweep.Run
  final: dict[str, float]
  best: dict[str, float]
  step: int


@dataclasses.dataclass(frozen=True)
class Row:
  """A combination's metric over its finished seeds (`seeds` asked)."""
  combination: sweep.Combination
  metric: str
  mode: str | None
  final: Stat
  best: Stat | None
  finished: int
  seeds: int


@dataclasses.dataclass
class Table:
  """The rows, by metric (training results last), then combination; `results`: the
  finished runs' own numbers."""
  rows: list[Row]
  results: list[RunResult]
  bindings: list[str]
  last_steps: int

  @property
  def metrics(self) -> list[str]:
    """The metrics of the rows, in their order."""
    return list(dict.fromkeys(row.metric for row in self.rows))

  def markdown(self) -> str:
    """The table in Markdown, with a note on how to read it."""
    shorts = sweep.short_names(self.bindings)
    header = ["metric", *shorts, "final", "best", "seeds"]
    lines = ["| " + " | ".join(header) + " |",
             "|---|" + "---|" * len(shorts) + "---:|---:|---:|"]
    for row in self.rows:
      best = "–" if row.best is None else f"{row.best} ({row.mode})"
      values = [row.combination.values[b].replace("|", "\\|") for b in self.bindings]
      lines.append("| " + " | ".join([row.metric, *values, str(row.final), best,
                                       f"{row.final.n}/{row.seeds}"]) + " |")
    if len(lines) == 2:
      lines.append("| (no run has finished) |" + " |" * (len(header) - 1))
    lines += ["", f"Mean ± standard deviation over the seeds that finished (seeds: "
              "those with a value / asked). final: at a run's last evaluation; best: the lowest "
              "(min) or highest (max) over its evaluations. train/KEY: the mean of the "
              f"training result KEY over a run's last {self.last_steps} steps."]
    return "\n".join(lines) + "\n"

  def write_csv(self, path: str) -> None:
    """The rows as CSV, n being the seeds with a value, finished those that finished,
    seeds those asked; an empty cell where there is no number."""
    with open(path, "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(["metric", *self.bindings, "combination", "final_mean", "final_std",
                       "best_mean", "best_std", "best_mode", "n", "finished", "seeds"])
      for row in self.rows:
        best = row.best or Stat(math.nan, None, 0)
        writer.writerow([row.metric, *(row.combination.values[b] for b in self.bindings),
                         row.combination.name, *_csv_stat(row.final), *_csv_stat(best),
                         row.mode or "", row.final.n, row.finished, row.seeds])


def _csv_stat(stat):
  if not stat.n:
    return "", ""
  return repr(stat.mean), "" if stat.std is None else repr(stat.std)


def run_result(run: sweep.Run, best_modes: Mapping[str, str] | None = None,
               last_steps: int = LAST_STEPS) -> RunResult:
  """The numbers of the finished run `run`, from its metrics.jsonl and history.jsonl."""
  final, best, step = {}, {}, 0
  evaluations = _rows(os.path.join(run.workdir, history_lib.METRICS_FILE_NAME))
  for metric in dict.fromkeys(k for row in evaluations for k in row if k != "step"):
    points = [(row["step"], row[metric]) for row in evaluations
              if metric in row and math.isfinite(row[metric])]
    if not points:
      continue
    final[metric] = points[-1][1]
    step = max(step, int(points[-1][0]))
    mode = best_mode(metric, best_modes)
    if mode is not None:
      best[metric] = (min if mode == "min" else max)(value for _, value in points)
  steps = _rows(os.path.join(run.workdir, history_lib.FILE_NAME))
  if steps:
    step = max(step, int(steps[-1]["step"]) + 1)  # `ctx.step` as the last step ran, from 0
  for key in dict.fromkeys(k for row in steps for k in row if k != "step"):
    values = [row[key] for row in steps[-last_steps:] if key in row and math.isfinite(row[key])]
    if values:
      final[f"train/{key}"] = statistics.fmean(values)
  return RunResult(run, final, best, step)


def _rows(path):
  """The rows of a metrics.jsonl or history.jsonl, values as float64 (`ctl.read_history`
  keeps float32); a line cut short by a crash is left out, as there."""
  rows = []
  with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as f:
    for line in f:
      with contextlib.suppress(ValueError, TypeError, AttributeError):
        rows.append({k: math.nan if v is None else float(v) for k, v in json.loads(line).items()})
  return [row for row in rows if "step" in row]


def summarize(runs: Sequence[sweep.Run], best_modes: Mapping[str, str] | None = None,
              last_steps: int = LAST_STEPS, metrics: Sequence[str] | None = None) -> Table:
  """The table of the finished runs among `runs` (`sweep.plan`'s): `best_modes` over
  the names' defaults (`best_mode`); `metrics` in this order (default: every one)."""
  results = [run_result(run, best_modes, last_steps) for run in runs
             if sweep.finished(run.workdir)]
  combinations = list({run.combination.name: run.combination for run in runs}.values())
  asked = {c.name: sum(run.combination.name == c.name for run in runs) for c in combinations}
  if metrics is None:
    metrics = list(dict.fromkeys(m for r in results for m in r.final))
    metrics.sort(key=lambda m: m.startswith("train/"))  # evaluations first, stable
  rows = []
  for metric in metrics:
    mode = None if metric.startswith("train/") else best_mode(metric, best_modes)
    for combination in combinations:
      mine = [r for r in results if r.run.combination.name == combination.name]
      rows.append(Row(combination, metric, mode,
                      Stat.of([r.final.get(metric, math.nan) for r in mine]),
                      None if mode is None else Stat.of([r.best.get(metric, math.nan)
                                                         for r in mine]),
                      len(mine), asked[combination.name]))
  bindings = list(combinations[0].values) if combinations else []
  return Table(rows, results, bindings, last_steps)


def write_hparams(directory: str, axes: Sequence[sweep.Axis], table: Table) -> list[str]:
  """TensorBoard HParams data for `tensorboard --logdir DIRECTORY`; the files written.

  The experiment goes to `directory`, each finished run's session to its work
  directory; a combination's seeds share a trial ID (its name), which the tab
  shows averaged. Files this function wrote before are replaced.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tensorboard.plugins.hparams import api as hp  # pylint: disable=import-outside-toplevel

  values = {axis.binding: _hparam_values(axis) for axis in axes}
  hparams = {b: hp.HParam(b, hp.Discrete(list(known.values()))) for b, known in values.items()}
  metrics = []
  for metric in table.metrics:
    metrics.append(hp.Metric(f"final/{metric}", display_name=f"final {metric}"))
    if any(r.best is not None for r in table.rows if r.metric == metric):
      metrics.append(hp.Metric(f"best/{metric}", display_name=f"best {metric}"))
  written = [_write_events(directory, lambda: hp.hparams_config(
      hparams=list(hparams.values()), metrics=metrics))]
  for result in table.results:

    def session(result=result):
      hp.hparams({hparams[b]: values[b][v] for b, v in result.run.combination.values.items()},
                 trial_id=result.run.combination.name)
      for kind, numbers in (("final", result.final), ("best", result.best)):
        for metric, value in numbers.items():
          tf.summary.scalar(f"{kind}/{metric}", value, step=result.step)

    written.append(_write_events(result.run.workdir, session))
  return written


def _hparam_values(axis):
  """`{value's gin text: its hyperparameter value}`: as gin parsed it if the axis' values
  are all numbers, all booleans or all strings, else the gin text."""
  parsed = axis.parsed
  kinds = {bool if isinstance(v, bool) else float if isinstance(v, (int, float))
           else str if isinstance(v, str) else None for v in parsed}
  if len(kinds) == 1 and None not in kinds:
    return dict(zip(axis.values, parsed))
  return {text: text for text in axis.values}


def _write_events(directory, write):
  """Calls `write()` under a new summary writer in `directory` (removing the file it
  wrote there before); the new file's path."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  pattern = os.path.join(glob.escape(directory), "events.out.tfevents.*" + HPARAMS_SUFFIX)
  for old in glob.glob(pattern):
    os.remove(old)
  writer = tf.summary.create_file_writer(directory, filename_suffix=HPARAMS_SUFFIX)
  with writer.as_default():
    write()
  writer.close()
  return glob.glob(pattern)[0]
