"""Test set-up: split the CPU into 2 logical devices before any TF op runs.

In-process tests can then build `mirrored` with 2 replicas; anything that needs
another device count, or a fresh process, runs in a subprocess (tests/helpers.py).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

import ctl  # noqa: E402

import helpers  # noqa: E402

ctl.configure_logical_cpus(2)


_exit_status = None


def pytest_sessionfinish(session, exitstatus):
  del session
  global _exit_status
  _exit_status = int(exitstatus)


def pytest_unconfigure(config):
  # TF 2.21 can stall for minutes at interpreter exit, freeing the tf.data
  # iterators that runners left alive: each ~RootDataset::Iterator waits for
  # its autotune thread (Model::OptimizeLoop, in a timed wait) to notice the
  # cancellation. Caught with gdb in 1 of 5 runs of tests/test_runner.py -n 0:
  # 107 s between pytest_unconfigure and the exit, 11 such threads alive; the
  # other runs took 1-8 s. Neither deleting the iterators nor gc in a plain
  # script reproduces it. Everything is reported by now: leave without the
  # interpreter's clean-up.
  del config
  if _exit_status is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)  # pylint: disable=protected-access


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
  """Runs made once per test session, for every module and xdist worker."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the session's directory, above each worker's own
  return helpers.SharedRuns(root / "shared-runs")
