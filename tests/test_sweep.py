"""`ctl sweep`: grids and seeds parsed, every combination trained, resumed, tabulated.

The fast tests parse grids, name combinations, check the command's usage
errors, its job list and Slurm array script (nothing trains), and tabulate
runs written by hand. The slow ones run the real thing: a tiny GAN swept over
2 generator widths x 2 seeds, its table, CSV and TensorBoard HParams data
read back as TensorBoard reads them, reruns that skip and resume, a failed
run, and Ctrl-C. (tests/test_slurm.py runs the Slurm array script on a real Slurm.)
"""

import csv
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import time

import gin
import pytest

from ctl import cli
from ctl.tools import sweep
from ctl.tools import sweep_table

import helpers
from helpers import ROOT

CONFIG = os.path.join("examples", "configs", "dcgan.gin")  # for subprocesses, run in ROOT
# The tiny GAN of tests/helpers.py in one compiled call of its 4 steps, with one
# classifier FID at its end (200 samples): the table has an evaluation metric
# to take the best of. The generator's width is what the sweep varies.
_CHANGED = {"gan.Schedule.fid_every = 0": "gan.Schedule.fid_every = 4",
            "gan.Schedule.samples_every = 2": "gan.Schedule.samples_every = 4",
            "gan.Schedule.steps_per_loop = 2": "gan.Schedule.steps_per_loop = 4",
            "gan.Schedule.checkpoint_every = 2": "gan.Schedule.checkpoint_every = 4"}
TINY = []
for _binding in helpers.TINY_GAN[1::2]:  # ["--gin", binding, ...]
  if _binding != "gan.dcgan_generator.width = 8":
    TINY += ["--gin", _CHANGED.get(_binding, _binding)]
WIDTHS = "gan.dcgan_generator.width=[8, 16]"


def _errors(capsys, *args):
  """(exit code, stderr) of `ctl sweep ARGS` run in this process."""
  code = cli.main(["sweep", *args])
  return code, capsys.readouterr().err


# Parsing and naming.

def test_a_grid_is_a_binding_and_a_list_of_gin_values():
  axis = sweep.parse_grid("gan.Experiment.batch_size = [16, 32]")
  assert (axis.binding, axis.values, axis.parsed) == ("gan.Experiment.batch_size",
                                                      ("16", "32"), (16, 32))
  axis = sweep.parse_grid("generator/keras.optimizers.Adam.learning_rate=[1e-3, 2e-4]")
  assert axis.binding == "generator/keras.optimizers.Adam.learning_rate"
  assert axis.values == ("0.001", "0.0002")
  # References and macros stay as text, for ctl train's gin to resolve.
  axis = sweep.parse_grid("gan.Experiment.loss=[%gan.losses.hinge, @gan.losses.wgan()]")
  assert axis.values == ("%gan.losses.hinge", "@gan.losses.wgan()")
  axis = sweep.parse_grid("gan.Experiment.augment=[(), ('color', 'cutout'), None, 'x y']")
  assert axis.values == ("()", "('color', 'cutout')", "None", "'x y'")
  assert sweep.parse_grid("STEPS=[100]").binding == "STEPS"  # a macro


@pytest.mark.parametrize("text, says", [
    ("gan.Experiment.batch_size=[16, 32", "a bracket or string is not closed"),
    ("gan.Experiment.batch_size=[16 32]", "not BINDING=[v1, v2]"),
    ("gan.Experiment.batch_size=16", "must be a list in brackets"),
    ("gan.Experiment.batch_size=[]", "has no values"),
    ("gan.Experiment.batch_size=[16, 16]", "gives 16 twice"),
    ("[16, 32]", "not BINDING=[v1, v2]"),
    ("gan.Experiment.batch_size=[16] x", "not BINDING=[v1, v2]"),
])
def test_a_malformed_grid_is_named_with_the_form_to_use(text, says):
  with pytest.raises(ValueError) as raised:
    sweep.parse_grid(text)
  assert says in str(raised.value) and repr(text) in str(raised.value)


