"""The `ctl` command: help without TensorFlow, train/eval/export on a tiny run, gin errors.

The runs are subprocesses (as a user runs them); the help texts and the
configuration errors are checked in-process, where they cost no TensorFlow work.
"""

import json
import os
import shutil

import gin
import pytest

from ctl import cli

import helpers
from helpers import ROOT
from helpers import TINY_GAN
from helpers import ctl
from helpers import python

CONFIG = os.path.join("examples", "configs", "dcgan.gin")  # for subprocesses, run in ROOT
CONFIG_PATH = os.path.join(ROOT, CONFIG)  # for in-process calls
TINY = TINY_GAN


HELP_CHECK = """
import sys, time
start = time.perf_counter()
from ctl import cli
for argv in ([], ["train"], ["eval"], ["export"], ["check"], ["launch"], ["records"]):
  try:
    cli.main(argv + ["--help"])
  except SystemExit as e:
    assert e.code == 0, (argv, e.code)
seconds = time.perf_counter() - start
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "gin", "gan"))
print(seconds, heavy, file=sys.stderr)
"""


def test_help_imports_no_tensorflow():
  # What makes --help fast is that it imports no TensorFlow (seconds): the
  # command line imports the library only when a subcommand runs. The time
  # depends on the machine's load, so it is printed, not asserted.
  seconds, heavy = python(["-c", HELP_CHECK]).stderr.strip().splitlines()[-1].split(" ", 1)
  print(f"ctl --help and every subcommand's --help: {float(seconds):.3f} s")
  assert heavy == "[]", heavy
  assert "train" in ctl("--help").stdout


@pytest.mark.parametrize("command", ["train", "eval", "export", "check"])
def test_each_subcommand_explains_itself(command, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main([command, "--help"])
  assert exit_info.value.code == 0
  text = capsys.readouterr().out
  assert f"ctl {command} " in text  # the epilog's example
  assert "--gin" in text and "CONFIG.gin" in text


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shared_runs):
  """A 4-step run of the DCGAN example, shrunk (`ctl train`, shared with
  tests/test_multi_worker.py), a copy of its workdir, and `ctl train` run
  again on the copy; (the copy, the first run, the second's output, the
  checkpoint files before the second)."""
  first = helpers.tiny_gan_training(shared_runs)
  workdir = str(tmp_path_factory.mktemp("cli") / "run")
  helpers.SharedRuns.copy(first.workdir, workdir)
  checkpoints = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  second = ctl("train", CONFIG, "--workdir", workdir, *TINY)
  return workdir, first, second, checkpoints


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_train_writes_checkpoints_and_operative_config(trained):
  workdir, first, _, checkpoints = trained
  assert "ckpt-4.index" in checkpoints and "ckpt-2.index" in checkpoints
  operative = open(os.path.join(workdir, "checkpoints", "operative_config.gin")).read()
  assert "Schedule.total_steps = 4" in operative
  assert "mode" not in operative  # what to do is not part of the experiment
  assert first.workdir in first.stdout and "step 4" in first.stdout
  assert "gin bindings" not in first.stderr  # dcgan.gin and TINY use every binding


