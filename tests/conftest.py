"""Test set-up: split the CPU into 2 logical devices before any TF op runs.

In-process tests can then build `mirrored` with 2 replicas; anything that needs
another device count, or a fresh process, runs in a subprocess (tests/helpers.py).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import ctl  # noqa: E402

ctl.configure_logical_cpus(2)
