"""Parity: one seeded task gives the same numbers under every strategy.

Each configuration of `parity_task.CONFIGS` trains two tasks for 10 steps:
`gan` (two models, losses given as functions) and `bigan` (generator, encoder
and discriminator, three optimizers, two discriminator updates per step, tape
form). Every step's reduced results and every model's final weights must be
within 1e-5 (max absolute difference) of the eager run under the default
strategy. The reference runs in a process of its own, and so does each
strategy: the configurations of one strategy share a process
(`parity_task.group`), each with a fresh runner.
"""

import numpy as np
import parity_task
import pytest

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return helpers.run_task(tmp_path_factory.mktemp("reference"), "--eager")


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


def check(results, reference, label, tasks=("gan", "bigan")):
  for task in tasks:
    part = {k: v for k, v in results.items() if k.startswith(task + "/")}
    expected = {k: v for k, v in reference.items() if k.startswith(task + "/")}
    difference = helpers.max_difference(part, expected)
    print(f"parity {task}/{label}: max abs difference {difference:.3g}")
    assert difference <= TOLERANCE, f"{task}/{label}: {difference} > {TOLERANCE}"


@pytest.mark.parametrize("config", list(parity_task.CONFIGS))
def test_strategy_matches_eager_default(config, reference, runs):
  check(runs(config), reference, config, parity_task.options(config)["tasks"].split(","))


def test_multi_worker_two_processes_match(reference, tmp_path):
  check(helpers.run_workers(tmp_path, 2), reference, "multi_worker_2")


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
