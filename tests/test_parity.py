"""Parity: one seeded task gives the same numbers under every strategy.

Each configuration of `parity_task.CONFIGS` trains its tasks for 10 steps:
`gan` (two models, losses given as functions), `bigan` (generator, encoder
and discriminator, three optimizers, two discriminator updates per step, tape
form) and, under mirrored with 2 replicas and multi_worker, the optimizer
options (`parity_task.OPTIMIZERS`: clipping, weight decay, EMA, loss scaling, a
schedule, RMSprop, SGD with momentum, Lion) and `micro_batches`. Every step's
reduced results and every model's final weights must be within rounding of the
eager run under the default strategy, by ctl.tools.parity's float32 criterion: each
variable's difference, relative to its model's largest weight, at most 10 times the
rounding floor (the most that moving the eager run's initial weights by one ulp
moved its model), or within 16 float32 epsilons per step. (ctl parity's float64
replay, which decides where it can, is tested on ordinary GANs in
tests/test_parity_suite.py.)
The reference and the floor run in processes of their own, and so does each
strategy: the configurations of one strategy share a process
(`parity_task.group`), each with a fresh runner.
"""

import numpy as np
import parity_task
import pytest

from ctl.tools import parity

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

ALL_TASKS = ("--tasks", "gan,bigan,options")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return helpers.run_task(tmp_path_factory.mktemp("reference"), "--eager", *ALL_TASKS)


@pytest.fixture(scope="module")
def floor(tmp_path_factory):
  return helpers.run_task(tmp_path_factory.mktemp("floor"), "--eager", "--perturbed",
                          *ALL_TASKS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """runs(config): its results; the first config of a group runs the whole group."""
  results = {}

  def get(config):
    if config not in results:
      group = parity_task.group(config)
      out = helpers.run_task(tmp_path_factory.mktemp("parity"), "--configs", ",".join(group))
      for name in group:
        results[name] = {k[len(name) + 1:]: v for k, v in out.items()
                         if k.startswith(name + "/")}
    return results[config]

  return get


def of_task(arrays, task):
  """The arrays of `task`, keyed as ctl.tools.parity keys them (`loss/...`, `<model>/<i>`)."""
  return {k[len(task) + 1:]: v for k, v in arrays.items() if k.startswith(task + "/")}


def check(results, reference, floor, label, tasks=("gan", "bigan")):
  for task in tasks:
    expected = of_task(reference, task)
    rows = parity.compare(label, expected, of_task(results, task),
                          parity.float32_tolerances(expected, [of_task(floor, task)]))
    largest = max(rows, key=lambda r: r.difference)
    print(f"parity {task}/{label}: largest difference {largest.difference:.3g} "
          f"({largest.key}), largest floor {max(r.floor for r in rows):.3g}")
    bad = [f"{r.key}: {r.difference:.3g} > {r.tolerance:.3g}" for r in rows if not r.ok]
    assert not bad, f"{task}/{label}: past rounding: {bad[:5]}"


@pytest.mark.parametrize("config", list(parity_task.CONFIGS))
def test_strategy_matches_eager_default(config, reference, floor, runs):
  check(runs(config), reference, floor, config,
        parity_task.task_names(parity_task.options(config)["tasks"]))


def test_multi_worker_two_processes_match(reference, floor, tmp_path):
  check(helpers.run_workers(tmp_path, 2, *ALL_TASKS), reference, floor, "multi_worker_2",
        parity_task.task_names("gan,bigan,options"))


def test_jit_under_mirrored_refuses_the_tape_form(tmp_path):
  """The gan task's loss functions compile under mirrored (jit_mirrored_2 above);
  bigan's tape form is refused, naming the function form."""
  proc = helpers.python([helpers.TASK, "--out", str(tmp_path / "x.npz"), "--tasks", "bigan",
                         "--jit", "--strategy", "mirrored", "--logical-cpus", "2"],
                        check=False)
  assert proc.returncode != 0
  assert "loss must be given as a function" in proc.stderr
  assert "ctx.minimize(lambda: ..., 'generator')" in proc.stderr


def test_each_configuration_shares_a_process_only_with_its_strategy():
  groups = {tuple(parity_task.group(c)) for c in parity_task.CONFIGS}
  assert sorted(c for g in groups for c in g) == sorted(parity_task.CONFIGS)
  for g in groups:
    assert len({parity_task.process_key(c) for c in g}) == 1, g
  assert ("mirrored_2_eager",) in groups  # eager mirrored alone (TF field notes)


def test_reference_is_a_real_training_run(reference):
  # Guard against a vacuous parity: the losses move and stay finite.
  for task in ("gan", "bigan"):
    losses = reference[f"{task}/loss/discriminator_loss"]
    assert losses.shape == (10,), task
    assert np.isfinite(losses).all() and abs(losses[-1] - losses[0]) > 1e-3, task


def test_micro_batches_equal_the_whole_batch(reference, floor):
  """ctx.minimize(..., micro_batches=2) on the gan task: the same updates as one
  pass over the whole batch (gan_step), within rounding, eagerly; the
  configurations above check it compiled and under mirrored."""
  whole = {k: v for k, v in of_task(reference, "gan").items() if "real_score" not in k}
  sliced = of_task(reference, "micro_batches")
  floor_of_gan = {k: v for k, v in of_task(floor, "gan").items() if "real_score" not in k}
  rows = parity.compare("micro_batches", whole, sliced,
                        parity.float32_tolerances(whole, [floor_of_gan]))
  assert all(r.ok for r in rows), [r for r in rows if not r.ok][:3]
