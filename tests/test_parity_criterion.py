"""ctl.tools.parity's criterion and report on arrays made here (no training, no processes):
what counts as rounding in float32 and in float64, how configurations are named,
what the diagnosis reads, what the table shows."""

import dataclasses

import numpy as np
import pytest

from ctl.tools import parity

EPS = parity.FLOAT32_EPSILON


def runs(steps=10):
  """A reference, its floor (1e-7 away) and a run 5e-7 away, with a model of two
  variables (weights up to 2), an optimizer slot and a logged loss."""
  reference = {"loss/d": np.linspace(1.0, 0.5, steps), "m/0": np.array([2.0, -1.0]),
               "m/1": np.array([1e-4]),  # a bias near zero
               "optimizer:m/momentum/1": np.array([0.5, 0.1]), "counter:step": np.array(10)}
  floor = {k: v + 1e-7 if v.dtype.kind == "f" else v for k, v in reference.items()}
  near = {k: v + 5e-7 if v.dtype.kind == "f" else v for k, v in reference.items()}
  return reference, floor, near


def float32_rows(reference, floors, run, config="c"):
  return parity.compare(config, reference, run, parity.float32_tolerances(reference, floors))


def test_a_difference_within_ten_floors_is_rounding():
  reference, floor, near = runs()
  assert all(r.ok for r in float32_rows(reference, [floor], near))
  far = {k: v + 1e-4 if v.dtype.kind == "f" else v for k, v in reference.items()}
  rows = float32_rows(reference, [floor], far)
  assert not any(r.ok for r in rows if r.key != "counter:step")


def test_variables_are_judged_on_their_groups_scale():
  """The bias of 1e-4 differs by 5e-7: 5e-3 of itself, 2.5e-7 of the model's largest
  weight; the optimizer slot on its own kind's largest value (0.5)."""
  reference, floor, near = runs()
  rows = {r.key: r for r in float32_rows(reference, [floor], near)}
  assert rows["m/1"].difference == pytest.approx(5e-7 / 2.0)
  assert rows["optimizer:m/momentum/1"].difference == pytest.approx(5e-7 / 0.5)
  assert parity.group("optimizer:m/momentum/1") == "optimizer:m/momentum"
  assert parity.group("m/1") == "m" and parity.group("loss/d") == "loss"


def test_the_floor_is_the_largest_over_its_group_and_the_floor_runs():
  """One floor run is one sample: a variable whose own floor came out tiny is
  judged by the largest floor of its model over every floor run."""
  reference, _, _ = runs()
  quiet = dict(reference, **{"m/0": reference["m/0"] + np.array([1e-6, 0.0]),
                             "m/1": reference["m/1"]})  # m/1 did not move in this run
  loud = dict(reference, **{"m/0": reference["m/0"] + np.array([0.0, 4e-6])})
  tolerances = parity.float32_tolerances(reference, [quiet, loud])
  assert tolerances["m/1"][0] == pytest.approx(4e-6 / 2.0)  # m/0's, in the other run
  assert tolerances["m/1"][1] == pytest.approx(max(10 * 2e-6, 16 * EPS * 10))


def test_without_a_floor_each_step_may_add_sixteen_epsilons():
  reference, _, _ = runs(steps=10)
  same = dict(reference)  # a floor run equal to the reference: floor 0
  off = {k: v * (1 + 100 * EPS) for k, v in reference.items()}  # 100 eps: under 160
  rows = float32_rows(reference, [same], off)
  assert all(r.floor == 0 for r in rows) and all(r.ok for r in rows), rows
  rows = float32_rows(reference, [same], {k: v * (1 + 400 * EPS) for k, v in reference.items()})
  assert not all(r.ok for r in rows)


