"""`ctl parity` finds every planted bug, on every seed, and names its cause.

Every bug of tests/parity_planted.py, on seeds 0-4, 3 steps: each is called
DIFFERS (decided in float64), with its cause named (with its line, where the
step wrote it); and the same toy step without a bug is called rounding.
(tests/test_parity_suite.py: no false alarm on ordinary GANs.)
"""

import os

import pytest

from ctl.tools import parity

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

SEEDS = range(5)
PLANTED_MODULE = os.path.join(helpers.ROOT, "tests", "parity_planted.py")
# bug -> (configurations, what one cause says); "" is the step without a bug.
PLANTED = {
    "": (["compiled", "mirrored:2"], None),
    "replica_scaled": (["mirrored:2"], ["scaled by the replica count"]),
    "noise_per_replica": (["mirrored:2"], ["draws whose numbers depend on the layout: ",
                                           "parity_planted.py:", "tf.random.stateless_normal("]),
    "random_sync_bn": (["mirrored:2"], ["draws whose numbers depend on the layout: ",
                                        "parity_planted.py:", "tf.random.normal("]),
    "tf_random": (["compiled", "mirrored:2"], ["draws whose numbers depend on the layout: ",
                                               "parity_planted.py:", "tf.random.normal("]),
    "regulariser_batch_mean": (["mirrored:2"], ["a value computed over the replica's batch: ",
                                                "parity_planted.py:", "tf.reduce_mean(fake, 0)"]),
    "layers": (["mirrored:2"], ["discriminator (Dropout); generator (BatchNormalization)"]),
    "batch_norm": (["mirrored:2"], ["layers that work per replica: generator "
                                    "(BatchNormalization)"]),
    "python_random": (["compiled"], ["np.random"]),
    "python_counter": (["compiled"], ["a Python counter"]),
    "penalty_over_batch": (["mirrored:2"], ["a value computed over the replica's batch: ",
                                            "parity_planted.py:", "tf.norm("]),
    "own_micro_batches": (["mirrored:2"], ["batch statistics: discriminator "
                                           "(BatchNormalization synchronized)"]),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_differs_on_every_seed_and_is_named(bug, monkeypatch):
  configs, words = PLANTED[bug]
  monkeypatch.setenv("PLANTED_BUG", bug)
  report = parity.check(PLANTED_MODULE, configs, steps=3, seeds=SEEDS, jobs=2)
  print(report)
  assert len(report.configs) == len(configs) * len(SEEDS)
  for name in report.configs:
    if words is None:
      assert report.within_rounding(name), str(report)
      continue
    if bug == "tf_random" and name.startswith("compiled ") and report.within_rounding(name):
      continue  # a fresh op-seeded draw can give the eager numbers compiled: no difference
    assert report.verdict(name) == "DIFFERS", name
    assert any(all(w in cause for w in words) for cause in report.causes[name]), (
        name, report.causes[name])
    if "depend on the layout" in words[0]:  # the line is the cause: no second suspect
      assert not any("batch statistics" in c or "something is computed" in c
                     for c in report.causes[name]), report.causes[name]