@pytest.mark.slow  # `ctl` in subprocesses that import TensorFlow
def test_train_resumes_with_another_batch_size_given_restart_data(shared_runs, tmp_path):
  workdir = str(tmp_path / "run")
  helpers.SharedRuns.copy(helpers.tiny_gan_training(shared_runs).workdir, workdir)  # batch 16
  other = [*TINY, "--gin", "gan.Experiment.batch_size = 8", "--gin",
           "gan.Schedule.total_steps = 6"]
  refused = ctl("train", CONFIG, "--workdir", workdir, *other, check=False)
  assert refused.returncode == 1, refused.stderr
  assert "holds the position in data batched by 16" in refused.stderr
  assert "`ctl train --restart-data`" in refused.stderr
  resumed = ctl("train", CONFIG, "--workdir", workdir, *other, "--restart-data")
  assert "ckpt-4 (step 4)" in resumed.stderr and "restore_data=False" in resumed.stderr
  assert "ckpt-6.index" in os.listdir(os.path.join(workdir, "checkpoints"))


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_train_warns_of_the_bindings_it_never_used(tmp_path):
  """A misspelt scope and a penalty's weight with another penalty set: gin
  takes both, the run changes nothing for them, and ctl train says so."""
  proc = ctl("train", CONFIG, "--workdir", str(tmp_path / "run"), *TINY,
             "--gin", "generatr/keras.optimizers.Adam.learning_rate = 1e-3",
             "--gin", "gan.penalties.wasserstein_gradient_penalty.weight = 5.0")
  warning = proc.stderr[proc.stderr.index("ctl train: warning: this run used none"):]
  assert warning.splitlines()[1:3] == [
      "  generatr/keras.optimizers.Adam.learning_rate",
      "  gan.penalties.wasserstein_gradient_penalty.weight"], warning
  assert "check the scope's spelling" in warning


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_train_stopped_by_ctrl_c_lists_the_bindings_it_never_used(tmp_path):
  """The list is what a user checks when a run looks wrong: it comes after a
  Ctrl-C too, once the step has run."""
  workdir = tmp_path / "run"
  code, stderr = helpers.ctrl_c_once(
      ["-m", "ctl.cli", "train", CONFIG, "--workdir", str(workdir), *TINY,
       "--gin", "gan.Schedule.total_steps = 100000",
       "--gin", "generatr/keras.optimizers.Adam.learning_rate = 1e-3"],
      workdir / "samples" / "samples_00000002.png")
  assert code == 130, stderr[-3000:]
  warning = stderr[stderr.index("ctl train: warning: this run used none"):]
  assert "changed nothing up to the Ctrl-C:" in warning.splitlines()[0], warning
  assert warning.splitlines()[1] == "  generatr/keras.optimizers.Adam.learning_rate", warning


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_rerun_resumes_and_finds_nothing_to_train(trained):
  workdir, _, second, checkpoints = trained
  assert "nothing to train" in second.stderr
  assert "gin bindings" not in second.stderr  # it trained nothing, so it calls nothing
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == checkpoints


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_eval_prints_json_metrics_of_the_newest_checkpoint(trained):
  workdir = trained[0]
  proc = ctl("eval", CONFIG, "--workdir", workdir, *TINY)
  metrics = json.loads(proc.stdout)
  assert metrics["step"] == 4
  assert metrics["classifier_fid"] > 0


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_eval_of_a_step_evaluates_the_checkpoint_of_that_step(trained):
  proc = ctl("eval", CONFIG, "--workdir", trained[0], *TINY, "--checkpoint", "2")
  assert json.loads(proc.stdout)["step"] == 2  # not the newest (4), nor a folder named 2


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_export_writes_the_generator(trained, tmp_path):
  out = str(tmp_path / "exported")
  proc = ctl("export", CONFIG, "--workdir", trained[0], "--out", out, *TINY)
  assert os.path.exists(os.path.join(out, "generator.keras"))
  assert os.path.join(out, "generator.keras") in proc.stdout.split()


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_export_where_it_cannot_write_names_the_fix(trained, tmp_path):
  """A read-only work directory, or a file in the way (root writes anywhere):
  exit 1, naming the directory and --out, with no traceback."""
  in_the_way = tmp_path / "exported"
  in_the_way.write_text("a file\n")
  proc = ctl("export", CONFIG, "--workdir", trained[0], "--out", str(in_the_way), *TINY,
             check=False)
  assert proc.returncode == 1, proc.stderr
  assert f"could not export model 'generator' to {in_the_way}" in proc.stderr
  assert "`ctl export --out DIR`" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_eval_of_a_folder_with_no_readable_checkpoint_is_an_error_line(trained, tmp_path):
  work = tmp_path / "copy"
  shutil.copytree(trained[0], work)
  for data in (work / "checkpoints").glob("ckpt-*.data-*"):
    data.write_bytes(b"")  # every checkpoint's data gone
  proc = ctl("eval", CONFIG, "--workdir", str(work), *TINY, check=False)
  assert proc.returncode == 1, proc.stderr
  assert f"ctl eval: error: no checkpoint in {work / 'checkpoints'} can be read" in proc.stderr
  assert "Nothing was deleted" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_eval_of_the_best_checkpoint_of_a_run_that_kept_none_says_how_to_keep_them(trained):
  proc = ctl("eval", CONFIG, "--workdir", trained[0], *TINY, "--checkpoint", "best",
             check=False)
  assert proc.returncode == 1, proc.stderr
  assert "no kept checkpoint in" in proc.stderr and "gan.Schedule.keep_best" in proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_eval_without_checkpoint_names_the_directory(tmp_path):
  proc = ctl("eval", CONFIG, "--workdir", str(tmp_path), *TINY, check=False)
  assert proc.returncode == 1
  assert os.path.join(str(tmp_path), "checkpoints") in proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.fixture
def clean_gin():
  yield
  gin.clear_config()  # a failed parse leaves the file's bindings for later tests


@pytest.mark.parametrize("args, named, suggested", [
    (["--gin", "gan.Schedul.total_steps = 3"], "gan.Schedul.total_steps = 3", "'gan.Schedule'"),
    (["--gin", "gan.Schedule.total_step = 3"], "gan.Schedule.total_step = 3",
     "'gan.Schedule.total_steps'"),
    (["--gin", "gan.Schedule.total_steps = = 3"], "gan.Schedule.total_steps = = 3",
     "binding reads"),
    (["--gin", "gan.Experiment.dataset = @gan.mnist_datset"], "@gan.mnist_datset",
     "'gan.mnist_dataset'"),
    (["--experiment", "gan.Experimnet"], "gan.Experimnet", "'gan.Experiment'"),
    (["--strategy", "mirroed"], "mirroed", "'mirrored'"),
    # As when a run resumes on more replicas than its batch divides by.
    (["--strategy", "mirrored", "--gin", "gan.Experiment.batch_size = 7"],
     "global batch size (7) is not divisible by the 2 replicas", "e.g. 6"),
], ids=["configurable", "parameter", "syntax", "reference", "experiment", "strategy",
        "batch-for-the-replicas"])
