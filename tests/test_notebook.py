"""Runs examples/notebooks/debug_step.ipynb top to bottom; any cell error fails.

The notebook asserts its own results (finite losses, 2 replicas, eager/mirrored
parity), so executing it is the test; this file also checks that what it shows
are pictures: the sample grid and the loss curves as PNG images, and `fit`'s
progress as a widget. It runs in a fresh kernel, i.e. its own process, as its
device setup requires.
"""

import os
import re
import time

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "notebooks", "debug_step.ipynb")


def test_notebook_is_stored_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:80]


def test_notebook_runs(monkeypatch):
  monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # as a user's kernel starts
  monkeypatch.delenv("CTL_VERBOSE", raising=False)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
      nb, timeout=600, kernel_name="python3",
      resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
  client.execute()  # raises CellExecutionError, with the traceback, if a cell fails
  printed = "".join(output.get("text", "") for cell in nb.cells
                    for output in cell.get("outputs", []) if output.get("name"))
  # absl's C++ lines, and the INFO lines of TF's Python logger, which TF sets to
  # INFO on its first use in a notebook (mirrored's "Collective all_reduce ...").
  chatter = re.findall(r"^(?:[IWEF]\d{4} |WARNING: All log messages|INFO:tensorflow).*",
                       printed, re.M)
  assert not chatter, chatter  # quiet.apply() in the first cell: no TensorFlow log lines
  shown = {}  # mime type -> the cells that show one
  for cell in nb.cells:
    for output in cell.get("outputs", []):
      for mime in output.get("data", {}):
        shown.setdefault(mime, []).append(cell.source)
  images = shown.get("image/png", [])
  assert any("ctl.Samples" in source for source in images), shown  # the grid, by fit
  assert any(".plot(" in source for source in images), shown  # the loss curves
  widgets = shown.get("application/vnd.jupyter.widget-view+json", [])
  assert any(".fit(" in source for source in widgets), sorted(shown)  # fit's progress bar


def test_a_second_interrupt_in_a_notebook_keeps_the_kernel_and_saves_the_call(tmp_path):
  """Jupyter's interrupt (SIGINT to the kernel) twice inside a compiled call:
  the kernel lives on with its runner, the call's steps are saved, the cell
  ends with ctl.Interrupted."""
  import jupyter_client  # pylint: disable=import-outside-toplevel
  work = tmp_path / "work"
  setup = f"""
import os, sys, time
sys.path.insert(0, {os.path.join(ROOT, "tests")!r})
import tensorflow as tf
import ctl, toy_gan
WORK = {str(work)!r}
os.makedirs(WORK, exist_ok=True)

def wait(step):
  if int(step) == 5:
    open(os.path.join(WORK, "paused"), "w").close()
    while not os.path.exists(os.path.join(WORK, "go")):
      time.sleep(0.02)
  return step

def prepare(ctx, real):
  waited = tf.py_function(wait, [ctx.step], tf.int64)
  waited.set_shape([])
  return real + 0.0 * tf.cast(waited, tf.float32)

runner = ctl.Runner(toy_gan.make_step(prepare=prepare), toy_gan.mlp_gan(toy_gan.FEATURES),
                    toy_gan.batches(toy_gan.normal_features(40, seed=5), repeat=True),
                    steps_per_loop=3)
"""
  manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
  try:
    def reply_to(msg_id, timeout):
      """The shell reply to request `msg_id`; replies to others are passed over (on a
      loaded machine, start_new_kernel asks for the kernel's info more than once, and
      a second reply waits on the shell channel)."""
      while True:
        msg = client.get_shell_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
          return msg["content"]

    def run(code, timeout=300):
      """(the reply's content, what the cell printed)."""
      msg_id = client.execute(code)
      printed = []
      while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
          continue
        if msg["msg_type"] == "stream":
          printed.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
          break
      return reply_to(msg_id, timeout), "".join(printed)

    reply, printed = run(setup)
    assert reply["status"] == "ok", (reply, printed)
    # stop_on_error=False: this cell ends in an error, after whose reply ipykernel
    # would abort the requests that reach it before it has set and cleared its
    # abort flag, which the next cell's, sent at once, sometimes did ('aborted').
    msg_id = client.execute(
        "runner.fit(12, WORK, checkpoint=ctl.Checkpoint(ctl.Every(steps=4)), progress=False)",
        stop_on_error=False)
    printed = []
    deadline = time.monotonic() + 300
    while not (work / "paused").exists():  # inside the call of steps 4, 5 and 6
      assert time.monotonic() < deadline, "no pause in 300 s"
      if client.shell_channel.msg_ready():  # the cell ended before its pause?
        msg = client.get_shell_msg(timeout=1)
        assert msg["parent_header"].get("msg_id") != msg_id, msg["content"]
      time.sleep(0.05)

    def wait_for(text):
      while text not in "".join(printed):
        msg = client.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
          printed.append(msg["content"]["text"])

    manager.interrupt_kernel()
    wait_for("ctl: Ctrl-C:")
    manager.interrupt_kernel()
    wait_for("ctl: second Ctrl-C: a notebook's kernel is kept: the compiled call in "
             "flight ends")
    (work / "go").touch()
    reply = reply_to(msg_id, 300)
    assert reply["status"] == "error" and reply["ename"] == "Interrupted", reply
    assert manager.is_alive()
    reply, printed = run("print('at step', int(runner.global_step.numpy()), "
                         "tf.train.latest_checkpoint(os.path.join(WORK, 'checkpoints')))")
    assert reply["status"] == "ok", reply
    assert f"at step 7 {work / 'checkpoints' / 'ckpt-7'}" in printed  # nothing lost
  finally:
    client.stop_channels()
    manager.shutdown_kernel(now=True)
