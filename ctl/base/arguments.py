"""Argument checks shared by ctl and the packages built on it, with one message style.

    num_shards = arguments.integer("num_shards", num_shards, minimum=1,
                                   fix="use e.g. 8, more than the input pipelines")

Each check returns the value and raises early, naming the argument, the
value and, where one is given, the fix: `<name> must be <what>, got
<value!r>.` TypeError when the value has the wrong type, ValueError when it is
out of range. TensorFlow-free, for the launcher and the command line.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterable


def integer(name: str, value: object, *, minimum: int | None = None, meaning: str = "",
            fix: str = "") -> int:
  """`value` as an int; raises unless it is an int (not a bool) >= `minimum`."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(_message(name, _what("an int", minimum, meaning), value, fix))
  if minimum is not None and value < minimum:
    raise ValueError(_message(name, _what("an int", minimum, meaning), value, fix))
  return int(value)


def number(name: str, value: object, *, minimum: float | None = None,
           above: float | None = None, meaning: str = "", fix: str = "") -> float:
  """`value` as a float; raises unless it is a real number (not a bool) >=
  `minimum` (or > `above`)."""
  what = _what("a number", minimum, meaning, above)
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(_message(name, what, value, fix))
  if (minimum is not None and value < minimum) or (above is not None and value <= above):
    raise ValueError(_message(name, what, value, fix))
  return float(value)


def did_you_mean(name: str, candidates: Iterable[str], prefix: str = "") -> str:
  """` (did you mean 'x'?)` for the candidates closest to `name`, or "".

  Case, spaces around it and `-` for `_` do not count: `"Mirrored "` and
  `"multi-worker"` get `'mirrored'` and `'multi_worker'` first.
  """
  keyed = {}
  for candidate in candidates:
    keyed.setdefault(_key(candidate), candidate)
  key = _key(name)
  close = [key] if key in keyed else difflib.get_close_matches(key, list(keyed), n=3,
                                                               cutoff=0.6)
  shown = " or ".join(repr(prefix + keyed[k]) for k in close)
  return f" (did you mean {shown}?)" if close else ""


def _key(name):
  return str(name).strip().lower().replace("-", "_")


def _what(kind, minimum, meaning, above=None):
  bound = f" > {above}" if above is not None else f" >= {minimum}" if minimum is not None else ""
  return f"{kind}{bound}" + (f" ({meaning})" if meaning else "")


class VariableError(ValueError):
  """An environment variable ctl reads (TF_CONFIG, CTL_STARTUP_TIMEOUT, ...) has a
  value it cannot use; the message names the variable, the value and the fix.
  The `ctl` command reports it as a usage error (exit 2), without a traceback."""


class LayoutError(ValueError):
  """A global batch that the replicas cannot share equally (e.g. a run resumed on
  another replica count); the message names both and the fix. The `ctl` command
  reports it as a usage error (exit 2), without a traceback."""


def _message(name, what, value, fix):
  fix = fix.rstrip(".")
  return f"{name} must be {what}, got {value!r}." + (f" {fix[0].upper()}{fix[1:]}." if fix else "")
