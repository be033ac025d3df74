"""The main job and the guides' examples (README's too) run, for a few steps, in fresh
processes."""

import glob
import json
import os
import re
import struct
import textwrap

import pytest

import helpers

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train


def png_size(path):
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n", path
  return struct.unpack(">II", header[16:24])


# The second: what a user switches, the strategy and the precision (bfloat16 compute).
@pytest.mark.parametrize("strategy", [[], ["--strategy", "mirrored", "--logical-cpus", "2",
                                          "--mixed-precision", "mixed_bfloat16"]])
def test_main_job_trains_writes_its_workdir_and_resumes(strategy, tmp_path):
  command = ["examples/mnist_dcgan.py", "--steps", "6", "--steps-per-loop", "3",
             "--samples-every", "3", "--fid-samples", "200", "--workdir", str(tmp_path)]
  command += strategy
  proc = helpers.python(command)
  # Not a terminal: progress is logged as lines, the last at the end.
  lines = [line for line in proc.stderr.splitlines() if line.startswith("ctl: step ")]
  assert lines and lines[-1].startswith("ctl: step 6/6 (100%)"), proc.stderr[-2000:]
  losses = [float(v) for v in re.findall(r"_loss (\S+)", lines[-1])]
  assert len(losses) == 2 and all(abs(v) < 10 for v in losses)  # hinge: G's may be < 0
  assert png_size(tmp_path / "samples" / "samples_00000003.png") == (224, 224)
  assert png_size(tmp_path / "samples" / "samples_00000006.png") == (224, 224)
  assert (tmp_path / "checkpoints" / "ckpt-6.index").exists()
  # No gin here: the file says so (it was empty).
  assert "No gin bindings" in (tmp_path / "checkpoints" / "operative_config.gin").read_text()
  assert os.listdir(tmp_path / "events" / "train")
  # The averaged generator is the one exported and measured at the end.
  assert (tmp_path / "export" / "generator_ema.keras").exists()
  assert (tmp_path / "export" / "generator_ema" / "saved_model.pb").exists()
  metrics = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [m["step"] for m in metrics] == [6] and metrics[0]["num_samples"] == 200
  assert metrics[0]["classifier_fid"] > 0
  assert re.search(r"ctl: classifier FID at step 6: [0-9.]+", proc.stderr), proc.stderr[-2000:]
  # The same command again: already done, nothing trained.
  again = helpers.python(command)
  assert "already at step 6 of 6" in again.stderr
  if not strategy:  # another run's checkpoints (here another batch size): a message, kept
    other = helpers.python(command + ["--steps", "9", "--batch-size", "32"], check=False)
    assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert "mnist_dcgan.py: checkpoint" in other.stderr, other.stderr[-3000:]
    assert "give the flags the run was started with" in other.stderr  # the script's advice
    assert (tmp_path / "checkpoints" / "ckpt-6.index").exists()


def test_ctrl_c_saves_and_exits_with_130_without_a_traceback(tmp_path):
  code, stderr = helpers.ctrl_c_once(
      ["examples/mnist_dcgan.py", "--steps", "100000", "--steps-per-loop", "2",
       "--samples-every", "2", "--workdir", str(tmp_path)],
      tmp_path / "samples" / "samples_00000002.png")
  assert code == 130, stderr[-3000:]
  step = int(re.search(r"Ctrl-C: saved a checkpoint at step (\d+)", stderr)[1])
  assert (tmp_path / "checkpoints" / f"ckpt-{step}.index").exists()
  assert "Traceback" not in stderr, stderr[-3000:]


# The guides whose ```python blocks run, in the order they run: the step contract's
# quick look (README's example too), then the outer loop's, which goes on from it,
# then the research workflow's (a dry run, trackers).
GUIDES = ("docs/step.md", "docs/outer-loop.md", "docs/workflow.md")


def _python_blocks(path):
  with open(os.path.join(helpers.ROOT, path)) as f:
    return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_guides_python_blocks_all_run_here():
  with_blocks = sorted(os.path.relpath(path, helpers.ROOT)
                       for path in glob.glob(os.path.join(helpers.ROOT, "docs", "**", "*.md"),
                                             recursive=True)
                       if _python_blocks(os.path.relpath(path, helpers.ROOT)))
  assert with_blocks == sorted(GUIDES), (
      f"{with_blocks}: each guide with a ```python block must run in "
      "test_guide_examples_run; add it to GUIDES, in the order its code runs")
  # README's example is the step contract's, word for word.
  assert _python_blocks("README.md") == _python_blocks("docs/step.md")[:1]


def test_guide_examples_run(tmp_path):
  blocks = [block for guide in GUIDES for block in _python_blocks(guide)]
  # The quick look; the outer loop, showing ctl's log lines, an action of one's
  # own, every step's numbers; a dry run and trackers.
  assert len(blocks) == 6
  code = "\n".join(textwrap.dedent(block) for block in blocks)
  code = code.replace("runner.train(1000)", "runner.train(4)")
  code = code.replace("runner.fit(2000,", "runner.fit(8,").replace("runner.fit(2500,",
                                                                   "runner.fit(12,")
  code = code.replace('"runs/readme', '"' + str(tmp_path))
  code += ("\nassert history['generator_loss'].shape == (4,), history"
           "\nassert 0 < metrics['real_score'] < 1, metrics"
           "\nassert list(runner.history.steps) == list(range(12)), runner.history"
           "\nassert len(pandas.read_json(" + repr(str(tmp_path / "history.jsonl"))
           + ", lines=True)) == 12"
           "\nimport mlflow\nclient = mlflow.MlflowClient(store)"
           "\nruns = client.search_runs([client.get_experiment_by_name('ctl').experiment_id])"
           "\nassert [run.info.status for run in runs] == ['FINISHED'], runs"
           "\nprint('ok')\n")
  script = tmp_path / "guide_examples.py"
  script.write_text(code)
  assert helpers.python([str(script)]).stdout.strip().endswith("ok")
