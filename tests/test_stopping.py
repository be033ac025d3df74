"""In one process: how `fit` stops (signals sent to itself), the work
directory's lock, a work directory deleted mid-run, the waits for a cluster's
peers, and what the step's first call tells about its data.

The same faults in real subprocesses, with their exit codes, are the fault
matrix of tests/test_faults.py.
"""

import json
import logging
import os
import signal
import socket
import time
import warnings
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.distribute import launch
from ctl.distribute import peers
from ctl.loop import stopping
from ctl.loop import workdir as workdir_lib
from ctl.loop.session import Session

import helpers
from test_outer_loop import build
from test_outer_loop import data
from test_outer_loop import runner
from test_outer_loop import step


class SendAt(ctl.Action):
  """An action that sends this process `signum` at step `at` (end: None)."""

  def __init__(self, signum, at=None):
    self.signum = signum
    self.every = ctl.Every(steps=at) if at else None
    self.sent = False

  def __call__(self, context):
    if not self.sent:
      self.sent = True
      os.kill(os.getpid(), self.signum)  # the handler runs before this returns


@pytest.fixture(autouse=True)
def ctrl_c_as_in_a_terminal():
  """SIGINT raises KeyboardInterrupt, as in a terminal, even when this test runs
  in the background (a shell's background job starts with SIGINT ignored, and
  `fit` then leaves it ignored)."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


def latest_step(workdir):
  path = tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))
  return int(path.rsplit("-", 1)[1]) if path else None


@pytest.mark.parametrize("signum,raised", [(signal.SIGTERM, SystemExit),
                                           (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_during_an_action_saves_at_once_and_stops(tmp_path, signum, raised,
                                                          caplog, capfd):
  previous = signal.getsignal(signum)
  also_due, later = SendAt(signum, at=4), SendAt(signum)  # must not run
  with pytest.raises(raised) as stopped:
    runner().fit(12, tmp_path, actions=[SendAt(signum, at=4), also_due, later],
                 progress=False)
  assert latest_step(tmp_path) == 4  # no step lost
  assert not also_due.sent and not later.sent
  assert stopped.value.__context__ is None  # no "during handling of Abandoned" chain
  # Said as the signal came, and what it skipped.
  name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
  assert (f"ctl: {name}: abandoning the SendAt in progress, saving a checkpoint and "
          "stopping") in capfd.readouterr().err
  assert "SendAt abandoned at step 4 by a signal; not run at this step: SendAt" in caplog.text
  if signum == signal.SIGTERM:
    assert isinstance(stopped.value, ctl.Preempted) and stopped.value.code == 42
  else:
    assert isinstance(stopped.value, ctl.Interrupted)
    assert "Ctrl-C: saved a checkpoint at step 4" in str(stopped.value)
  if signum == signal.SIGTERM:  # the process is exiting with 42: a further SIGTERM is let go
    assert signal.getsignal(signum) is stopping.already_stopping
    signal.signal(signum, previous)
  assert signal.getsignal(signum) is previous
  assert not (tmp_path / workdir_lib.LOCK_NAME).exists()  # released
  resumed = runner()
  resumed.fit(12, tmp_path, progress=False)
  assert int(resumed.global_step.numpy()) == 12


@pytest.mark.parametrize("nohup", [False, True])
def test_sighup_stops_as_sigterm_unless_ignored_as_under_nohup(tmp_path, nohup, monkeypatch,
                                                               capfd):
  """A closed terminal (SIGHUP) stops the run as SIGTERM does, saved; under
  nohup (SIGHUP ignored) the run goes on to its end. (The real hang-up of a
  terminal is in tests/test_fault_matrix.py.)"""
  # Not this test's terminal: ctl would send it to /dev/null.
  monkeypatch.setattr(stopping, "_is_terminal", lambda fd: False)
  previous = signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL)
  try:
    if nohup:
      runner().fit(12, tmp_path, actions=[SendAt(signal.SIGHUP, at=4)], progress=False)
      assert latest_step(tmp_path) == 12
    else:
      class HangUpAt(SendAt):
        def __call__(self, context):
          super().__call__(context)
          time.sleep(10)  # SIGTERM, from ctl's signal thread, abandons the wait

      with pytest.raises(ctl.Preempted):
        runner().fit(12, tmp_path, actions=[HangUpAt(signal.SIGHUP, at=4)], progress=False)
      assert latest_step(tmp_path) == 4
      assert "ctl: SIGHUP (the terminal closed): stopping as at SIGTERM." in (
          capfd.readouterr().err)
    # After the stop (exit code 42) a further SIGHUP is let go, not a death by SIGHUP.
    assert signal.getsignal(signal.SIGHUP) == (signal.SIG_IGN if nohup else
                                               stopping.already_stopping)
  finally:
    signal.signal(signal.SIGHUP, previous)


def test_a_signal_inside_a_callback_lets_the_action_finish_then_stops(tmp_path, capfd):
  finished = []

  class Garbage:
    pass

  class Action(ctl.Action):
    every = ctl.Every(steps=4)

    def __call__(self, context):  # the signal's handler runs inside a weakref's callback
      def callback(_):
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # Python operations: the handler runs among them
      garbage = Garbage()
      ref = weakref.ref(garbage, callback)  # noqa: F841
      del garbage  # the callback runs here; Python drops what it raises
      finished.append(context.step)

  with pytest.raises(ctl.Interrupted):
    runner().fit(12, tmp_path, actions=[Action()], progress=False)
  assert finished == [4]  # not abandoned: Python cannot raise from a callback
  assert latest_step(tmp_path) == 4  # but stopped right after it, saved
  err = capfd.readouterr().err
  assert "ctl: the signal came inside a callback: stopping after the work" in err
  assert "Exception ignored" not in err and "Traceback" not in err, err


class SecondCtrlC:
  """A `Stopper` of this process, inside `in_call` blocks as `fit` runs them,
  sent real SIGINTs: what it writes, and whether it ends the process (its
  exit is recorded instead)."""

  def __init__(self, tmp_path, monkeypatch, *, notebook=False):
    r = runner()
    self.session = Session(r.compiled_step, r.history, str(tmp_path / "c"),
                           checkpoint=ctl.Checkpoint()).__enter__()
    self.stopper = stopping.Stopper(r.placement, self.session,
                                    steps_per_loop=r.steps_per_loop)
    self.lines, self.exits = [], []
    monkeypatch.setattr(stopping, "_write", self.lines.append)
    monkeypatch.setattr(stopping.notebook, "in_notebook", lambda: notebook)
    monkeypatch.setattr(self.stopper, "_exit", self.exits.append)

  def press(self, times, *, until):
    """Sends SIGINT `times` times, each once the line before it is out; then
    waits (at most 10 s) for `until()`."""
    for _ in range(times):
      said = len(self.lines)
      os.kill(os.getpid(), signal.SIGINT)
      deadline = time.monotonic() + 10
      while len(self.lines) == said and not self.exits and time.monotonic() < deadline:
        time.sleep(0.01)
    deadline = time.monotonic() + 10
    while not until() and time.monotonic() < deadline:
      time.sleep(0.01)

  def close(self):
    self.stopper.close()
    self.session.__exit__(None, None, None)


def test_a_second_ctrl_c_in_a_long_call_quits_at_once(tmp_path, monkeypatch):
  second = SecondCtrlC(tmp_path, monkeypatch)
  try:
    with second.stopper.in_call(1):
      time.sleep(0.05)  # a step takes 0.05 s
    with second.stopper.in_call(200):  # about 10 s: longer than the wait
      second.press(2, until=lambda: second.exits)
  finally:
    second.close()
  assert second.exits == [ctl.INTERRUPTED_EXIT_CODE]
  assert second.lines[-1] == ("ctl: second Ctrl-C: quitting now, without saving: the "
                              "steps since the start are lost.")


def test_a_second_ctrl_c_in_the_first_call_quits_at_once(tmp_path, monkeypatch):
  second = SecondCtrlC(tmp_path, monkeypatch)
  try:
    with second.stopper.in_call(200):  # no call has ended: its length is unknown
      second.press(2, until=lambda: second.exits)
  finally:
    second.close()
  assert second.exits == [ctl.INTERRUPTED_EXIT_CODE]


def test_a_second_and_third_ctrl_c_never_end_a_notebooks_kernel(tmp_path, monkeypatch):
  second = SecondCtrlC(tmp_path, monkeypatch, notebook=True)
  try:
    with second.stopper.in_call(1):
      time.sleep(0.05)
    with second.stopper.in_call(200):
      second.press(3, until=lambda: len(second.lines) >= 3)
    with pytest.raises(ctl.Interrupted):
      second.stopper.check(200, then=lambda: pytest.fail("the actions due ran"))
  finally:
    second.close()
  assert not second.exits
  kept = second.lines[1:3]
  assert all(line.startswith("ctl: second Ctrl-C: a notebook's kernel is kept: ")
             for line in kept), second.lines
  assert "the compiled call in flight ends in about" in kept[0]
  assert "restarting the kernel stops it now" in kept[1]
  assert second.lines[-1] == ("ctl: second Ctrl-C: saved at the end of the compiled call; "
                              "stopping.")


class Record(ctl.Action):
  """Keeps the steps whose results it was given."""

  def __init__(self, every):
    self.every = ctl.Every(steps=every)
    self.steps = []

  def __call__(self, context):
    n = len(next(iter(context.results.values())))
    self.steps += range(context.step - n, context.step)


def test_a_signal_inside_a_call_saves_then_runs_that_steps_actions(tmp_path):
  def signalling_step(ctx, real):  # SIGTERM to this process while step 5 runs
    def send(value):
      if int(value) == 5:
        os.kill(os.getpid(), signal.SIGTERM)
      return value
    sent = tf.py_function(send, [ctx.step], tf.int64)
    sent.set_shape([])
    return step(ctx, real + 0.0 * tf.cast(sent, tf.float32))

  record = Record(every=4)
  r = ctl.Runner(signalling_step, build, data().repeat(), steps_per_loop=4)
  with pytest.raises(SystemExit) as stopped:
    r.fit(12, tmp_path, actions=[record], progress=False)
  assert stopped.value.code == 42
  assert latest_step(tmp_path) == 8  # the call of steps 4-7 ended, then the save
  assert record.steps == list(range(8))  # its results reached the actions: none lost


def test_ctrl_c_without_a_workdir_stops_and_keeps_the_runner():
  r = runner()
  with pytest.raises(ctl.Interrupted, match="stopped at step 4 .no workdir, nothing saved"):
    r.fit(12, None, actions=[SendAt(signal.SIGINT, at=4)], progress=False)
  assert int(r.global_step.numpy()) == 4
  r.fit(8, None, progress=False)  # a notebook goes on with the same runner
  assert int(r.global_step.numpy()) == 8


def test_sigterm_during_the_end_abandons_it_and_the_rerun_does_it(tmp_path):
  with pytest.raises(SystemExit) as stopped:
    runner().fit(4, tmp_path, actions=[SendAt(signal.SIGTERM), ctl.Export("generator")],
                 progress=False)
  assert stopped.value.code == 42
  assert latest_step(tmp_path) == 4
  # The end was cut short: no export, no mark that it ran; the rerun does it.
  assert not (tmp_path / "export" / "generator.keras").exists()
  assert not (tmp_path / "checkpoints" / "finished_step").exists()
  runner().fit(4, tmp_path, actions=[ctl.Export("generator")], progress=False)
  assert (tmp_path / "export" / "generator.keras").exists()
  assert (tmp_path / "checkpoints" / "finished_step").read_text() == "4\n"


# The work directory.

def test_the_lock_names_its_holder_and_is_released(tmp_path):
  lock = workdir_lib.Lock(str(tmp_path))
  holder = json.loads((tmp_path / workdir_lib.LOCK_NAME).read_text())
  assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
  with pytest.raises(ctl.WorkdirInUse, match=rf"in use by process {os.getpid()} on "):
    workdir_lib.Lock(str(tmp_path))
  lock.release()
  assert not (tmp_path / workdir_lib.LOCK_NAME).exists()
  workdir_lib.Lock(str(tmp_path)).release()  # free again


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, caplog):
  # What a SIGKILLed run leaves: the file, with no flock on it (the kernel
  # dropped that with the process).
  (tmp_path / workdir_lib.LOCK_NAME).write_text(json.dumps(
      {"host": socket.gethostname(), "pid": 2 ** 22 + 1, "since": "then",
       "command": "train.py"}))
  with caplog.at_level(logging.WARNING, logger="ctl"):
    r = runner()
    r.fit(4, tmp_path, progress=False)
  assert "taking over the lock file left by process 4194305" in caplog.text
  assert int(r.global_step.numpy()) == 4


class DeleteWorkdir(ctl.Action):
  every = ctl.Every(steps=4)

  def __call__(self, context):
    if context.step == 4:
      tf.io.gfile.rmtree(context.workdir)


def test_a_workdir_deleted_mid_run_is_made_again_and_written(tmp_path, caplog):
  workdir = tmp_path / "run"
  with caplog.at_level(logging.WARNING, logger="ctl"):
    runner(steps_per_loop=2).fit(
        8, workdir, actions=[DeleteWorkdir()], summaries=ctl.Summaries(ctl.Every(steps=2)),
        progress=False)
  assert f"workdir {workdir} disappeared (deleted or moved), noticed at step 6" in caplog.text
  # Saved at once (step 6), then at the end; the summaries after it are on disk.
  assert latest_step(workdir) == 8
  assert (workdir / workdir_lib.LOCK_NAME).exists() is False  # released at the end
  events = tf.io.gfile.glob(str(workdir / "events" / "train" / "events.out.tfevents.*"))
  steps = {e.step for path in events for e in tf.compat.v1.train.summary_iterator(path)
           if e.summary.value}
  assert steps == {6, 8}


def test_a_killed_exports_scratch_is_removed_by_the_next_run(tmp_path, caplog):
  scratch = tmp_path / "export" / ".generator-x1y2"
  scratch.mkdir(parents=True)
  (scratch / "model.keras").write_text("half written")
  with caplog.at_level(logging.INFO, logger="ctl"):
    runner().fit(4, tmp_path, actions=[ctl.Export("generator")], progress=False)
  assert not scratch.exists()
  assert sorted(os.listdir(tmp_path / "export")) == ["generator", "generator.keras"]


def test_restore_data_false_resumes_with_another_batch_size(tmp_path):
  runner().fit(4, tmp_path, progress=False)
  bigger = ctl.Runner(step, build, data().unbatch().batch(16, drop_remainder=True).repeat(),
                      steps_per_loop=2)
  bigger.fit(6, tmp_path, checkpoint=ctl.Checkpoint(restore_data=False), progress=False)
  assert int(bigger.global_step.numpy()) == 6


def test_stateful_augmentation_trains_and_resumes_under_the_policy_the_error_names(tmp_path):
  # `fit` refuses such data before step 0 (tests/test_bad_input.py); the fix its
  # message names saves the position without the random op's state.
  options = tf.data.Options()
  options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.WARN
  augmented = data().unbatch().map(lambda x: x + tf.random.uniform([2], 0.0, 0.01))
  augmented = augmented.batch(8, drop_remainder=True).repeat().with_options(options)
  ctl.Runner(step, build, augmented, steps_per_loop=2).fit(4, tmp_path, progress=False)
  resumed = ctl.Runner(step, build, augmented, steps_per_loop=2)
  resumed.fit(6, tmp_path, progress=False)
  assert latest_step(str(tmp_path)) == 6 and int(resumed.global_step.numpy()) == 6


def test_evaluate_with_num_batches_reads_that_many_of_an_endless_dataset():
  r = runner()
  counted = r.evaluate(lambda ctx, x: {"rows": tf.cast(tf.shape(x)[0], tf.float32)},
                       data().repeat(), num_batches=3)
  assert counted == {"rows": 8.0}


# The step's first call.

def test_the_data_note_is_only_for_errors_about_the_data():
  def buggy(ctx, x):
    raise ValueError("a bug of the step's own")
  with pytest.raises(ValueError) as error:
    ctl.Runner(buggy, build, data().repeat()).train(1)
  assert "data elements" not in "".join(getattr(error.value, "__notes__", []))

  def loss_outside_the_tape(ctx, x):
    with tf.GradientTape() as tape:
      pass
    loss = ctx.average(tf.square(ctx.models["discriminator"](x)[:, 0]))
    return {"loss": ctx.minimize(loss, "discriminator", tape=tape)}  # x: (8, 2), in the trace
  for eager in (False, True):
    with pytest.raises(ValueError, match="not recorded by the tape") as error:
      ctl.Runner(loss_outside_the_tape, build, data().repeat(), eager=eager).train(1)
    assert "data elements" not in "".join(getattr(error.value, "__notes__", []))
  wrong = tf.data.Dataset.from_tensor_slices(np.zeros((16, 5), "float32")).batch(8).repeat()
  with pytest.raises(Exception) as error:
    ctl.Runner(step, build, wrong).train(1)
  assert "data elements" in "".join(getattr(error.value, "__notes__", []))


def test_images_outside_the_generators_range_get_a_warning_naming_the_scale():
  import gan  # pylint: disable=import-outside-toplevel

  def digits(global_batch_size, value=255, dtype=tf.uint8):
    images = tf.zeros((32, 28, 28, 1), dtype) + value
    return tf.data.Dataset.from_tensor_slices(images).repeat().batch(global_batch_size)

  def experiment(dataset):
    return gan.Experiment(dataset=dataset, batch_size=8,
                          generator=lambda **kw: gan.dcgan_generator(width=4, **kw),
                          discriminator=lambda **kw: gan.dcgan_discriminator(4, **kw))

  with pytest.warns(UserWarning, match=r"\(uint8, shaped like the output of model "
                    r"'generator'\) holds values in \[255, 255\], but 'generator' ends in "
                    r"tanh, whose output is in \[-1, 1\].*/ 127.5 - 1"):
    experiment(digits).build()  # through gan.Experiment's Runner
  with pytest.warns(UserWarning, match=r"float32, shaped like .* holds values in \[0, 2\]"):
    experiment(lambda b: digits(b, 2.0, tf.float32).map(lambda x: x * tf.cast(
        tf.range(8)[:, None, None, None] % 2, tf.float32))).build()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    experiment(lambda b: digits(b, 0.5, tf.float32)).build()  # in range: no word
  # As gan.data.load_mnist gives them, no channel axis, to a hand-written Runner.
  def gan_build():
    return ({"generator": gan.dcgan_generator(width=4, noise_dim=8),
             "discriminator": gan.dcgan_discriminator(4)},
            {"generator": keras.optimizers.Adam(), "discriminator": keras.optimizers.Adam()})
  with pytest.warns(UserWarning, match=r"holds values in \[255, 255\], but 'generator'"):
    ctl.Runner(lambda ctx, batch: {}, gan_build, digits(8).map(lambda x: x[..., 0]))

  def build():  # a sigmoid discriminator's [1] output is not labels' shape
    generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    discriminator = keras.Sequential([keras.Input((3,)),
                                      keras.layers.Dense(1, activation="sigmoid")])
    return ({"generator": generator, "discriminator": discriminator},
            {"generator": keras.optimizers.Adam(), "discriminator": keras.optimizers.Adam()})
  labelled = tf.data.Dataset.from_tensor_slices(
      (tf.zeros((16, 3)), tf.range(16))).repeat().batch(8)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    ctl.Runner(lambda ctx, batch: {}, build, labelled)


# Waiting for a cluster's peers.

class Clock:

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def test_waiting_for_peers_names_those_that_never_answer(capsys):
  with socket.create_server(("127.0.0.1", 0)) as up:
    here = f"127.0.0.1:{up.getsockname()[1]}"
    gone = f"127.0.0.1:{launch.free_ports(1)[0]}"
    others, me = peers.cluster_peers({"worker": [here, gone, "127.0.0.1:1"]}, "worker", 2)
    assert others == [("worker 0", here), ("worker 1", gone)] and me == "127.0.0.1:1"
    clock = Clock()
    with pytest.raises(SystemExit) as stopped:
      peers.wait_for_peers(others, me, 5, clock=clock, sleep=clock.sleep)
  assert stopped.value.code == peers.STARTUP_FAILED_EXIT_CODE == 1
  err = capsys.readouterr().err
  assert f"gave up after waiting 5 s for the cluster's other tasks: worker 1 at {gone} " \
         "never answered" in err
  assert "worker 0" not in err and "CTL_STARTUP_TIMEOUT" in err
  assert clock.now >= 5


def test_while_waiting_this_task_listens_for_its_peers():
  port = launch.free_ports(1)[0]
  checked = []
  with socket.socket() as late:  # the peer: bound, listening from the first sleep on
    late.bind(("127.0.0.1", 0))
    peer = f"127.0.0.1:{late.getsockname()[1]}"

    def check_me_listening(seconds):
      with socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # the placeholder of this task accepts
      # on its address in TF_CONFIG only, not on every interface
      mine = [s for s in helpers.listeners([os.getpid()]) if s.port == port]
      assert [s.address for s in mine] == ["127.0.0.1"], mine
      checked.append(seconds)
      late.listen()
    peers.wait_for_peers([("worker 0", peer)], f"127.0.0.1:{port}", 5, sleep=check_me_listening)
  assert checked
  with pytest.raises(OSError):  # closed again, for TF's server to bind
    socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_a_signal_ends_the_wait_for_peers(capsys):
  def interrupt(seconds):
    os.kill(os.getpid(), signal.SIGTERM)
  gone = f"127.0.0.1:{launch.free_ports(1)[0]}"
  previous = signal.getsignal(signal.SIGTERM)
  with pytest.raises(SystemExit) as stopped:
    peers.wait_for_peers([("chief 0", gone)], None, 0, sleep=interrupt)
  assert stopped.value.code == 128 + signal.SIGTERM
  assert f"SIGTERM while waiting for the cluster's other tasks (chief 0 at {gone} not " \
         "there yet); nothing was trained" in capsys.readouterr().err
  assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize("value,env,expected", [
    (None, {}, 600.0), (None, {"CTL_STARTUP_TIMEOUT": "30"}, 30.0),
    (5, {"CTL_STARTUP_TIMEOUT": "30"}, 5.0), (0, {}, 0.0)])
def test_startup_timeout_comes_from_the_argument_the_variable_or_the_default(
    value, env, expected):
  assert peers.startup_timeout(value, env) == expected


@pytest.mark.parametrize("value,env,expected", [
    (None, {}, 60.0), (None, {"CTL_HEARTBEAT_TIMEOUT": "300"}, 300.0),
    (5, {"CTL_HEARTBEAT_TIMEOUT": "300"}, 5.0)])
def test_heartbeat_timeout_comes_from_the_argument_the_variable_or_the_default(
    value, env, expected):
  assert peers.heartbeat_timeout(value, env) == expected
