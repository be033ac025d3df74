"""Loggers and the run manifest: MLflow (a SQLite store) and Weights & Biases
(offline) hold a run's parameters, every step, the reported metrics and the
sample grids, once each across a resume; a failing tracker does not stop
training; each fit appends its manifest, and a resume that changes the seed
says so."""

import glob
import json
import logging
import os
import re
import shutil
import struct

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import ctl
from ctl.loop import loggers as loggers_lib
from ctl.loop import manifest

import helpers
import test_outer_loop
from helpers import TINY_GAN


class GridAndScore(ctl.Action):
  """Every 4 steps: a sample grid and a reported metric, as the GAN kit's actions."""

  def __init__(self):
    self.every = ctl.Every(steps=4)

  def __call__(self, context):
    context.report(images={"grid": np.full((6, 6, 1), context.step, np.uint8)})
    context.report({"score": 1.0 / (1 + context.step)})


def train(workdir, total_steps, loggers, *, seed=0):
  runner = test_outer_loop.runner(seed=seed)
  runner.fit(total_steps, str(workdir), checkpoint=ctl.Checkpoint(ctl.Every(steps=8)),
             actions=[GridAndScore()], loggers=loggers, progress=False)
  return runner


def crash_after_step_12(workdir):
  """What a kill after step 12 leaves: the steps logged to 12, the checkpoint
  of step 8 (the end's save at 12 removed)."""
  for path in glob.glob(os.path.join(workdir, "checkpoints", "ckpt-12*")):
    os.remove(path)
  os.remove(os.path.join(workdir, "checkpoints", "finished_step"))


def mlflow_records(store):
  """(parameters, {metric: [(step, value)]}, image steps, artifact names, runs, status)."""
  import mlflow
  client = mlflow.MlflowClient(store)
  runs = client.search_runs([client.get_experiment_by_name("ctl").experiment_id])
  run = runs[0]
  metrics = {key: sorted((m.step, m.value) for m in client.get_metric_history(
      run.info.run_id, key)) for key in run.data.metrics}
  images = sorted(int(a.path.split("+step+")[1].split("+")[0]) for a in
                  client.list_artifacts(run.info.run_id, "images") if a.path.endswith(".png")
                  and "compressed" not in a.path)
  manifests = [a.path for a in client.list_artifacts(run.info.run_id, "manifest")]
  return run.data.params, metrics, images, manifests, len(runs), run.info.status


def wandb_records(workdir):
  """The same, read back from the offline runs' `.wandb` files."""
  import wandb
  from wandb.proto import wandb_internal_pb2
  # run.finish() returns before W&B's service has written the run's file (seen:
  # 2 of 30 files still a bare header under load); its teardown waits for that.
  wandb.teardown()
  files = sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb")))
  params, metrics, images, ids = {}, {}, [], set()
  for path in files:
    for record in _wandb_records(path, wandb_internal_pb2):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        ids.add(record.run.run_id)
        params.update({item.key: json.loads(item.value_json)
                       for item in record.run.config.update})
      elif kind == "config":
        params.update({item.key: json.loads(item.value_json) for item in record.config.update})
      elif kind == "history":
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
               for item in record.history.item}
        step = row.pop("_step")
        if "grid/_type" in row:
          images.append(step)
        for key, value in row.items():
          if not key.startswith("_") and "/" not in key:
            metrics.setdefault(key, []).append((step, value))
  params = {k: v.get("value", v) if isinstance(v, dict) else v for k, v in params.items()}
  return params, {k: sorted(v) for k, v in metrics.items()}, sorted(images), files, len(ids)


def _wandb_records(path, proto):
  """The records of a `.wandb` file: W&B's header, then LevelDB's log format
  (32 KiB blocks of chunks, each a CRC, a length and a kind)."""
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", data[:7]
  position, pending, block = 7, b"", 32768
  while position + 7 <= len(data):
    if block - position % block < 7:  # a block's tail too short for a header: padding
      position += block - position % block
      continue
    _, length, kind = struct.unpack("<IHB", data[position:position + 7])
    pending += data[position + 7:position + 7 + length]
    position += 7 + length
    if kind in (1, 4) and pending:  # a whole record, or a record's last chunk
      record = proto.Record()
      record.ParseFromString(pending)
      pending = b""
      yield record


