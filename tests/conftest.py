"""Test set-up: split the CPU into 2 logical devices before any TF op runs.

In-process tests can then build `mirrored` with 2 replicas; anything that needs
another device count, or a fresh process, runs in a subprocess (tests/helpers.py).
"""

import os
import runpy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Keras, in this process and every process a test starts, skips the optional
# packages ctl never asks of it (tests/lean_keras/sitecustomize.py says which, and why).
LEAN_KERAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lean_keras")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (LEAN_KERAS, os.environ.get("PYTHONPATH")) if p)
runpy.run_path(os.path.join(LEAN_KERAS, "sitecustomize.py"))

import pytest  # noqa: E402

import ctl  # noqa: E402

import helpers  # noqa: E402

ctl.configure_logical_cpus(2)


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
  """Runs made once per test session, for every module and xdist worker."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the session's directory, above each worker's own
  return helpers.SharedRuns(root / "shared-runs")


# The files that take minutes (one run's CPU seconds, most first), started first.
# pytest-xdist hands whole files (--dist loadfile) to its workers in the order
# they are collected, alphabetical: last came test_slurm, test_sweep and
# test_ray, which one worker then ran alone while the other had finished
# (the last 7% of the tests took 10 of 27 minutes). Longest first evens out.
LONGEST_FIRST = ("test_faults.py", "test_fault_matrix.py", "test_parity_suite.py",
                 "test_parity.py", "test_parity_planted.py", "test_bench.py", "test_slurm.py",
                 "test_examples.py", "test_cli.py", "test_parity_tool.py",
                 "test_sample_evaluation.py", "test_gan_parts.py", "test_sweep.py",
                 "test_ray.py")


def pytest_collection_modifyitems(items):
  """Orders the files longest first (`LONGEST_FIRST`), the others after them as
  collected; the tests of a file keep their order."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
