"""Progress of `fit`: a tqdm bar on a terminal, periodic log lines elsewhere.

    progress = Progress(total=2500, initial=0, enabled=True)
    progress.update(100, {"generator_loss": array([...])})   # after each call
    progress.close()

Elsewhere (a log file, CI) a line is logged after the first compiled call, then
every 30 seconds and at the end (docs/outer-loop.md, "Progress"). In a notebook the
bar is tqdm's widget (with ipywidgets: `pip install 'ctl-loops[notebook]'`).
"""

import logging
import sys
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import TextIO

import numpy as np

from ctl.loop import notebook

_log = logging.getLogger("ctl")


class Progress:
  """Shows steps done of `total`, the latest results, speed and time left.

  Each result is its mean over the last call's steps, as `ctl.Summaries` writes it:
  the last value alone would show a lazy penalty as 0 between two of its steps.

  `total`: the step training goes up to; `initial`: the step it starts from;
  `stream`: where the bar goes, if it is a terminal (else log lines every
  `log_seconds` of `clock`).
  """

  def __init__(self, total: int, initial: int, *, enabled: bool = True,
               stream: TextIO | None = None, log_seconds: float = 30.0,
               clock: Callable[[], float] = time.monotonic):
    stream = stream or sys.stderr
    self.total = total
    self._initial = initial
    self._clock = clock
    self._start = clock()
    self._last_log = self._start
    self._log_seconds = log_seconds
    self._step = initial
    self._first_call = True
    self._bar = None
    self._enabled = enabled
    if enabled and notebook.in_notebook():
      self._bar = _notebook_bar(total=total, initial=initial, unit="step", smoothing=0.1)
    elif enabled and getattr(stream, "isatty", lambda: False)():
      from tqdm import tqdm  # pylint: disable=import-outside-toplevel
      self._bar = tqdm(total=total, initial=initial, unit="step", file=stream,
                       dynamic_ncols=True, smoothing=0.1)

  def update(self, step: int, results: Mapping[str, np.ndarray]) -> None:
    """Training reached `step`; `results`: the last call's per-step values."""
    latest = {k: float(np.mean(v)) for k, v in results.items()}
    advanced, self._step = step - self._step, step
    if not self._enabled:
      return
    if self._bar is not None:
      self._bar.set_postfix({k: f"{v:.4g}" for k, v in latest.items()}, refresh=False)
      self._bar.update(advanced)
      return
    now = self._clock()
    if self._first_call:  # said at once; speed and time left count from here
      self._first_call = False
      values = "  ".join(f"{k} {v:.4g}" for k, v in latest.items())
      _log.info("step %d/%d  %s  first call %.1f s (compiling the step included)",
                step, self.total, values, now - self._start)
      self._start = self._last_log = now
      self._initial = step
      return
    if now - self._last_log >= self._log_seconds or step >= self.total:
      self._last_log = now
      _log.info("%s", self.line(step, latest, now))

  def line(self, step: int, latest: Mapping[str, float], now: float) -> str:
    elapsed = now - self._start
    rate = (step - self._initial) / elapsed if elapsed > 0 else 0.0
    left = (self.total - step) / rate if rate > 0 else float("nan")
    values = "  ".join(f"{k} {v:.4g}" for k, v in latest.items())
    return (f"step {step}/{self.total} ({100.0 * step / self.total:.0f}%)  {values}  "
            f"{rate:.2f} steps/s  ETA {_duration(left)}")

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def _notebook_bar(**options):
  """tqdm's widget bar; its text bar if ipywidgets is missing."""
  from tqdm import notebook as tqdm_notebook  # pylint: disable=import-outside-toplevel
  try:
    return tqdm_notebook.tqdm(**options)
  except ImportError:  # "IProgress not found": no ipywidgets
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(file=sys.stderr, **options)


def _duration(seconds):
  if not np.isfinite(seconds):
    return "?"
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