def test_float64_rounding_is_judged_on_a_fixed_tolerance():
  reference, _, _ = runs()
  tolerances32 = parity.float32_tolerances(reference, [reference])
  floor64 = {k: v + 1e-15 if v.dtype.kind == "f" else v for k, v in reference.items()}
  tolerances64 = parity.float64_tolerances(reference, floor64, tolerances32)
  assert tolerances64["m/0"][1] == pytest.approx(parity.FLOAT64_TOLERANCE * 10)
  rounding = {k: v + 1e-13 if v.dtype.kind == "f" else v for k, v in reference.items()}
  bug = {k: v + 1e-6 if v.dtype.kind == "f" else v for k, v in reference.items()}
  assert all(r.ok for r in parity.compare("c", reference, rounding, tolerances64, "float64"))
  assert not any(r.ok for r in parity.compare("c", reference, bug, tolerances64, "float64")
                 if r.key != "counter:step")


def test_a_variable_that_float64_rounding_moves_is_judged_as_in_float32():
  """A bias before batch norm: its gradient is 0 but for rounding, which Adam turns
  into steps of its learning rate, in float64 too."""
  reference, floor, _ = runs()
  tolerances32 = parity.float32_tolerances(reference, [floor])
  floor64 = dict(reference, **{"m/1": reference["m/1"] + 1e-3})
  tolerances64 = parity.float64_tolerances(reference, floor64, tolerances32)
  assert tolerances64["m/1"] == (pytest.approx(1e-3 / 2), pytest.approx(1e-2 / 2))
  assert tolerances64["m/0"][1] == pytest.approx(parity.FLOAT64_TOLERANCE * 10)


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


def diagnosed(run, about, config="mirrored:2", floors=None):
  reference, floor, _ = runs()
  config = parity.Config.parse(config)
  rows = float32_rows(reference, [floor], run, config.name)
  return parity.diagnose(config, rows, reference, run, about,
                         floors=[floor] if floors is None else floors)


def test_a_loss_scaled_by_the_replica_count_is_named():
  reference, _, _ = runs()
  causes = diagnosed(dict(reference, **{"loss/d": reference["loss/d"] * 2}), {})
  assert any("2 times the reference" in c and "scaled by the replica count" in c
             for c in causes), causes


def test_layers_that_work_per_replica_are_named():
  reference, _, _ = runs()
  moved = {k: v + 0.1 for k, v in reference.items()}
  causes = diagnosed(moved, {"layers": {"m": ["Dropout"], "g": ["BatchNormalization"]}})
  assert any("g (BatchNormalization); m (Dropout)" in c for c in causes), causes


def test_a_value_over_the_replicas_batch_is_named_with_its_line():
  reference, _, _ = runs()
  moved = {k: v + 0.1 for k, v in reference.items()}
  line = "my_gan.py:12: norm = tf.norm(gradients) (Sum over the batch axis)"
  causes = diagnosed(moved, {"analysis": {"batch_reductions": [line]}})
  assert any(c.startswith("a value computed over the replica's batch: " + line)
             for c in causes), causes


def test_batch_statistics_are_named_when_only_replicas_differ_at_the_first_step():
  reference, _, _ = runs()
  moved = {k: v + 0.1 for k, v in reference.items()}
  about = {"statistics": {"g": ["BatchNormalization synchronized"]},
           "analysis": {"micro_batches": True}}
  causes = diagnosed(moved, about)
  assert any(c.startswith("batch statistics: g (BatchNormalization synchronized)") and
             "micro_batches=k" in c for c in causes), causes
  assert not any("batch statistics" in c for c in diagnosed(moved, about, "compiled"))


def test_another_number_of_updates_is_named():
  reference, _, _ = runs()
  causes = diagnosed(dict(reference, **{"counter:step": np.array(11)}),
                     {"paths": {"counter:step": "step counter"}}, "compiled")
  assert any(c.startswith("step counter is 11 here and 10 in the reference") for c in causes)


def test_a_step_that_is_not_deterministic_is_named():
  reference, floor, _ = runs()
  drawn = dict(floor, **{"loss/d": reference["loss/d"] + 0.3})  # moved at step 0
  causes = diagnosed({k: v + 0.3 for k, v in reference.items()}, {}, "compiled",
                     floors=[drawn])
  assert any("not deterministic on its own" in c for c in causes), causes