def test_combinations_are_named_by_the_shortest_distinct_ends_of_their_bindings():
  axes = [sweep.parse_grid("gan.dcgan_generator.width=[8, 16]"),
          sweep.parse_grid("gan.dcgan_discriminator.width=[4]"),
          sweep.parse_grid("gan.Experiment.loss=[%gan.losses.hinge, @gan.losses.wgan()]")]
  names = [c.name for c in sweep.combinations(axes)]
  assert names == [
      "dcgan_generator.width=8,dcgan_discriminator.width=4,loss=hinge",
      "dcgan_generator.width=8,dcgan_discriminator.width=4,loss=wgan",
      "dcgan_generator.width=16,dcgan_discriminator.width=4,loss=hinge",
      "dcgan_generator.width=16,dcgan_discriminator.width=4,loss=wgan"]
  assert sweep.combinations(axes)[1].bindings == [
      "gan.dcgan_generator.width = 8", "gan.dcgan_discriminator.width = 4",
      "gan.Experiment.loss = @gan.losses.wgan()"]
  assert [c.name for c in sweep.combinations([])] == ["default"]


def test_values_a_file_name_cannot_tell_apart_get_a_digest_each():
  names = [c.name for c in sweep.combinations([sweep.parse_grid("a.b=['x y', 'x_y', 'z/w']")])]
  assert names[2] == "b=z_w"
  assert names[0].startswith("b=x_y-") and names[1].startswith("b=x_y-")
  assert len(set(names)) == 3
  long = sweep.combinations([sweep.parse_grid(f"a.b=['{'x' * 300}']")])[0].name
  assert len(long) <= 100


def test_the_plan_puts_each_run_in_its_combination_and_seed_directory(tmp_path):
  runs = sweep.plan([sweep.parse_grid(WIDTHS)], [0, 3], str(tmp_path), "gan.Experiment.seed")
  assert [(r.index, r.name) for r in runs] == [
      (0, "width=8/seed-0"), (1, "width=8/seed-3"), (2, "width=16/seed-0"),
      (3, "width=16/seed-3")]
  assert runs[1].workdir == os.path.join(str(tmp_path), "width=8", "seed-3")
  assert runs[1].bindings == ["gan.dcgan_generator.width = 8", "gan.Experiment.seed = 3"]
  assert sweep.train_command("dcgan", ["STEPS = 10"], runs[1], ["--strategy", "mirrored"]) == [
      "train", "dcgan", "--gin", "STEPS = 10", "--gin", "gan.dcgan_generator.width = 8",
      "--gin", "gan.Experiment.seed = 3", "--workdir", runs[1].workdir,
      "--strategy", "mirrored"]


# The command's usage errors: exit 2, one line naming the fix, nothing trained.

@pytest.mark.parametrize("args, says", [
    (["--grid", "gan.dcgan_generator.width=[8, 16"], "a bracket or string is not closed"),
    (["--grid", "gan.dcgan_generator.width=[]"], "has no values"),
    (["--grid", "gan.dcgan_generator.width=[8]", "--grid", "gan.dcgan_generator.width=[16]"],
     "given twice"),
    (["--grid", "gan.dcgan_generator.widht=[8, 16]"], "did you mean 'gan.dcgan_generator.width'"),
    (["--grid", "gan.Experiment.loss=[@gan.losses.hing]"], "@gan.losses.hing"),
    (["--seeds", "0"], "--seeds 0: give a count from 1"),
    (["--seeds", "2-1"], "--seeds 2-1: give seeds as 0,1,2 or a range 0-4"),
    (["--seed-binding", "gan.Experiment.sed"], "did you mean 'gan.Experiment.seed'"),
    (["--best-mode", "classifier_fid"], "give METRIC=min or METRIC=max"),
    (["--strategy", "mirored"], "did you mean 'mirrored'"),
    (["--only-index", "4", "--grid", WIDTHS], "this sweep has 2 runs; give 0 to 1"),
    # The seed is --seeds': a grid or a binding of it would be overridden, silently.
    (["--grid", "gan.Experiment.seed=[1, 2]"], "which --seeds sets (it would override these "
     "values); pass --seeds 1,2 instead"),
    (["--gin", "gan.Experiment.seed = 3"], "which --seeds sets (it would override this "
     "binding)"),
    # A macro nothing refers to (a typo of STEPS): every run would be the same.
    (["--grid", "STEP=[10, 20]"], "STEP is a gin macro nothing in"),
])
def test_a_mistake_in_the_command_exits_2_with_one_line(tmp_path, capsys, args, says):
  code, err = _errors(capsys, os.path.join(ROOT, CONFIG), "--sweep-dir", str(tmp_path / "s"),
                      *args)
  assert code == 2, err
  assert err.startswith("ctl sweep: error: ") and err.count("\n") == 1, err
  assert says in err, err
  assert not os.path.exists(tmp_path / "s" / "width=8")


