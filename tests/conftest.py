"""Test set-up: split the CPU into 2 logical devices before any TF op runs.

In-process tests can then build `mirrored` with 2 replicas; anything that needs
another device count, or a fresh process, runs in a subprocess (tests/helpers.py).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

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
