"""Configs by name: `ctl train dcgan` runs the .gin file the GAN kit ships.

The names come from the entry points `ctl.configs` (pyproject.toml), found
without importing the package; a path works as before, and a misspelt name
fails at once, listing the names. tests/test_wheel.py runs a name from an
installed wheel, outside the repo.
"""

import os

import pytest

from ctl import cli
from ctl.cli import jobs as cli_jobs
from ctl.cli import parity as cli_parity
from ctl.tools import configs
from ctl.tools import experiments

from helpers import ROOT

NAMES = ["bigan", "conditional_dcgan", "dcgan", "hinge_sn", "stacked_mnist", "tfgan_mnist",
         "wgan_gp"]


def test_the_kit_ships_every_example_config_by_name():
  shipped = configs.shipped()
  assert list(shipped) == NAMES
  for name, path in shipped.items():
    assert path == os.path.join(ROOT, "gan", "configs", name + ".gin")
    # examples/configs/ is the same directory (a link), so its paths keep working
    assert os.path.samefile(path, os.path.join(ROOT, "examples", "configs", name + ".gin"))


@pytest.mark.parametrize("config, expected", [
    ("dcgan", True), ("conditional_dcgan", True), ("dcgan.gin", False),
    (os.path.join("examples", "configs", "dcgan.gin"), False), ("configs/dcgan", False)])
def test_a_name_has_no_gin_ending_and_no_directory(config, expected):
  assert configs.is_name(config) is expected


def test_a_name_becomes_its_path_and_a_path_stays_as_given(tmp_path, monkeypatch):
  assert experiments.find_config("wgan_gp") == configs.shipped()["wgan_gp"]
  path = os.path.join(ROOT, "examples", "configs", "dcgan.gin")
  assert experiments.find_config(path) == path
  # a file that exists is a path, even without .gin: what worked before still does
  monkeypatch.chdir(tmp_path)
  (tmp_path / "dcgan").write_text("")
  assert experiments.find_config("dcgan") == "dcgan"


def test_the_default_workdir_of_a_name_is_runs_name():
  path = experiments.find_config("hinge_sn")
  assert cli_jobs.default_workdir(path) == os.path.join("runs", "hinge_sn")


def test_a_misspelt_name_names_the_closest_and_lists_the_shipped():
  with pytest.raises(experiments.ConfigError) as error:
    experiments.find_config("dcgn")
  message = str(error.value)
  assert "'dcgn' is neither a file nor a shipped config's name" in message
  assert "(did you mean 'dcgan'?)" in message
  assert f"(one of {', '.join(NAMES)})" in message
  assert "or the path of a .gin file" in message


def test_a_missing_path_lists_the_shipped_names_too():
  with pytest.raises(experiments.ConfigError) as error:
    experiments.find_config(os.path.join("nowhere", "dcgan.gin"))
  assert "not found" in str(error.value) and ", ".join(NAMES) in str(error.value)


@pytest.mark.parametrize("command", ["train", "eval", "export", "check"])
def test_each_command_refuses_a_misspelt_name_before_tensorflow(command, capsys):
  assert cli.main([command, "wgan-gp"]) == 2
  err = capsys.readouterr().err
  assert f"ctl {command}: error: config 'wgan-gp'" in err and "did you mean 'wgan_gp'" in err


@pytest.mark.parametrize("command", ["train", "eval", "export", "check"])
def test_each_commands_help_lists_the_names(command, capsys):
  with pytest.raises(SystemExit):
    cli.main([command, "--help"])
  help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
  assert ", ".join(NAMES) in help_text


def test_parity_takes_a_name_too(tmp_path, monkeypatch):
  assert cli_parity.shipped_config("bigan") == configs.shipped()["bigan"]
  monkeypatch.chdir(tmp_path)
  for module in ("my_gan.py", "json", "dcgan.gin", "nothing_shipped"):
    assert cli_parity.shipped_config(module) == module  # a file or a module: as given


