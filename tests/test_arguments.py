"""The shared argument checks: one message style, the type and the range told apart."""

import numpy as np
import pytest

from ctl.base import arguments


def test_an_int_in_range_is_returned_as_an_int():
  assert arguments.integer("n", 3, minimum=1) == 3
  value = arguments.integer("n", np.int64(4), minimum=0)  # numpy ints are ints
  assert value == 4 and type(value) is int


@pytest.mark.parametrize("value, error", [
    (0, ValueError), (2.5, TypeError), (True, TypeError), ("3", TypeError), (None, TypeError)])
def test_integer_names_the_argument_the_bound_the_value_and_the_fix(value, error):
  with pytest.raises(error) as raised:
    arguments.integer("num_shards", value, minimum=1, meaning="files", fix="use e.g. 8.")
  assert str(raised.value) == (f"num_shards must be an int >= 1 (files), got {value!r}. "
                               "Use e.g. 8.")


@pytest.mark.parametrize("value, error", [(0, ValueError), (-1.5, ValueError),
                                          (False, TypeError), ("10", TypeError)])
def test_number_above_a_bound(value, error):
  with pytest.raises(error, match=rf"seconds must be a number > 0, got {value!r}\.$"):
    arguments.number("seconds", value, above=0)


def test_number_at_least_a_bound():
  assert arguments.number("grace", 0, minimum=0) == 0.0
  with pytest.raises(ValueError, match=r"grace must be a number >= 0 \(seconds\), got -1\.$"):
    arguments.number("grace", -1, minimum=0, meaning="seconds")


@pytest.mark.parametrize("name, hint", [
    ("mirored", " (did you mean 'mirrored'?)"),
    ("Mirrored ", " (did you mean 'mirrored'?)"),  # case and spaces do not count
    ("MULTI-WORKER", " (did you mean 'multi_worker'?)"),  # nor - for _
    ("zzz", ""),
])
def test_did_you_mean_suggests_the_nearest_names(name, hint):
  assert arguments.did_you_mean(name, ["mirrored", "multi_worker", "default"]) == hint


def test_did_you_mean_keeps_the_candidates_spelling_and_a_prefix():
  assert arguments.did_you_mean("lr", ["LR", "lr_decay"], prefix="Adam.") == (
      " (did you mean 'Adam.LR'?)")