def test_a_reference_that_is_not_deterministic_gives_no_verdict_of_rounding():
  """A floor run that differs at the first step (an unseeded draw): its differences
  are no rounding floor, so tolerances built on it could hide anything."""
  reference, floor, near = runs()
  drawn = dict(floor, **{"loss/d": reference["loss/d"] + 0.3})
  assert parity.not_deterministic(reference, [drawn])
  assert not parity.not_deterministic(reference, [floor])
  report = parity.Report(float32_rows(reference, [drawn], near), unsteady={"c"})
  assert all(r.ok for r in report.rows) and not report.within_rounding("c")
  assert report.verdict("c") == "undecided" and not report.differs  # nor DIFFERS
  assert "the reference is not deterministic on its own" in str(report)


def report_of(near32, run64):
  reference, floor, _ = runs()
  tolerances32 = parity.float32_tolerances(reference, [floor])
  tolerances64 = parity.float64_tolerances(reference, reference, tolerances32)
  rows = (parity.compare("compiled", reference, near32, tolerances32, "float32") +
          parity.compare("compiled", reference, run64, tolerances64, "float64"))
  return parity.Report(rows, decided_by={"compiled": "float64"}, steps=10)


def test_float64_decides_and_the_table_shows_both():
  reference, _, near = runs()
  amplified = {k: v + 1e-4 if v.dtype.kind == "f" else v for k, v in reference.items()}
  report = report_of(amplified, reference)  # float32 past its floor; float64 agrees
  assert report.ok and report.within_rounding("compiled")
  lines = str(report).splitlines()
  assert lines[1].split()[:3] == ["compiled", "rounding", "float64"]
  assert lines[2].split()[0] == "float32" and lines[2].endswith("(largest, past)")
  report = report_of(near, {k: v + 1e-6 if v.dtype.kind == "f" else v
                            for k, v in reference.items()})
  assert not report.ok and "compiled" in str(report).splitlines()[1]
  assert "DIFFERS" in str(report).splitlines()[1]


def test_the_table_names_the_largest_difference_its_tolerance_and_the_closest():
  reference, floor, _ = runs()
  run = dict(reference, **{"m/0": reference["m/0"] + 1e-6,  # largest, relative 5e-7
                           "loss/d": reference["loss/d"] + 1e-6})  # 2e-6 of its tolerance
  tolerances = parity.float32_tolerances(reference, [floor])
  report = parity.Report(parity.compare("c", reference, run, tolerances), steps=10)
  largest, worst = report.largest("c"), report.worst("c")
  assert largest.key == "loss/d" or largest.difference >= worst.difference
  text = str(report)
  assert f"{largest.difference:10.2e} {largest.tolerance:10.2e}  {largest.key} (largest)" in text
  verbose = report.format(verbose=True)
  assert "c, float32, every variable (difference, tolerance, floor):" in verbose
  assert all(key in verbose for key in reference)


def test_float32_alone_past_its_tolerance_by_little_is_undecided():
  """Where float64 could not run: past the tolerance by less than UNDECIDED_FACTOR
  is neither rounding nor DIFFERS (a correct run reached 1.8 times it, a bug
  3.3 times); further past, DIFFERS; the report says by how much."""
  reference, floor, _ = runs()
  tolerances = parity.float32_tolerances(reference, [floor])
  scale = 2.0  # the model's largest weight
  for factor, verdict in [(0.5, "rounding"), (3.0, "undecided"), (30.0, "DIFFERS")]:
    moved = dict(reference, **{"m/0": reference["m/0"] +
                               np.array([factor * tolerances["m/0"][1] * scale, 0.0])})
    report = parity.Report(parity.compare("c", reference, moved, tolerances), steps=10,
                           first_differs={"c"})
    assert report.verdict("c") == verdict, (factor, str(report))
    assert report.differs == (verdict == "DIFFERS")
    assert report.ok == (verdict == "rounding")
    if verdict != "rounding":
      assert f"(at most {report.worst('c').margin:.3g} times it)" in str(report)
      assert ("undecided: float32 alone cannot tell" in str(report)) == (verdict == "undecided")
  # Far past, but the first step's logged values alike: amplified, or a bug?
  report.first_differs.clear()
  assert report.verdict("c") == "undecided" and not report.differs
  assert "or further with the first step's logged values alike" in str(report)
  # Decided in float64, the same margin is DIFFERS.
  moved = dict(reference, **{"m/0": reference["m/0"] + np.array([3.0 * tolerances["m/0"][1]
                                                                 * scale, 0.0])})
  report = parity.Report([dataclasses.replace(r, precision="float64") for r in
                          parity.compare("c", reference, moved, tolerances)],
                         decided_by={"c": "float64"}, steps=10)
  assert report.verdict("c") == "DIFFERS"


