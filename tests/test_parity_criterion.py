"""ctl.parity's criterion and report on arrays made here (no training, no processes):
what counts as rounding, how configurations are named, what the diagnosis reads."""

import numpy as np
import pytest

from ctl import parity

EPS = parity.FLOAT32_EPSILON


def runs(steps=10):
  """A reference, its floor (1e-7 away) and a run 5e-7 away, with a model of two
  variables (weights up to 2) and a logged loss."""
  reference = {"loss/d": np.linspace(1.0, 0.5, steps), "m/0": np.array([2.0, -1.0]),
               "m/1": np.array([1e-4])}  # a bias near zero
  floor = {k: v + 1e-7 for k, v in reference.items()}
  near = {k: v + 5e-7 for k, v in reference.items()}
  return reference, floor, near


def test_a_difference_within_ten_floors_is_rounding():
  reference, floor, near = runs()
  rows = parity.compare(reference, floor, {"mirrored:2": near})
  assert all(r.ok for r in rows), rows
  far = {k: v + 1e-4 for k, v in reference.items()}
  rows = parity.compare(reference, floor, {"mirrored:2": far})
  assert not any(r.ok for r in rows)


def test_variables_are_judged_on_their_models_scale():
  """The bias of 1e-4 differs by 5e-7: 5e-3 of itself, 2.5e-7 of the model's largest weight."""
  reference, floor, near = runs()
  row = next(r for r in parity.compare(reference, floor, {"c": near}) if r.key == "m/1")
  assert row.difference == pytest.approx(5e-7 / 2.0)
  assert row.floor == pytest.approx(1e-7 / 2.0)


def test_without_a_floor_each_step_may_add_sixteen_epsilons():
  reference, _, _ = runs(steps=10)
  same = dict(reference)  # a floor run equal to the reference: floor 0
  off = {k: v * (1 + 100 * EPS) for k, v in reference.items()}  # 100 eps: under 160
  rows = parity.compare(reference, same, {"c": off})
  assert all(r.floor == 0 and r.steps == 10 for r in rows)
  assert all(r.ok for r in rows), rows
  rows = parity.compare(reference, same, {"c": {k: v * (1 + 400 * EPS)
                                                 for k, v in reference.items()}})
  assert not all(r.ok for r in rows)


def test_non_finite_values_count_as_different_unless_equal():
  assert parity.relative_difference(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])) == 0
  assert parity.relative_difference(np.array([1.0]), np.array([np.inf])) == float("inf")
  assert parity.relative_difference(np.zeros(3), np.zeros(4)) == float("inf")


@pytest.mark.parametrize("name, strategy, replicas, options", [
    ("compiled", "default", 1, {}),
    ("jit", "default", 1, {"jit_compile": True}),
    ("mirrored:4", "mirrored", 4, {}),
    ("multi_worker:2", "multi_worker", 2, {}),
    ("mirrored:2+steps_per_loop:5", "mirrored", 2, {"steps_per_loop": 5}),
    ("mirrored:2+eager", "mirrored", 2, {"eager": True}),
])
def test_configuration_names(name, strategy, replicas, options):
  config = parity.Config.parse(name)
  assert (config.strategy, config.replicas, dict(config.options)) == (
      strategy, replicas, options)


@pytest.mark.parametrize("name, words", [
    ("mirored:2", "'mirored' is not one of"),
    ("mirrored", "needs a count, e.g. 'mirrored:2'"),
    ("jit:1", "'jit' takes no count"),
    ("mirrored:0", "must be an int >= 1, got '0'"),
])
def test_bad_configuration_names(name, words):
  with pytest.raises(ValueError, match=words):
    parity.Config.parse(name)


def test_a_loss_scaled_by_the_replica_count_is_named():
  reference, floor, _ = runs()
  scaled = dict(reference, **{"loss/d": reference["loss/d"] * 2})
  config = parity.Config.parse("mirrored:2")
  rows = parity.compare(reference, floor, {config.name: scaled})
  causes = parity.diagnose(config, rows, reference, floor, scaled, {"m": []})
  assert any("2 times the reference" in c and "scaled by the replica count" in c
             for c in causes), causes


def test_layers_that_work_per_replica_are_named():
  reference, floor, _ = runs()
  moved = {k: v + 0.1 for k, v in reference.items()}
  config = parity.Config.parse("mirrored:2")
  rows = parity.compare(reference, floor, {config.name: moved})
  causes = parity.diagnose(config, rows, reference, floor, moved,
                           {"m": ["Dropout"], "g": ["BatchNormalization"]})
  assert any("g (BatchNormalization); m (Dropout)" in c for c in causes), causes


def test_the_report_gives_each_configuration_a_verdict():
  reference, floor, near = runs()
  far = {k: v + 1e-3 for k, v in reference.items()}
  rows = parity.compare(reference, floor, {"compiled": near, "mirrored:2": far})
  report = parity.Report(rows, {"mirrored:2": ["a cause"]})
  text = str(report)
  assert not report.ok
  assert [line.split()[-1] for line in text.splitlines()[1:3]] == ["rounding", "DIFFERS"]
  assert "likely: a cause" in text