def test_config_mistakes_exit_2_naming_the_binding(args, named, suggested, tmp_path,
                                                   capsys, clean_gin):
  code = cli.main(["train", CONFIG_PATH, "--workdir", str(tmp_path)] + args)
  err = capsys.readouterr().err
  assert code == 2, err
  assert err.startswith("ctl train: error: ") and len(err.strip().splitlines()) == 1, err
  assert named in err and suggested in err
  assert not os.listdir(tmp_path)


def test_mistake_in_a_gin_file_names_file_and_line(tmp_path, capsys, clean_gin):
  config = tmp_path / "bad.gin"
  config.write_text("gan.Schedule.total_steps = 3\ngan.dcgan_generator.widht = 8\n")
  assert cli.main(["check", str(config)]) == 2
  err = capsys.readouterr().err
  assert f"{config}, line 2" in err and "'gan.dcgan_generator.width'" in err


def test_the_default_experiment_comes_from_an_entry_point():
  from ctl.tools import experiments  # pylint: disable=import-outside-toplevel
  # ctl names no experiment: gan registers its own (pyproject.toml).
  assert experiments.default_experiment() == "gan.experiment:Experiment"


# An experiment of the user's own, through `--experiment module:attribute`.
OWN_EXPERIMENT = """
class OnlyEvaluates:
  def evaluate(self, workdir, strategy="default"):
    return {"step": 0, "workdir": workdir, "strategy": strategy}
"""


@pytest.fixture
def own_experiment(tmp_path, monkeypatch):
  (tmp_path / "own_experiment.py").write_text(OWN_EXPERIMENT)
  (tmp_path / "empty.gin").write_text("")
  monkeypatch.syspath_prepend(str(tmp_path))
  return str(tmp_path / "empty.gin")


def test_an_experiment_of_ones_own_is_called_by_method(own_experiment, tmp_path, capsys,
                                                       clean_gin):
  workdir = str(tmp_path / "run")
  assert cli.main(["eval", own_experiment, "--experiment", "own_experiment:OnlyEvaluates",
                   "--workdir", workdir]) == 0
  assert json.loads(capsys.readouterr().out) == {"step": 0, "workdir": workdir,
                                                 "strategy": "default"}


def test_an_experiment_without_the_method_is_named(own_experiment, capsys, clean_gin):
  assert cli.main(["export", own_experiment, "--experiment",
                   "own_experiment:OnlyEvaluates"]) == 2
  err = capsys.readouterr().err
  assert "OnlyEvaluates has no method export" in err, err
  assert "ctl.tools.experiments.Experiment" in err and len(err.strip().splitlines()) == 1


def test_missing_config_file_suggests_a_neighbour(capsys):
  assert cli.main(["eval", os.path.join(ROOT, "examples", "configs", "dcgn.gin")]) == 2
  err = capsys.readouterr().err
  assert "dcgn.gin not found" in err and "'dcgan.gin'" in err


@pytest.mark.slow  # `ctl` in a subprocess that imports TensorFlow
def test_console_command_prints_no_traceback_for_a_misspelt_parameter():
  proc = ctl("train", CONFIG, "--gin", "gan.Schedule.total_step = 3", check=False)
  assert proc.returncode == 2
  assert "Traceback" not in proc.stderr
  assert "gan.Schedule.total_step = 3" in proc.stderr
  assert "'gan.Schedule.total_steps'" in proc.stderr


@pytest.mark.slow  # `ctl` in subprocesses that import TensorFlow
@pytest.mark.parametrize("variables, message", [
    ({"CTL_HEARTBEAT_TIMEOUT": "abc"},
     "CTL_HEARTBEAT_TIMEOUT='abc' is not a number of seconds; set it to e.g. 60."),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", '
                   '"index": 2}}'},
     "TF_CONFIG task 'worker' index 2 is not in the cluster"),
])
def test_a_bad_cluster_variable_is_a_usage_error_without_a_traceback(variables, message,
                                                                     tmp_path):
  proc = helpers.python(["-m", "ctl.cli", "train", CONFIG, "--strategy", "auto", "--workdir",
                         str(tmp_path / "run"), *helpers.TINY_GAN], env=variables, check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and f"ctl train: error: {message}" in proc.stderr


def test_a_number_refused_in_the_shared_message_style_names_its_binding(tmp_path):
  # ctl.arguments ends its messages "got 0.": the binding is still found.
  from ctl.tools import experiments
  config = tmp_path / "x.gin"
  config.write_text("gan.Experiment.batch_size = 64\n")
  error = ValueError("batch_size must be an int >= 1, got 0.\n  In call to configurable "
                     "'Experiment'")
  assert experiments.binding_of(error, [str(config)], ["gan.Experiment.batch_size = 0"]) == (
      "`gan.Experiment.batch_size = 0` (--gin)")
  error = ValueError("weight must be a number >= 0, got 0.5.\n  In call to configurable 'x'")
  assert experiments.binding_of(error, [str(config)], ["x.weight = 0"]) is None