def test_an_unknown_config_is_a_usage_error(tmp_path, capsys):
  code, err = _errors(capsys, "dcgn", "--sweep-dir", str(tmp_path))
  assert code == 2 and "did you mean 'dcgan'" in err and err.count("\n") == 1, err


def test_a_sweep_directory_of_other_bindings_is_refused(tmp_path, capsys):
  config = os.path.join(ROOT, CONFIG)
  assert cli.main(["sweep", config, "--sweep-dir", str(tmp_path), "--grid", WIDTHS,
                   "--gin", "STEPS = 10", "--job-list"]) == 0
  capsys.readouterr()
  code, err = _errors(capsys, config, "--sweep-dir", str(tmp_path), "--grid", WIDTHS,
                      "--gin", "STEPS = 20", "--job-list")
  assert code == 2 and "['STEPS = 10']" in err and "another --sweep-dir" in err, err
  # More values or seeds extend the same sweep.
  assert cli.main(["sweep", config, "--sweep-dir", str(tmp_path), "--gin", "STEPS = 10",
                   "--grid", "gan.dcgan_generator.width=[8, 16, 32]", "--job-list"]) == 0
  record = sweep.read_record(str(tmp_path))
  assert list(record["combinations"]) == ["width=8", "width=16", "width=32"]


