"""`ctl parity` on a user's own step: within rounding when it is right, and each
planted bug (tests/parity_planted.py) found and named.

Each `ctl.parity.check` runs the eager reference, the rounding floor and each
configuration in processes of their own (3 steps each, to keep it short).
"""

import os

import pytest

from ctl import parity

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

PLANTED = os.path.join(helpers.ROOT, "tests", "parity_planted.py")


def check(monkeypatch, bug, configs):
  monkeypatch.setenv("PLANTED_BUG", bug)
  report = parity.check(PLANTED, configs, steps=3)
  print(report)
  return report


def test_a_right_step_is_within_rounding(monkeypatch):
  report = check(monkeypatch, "", ["compiled", "mirrored:2"])
  assert report.ok, str(report)
  assert {r.config for r in report.rows} == {"compiled", "mirrored:2"}
  assert "DIFFERS" not in str(report)


@pytest.mark.parametrize("bug, configs, config, words", [
    ("replica_scaled", ["mirrored:2"], "mirrored:2", "scaled by the replica count"),
    ("noise_per_replica", ["mirrored:2"], "mirrored:2", "noise drawn without ctx.normal"),
    ("layers", ["mirrored:2"], "mirrored:2", "discriminator (Dropout); generator "
                                             "(BatchNormalization)"),
    ("python_random", ["compiled"], "compiled", "np.random"),
])
def test_a_planted_bug_is_named(monkeypatch, bug, configs, config, words):
  report = check(monkeypatch, bug, configs)
  assert not report.ok
  assert not all(r.ok for r in report.rows if r.config == config)
  assert any(words in cause for cause in report.causes[config]), report.causes
  assert "DIFFERS" in str(report) and words in str(report)


def test_the_command_on_the_wgan_gp_example(tmp_path):
  """The README's example: a WGAN-GP with an encoder, 5 critic updates per step,
  Adam, 10 steps, against compiled, mirrored and multi_worker."""
  proc = helpers.ctl("parity", os.path.join(helpers.ROOT, "examples", "parity_wgan_gp.py"),
                     "--against", "compiled,mirrored:2,multi_worker:2",
                     "--steps", "10", check=False)
  print(proc.stdout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  lines = [line for line in proc.stdout.splitlines() if line.endswith("rounding")]
  assert [line.split()[0] for line in lines] == [
      "compiled", "mirrored:2", "multi_worker:2"]


def test_the_command_refuses_mistakes_before_running(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def build():\n  pass\n")
  for args, words in [
      ([str(bad)], "does not define step, data"),
      ([str(tmp_path / "missing.py")], "no file"),
      ([PLANTED, "--against", "mirored:2"], "'mirored' is not one of"),
      ([PLANTED, "--against", "mirrored"], "needs a count, e.g. 'mirrored:2'"),
      ([PLANTED, "--against", "jit:2"], "'jit' takes no count"),
      ([PLANTED, "--steps", "0"], "--steps 0"),
  ]:
    proc = helpers.ctl("parity", *args, check=False)
    assert proc.returncode == 2, (args, proc.stderr)
    assert words in proc.stderr, (args, proc.stderr)


def test_the_command_on_a_gin_experiment():
  """A .gin file: its experiment's runner, with each configuration's options."""
  proc = helpers.ctl("parity", os.path.join(helpers.ROOT, "examples", "configs", "dcgan.gin"),
                     *helpers.TINY_GAN, "--against", "mirrored:2", "--steps", "2",
                     check=False)
  print(proc.stdout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = [line.split() for line in proc.stdout.splitlines() if line.endswith("rounding")]
  assert [row[0] for row in rows] == ["mirrored:2"]
  model, _, rest = rows[0][1].partition("/")
  assert not rest.isdigit(), rows  # a variable is named by its path, not its position
