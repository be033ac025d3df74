"""bench/gan_quality.py's table: rows from separate invocations meet in one file,
and each config is judged against its target from the figures alone (no training)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import helpers
from helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import gan_quality  # noqa: E402  (bench/ is no package)
import run as run_bench  # noqa: E402

FLOOR = 0.6
CPU = {"cpu": "test CPU", "cores": 2, "bfloat16_instructions": False}
RECIPE = {"bindings": [], "main_args": []}


def _run(config, seed, curve, seconds=170.0):
  return {"config": config, "seed": seed, "seconds": seconds,
          "curve": [{"step": step, "seconds": t, "classifier_fid": fid, **extra}
                    for step, t, fid, extra in curve], "grid": None}


def test_rows_of_two_invocations_share_one_table_and_are_judged(tmp_path):
  docs = str(tmp_path)
  main = [_run("main_job", seed, [(2800, 165.0, fid, {"precision": 0.7})])
          for seed, fid in enumerate([5.0, 5.5, 5.9])]  # all under 10 x 0.6 = 6
  results = gan_quality.save_runs(docs, "main_job", main, FLOOR,
                                 "python bench/gan_quality.py --configs main_job", CPU, RECIPE)
  main_row = results["main_job"]["row"]
  assert main_row["reached_10x"] == 3 and main_row["best_fid"][0] == pytest.approx(5.4667, 1e-4)
  scores = {"classifier_score_32": 7.0, "real_score_32": 8.0,  # ratio 0.875 < 0.95
            "second_score_32": 6.3, "second_real_score_32": 7.0}  # the check's: 0.9
  tfgan = [_run("tfgan_mnist", 0, [(500, 30.0, 40.0, {}), (5000, 300.0, 9.0, dict(scores))])]
  results = gan_quality.save_runs(docs, "tfgan_mnist", tfgan, FLOOR,
                                  "python bench/gan_quality.py --configs tfgan_mnist", CPU, RECIPE)
  assert results["tfgan_mnist"]["row"]["final_score_32_ratio"][0] == pytest.approx(0.875)
  assert results["tfgan_mnist"]["row"]["final_second_score_32_ratio"][0] == pytest.approx(0.9)
  assert sorted(results) == ["main_job", "tfgan_mnist"]  # the first invocation's row kept
  with open(os.path.join(docs, "quality", "results.json")) as f:
    assert sorted(json.load(f)) == ["main_job", "tfgan_mnist"]
  text = gan_quality.markdown(results)
  main_line = next(line for line in text.splitlines() if line.startswith("| main_job | ≤"))
  assert "| met |" in main_line and "5.47 ± 0.45 (9.1x)" in main_line
  tfgan_line = next(line for line in text.splitlines() if line.startswith("| tfgan_mnist | s"))
  assert "| not met |" in tfgan_line and "| TF-GAN's tutorial: 0.89–0.90" in tfgan_line
  assert "`python bench/gan_quality.py --configs tfgan_mnist`" in text


def test_seeds_measured_apart_join_one_row_of_the_same_recipe_and_cpu(tmp_path):
  docs, config = str(tmp_path), "tfgan_mnist"
  first = "python bench/gan_quality.py --configs tfgan_mnist --seeds 1"
  gan_quality.save_runs(docs, config, [_run(config, 0, [(5000, 300.0, 4.0, {})])], FLOOR,
                        first, CPU, RECIPE)
  later = "python bench/gan_quality.py --configs tfgan_mnist --seeds 2 --first-seed 1"
  results = gan_quality.save_runs(docs, config, [_run(config, s, [(5000, 310.0, fid, {})])
                                                 for s, fid in ((2, 2.0), (1, 3.0))],
                                  FLOOR, later, CPU, RECIPE)
  entry = results[config]
  assert [run["seed"] for run in entry["runs"]] == [0, 1, 2]
  assert entry["row"]["seeds"] == 3 and entry["row"]["best_fid"][0] == pytest.approx(3.0)
  assert entry["commands"] == [first, later]
  assert f"`{first}`, then `{later}`" in gan_quality.markdown(results)
  # A seed run again replaces its record; the stored file is what the next call reads.
  again = gan_quality.save_runs(docs, config, [_run(config, 1, [(5000, 300.0, 6.0, {})])],
                                FLOOR, later, CPU, RECIPE)[config]
  assert [run["seed"] for run in again["runs"]] == [0, 1, 2]
  assert again["row"]["best_fid"][0] == pytest.approx(4.0) and again["commands"] == [first, later]
  # Every seed run again by one command: the row is that command's alone.
  whole = "python bench/gan_quality.py --configs tfgan_mnist --seeds 3"
  redone = gan_quality.save_runs(docs, config, [_run(config, s, [(5000, 300.0, 5.0, {})])
                                                for s in range(3)], FLOOR, whole, CPU, RECIPE)
  assert redone[config]["commands"] == [whole]
  # Another recipe, or another CPU, starts the row again: their figures do not mix.
  other = gan_quality.save_runs(docs, config, [_run(config, 1, [(2000, 100.0, 9.0, {})])],
                                FLOOR, "... --steps 2000", CPU,
                                {"bindings": ["gan.Schedule.total_steps = 2000"],
                                 "main_args": ["--steps", "2000"]})[config]
  assert [run["seed"] for run in other["runs"]] == [1] and other["row"]["seeds"] == 1
  moved = gan_quality.save_runs(docs, config, [_run(config, 0, [(2000, 90.0, 8.0, {})])],
                                FLOOR, "... --steps 2000", dict(CPU, cpu="another CPU"),
                                other["recipe"])[config]
  assert [run["seed"] for run in moved["runs"]] == [0] and moved["commands"] == ["... --steps 2000"]


def test_a_mixed_precision_row_sits_beside_the_float32_row_and_is_judged_alike(tmp_path):
  docs = str(tmp_path)
  for policy, fid in ((None, 5.0), ("mixed_bfloat16", 7.0)):  # 10x 0.6 = 6: met, not met
    results = gan_quality.save_runs(
        docs, gan_quality.row_name("main_job", policy),
        [_run("main_job", 0, [(2800, 150.0, fid, {})], seconds=150.0)], FLOOR,
        "python bench/gan_quality.py --configs main_job", CPU, RECIPE)
  assert sorted(results) == ["main_job", "main_job (mixed_bfloat16)"]
  assert results["main_job (mixed_bfloat16)"]["row"]["config"] == "main_job"
  text = gan_quality.markdown(results)
  assert "| main_job | ≤ 10x in ≤ 3 min | – | met |" in text
  assert "| main_job (mixed_bfloat16) | ≤ 10x in ≤ 3 min | – | not met |" in text
  assert "(quality/main_job_mixed_bfloat16.png)" in text


def test_the_recipe_digest_ignores_comments_and_docstrings_not_code(tmp_path, monkeypatch):
  for folder in ("examples", os.path.join("gan", "configs")):
    os.makedirs(tmp_path / folder)
  main = open(os.path.join(ROOT, "examples", "mnist_dcgan.py")).read()
  gin = open(os.path.join(ROOT, "gan", "configs", "dcgan.gin")).read()
  monkeypatch.setattr(gan_quality, "ROOT", str(tmp_path))

  def digests(main_text, gin_text):
    (tmp_path / "examples" / "mnist_dcgan.py").write_text(main_text)
    (tmp_path / "gan" / "configs" / "dcgan.gin").write_text(gin_text)
    return gan_quality.source_digest("main_job"), gan_quality.source_digest("dcgan")

  before = digests(main, gin)
  assert digests(main.replace('"""Trains', '"""Now trains', 1) + "# a note\n",
                 "# Expected: another figure\n" + gin + "\n") == before
  changed = digests(main.replace("EMA_DECAY, EMA_START = 0.99", "EMA_DECAY, EMA_START = 0.999"),
                    gin + "gan.Schedule.total_steps = 20000\n")
  assert changed[0] != before[0] and changed[1] != before[1]
  # A '#' inside a string is a value, not a comment.
  marked = gin + 'gan.Experiment.name = "run #1"  # a comment\n'
  assert digests(main, marked)[1] != digests(main, marked.replace("#1", "#2"))[1]
  assert digests(main, marked)[1] == digests(main, marked.replace("a comment", "another"))[1]


def test_the_stored_command_names_no_directory_of_this_machine_and_no_replace():
  argv = ["--configs", "main_job", "--workdir", "/tmp/q", "--docs=/tmp/d", "--replace",
          "--gin", "a = 1"]
  assert gan_quality.shown_command(argv) == \
      "python bench/gan_quality.py --configs main_job --gin 'a = 1'"


def test_rows_saved_before_runs_were_kept_still_render():
  row = gan_quality.summarize("main_job", [_run("main_job", 0, [(2800, 165.0, 5.0, {})])], FLOOR)
  text = gan_quality.markdown({"main_job": {"row": row, "command": "python old", "cpu": CPU,
                                            "date": "2026-11-25"}})
  assert "`python old` (last on 2026-11-25)" in text


@pytest.mark.parametrize("config", gan_quality.CONFIGS)
def test_every_configs_target_can_be_judged(config):
  final = {"label_accuracy": 0.98, "encoder_1nn_accuracy": 0.96,
           "random_encoder_1nn_accuracy": 0.5, "pixels_1nn_accuracy": 0.8,
           "reconstruction_ratio": 0.5, "classifier_score_32": 7.9, "real_score_32": 8.0,
           "second_score_32": 7.9, "second_real_score_32": 8.0, "modes": 995, "mode_kl": 0.05}
  good = [_run(config, 0, [(100, 60.0, 1.1, final)])]  # under 2x 0.6 in a minute
  assert gan_quality.met(gan_quality.summarize(config, good, FLOOR)) == "met"
  if config == "tfgan_mnist":  # the second classifier's ratio counts as much as the first's
    second_misses = [_run(config, 0, [(100, 60.0, 1.1, dict(final, second_score_32=7.0))])]
    assert gan_quality.met(gan_quality.summarize(config, second_misses, FLOOR)) == "not met"
  bad = [_run(config, 0, [(100, 60.0, 30.0, dict(final, label_accuracy=0.5,
                                                   reconstruction_ratio=0.9,
                                                   classifier_score_32=5.0, modes=99,
                                                   mode_kl=3.4))])]
  assert gan_quality.met(gan_quality.summarize(config, bad, FLOOR)) == "not met"


def test_the_main_job_misses_its_target_when_one_seed_misses_or_it_is_slow():
  slow = [_run("main_job", 0, [(2800, 200.0, 5.0, {})], seconds=200.0)]
  assert gan_quality.met(gan_quality.summarize("main_job", slow, FLOOR)) == "not met"
  one_misses = [_run("main_job", s, [(2800, 100.0, fid, {})]) for s, fid in enumerate([5, 7])]
  assert gan_quality.met(gan_quality.summarize("main_job", one_misses, FLOOR)) == "not met"


def test_one_seed_shows_no_spread():
  row = gan_quality.summarize("dcgan", [_run("dcgan", 0, [(1000, 60.0, 3.0, {})])], FLOOR)
  assert row["best_fid"] == (3.0, None)
  text = gan_quality.markdown({"dcgan": {"row": row, "commands": ["python x"], "cpu": CPU,
                                         "date": "2026-11-26"}})
  assert "| 3.00 (5.0x) |" in text and "± 0.00" not in text


def _store(docs, name, recipe, cpu=CPU):
  gan_quality.save_runs(str(docs), name, [_run(name.split(" ")[0], 0, [(2800, 170.0, 5.0, {})])],
                        FLOOR, "python bench/gan_quality.py", cpu, recipe)


def test_what_would_replace_a_stored_row_is_named(tmp_path):
  recipe = {**RECIPE, "source": "abc"}
  assert gan_quality.stored_differences(str(tmp_path), "main_job", recipe, CPU) == []
  _store(tmp_path, "main_job", recipe)
  assert gan_quality.stored_differences(str(tmp_path), "main_job", recipe, CPU) == []
  other = {"bindings": ["gan.Schedule.total_steps = 200"], "main_args": ["--steps", "200"],
           "source": "def"}
  differences = gan_quality.stored_differences(str(tmp_path), "main_job", other,
                                               {**CPU, "cpu": "another CPU"})
  assert len(differences) == 4, differences
  assert "total_steps = 200" in differences[0] and "'--steps', '200'" in differences[1]
  assert "examples/mnist_dcgan.py" in differences[2] and "abc" in differences[2]
  assert "another CPU" in differences[3]


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps 0: give the step to train each run to, at least 1"),
    (["--quick", "--seeds", "2"], "--quick --seeds 2: --quick runs one short seed"),
    (["--configs", "main_job", "--steps", "200"],
     "holds row 'main_job', which these runs would replace rather than join: gin bindings"),
])
def test_bad_arguments_and_a_row_it_would_replace_stop_it_before_any_training(
    argv, message, tmp_path, monkeypatch, capsys):
  _store(tmp_path, "main_job", {**RECIPE, "source": gan_quality.source_digest("main_job")},
         cpu=run_bench.cpu_features())
  monkeypatch.setattr(gan_quality, "floor", lambda: pytest.fail("measured the floor"))
  monkeypatch.setattr(gan_quality, "run_one", lambda *a: pytest.fail("trained"))
  before = (tmp_path / "quality" / "results.json").read_text()
  with pytest.raises(SystemExit) as stopped:
    gan_quality.main(argv + ["--docs", str(tmp_path), "--workdir", str(tmp_path / "w")])
  assert stopped.value.code == 2
  assert message in capsys.readouterr().err
  assert (tmp_path / "quality" / "results.json").read_text() == before


def test_a_terminated_benchmark_ends_the_training_it_waits_on(tmp_path):
  """`timeout` or `kill` (SIGTERM) on the benchmark: its training process, a stand-in
  here that sleeps, does not live on."""
  pid_file = tmp_path / "pid"
  script = f"""
import sys
sys.path.insert(0, {os.path.join(ROOT, "bench")!r})
import gan_quality
gan_quality.command_of = lambda *a: [sys.executable, "-c", "import os, time; "
    "open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"]
gan_quality.as_a_command()
gan_quality.run_one("dcgan", 0, {str(tmp_path / "w")!r}, [])
"""
  bench = subprocess.Popen([sys.executable, "-c", script])
  try:
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()):
      assert time.monotonic() < deadline and bench.poll() is None
      time.sleep(0.1)
    child = int(pid_file.read_text())
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while helpers.alive(child):
      assert time.monotonic() < deadline, "the training process outlived the benchmark"
      time.sleep(0.1)
  finally:
    bench.kill()