def test_a_grid_over_a_macro_that_gin_refers_to_is_a_sweep(tmp_path, capsys):
  """A macro of the user's own (`--gin "... = %W" --grid "W=[8, 16]"`) is gridded, not
  refused for being undefined without its values."""
  assert cli.main(["sweep", os.path.join(ROOT, CONFIG), "--sweep-dir", str(tmp_path),
                   "--gin", "gan.dcgan_generator.width = %W", "--grid", "W=[8, 16]",
                   "--job-list"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2 and "W = 8" in lines[0] and "W = 16" in lines[1], lines


# Cluster mode: the job list and the Slurm array script.

def test_the_job_list_is_one_ctl_train_command_per_run(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(ROOT)  # CONFIG is relative
  directory = str(tmp_path / "sweep")
  assert cli.main(["sweep", CONFIG, "--grid", WIDTHS, "--seeds", "2", "--sweep-dir", directory,
                   "--gin", "STEPS = 10", "--strategy", "mirrored", "--logger", "mlflow",
                   "--job-list"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 4
  commands = [shlex.split(line) for line in lines]
  assert all(c[:3] == ["ctl", "train", CONFIG] for c in commands)
  first = commands[0]
  assert first[first.index("--workdir") + 1] == os.path.join(directory, "width=8", "seed-0")
  assert first[-4:] == ["--strategy", "mirrored", "--logger", "mlflow"]
  gins = [first[i + 1] for i, arg in enumerate(first) if arg == "--gin"]
  assert gins == ["STEPS = 10", "gan.dcgan_generator.width = 8", "gan.Experiment.seed = 0"]
  last = commands[3]
  assert "gan.Experiment.seed = 1" in last and "gan.dcgan_generator.width = 16" in last
  assert not os.path.exists(os.path.join(directory, "width=8"))  # nothing trained
  record = sweep.read_record(directory)
  assert record["combinations"]["width=16"] == {"gan.dcgan_generator.width": "16"}
  assert record["seed_binding"] == "gan.Experiment.seed"
  # Checking the config parsed it here: gin is left as found, unlocked and empty
  # (a locked config refuses the configurables later code in this process registers).
  assert not gin.config_is_locked() and gin.config_str() == ""


def test_a_table_of_no_finished_run_leaves_the_sweeps_table_as_it_is(tmp_path, capsys,
                                                                     monkeypatch):
  """--table-only with a grid other than the sweep's (a grid dropped, a value
  mistyped) finds no finished run: it says so and keeps results.md."""
  monkeypatch.chdir(ROOT)  # CONFIG is relative
  (tmp_path / "results.md").write_text("the sweep's table\n")
  assert cli.main(["sweep", CONFIG, "--grid", WIDTHS, "--sweep-dir", str(tmp_path),
                   "--table-only"]) == 1
  assert "no run of this sweep has finished" in capsys.readouterr().err
  assert (tmp_path / "results.md").read_text() == "the sweep's table\n"


def test_the_slurm_array_runs_one_run_per_task_and_requeues_a_preempted_one(tmp_path, capsys):
  script = tmp_path / "sweep.sbatch"
  directory = str(tmp_path / "sweep")
  config = os.path.join(ROOT, CONFIG)
  assert cli.main(["sweep", config, "--grid", WIDTHS, "--seeds", "0-2", "--sweep-dir",
                   directory, "--slurm-array", str(script)]) == 0
  err = capsys.readouterr().err
  assert "a Slurm array of 6 tasks" in err and "--table-only" in err
  text = script.read_text()
  assert "#SBATCH --array=0-5\n" in text
  assert "#SBATCH --requeue\n" in text and "#SBATCH --signal=TERM@120\n" in text
  assert f"#SBATCH --output={directory}/slurm-%A_%a.out" in text
  task = next(line for line in text.splitlines() if line.startswith("srun "))
  assert shlex.split(task) == ["srun", "ctl", "sweep", config, "--grid", WIDTHS, "--seeds",
                               "0-2", "--sweep-dir", directory, "--only-index",
                               "$SLURM_ARRAY_TASK_ID"]
  assert 'if [ "$code" -eq 42 ]; then' in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
  subprocess.run(["bash", "-n", str(script)], check=True)


# The table, from runs written by hand.

def _fake_run(run, fids, losses, finished=True):
  """A run's files as `ctl train` leaves them: an FID per evaluation, a loss per step."""
  os.makedirs(os.path.join(run.workdir, "checkpoints"))
  with open(os.path.join(run.workdir, "metrics.jsonl"), "w") as f:
    for i, fid in enumerate(fids):
      f.write(json.dumps({"step": 10 * (i + 1), "classifier_fid": fid, "label_accuracy":
                          0.5 + fid / 1000, "num_samples": 200}) + "\n")
  with open(os.path.join(run.workdir, "history.jsonl"), "w") as f:
    for step, loss in enumerate(losses):
      f.write(json.dumps({"step": step, "generator_loss": loss}) + "\n")
  if finished:
    with open(os.path.join(run.workdir, "checkpoints", "finished_step"), "w") as f:
      f.write(f"{len(losses)}\n")


def _hand_made_sweep(tmp_path):
  axes = [sweep.parse_grid("gan.Experiment.loss=[%gan.losses.hinge, 'x']")]
  runs = sweep.plan(axes, [0, 1, 2], str(tmp_path), "gan.Experiment.seed")
  _fake_run(runs[0], [30.0, 10.0, 20.0], [1.0] * 5 + [2.0] * 3)
  _fake_run(runs[1], [40.0, 14.0, 16.0], [3.0] * 8)
  _fake_run(runs[2], [1.0], [0.0] * 8, finished=False)  # interrupted: left out
  _fake_run(runs[3], [5.0, 6.0], [1.0, 1.0])
  return axes, runs


def test_the_table_gives_final_and_best_as_mean_and_std_over_finished_seeds(tmp_path):
  axes, runs = _hand_made_sweep(tmp_path)
  table = sweep_table.summarize(runs, {"label_accuracy": "min"}, last_steps=3)
  rows = {(r.metric, r.combination.name): r for r in table.rows}
  fid = rows["classifier_fid", "loss=hinge"]
  assert (fid.finished, fid.seeds, fid.mode) == (2, 3, "min")
  assert fid.final.mean == 18.0 and fid.final.std == pytest.approx(statistics.stdev([20, 16]))
  assert fid.best.mean == 12.0 and fid.best.std == pytest.approx(statistics.stdev([10, 14]))
  assert rows["label_accuracy", "loss=hinge"].best.mean == pytest.approx(0.512)  # --best-mode
  assert rows["num_samples", "loss=hinge"].best is None  # neither min nor max by its name
  one = rows["classifier_fid", "loss=x"]
  assert (one.final.mean, one.final.std, one.best.mean, one.finished) == (6.0, None, 5.0, 1)
  loss = rows["train/generator_loss", "loss=hinge"]  # the last 3 steps' mean, per seed
  assert loss.final.mean == 2.5 and loss.best is None
  assert table.metrics == ["classifier_fid", "label_accuracy", "num_samples",
                           "train/generator_loss"]
  markdown = table.markdown()
  assert "| metric | loss | final | best | seeds |" in markdown
  assert "| classifier_fid | %gan.losses.hinge | 18 ± 2.8 | 12 ± 2.8 (min) | 2/3 |" in markdown
  assert "| classifier_fid | 'x' | 6 | 5 (min) | 1/3 |" in markdown
  assert "last 3 steps" in markdown


def test_the_csv_has_a_row_per_combination_and_metric(tmp_path):
  _, runs = _hand_made_sweep(tmp_path)
  table = sweep_table.summarize(runs, metrics=["classifier_fid", "train/generator_loss",
                                               "absent"])
  table.write_csv(str(tmp_path / "results.csv"))
  with open(tmp_path / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["metric"], r["combination"]) for r in rows] == [
      ("classifier_fid", "loss=hinge"), ("classifier_fid", "loss=x"),
      ("train/generator_loss", "loss=hinge"), ("train/generator_loss", "loss=x"),
      ("absent", "loss=hinge"), ("absent", "loss=x")]
  assert rows[0]["gan.Experiment.loss"] == "%gan.losses.hinge"
  assert float(rows[0]["final_mean"]) == 18.0 and float(rows[0]["best_mean"]) == 12.0
  assert rows[0]["best_mode"] == "min" and (rows[0]["finished"], rows[0]["seeds"]) == ("2", "3")
  assert rows[1]["final_std"] == "" and rows[2]["best_mean"] == ""
  assert rows[4]["final_mean"] == "" and (rows[4]["n"], rows[4]["finished"]) == ("0", "2")


@pytest.mark.parametrize("metric, mode", [
    ("classifier_fid", "min"), ("intra_class_fid", "min"), ("classifier_kid", "min"),
    ("discriminator_loss", "min"), ("label_accuracy", "max"), ("classifier_score_32", "max"),
    ("precision", "max"), ("recall", "max"), ("classifier_kid_std", None),
    ("num_samples", None), ("reconstruction_ratio", None)])
def test_whether_best_is_lowest_or_highest_comes_from_the_name(metric, mode):
  assert sweep_table.best_mode(metric) == mode
  assert sweep_table.best_mode(metric, {metric: "max"}) == "max"


def session_groups(directory):
  """{group name: (hparams, {metric tag: value}, [session names])} as TensorBoard's
  HParams tab lists them for `tensorboard --logdir DIRECTORY`."""
  from tensorboard import context
  from tensorboard.backend.event_processing import data_provider
  from tensorboard.backend.event_processing import plugin_event_multiplexer
  from tensorboard.plugins import base_plugin
  from tensorboard.plugins.hparams import api_pb2
  from tensorboard.plugins.hparams import backend_context
  from tensorboard.plugins.hparams import list_session_groups
  multiplexer = plugin_event_multiplexer.EventMultiplexer()
  multiplexer.AddRunsFromDirectory(directory)
  multiplexer.Reload()
  provider = data_provider.MultiplexerDataProvider(multiplexer, directory)
  backend = backend_context.Context(base_plugin.TBContext(
      logdir=directory, data_provider=provider, multiplexer=multiplexer))
  request = api_pb2.ListSessionGroupsRequest(
      start_index=0, slice_size=100, allowed_statuses=[
          api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_RUNNING])
  response = list_session_groups.Handler(context.RequestContext(), backend, "", request).run()
  groups = {}
  for group in response.session_groups:
    hparams = {name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
               for name, value in group.hparams.items()}
    groups[group.name] = (hparams, {m.name.tag: m.value for m in group.metric_values},
                          sorted(s.name for s in group.sessions))
  return groups


def test_hparams_data_shows_each_combination_as_a_group_of_its_seeds(tmp_path):
  axes, runs = _hand_made_sweep(tmp_path)
  table = sweep_table.summarize(runs, last_steps=3)
  sweep_table.write_hparams(str(tmp_path), axes, table)
  sweep_table.write_hparams(str(tmp_path), axes, table)  # again: replaces its files
  groups = session_groups(str(tmp_path))
  assert sorted(groups) == ["loss=hinge", "loss=x"]
  hparams, metrics, sessions = groups["loss=hinge"]
  # A reference and a string: the gin text of each, as strings.
  assert hparams == {"gan.Experiment.loss": "%gan.losses.hinge"}
  assert sessions == ["loss=hinge/seed-0", "loss=hinge/seed-1"]  # seed-2 did not finish
  assert metrics["final/classifier_fid"] == pytest.approx(18.0)  # averaged over the seeds
  assert metrics["best/classifier_fid"] == pytest.approx(12.0)
  assert metrics["final/train/generator_loss"] == pytest.approx(2.5)
  assert "best/num_samples" not in metrics
  assert groups["loss=x"][0] == {"gan.Experiment.loss": "'x'"}
  written = [n for n in os.listdir(runs[0].workdir) if n.endswith(sweep_table.HPARAMS_SUFFIX)]
  assert len(written) == 1


# The real thing: `ctl sweep` training a tiny GAN.

def _sweep(directory, *args, check=True):
  return helpers.ctl("sweep", CONFIG, "--grid", WIDTHS, "--seeds", "2", "--sweep-dir",
                     directory, *TINY, *args, check=check)


@pytest.mark.slow
def test_a_sweep_of_2_widths_by_2_seeds_trains_tabulates_skips_and_resumes(tmp_path):
  directory = str(tmp_path / "sweep")
  proc = _sweep(directory)
  names = ["width=8/seed-0", "width=8/seed-1", "width=16/seed-0", "width=16/seed-1"]
  for i, name in enumerate(names, 1):
    assert f"ctl sweep: [{i}/4] {name}: training; log: " in proc.stderr, proc.stderr
    assert f"ctl sweep: [{i}/4] {name}: finished in " in proc.stderr
    workdir = os.path.join(directory, *name.split("/"))
    assert sweep.finished(workdir)
    log = open(os.path.join(workdir, "train.log")).read()
    assert log.startswith("# ctl sweep, ") and "ctl train: step 4, outputs in" in log
  # The table: printed, and in results.md and results.csv.
  assert "| classifier_fid | 8 |" in proc.stdout and "| classifier_fid | 16 |" in proc.stdout
  markdown = open(os.path.join(directory, "results.md")).read()
  assert proc.stdout in markdown and "4 of 4 runs finished" in markdown
  with open(os.path.join(directory, "results.csv")) as f:
    rows = {(r["metric"], r["gan.dcgan_generator.width"]): r for r in csv.DictReader(f)}
  fids = {}
  for width in ("8", "16"):
    fids[width] = [json.loads(open(os.path.join(directory, f"width={width}", f"seed-{s}",
                                                "metrics.jsonl")).readlines()[-1])
                   ["classifier_fid"] for s in (0, 1)]
    row = rows["classifier_fid", width]
    assert (row["finished"], row["seeds"], row["best_mode"]) == ("2", "2", "min")
    assert float(row["final_mean"]) == pytest.approx(statistics.mean(fids[width]))
    assert float(row["final_std"]) == pytest.approx(statistics.stdev(fids[width]))
    assert math.isfinite(float(rows["train/generator_loss", width]["final_mean"]))
  assert fids["8"][0] != fids["8"][1]  # the seeds differ
  # TensorBoard's HParams tab: a group per width, its 2 seeds averaged.
  groups = session_groups(directory)
  assert sorted(groups) == ["width=16", "width=8"]
  hparams, metrics, sessions = groups["width=8"]
  assert hparams == {"gan.dcgan_generator.width": 8.0}
  assert sessions == ["width=8/seed-0", "width=8/seed-1"]
  assert metrics["final/classifier_fid"] == pytest.approx(statistics.mean(fids["8"]), rel=1e-6)

  # A rerun trains nothing; one whose end was not marked is run again, alone.
  again = _sweep(directory)
  assert again.stderr.count(": skipped: finished") == 4, again.stderr
  assert again.stdout == proc.stdout
  os.remove(os.path.join(directory, "width=16", "seed-0", "checkpoints", "finished_step"))
  resumed = _sweep(directory)
  assert resumed.stderr.count(": skipped: finished") == 3, resumed.stderr
  assert "[3/4] width=16/seed-0: resuming" in resumed.stderr
  assert sweep.finished(os.path.join(directory, "width=16", "seed-0"))
  log = open(os.path.join(directory, "width=16", "seed-0", "train.log")).read()
  assert log.count("# ctl sweep, ") == 2  # the rerun's output appended


@pytest.mark.slow
def test_a_failed_run_is_reported_and_the_sweep_goes_on(tmp_path):
  # A batch size the experiment refuses when it is made, not when gin parses it.
  directory = str(tmp_path / "sweep")
  proc = helpers.ctl("sweep", CONFIG, "--grid", "gan.Experiment.batch_size=[0, -1]",
                     "--sweep-dir", directory, *TINY, check=False)
  assert proc.returncode == 1, proc.stderr
  assert "[1/2] batch_size=0/seed-0: failed (exit code 2)" in proc.stderr
  assert "[2/2] batch_size=-1/seed-0: failed (exit code 2)" in proc.stderr
  assert "batch_size must be an int >= 1" in proc.stderr  # the end of its log
  log = os.path.join(directory, "batch_size=-1", "seed-0", "train.log")
  assert "2 of 2 runs failed:\n  batch_size=0/seed-0 (exit code 2): " in proc.stderr
  assert f"batch_size=-1/seed-0 (exit code 2): {log}" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert "(no run has finished)" in open(os.path.join(directory, "results.md")).read()


def _long_sweep(directory):
  """A sweep whose first run trains for long; (process, that run's workdir) once
  the run has saved its first checkpoint."""
  long = [arg.replace("gan.Schedule.total_steps = 4", "gan.Schedule.total_steps = 100000")
          for arg in TINY]
  workdir = directory / "width=8" / "seed-0"
  proc = helpers.start_python(["-m", "ctl.cli", "sweep", CONFIG, "--grid", WIDTHS,
                               "--sweep-dir", str(directory), *long])
  deadline = time.monotonic() + 120
  while not (workdir / "checkpoints" / "checkpoint").exists() and proc.poll() is None:
    if time.monotonic() > deadline:
      proc.kill()
      raise AssertionError("no checkpoint within 120 s")
    time.sleep(0.1)
  return proc, workdir


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, said, saved", [
    (signal.SIGINT, 130, "interrupted (Ctrl-C)", "Ctrl-C: saved a checkpoint at step"),
    (signal.SIGHUP, 42, "SIGHUP", "SIGTERM: saved a checkpoint at step")])
def test_a_signal_stops_the_run_in_progress_after_it_saved_and_then_the_sweep(
    tmp_path, signum, code, said, saved):
  """Ctrl-C, or a closed terminal (SIGHUP), is passed on to the run in progress,
  which saves; then the sweep stops, with the run's code."""
  proc, workdir = _long_sweep(tmp_path / "sweep")
  try:
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == code, stderr
  assert "Traceback" not in stderr
  assert f"{said}: width=8/seed-0 stopped (exit code {code}, saved)" in stderr
  assert "width=16" not in stderr  # the sweep stopped
  log = (workdir / "train.log").read_text()
  assert saved in log
  assert not sweep.finished(str(workdir))


@pytest.mark.slow
def test_a_killed_sweep_leaves_no_run_behind(tmp_path):
  """SIGKILL to the sweep, which cannot pass it on: its run sees it gone within a
  second, saves and exits 42, and nothing of the sweep is left running."""
  proc, workdir = _long_sweep(tmp_path / "sweep")
  proc.kill()
  proc.communicate(timeout=60)
  deadline = time.monotonic() + 120
  while helpers.processes_naming(str(workdir)) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert helpers.processes_naming(str(workdir)) == []
  log = (workdir / "train.log").read_text()
  assert f"the process that started this one (pid {proc.pid}) is gone" in log
  assert "SIGTERM: saved a checkpoint at step" in log
