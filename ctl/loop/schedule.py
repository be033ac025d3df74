"""When periodic work is due: `Every`.

    every = ctl.Every(steps=1000, seconds=600)   # whichever comes first
    fit(..., actions=[ctl.Samples(fn, every)])   # `fit` asks it after every compiled call
"""

import time
from collections.abc import Callable

from ctl.base import arguments


class Every:
  """Says when periodic work is due: every `steps` steps and/or `seconds` seconds,
  whichever comes first.

  Args:
    steps: fire when the global step reaches a multiple of this (`fit` shortens
      a compiled call to land on it).
    seconds: fire when this many seconds passed since the last firing (or
      since `start`).
    clock: a function returning seconds; injectable for tests.
  """

  def __init__(self, steps: int | None = None, seconds: float | None = None, *,
               clock: Callable[[], float] = time.monotonic):
    if steps is None and seconds is None:
      raise ValueError("Every needs steps=... or seconds=... (or both); for work "
                       "that runs only at the end of training pass every=None.")
    if steps is not None:
      arguments.integer("Every: steps", steps, minimum=1)
    if seconds is not None:
      arguments.number("Every: seconds", seconds, above=0)
    self.steps = steps
    self.seconds = seconds
    self._clock = clock
    self._last_step = 0
    self._last_time = None

  def start(self, step: int) -> None:
    """Starts counting from `step` (the loop calls this when it starts)."""
    self._last_step = step
    self._last_time = self._clock()

  def due(self, step: int) -> bool:
    """True if the work is due at `step`."""
    if self._last_time is None:
      self.start(0)
    if self.steps and step // self.steps > self._last_step // self.steps:
      return True
    return bool(self.seconds) and self._clock() - self._last_time >= self.seconds

  def fired(self, step: int) -> None:
    """Records that the work ran at `step`."""
    self.start(step)

  def steps_to_next(self, step: int) -> int | None:
    """Steps from `step` to the next multiple of `steps` (None without `steps`)."""
    return self.steps - step % self.steps if self.steps else None

  def __repr__(self) -> str:
    args = ([f"steps={self.steps}"] * bool(self.steps)
            + [f"seconds={self.seconds}"] * bool(self.seconds))
    return f"Every({', '.join(args)})"


def check_every(owner: str, every: object) -> None:
  """Raises TypeError naming the fix unless `every` is an `Every` or None."""
  if every is not None and not isinstance(every, Every):
    raise TypeError(f"{owner}.every is {every!r}; use ctl.Every(steps=..., seconds=...) "
                    "or None.")