def test_a_note_that_every_configuration_shares_is_said_once():
  reference, floor, near = runs()
  rows = float32_rows(reference, [floor], near, "c seed=0") + float32_rows(
      reference, [floor], near, "c seed=1")
  note = "float64 cannot decide: the step makes float32 at my_gan.py:3; float32 decides."
  report = parity.Report(rows, notes={"c seed=0": [note], "c seed=1": [note]}, steps=10)
  assert str(report).count(note) == 1
  assert f"every configuration: {note}" in str(report)


def test_the_amplified_rounding_note_names_the_optimizers_used():
  reference, _, _ = runs()
  amplified = {k: v + 1e-4 if v.dtype.kind == "f" else v for k, v in reference.items()}
  report = report_of(amplified, reference)
  sgd = parity.amplified_note(report, "compiled", {"g": "SGD", "d": "SGD"})
  assert "(SGD)" in sgd[0] and "Adam" not in sgd[0]
  adam = parity.amplified_note(report, "compiled", {"g": "SGD", "d": "Adam"})
  assert "(Adam divides each gradient by its own running size" in adam[0]


def test_a_draw_with_its_line_is_the_cause_and_correct_batch_statistics_are_not_blamed():
  reference, _, _ = runs()
  moved = {k: v + 0.1 for k, v in reference.items()}
  line = "my_gan.py:9: z = tf.random.normal([8, 4]) (RandomStandardNormal)"
  about = {"statistics": {"g": ["BatchNormalization synchronized"]},
           "analysis": {"draws": [line]}}
  for config in ("mirrored:2", "compiled"):
    causes = diagnosed(moved, about, config)
    assert causes[0].startswith("draws whose numbers depend on the layout: " + line), causes
    assert not any("batch statistics" in c or "something is computed" in c or
                   "compiling alone" in c for c in causes), causes


def test_the_default_jobs_count_the_cpus_this_process_may_use(monkeypatch):
  """`taskset -c 0` on a 4-core machine: one job at a time, not four."""
  monkeypatch.setattr(parity.os, "sched_getaffinity", lambda pid: {0}, raising=False)
  monkeypatch.setattr(parity.os, "cpu_count", lambda: 4)
  assert parity.usable_cpus() == 1
  monkeypatch.setattr(parity.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
  assert parity.usable_cpus() == 3


def test_a_value_over_the_replicas_batch_is_named_when_the_first_step_agrees():
  """A regulariser of the codes' batch mean, small next to the loss: the first
  step's logged values agree to 1e-5, and the traced reduction is the evidence."""
  reference, _, _ = runs()
  moved = {k: v + 0.1 for k, v in reference.items()}
  moved["loss/d"] = reference["loss/d"] + np.array([0.0] + [0.1] * 9)
  line = "my_gan.py:60: mean_code = tf.reduce_mean(codes, axis=0) (Mean over the batch axis)"
  causes = diagnosed(moved, {"analysis": {"batch_reductions": [line]}})
  assert any(c.startswith("a value computed over the replica's batch: " + line)
             for c in causes), causes