def test_a_shipped_name_given_with_gin_says_to_drop_it(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(experiments.ConfigError, match="'dcgan' is a shipped config: give its "
                     "name, dcgan, without .gin"):
    experiments.find_config("dcgan.gin")


def test_an_include_is_found_beside_the_including_file_from_any_directory(tmp_path,
                                                                           monkeypatch):
  import gin  # pylint: disable=import-outside-toplevel
  (tmp_path / "configs" / "parts").mkdir(parents=True)
  (tmp_path / "configs" / "main.gin").write_text("include 'parts/steps.gin'\n")
  (tmp_path / "configs" / "parts" / "steps.gin").write_text(
      "include 'more.gin'\nSTEPS = 7\n")  # nested: beside parts/steps.gin
  (tmp_path / "configs" / "parts" / "more.gin").write_text("BATCH = 16\n")
  elsewhere = tmp_path / "elsewhere" / "parts"
  elsewhere.mkdir(parents=True)  # a file of the same relative path where the run starts
  (elsewhere / "steps.gin").write_text("STEPS = 1\n")
  monkeypatch.chdir(tmp_path / "elsewhere")
  try:
    experiments.parse_gin([str(tmp_path / "configs" / "main.gin")], [])
    assert gin.query_parameter("%STEPS") == 7 and gin.query_parameter("%BATCH") == 16
  finally:
    gin.clear_config()


def test_a_relative_config_path_parses_without_gins_path_not_found(tmp_path, monkeypatch,
                                                                  caplog):
  import gin  # pylint: disable=import-outside-toplevel
  (tmp_path / "cfg").mkdir()
  (tmp_path / "cfg" / "my.gin").write_text("include 'parts.gin'\nSTEPS = 3\n")
  (tmp_path / "cfg" / "parts.gin").write_text("BATCH = 8\n")
  monkeypatch.chdir(tmp_path)
  try:
    experiments.parse_gin(["cfg/my.gin"], [])
    assert gin.query_parameter("%STEPS") == 3 and gin.query_parameter("%BATCH") == 8
  finally:
    gin.clear_config()
  assert "Path not found" not in caplog.text  # gin tried cfg/cfg/my.gin first


@pytest.mark.parametrize("binding, refused", [
    ("keras.optimizers.schedules.CosineDecay.initial_learning_rate = '5e-4'", True),
    ("keras.optimizers.schedules.CosineDecay.decay_steps = '3000'", True),
    ("gan.mnist_dataset.global_batch_size = '64'", True),  # annotated int
    ("gan.data.image_folder_dataset.directory = '2024'", False),  # annotated str: a name
    ("gan.data.records_dataset.path = '17'", False),
    ("gan.data.tfds_dataset.name = '3'", False),
    ("keras.optimizers.schedules.CosineDecay.name = '7'", False),  # its default is a str
])
def test_a_number_in_quotes_is_refused_only_where_a_number_is_taken(binding, refused):
  import gin  # pylint: disable=import-outside-toplevel

  import gan  # pylint: disable=import-outside-toplevel
  assert gan.data  # imported: gan's configurables are registered
  try:
    if refused:
      with pytest.raises(experiments.ConfigError, match="is a string, but .* takes a number"):
        experiments.parse_gin([], [binding])
    else:
      experiments.parse_gin([], [binding])
  finally:
    gin.clear_config()


def test_a_gin_configurable_failing_in_a_compiled_step_gets_no_autograph_warning(caplog):
  import gin  # pylint: disable=import-outside-toplevel
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import ctl  # pylint: disable=import-outside-toplevel

  @gin.configurable("scaled_by_a_bad_factor")
  def scaled(x, factor=2.0):
    if factor > 1:  # a str from the config: TypeError
      return x * factor
    return x

  def step(ctx, x):
    return {"mean": ctx.average(tf.reduce_mean(scaled(x), axis=1))}

  def build():
    return ({"model": keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])},
            {"model": keras.optimizers.SGD()})

  gin.parse_config("scaled_by_a_bad_factor.factor = 'two'")
  data = tf.data.Dataset.from_tensor_slices(np.ones((16, 2), "float32")).batch(8).repeat()
  try:
    with caplog.at_level("WARNING"), pytest.raises(TypeError, match="'>' not supported"):
      ctl.Runner(step, build, data).train(1)
  finally:
    gin.clear_config()
  assert "AutoGraph could not transform" not in caplog.text


def test_unused_bindings_are_those_no_call_used_under_their_scope():
  import gin  # pylint: disable=import-outside-toplevel

  @gin.configurable("optimizer", module="unused_test")
  def optimizer(rate=0.1, decay=0.0):
    return rate, decay

  @gin.configurable("penalty", module="unused_test")
  def penalty(weight=1.0):
    return weight

  @gin.configurable("sampler", module="unused_test")
  def sampler(size=1):
    return size

  @gin.configurable("build", module="unused_test")
  def build(generator=None, discriminator=None):
    return generator, discriminator

  gin.parse_config("""
      STEPS = 3
      NEVER = 4
      unused_test.optimizer.decay = %STEPS     # unscoped, used inside the scopes
      generator/unused_test.optimizer.rate = 0.5
      generatr/unused_test.optimizer.rate = 0.7  # a misspelt scope
      unused_test.penalty.weight = 2.0         # a function the run never calls
      unused_test.sampler.size = 5             # an argument the caller passes itself
      unused_test.build.generator = @generator/unused_test.optimizer()
      unused_test.build.discriminator = @discriminator/unused_test.optimizer()
  """)
  try:
    assert build() == ((0.5, 3), (0.1, 3))
    optimizer(rate=1.0, decay=1.0)  # the caller passes both: no binding is used here
    assert sampler(size=3) == 3
    assert experiments.unused_bindings() == [
        "NEVER", "generatr/unused_test.optimizer.rate", "unused_test.penalty.weight",
        "unused_test.sampler.size"]
  finally:
    gin.clear_config()
  assert experiments.unused_bindings() == []