@pytest.mark.slow
@pytest.mark.parametrize("tracker", ["mlflow", "wandb"])
def test_a_tracker_holds_every_step_metric_and_grid_once_across_a_resume(tmp_path, tracker):
  """Trained to 12, killed (the checkpoint of step 8 survives), resumed to 16:
  steps 8 to 11 are trained again but the tracker's run holds each once, with
  the values of history.jsonl."""
  pytest.importorskip(tracker)
  workdir = tmp_path / "run"
  store = f"sqlite:///{tmp_path / 'mlflow.db'}"
  make = (lambda: ctl.MLflow(store)) if tracker == "mlflow" else ctl.WandB
  train(workdir, 12, [make()])
  crash_after_step_12(workdir)
  if tracker == "mlflow":  # killed between a write and its note: MLflow's store tells
    note = workdir / "trackers" / "mlflow.json"
    note.write_text(json.dumps({**json.loads(note.read_text()), "steps": 5}))
  train(workdir, 16, [make()])

  history = ctl.read_history(str(workdir))
  assert list(history.steps) == list(range(16))
  if tracker == "mlflow":
    params, metrics, images, manifests, runs, status = mlflow_records(store)
    assert (runs, status) == (1, "FINISHED")
    assert manifests == ["manifest/00000000.json", "manifest/00000008.json"]
    assert not glob.glob(str(tmp_path / "mlruns"))  # artifacts beside the store
  else:
    params, metrics, images, files, runs = wandb_records(str(workdir))
    assert (runs, len(files)) == (1, 2)  # one run, written by two fits
  for key in ("discriminator_loss", "generator_loss"):
    steps, values = zip(*metrics[key])
    assert list(steps) == list(range(16)), key  # each step once
    np.testing.assert_allclose(values, history[key], rtol=1e-6)
  assert metrics["score"] == [(s, pytest.approx(1 / (1 + s))) for s in (4, 8, 12, 16)]
  assert images == [4, 8, 12, 16]
  assert str(params["seed"]) == "0" and str(params["strategy.replicas"]) == "1"
  assert params["versions.tensorflow"] == tf.__version__
  with open(workdir / "trackers" / f"{tracker}.json") as f:
    assert json.load(f)["steps"] == 15


class Failing(ctl.Logger):
  """A tracker whose store goes away after its first call."""

  def __init__(self):
    self.calls = 0
    self.ended = None

  def log_steps(self, first_step, results):
    self.calls += 1
    if self.calls == 2:
      raise ConnectionError("store unreachable")

  def end(self, status):
    self.ended = status


def test_a_tracker_that_fails_is_dropped_and_training_goes_on(tmp_path, caplog):
  failing = Failing()
  with caplog.at_level(logging.WARNING, logger="ctl"):
    train(tmp_path, 12, [failing])
  assert failing.calls == 2 and failing.ended is None  # dropped: nothing more, not ended
  assert "logger Failing failed at step 4 (ConnectionError: store unreachable)" in caplog.text
  assert list(ctl.read_history(str(tmp_path)).steps) == list(range(12))


class RefusesToBegin(ctl.Logger):

  def begin(self, run):
    raise ValueError("no such tracking server")


def test_a_tracker_that_cannot_begin_stops_the_fit_before_its_first_step(tmp_path):
  with pytest.raises(ValueError, match="no such tracking server"):
    train(tmp_path, 12, [RefusesToBegin()])
  assert ctl.read_history(str(tmp_path)).steps.size == 0


