"""Quiet by default: `ctl` hides TensorFlow's own log lines unless --verbose or CTL_VERBOSE=1;
a TF_CPP_MIN_LOG_LEVEL the user set wins; `import ctl` and `import gan` change no logging."""

import logging
import os
import re
import subprocess
import sys

import pytest

from ctl import cli
from ctl.cli import quiet

from helpers import ROOT
from helpers import TINY_GAN

# A C++ log line of TensorFlow (absl's format, e.g. "E0000 00:00:17... cuInit ...").
TF_LINE = re.compile(r"^[IWEF]\d{4} ", re.MULTILINE)
CHATTER = ("absl::InitializeLog", "cuInit", "remapper", "oneDNN")


def _environment(**changes):
  env = {k: v for k, v in os.environ.items()
         if k not in ("TF_CPP_MIN_LOG_LEVEL", quiet.VERBOSE_VARIABLE)}
  return dict(env, PYTHONUNBUFFERED="1", **changes)


def _train(tmp_path, *extra, **env):
  """A 4-step `ctl train` of examples/configs/dcgan.gin; its stderr."""
  command = [sys.executable, "-m", "ctl.cli", "train", os.path.join("examples", "configs",
             "dcgan.gin"), "--workdir", str(tmp_path / "run"), *TINY_GAN, *extra]
  proc = subprocess.run(command, cwd=ROOT, env=_environment(**env), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  return proc.stderr


@pytest.mark.slow
def test_train_shows_only_ctl_lines_by_default(tmp_path):
  stderr = _train(tmp_path)
  assert not TF_LINE.search(stderr), stderr
  assert not [word for word in CHATTER if word in stderr], stderr
  assert "ctl: step 4/4" in stderr


@pytest.mark.slow
def test_verbose_after_the_command_shows_tensorflow_lines_but_no_remapper_failure(tmp_path):
  stderr = _train(tmp_path, "--verbose")
  assert TF_LINE.search(stderr), stderr
  assert "ctl: step 4/4" in stderr
  # gan's discriminators used to make Grappler's remapper fail on every compiled
  # step ("remapper failed: ... fanout '...LeakyReluGrad' exist for missing node
  # '...BiasAdd'"); gan.models.LeakyReLU avoids it.
  assert "remapper failed" not in stderr


def _python(script, **env):
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_environment(**env),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  return proc


@pytest.mark.slow
def test_a_log_level_the_user_set_is_kept():
  # The lines TensorFlow logs while it loads are INFO: shown at the user's level 0.
  stderr = _python("from ctl.cli import quiet; quiet.from_command_line(); import tensorflow",
                   TF_CPP_MIN_LOG_LEVEL="0").stderr
  assert re.search(r"^I\d{4} ", stderr, re.MULTILINE), stderr


@pytest.mark.slow
def test_importing_the_library_changes_no_logging():
  # TensorFlow's import sets variables (TF2_BEHAVIOR, ...) and import hooks of its own.
  script = """if True:
    import logging, os, sys
    import tensorflow
    def state():
      loggers = {name: logging.getLogger(name).level for name in ("", "tensorflow", "absl", "ctl")}
      return dict(os.environ), loggers, len(logging.getLogger().handlers), list(sys.meta_path)
    before = state()
    import ctl, ctl.cli, gan
    print(state() == before)
  """
  assert _python(script).stdout.strip() == "True"


@pytest.mark.parametrize("argv", [["--verbose", "check", "x.gin"], ["check", "x.gin", "--verbose"]])
def test_verbose_goes_before_or_after_the_command(argv):
  assert cli.make_parser().parse_args(argv).verbose
  assert not cli.make_parser().parse_args(["check", "x.gin"]).verbose


def test_quiet_sets_the_level_meanwhile_and_puts_it_back(monkeypatch):
  monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
  monkeypatch.delenv(quiet.VERBOSE_VARIABLE, raising=False)
  tf_logger = logging.getLogger("tensorflow")
  monkeypatch.setattr(tf_logger, "level", logging.NOTSET)  # as TensorFlow leaves it
  with quiet.unless_verbose():
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert tf_logger.level == logging.WARNING
  assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
  assert tf_logger.level == logging.NOTSET


def test_a_set_level_wins_and_verbose_is_passed_on(monkeypatch):
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
  monkeypatch.delenv(quiet.VERBOSE_VARIABLE, raising=False)
  with quiet.unless_verbose():
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
  with quiet.unless_verbose(verbose=True):
    assert os.environ[quiet.VERBOSE_VARIABLE] == "1"  # for the processes ctl starts
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
  assert quiet.VERBOSE_VARIABLE not in os.environ
  monkeypatch.setenv(quiet.VERBOSE_VARIABLE, "1")
  assert quiet.verbose_requested([])
  monkeypatch.setenv(quiet.VERBOSE_VARIABLE, "0")
  assert not quiet.verbose_requested([]) and quiet.verbose_requested(["--verbose"])