class Unreachable(loggers_lib.Tracker):
  """A tracker whose server does not answer."""
  name = "unreachable"

  def start(self, run, run_id):
    raise ConnectionError("http://127.0.0.1:9: connection refused\nretries exhausted")

  def send_steps(self, rows):
    raise AssertionError("never started")

  send_metrics = send_image = finish = send_steps


def test_a_tracker_that_cannot_start_is_one_error_naming_it_and_no_fit_is_recorded(tmp_path):
  with pytest.raises(loggers_lib.TrackerError,
                     match=r"^unreachable: could not start a run \(ConnectionError: "
                           r"http://127.0.0.1:9: connection refused\); fix the tracker's "
                           r"address or drop the logger. Nothing was trained.$"):
    train(tmp_path, 12, [Unreachable()])
  assert manifest.read(str(tmp_path)) == []  # no record of a fit that never ran


@pytest.mark.slow
def test_a_fit_killed_before_its_first_save_leaves_no_mlflow_run_running(tmp_path):
  """Killed before any checkpoint, a rerun starts at step 0 with a run of its
  own; the killed fit's run is marked KILLED rather than left RUNNING."""
  pytest.importorskip("mlflow")
  import mlflow
  store = f"sqlite:///{tmp_path / 'mlflow.db'}"
  train(tmp_path / "run", 4, [ctl.MLflow(store)])
  client = mlflow.MlflowClient(store)
  killed = client.search_runs([client.get_experiment_by_name("ctl").experiment_id])[0]
  client.update_run(killed.info.run_id, status="RUNNING")  # as a SIGKILL leaves it
  shutil.rmtree(tmp_path / "run" / "checkpoints")  # before its first save
  train(tmp_path / "run", 4, [ctl.MLflow(store)])
  runs = client.search_runs([client.get_experiment_by_name("ctl").experiment_id])
  status = {run.info.run_id: run.info.status for run in runs}
  assert status.pop(killed.info.run_id) == "KILLED"
  assert list(status.values()) == ["FINISHED"]


@pytest.mark.parametrize("loggers, message", [
    ("mlflow", "pass a list of loggers"),
    (["mlflow"], r"ctl.loop.loggers.by_name\('mlflow'\)"),
    ([ctl.Logger], r"is a class; pass an instance of it, e.g. Logger\(\)"),
    ([object()], "lacks begin, log_steps, log_metrics, log_image, flush, end"),
])
def test_bad_loggers_are_refused_naming_the_fix(tmp_path, loggers, message):
  with pytest.raises(TypeError, match=message):
    train(tmp_path, 4, loggers)


def test_the_chief_alone_logs(tmp_path, monkeypatch):
  """A worker that is not the chief begins no logger (nor writes the manifest)."""
  class Recording(ctl.Logger):
    began = False

    def begin(self, run):
      Recording.began = True

  runner = test_outer_loop.runner()
  monkeypatch.setattr(type(runner.placement), "is_chief", property(lambda self: False))
  runner.fit(4, None, loggers=[Recording()], progress=False)
  assert not Recording.began


def test_each_fit_appends_its_manifest_and_a_resume_under_another_seed_says_so(
    tmp_path, caplog):
  train(tmp_path, 4, [], seed=0)
  with caplog.at_level(logging.WARNING, logger="ctl"):
    runner = test_outer_loop.runner(seed=1)
    runner.fit(8, str(tmp_path), progress=False)
  assert "seed was 0 and is now 1" in caplog.text
  records = manifest.read(str(tmp_path))
  assert [(r["start_step"], r["total_steps"], r["seed"]) for r in records] == [
      (0, 4, 0), (4, 8, 1)]
  record = records[0]
  assert record["versions"]["tensorflow"] == tf.__version__
  assert record["versions"]["ctl-loops"]
  assert record["strategy"] == {"kind": "default", "class": "_DefaultDistributionStrategy",
                                "replicas": 1, "workers": 1}
  assert record["run"]["steps_per_loop"] == 4
  assert record["determinism"]["mixed_precision"] == "float32"
  assert record["machine"]["cpu"]["model"] and record["command"]
  if shutil.which("git") and os.path.isdir(os.path.join(helpers.ROOT, ".git")):
    commits = [about["commit"] for about in record["git"].values()]
    assert any(len(commit) == 40 for commit in commits), record["git"]
  accumulator = event_accumulator.EventAccumulator(
      str(tmp_path / "events" / "train"), size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  texts = {e.step: e.tensor_proto.string_val[0].decode() for e in
           accumulator.Tensors("manifest")}
  assert sorted(texts) == [0, 4] and '"seed": 1' in texts[4]


def test_a_manifest_cut_mid_line_keeps_every_other_record(tmp_path, caplog):
  """The next fit's record is not glued to the cut line: read gives it, and names the cut."""
  train(tmp_path, 4, [])
  train(tmp_path, 8, [])
  path = tmp_path / "manifest.jsonl"
  text = path.read_text()
  path.write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])  # the 2nd cut
  train(tmp_path, 12, [])
  with caplog.at_level(logging.WARNING, logger="ctl"):
    records = manifest.read(str(tmp_path))
  assert [r["start_step"] for r in records] == [0, 8]
  assert "manifest.jsonl: left out line 2, cut short or unreadable" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("tracker,note", [("mlflow", ""), ("mlflow", "{garbage"),
                                          ("wandb", "")])
def test_a_damaged_tracker_note_resumes_the_same_tracker_run(tmp_path, caplog, tracker, note):
  """The note in trackers/ empty or garbage: the resume finds the run of this work
  directory in the tracker (MLflow: by its tag; W&B: its folder) and logs to it,
  each step once."""
  pytest.importorskip(tracker)
  workdir = tmp_path / "run"
  store = f"sqlite:///{tmp_path / 'mlflow.db'}"
  make = (lambda: ctl.MLflow(store)) if tracker == "mlflow" else ctl.WandB
  train(workdir, 12, [make()])
  crash_after_step_12(workdir)
  (workdir / "trackers" / f"{tracker}.json").write_text(note)
  with caplog.at_level(logging.WARNING, logger="ctl"):
    train(workdir, 16, [make()])
  assert re.search(rf"{tracker}.json cannot be read \((empty|JSONDecodeError)\); resuming "
                   rf"the {tracker} run \w+ of this work directory, found in", caplog.text)
  if tracker == "mlflow":
    _, metrics, _, _, runs, status = mlflow_records(store)
    assert (runs, status) == (1, "FINISHED")
    assert [step for step, _ in metrics["generator_loss"]] == list(range(16))
  else:
    _, metrics, _, files, runs = wandb_records(str(workdir))
    assert runs == 1 and len(files) == 2
    assert sorted({step for step, _ in metrics["generator_loss"]}) == list(range(16))


@pytest.mark.slow
def test_ctl_train_logs_its_gin_bindings_to_mlflow(tmp_path):
  pytest.importorskip("mlflow")
  store = f"sqlite:///{tmp_path / 'mlflow.db'}"
  helpers.ctl("train", os.path.join("examples", "configs", "dcgan.gin"), "--workdir",
              str(tmp_path / "run"), *TINY_GAN, "--logger", "mlflow",
              env={"MLFLOW_TRACKING_URI": store, "MLFLOW_EXPERIMENT_NAME": "ctl"})
  params, metrics, images, manifests, runs, status = mlflow_records(store)
  assert (runs, status) == (1, "FINISHED")
  assert params["gin.gan.Schedule.total_steps"] == "4"
  assert params["gin.gan.dcgan_generator.width"] == "8"
  assert [step for step, _ in metrics["generator_loss"]] == [0, 1, 2, 3]
  assert images == [2, 4]
  record = manifest.read(str(tmp_path / "run"))[0]
  assert "Schedule.total_steps = 4" in record["gin"]["config"]
  assert record["command"][1:3] == ["train", os.path.join("examples", "configs", "dcgan.gin")]
