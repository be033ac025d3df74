"""The fault matrix: each fault in each phase of a run, in a real subprocess.

`MATRIX` lists every (fault, phase) cell: the test that makes it happen (here,
or in tests/test_faults.py for the faults that need a rerun compared with an
uninterrupted run), what the user gets, the exit code and the steps lost; or,
for a cell that cannot apply, why. docs/reliability.md shows it.

Every run is tests/resume_task.py: 12 steps, 3 per compiled call, a checkpoint
every 4, paused at a known point of a known phase (`--pause-in`) so that the
fault lands there; the pause waits for a `go` file that the test writes after
the fault. Each test prints its time to stop: from the fault (or from `go`,
when the run must first finish a compiled call) to the exit. No assert is on
a duration: "at once" is asserted as "without `go`", i.e. without the paused
work ever finishing.

    python -m pytest tests/test_fault_matrix.py -s   # with the times to stop
"""

import contextlib
import fcntl
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import termios
import time
import types
import typing

import numpy as np
import pytest
import tensorflow as tf
from test_faults import wait_for

import ctl
from ctl.loop import checkpoints
from ctl.loop import stopping

from helpers import RESUME_TASK
from helpers import ROOT
from helpers import alive
from helpers import free_ports
from helpers import subprocess_env

pytestmark = pytest.mark.slow  # subprocesses that import TensorFlow and train


class Cell(typing.NamedTuple):
  """One fault in one phase: its test and outcome, or why it cannot apply."""
  fault: str
  phase: str
  test: str | None  # "test_faults.py::name" for a test there
  outcome: str
  exit_code: str = ""
  steps_lost: str = ""


PHASES = ("start-up", "between calls", "inside a compiled call", "evaluation",
          "checkpoint save", "export")
MATRIX = [
    Cell("SIGKILL", "start-up", None, "n/a: nothing is trained yet; the kernel ends the "
         "process at once"),
    Cell("SIGKILL", "between calls", "test_faults.py::test_sigkill_then_rerun_equals_uninterrupted",
         "the newest checkpoint is restored by the rerun, which equals an uninterrupted run",
         "-9", "since the last checkpoint"),
    Cell("SIGKILL", "inside a compiled call", None, "as between calls: the kernel ends the "
         "process wherever it is, and a checkpoint is only ever replaced whole"),
    Cell("SIGKILL", "evaluation", None, "as between calls (an evaluation changes no "
         "training state)"),
    Cell("SIGKILL", "checkpoint save",
         "test_faults.py::test_crash_during_checkpoint_write_leaves_previous_restorable",
         "the previous checkpoint stays the newest and is restored", "-9",
         "since the previous checkpoint"),
    Cell("SIGKILL", "export", "test_sigkill_during_an_export_leaves_no_scratch_for_good",
         "the half-written export's scratch directory is removed by the next run, which "
         "exports again", "-9", "since the last checkpoint"),
    Cell("missing peer", "start-up", "test_a_missing_peer_times_out_naming_it",
         "after CTL_STARTUP_TIMEOUT (or startup_timeout; 600 s by default) the process "
         "exits naming the peers that never answered", "1", "none"),
    Cell("SIGTERM", "start-up", "test_a_signal_while_waiting_for_peers_exits_at_once",
         "the wait for the cluster's peers ends at once, naming them", "143", "none"),
    Cell("SIGTERM", "between calls",
         "test_faults.py::test_sigterm_saves_exits_42_and_rerun_resumes",
         "the action in progress is abandoned, a checkpoint saved at once; the rerun "
         "equals an uninterrupted run", "42", "none"),
    Cell("SIGTERM", "inside a compiled call", "test_a_signal_inside_a_compiled_call",
         "the call ends (at most steps_per_loop steps), a checkpoint is saved, that "
         "step's actions run", "42", "none"),
    Cell("SIGTERM", "evaluation", "test_a_signal_during_evaluation_abandons_it",
         "the evaluation is abandoned after the batch in flight, a checkpoint saved; the "
         "rerun runs it first at that step (no hole in metrics.jsonl)", "42", "none"),
    Cell("SIGTERM or Ctrl-C, the action stuck", "evaluation",
         "test_a_signal_during_a_stuck_evaluation_saves_from_another_thread",
         "the evaluation's batch never comes (a pipeline that yields nothing): after "
         "ctl.loop.stopping.STUCK_SECONDS (5 s) a thread saves a checkpoint and ends the process "
         "(in a notebook it saves and keeps the kernel)", "42 / 130", "none"),
    Cell("SIGTERM, SIGINT or SIGHUP, 10 times each", "evaluation",
         "test_a_stop_during_an_evaluation_reading_through_python_always_exits",
         "the evaluation's data come through Python (a tf.numpy_function, as a PIL "
         "decoding): every try saves and exits with its code, within seconds. The "
         "abandoned evaluation's iterator is kept, never freed: freeing it waits for its "
         "pipeline's thread, which needs the interpreter lock the freeing thread holds",
         "42 / 130 / 42", "none"),
    Cell("a further SIGTERM or SIGHUP (a closed terminal sends two)", "evaluation",
         "test_a_stop_during_an_evaluation_reading_through_python_always_exits",
         "ignored once the run has saved and is exiting: the exit code stays 42 (`ctl "
         "train` after Ctrl-C ignores Ctrl-C, SIGTERM and SIGHUP too: 130)", "42", "none"),
    Cell("SIGTERM", "checkpoint save", "test_a_signal_during_a_save_lets_it_finish",
         "the save finishes, then the run exits", "42", "none"),
    Cell("SIGTERM", "export", "test_a_signal_during_an_export_abandons_it",
         "the export is abandoned at once (its scratch directory removed), a checkpoint "
         "saved", "42", "none"),
    Cell("SIGINT (Ctrl-C)", "start-up", "test_a_signal_while_waiting_for_peers_exits_at_once",
         "as SIGTERM", "130", "none"),
    Cell("SIGINT (Ctrl-C)", "between calls", "test_ctrl_c_between_calls",
         "as SIGTERM, then `ctl.Interrupted` (the ctl command exits 130)", "130", "none"),
    Cell("SIGINT (Ctrl-C)", "inside a compiled call", "test_a_signal_inside_a_compiled_call",
         "a line at once saying what will happen; the call ends, then a checkpoint", "130",
         "none"),
    Cell("SIGINT (Ctrl-C)", "evaluation", "test_a_signal_during_evaluation_abandons_it",
         "as SIGTERM", "130", "none"),
    Cell("SIGINT (Ctrl-C)", "checkpoint save", "test_a_signal_during_a_save_lets_it_finish",
         "as SIGTERM", "130", "none"),
    Cell("SIGINT (Ctrl-C)", "export", "test_a_signal_during_an_export_abandons_it",
         "as SIGTERM", "130", "none"),
    Cell("SIGHUP (closed terminal)", "inside a compiled call",
         "test_a_closed_terminal_saves_and_stops_as_at_sigterm",
         "output to the lost terminal goes to /dev/null, then as SIGTERM: the call ends, "
         "a checkpoint is saved; the rerun resumes", "42", "none"),
    Cell("SIGHUP (closed terminal)", "(any other)", None, "as SIGTERM in that phase, "
         "which ctl sends itself; under `nohup` (SIGHUP ignored) the run goes on"),
    Cell("second SIGINT", "evaluation",
         "test_a_second_ctrl_c_during_a_stuck_evaluation_saves_first",
         "the process quits at once, saving first (the training is at rest during an "
         "action)", "130", "none"),
    Cell("second SIGINT", "inside a compiled call",
         "test_a_second_ctrl_c_waits_for_a_call_that_ends_soon_and_saves_it",
         "when the calls so far say the call in flight ends within "
         "ctl.loop.stopping.SECOND_CTRL_C_WAIT_SECONDS (3 s): a line says so, the call ends, a "
         "checkpoint is saved, the actions due are skipped, and the process stops", "130",
         "none"),
    Cell("second SIGINT, the call longer", "inside a compiled call",
         "test_a_second_ctrl_c_in_a_call_that_does_not_end_quits_within_the_wait",
         "the process quits at once if the call is expected to last longer than the wait "
         "(or is the first), else after the wait (also with the CPUs overloaded by "
         "busy processes); the lock file is removed. In a notebook the kernel is never "
         "ended: the cell stops after the call's save (tests/test_stopping.py)", "130",
         "since the last checkpoint"),
    Cell("second writer", "between calls", "test_a_second_writer_fails_at_once",
         "the second run fails before restoring, naming the first (host, PID, command); "
         "the first goes on", "1", "none"),
    Cell("second writer", "(any other)", None, "as between calls: the lock is held from "
         "before the restore to the end of `fit`"),
    Cell("launcher SIGKILL", "between calls", "test_killing_the_launcher_stops_its_workers",
         "each worker sees the launcher gone within a second and stops as at SIGTERM "
         "(both save together)", "42", "none"),
    Cell("launcher SIGKILL", "(any other)", None, "as SIGTERM in that phase, sent by each "
         "worker to itself"),
    Cell("private network refused (namespaces disabled)", "start-up",
         "test_a_refused_private_network_is_said_and_the_tasks_use_this_machines",
         "`ctl launch` warns, naming the refused step, and runs the tasks on this machine's "
         "network, where TensorFlow's servers listen on every interface; with --network "
         "private it exits before starting any task", "0 / 127", "none"),
    Cell("private network refused (namespaces disabled)", "(any other)", None,
         "n/a: the launcher makes the network before the first task starts, once for all "
         "its restarts"),
    Cell("workdir deleted", "between calls", "test_a_deleted_workdir_is_made_again",
         "noticed after the next compiled call: made again, a checkpoint saved there at "
         "once, summaries written to it again; the run ends normally", "0",
         "none (what was in the old directory is gone)"),
    Cell("checkpoint folder not quite right", "start-up",
         "test_a_checkpoint_folder_not_quite_right_restores_the_best_and_deletes_nothing",
         "the newest checkpoint that reads whole is restored, whatever the `checkpoint` "
         "file says, with a warning naming each one passed over and why: without that "
         "file (or with one TF cannot read, or an empty one), or with one set back to an "
         "older checkpoint (a stale copy: the newer ones are restored, not trained over), "
         "the newest found from the files; with it naming a checkpoint whose files are "
         "gone, or the newest's data truncated or overwritten or its index damaged, the "
         "one before (the damaged files moved into checkpoints/damaged/, the `checkpoint` "
         "file written again); `finished_step` missing or wrong, or the workdir copied "
         "with or without its lock: as if untouched. Nothing is deleted",
         "0", "since the restored checkpoint (none when the newest is whole)"),
    Cell("going back to an older checkpoint on purpose", "start-up",
         "test_going_back_to_an_older_checkpoint_sets_the_newer_aside",
         "`ctl train --resume-from 4` / `Checkpoint(resume_from=4)`: the newer "
         "checkpoints move, with the records as they were and the trackers' notes, into "
         "checkpoints/after-ckpt-4/ (`ctl eval --checkpoint after-ckpt-4` reads them; "
         "`best/`'s later copies into its best/, test_action_contract.py); "
         "the run trains from step 4; a rerun with the option resumes from its own newest",
         "0", "none (set aside, not deleted)"),
    Cell("history.jsonl cut mid-line (steps 6 to 11 gone, ckpt-12 restored)", "start-up",
         "test_history.py::test_a_history_cut_mid_line_names_the_line_and_marks_the_steps_lost",
         "a warning names the cut line and its step, and the steps that are not trained "
         "again; they are marked lost in the file (`{\"step\": 6, \"lost_through\": "
         "11}`), which `ctl.read_history` names; the next resume says nothing more", "0",
         "the values of those steps (a tracker's run may hold them)"),
    Cell("history.jsonl holding a garbage line", "start-up",
         "test_history.py::test_a_garbage_line_in_a_history_is_named_not_dropped_silently",
         "named by `ctl.read_history` and at the resume (its line number and the step "
         "missing), which marks the step lost", "0", "that step's values"),
    Cell("metrics.jsonl cut mid-line (the evaluations of steps 8 and 12 gone)", "start-up",
         "test_history.py::test_metrics_cut_mid_line_are_put_back_from_tensorboard",
         "the resume names the cut line and puts the lost metrics back from TensorBoard's "
         "events (float32 values), in step order", "0", "none"),
    Cell("metrics.jsonl with a line, or the whole file, deleted", "start-up",
         "test_history.py::test_metrics_missing_anywhere_are_put_back_from_tensorboard",
         "the resume puts the missing steps back from TensorBoard's events and says which",
         "0", "none"),
    Cell("history.jsonl holding a step on two lines", "start-up",
         "test_history.py::test_a_step_on_two_lines_is_named_and_written_once_at_the_resume",
         "`ctl.read_history` and the resume name the step; the last value is read, and "
         "written once at the resume", "0", "the other value"),
    Cell("history.jsonl deleted", "start-up",
         "test_history.py::test_a_deleted_history_is_marked_lost_at_the_resume",
         "the steps before the checkpoint are marked lost, with a warning", "0",
         "the values of those steps (a tracker's run may hold them)"),
    Cell("SIGHUP (closed terminal), twice, to `ctl launch`", "inside a compiled call",
         "test_launch.py::test_cli_forwards_sigterm_and_exits_with_the_tasks_code",
         "passed on to the tasks as SIGTERM, as SIGTERM is; the launcher exits with their "
         "42", "42", "none"),
    Cell("manifest.jsonl cut mid-line", "start-up",
         "test_loggers.py::test_a_manifest_cut_mid_line_keeps_every_other_record",
         "the next fit's record starts a line of its own; `ctl.loop.manifest.read` gives every "
         "other record and names the cut line", "0", "the cut record"),
    Cell("a tracker's note (trackers/<name>.json) empty or garbage", "start-up",
         "test_loggers.py::test_a_damaged_tracker_note_resumes_the_same_tracker_run",
         "a warning; the same tracker run is resumed, found by the work directory "
         "(MLflow: its `ctl.workdir` tag, the logged keys from the run's tags; W&B: its "
         "folder), each step logged once; none found: says it starts a new one", "0",
         "none"),
    Cell("SIGHUP (closed terminal) to `ctl parity --against multi_worker:2`",
         "inside a compiled call",
         "test_parity_tool.py::test_a_closed_terminal_stops_parity_and_the_workers_it_launched",
         "every run, the launcher and its workers are stopped; no process is left", "129",
         "none (parity saves nothing)"),
    Cell("SIGINT, SIGTERM or SIGHUP to `ctl eval --across`", "evaluation",
         "test_sample_evaluation.py::test_ctl_eval_across_stopped_leaves_no_process_behind",
         "the evaluation in progress (launcher and workers too) is stopped; no process is "
         "left", "130 / 143 / 129", "none"),
    Cell("Ctrl-C or SIGHUP to `ctl sweep`", "inside a compiled call",
         "test_sweep.py::test_a_signal_stops_the_run_in_progress_after_it_saved_and_then_the_sweep",
         "passed on to the run in progress, which saves; the sweep stops with its code",
         "130 / 42", "none"),
    Cell("SIGKILL to `ctl sweep`", "inside a compiled call",
         "test_sweep.py::test_a_killed_sweep_leaves_no_run_behind",
         "its run sees it gone within a second (as a launched task its launcher), saves "
         "and exits 42; no process is left (ctl parity's and eval --across's runs too)",
         "-9", "none"),
    Cell("disk full", "checkpoint save",
         "test_a_save_that_fills_the_disk_leaves_no_partial_files",
         "wherever the save fails (TF's first write, its merge, the `checkpoint` file), "
         "its partial files are removed (a whole checkpoint whose `checkpoint` file could "
         "not be updated is kept, and said so); an OSError names the newest complete "
         "checkpoint; freeing space and rerunning resumes", "1",
         "since the previous checkpoint"),
    Cell("checkpoint folder not quite right", "checkpoint save",
         "test_checkpoints_found_without_the_pointer_file_are_kept_as_before",
         "the checkpoints found without the `checkpoint` file are kept as before: `keep` "
         "removes the oldest when a new one is saved", "0", "none"),
    Cell("checkpoint folder not quite right, read by `ctl eval`/`ctl export`", "start-up",
         "test_evaluating_a_folder_with_a_damaged_newest_restores_the_one_before_untouched",
         "`Runner.restore` restores the newest that reads whole, with the same warnings, "
         "and changes nothing in the folder (a run may hold it)", "0", "none"),
    Cell("empty (0-byte) `checkpoint` file, read by `ctl eval`/`ctl export`", "start-up",
         "test_evaluating_a_folder_with_an_empty_pointer_file_restores_the_newest_untouched",
         "read as a missing pointer: the newest checkpoint is restored, with a warning, and "
         "the file is left as it is", "0", "none"),
    Cell("checkpoint folder not quite right", "(any other)", None,
         "n/a: the folder is read when a run starts"),
    Cell("no checkpoint readable", "start-up",
         "test_no_readable_checkpoint_is_refused_and_nothing_is_touched",
         "a ValueError naming each checkpoint and why it cannot be read (or the "
         "`checkpoint` file naming one whose files are all gone); nothing trained, "
         "moved or deleted", "1", "none"),
    Cell("evaluation data that never ends (unknown length)", "evaluation",
         "test_evaluation_data_of_unknown_length_that_never_ends_is_cut_with_a_warning",
         "the evaluation stops after ctl.parts.evaluation.UNKNOWN_LENGTH_BATCHES (1000) batches, "
         "with a warning naming num_batches and .take(); its metrics are over those "
         "batches and the run goes on (an endless dataset of known, infinite length is "
         "refused before training: tests/test_bad_input.py)", "0", "none"),
    Cell("evaluation data that yields no batch for long", "evaluation",
         "test_evaluation_data_that_yields_nothing_for_long_is_said",
         "after ctl.parts.evaluation.QUIET_SECONDS (60 s) without a batch, a warning (a filter "
         "that matches nothing? a generator that blocks?); the evaluation goes on waiting, "
         "and a SIGTERM or Ctrl-C then saves and stops within 5 s (the stuck-action row)",
         "0", "none"),
    Cell("failing write", "checkpoint save",
         "test_faults.py::test_failed_checkpoint_write_reports_and_keeps_the_previous",
         "an OSError naming the checkpoint and the fix; the previous checkpoint is whole",
         "1", "since the previous checkpoint"),
    Cell("failing write", "export", "test_a_failing_export_saves_the_steps_and_names_the_fix",
         "an OSError naming the export directory and the fix; a checkpoint is saved at "
         "that step first; no scratch left; the rerun resumes there", "1", "none"),
]


def start(workdir, *args, env=None):
  os.makedirs(workdir, exist_ok=True)
  return subprocess.Popen(
      [sys.executable, RESUME_TASK, "--workdir", str(workdir), "--out",
       os.path.join(workdir, "..", "out.npz"), "--steps", "12"] + list(args),
      cwd=ROOT, env=subprocess_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)


def finish(proc, timeout=180):
  """(exit code, the rest of the output)."""
  try:
    rest = proc.communicate(timeout=timeout)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return proc.returncode, rest


def go(workdir):
  open(os.path.join(workdir, "go"), "w").close()


def _metrics(workdir):
  """The rows of `<workdir>/metrics.jsonl`, as namespaces (`row.step`)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [types.SimpleNamespace(**json.loads(line)) for line in f]


def newest(workdir):
  path = tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))
  return int(path.rsplit("-", 1)[1]) if path else None


def report(cell, seconds):
  print(f"\ntime to stop, {cell}: {seconds:.2f} s")


SIGNALS = {"SIGTERM": (signal.SIGTERM, ctl.PREEMPTED_EXIT_CODE),
           "SIGINT": (signal.SIGINT, ctl.INTERRUPTED_EXIT_CODE)}


@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_inside_a_compiled_call(tmp_path, name):
  signum, code = SIGNALS[name]
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "call", "--pause-at", "5")
  wait_for(proc, "PAUSED call 5")  # inside the call of steps 4, 5 and 6
  proc.send_signal(signum)
  # Said at once, while the call still runs.
  wait_for(proc, f"ctl: {'Ctrl-C' if signum == signal.SIGINT else 'SIGTERM'}: when the "
           "compiled call in flight ends (at most 3 steps): saving a checkpoint, then "
           "running the actions due at that step")
  released = time.monotonic()
  go(work)
  exit_code, log = finish(proc)
  report(f"{name} inside a compiled call (from the call's end)", time.monotonic() - released)
  assert exit_code == code, log
  assert newest(work) == 7  # where the call ended: nothing lost


def test_a_closed_terminal_saves_and_stops_as_at_sigterm(tmp_path):
  """The run's terminal closes (a closed window, a dropped SSH session) inside a
  compiled call: the kernel sends SIGHUP, the call ends, a checkpoint is saved
  there, the exit code is 42, and nothing fails writing to the lost terminal;
  the rerun resumes."""
  work = tmp_path / "work"
  os.makedirs(work)
  terminal, its_end = os.openpty()

  def take_the_terminal():  # in the child, a session leader: as a login shell's job
    fcntl.ioctl(1, termios.TIOCSCTTY, 0)
    # SIGHUP's default action, as in a terminal: a suite run under nohup (CI's
    # background shell) would pass it on ignored, and ctl then leaves it so.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

  proc = subprocess.Popen(
      [sys.executable, RESUME_TASK, "--workdir", str(work), "--out",
       str(tmp_path / "out.npz"), "--steps", "12", "--pause-in", "call", "--pause-at", "5"],
      cwd=ROOT, env=subprocess_env(None), stdin=its_end, stdout=its_end, stderr=its_end,
      start_new_session=True, preexec_fn=take_the_terminal)  # noqa: PLW1509
  os.close(its_end)
  try:
    # The whole line (the task writes its end apart): inside the call of steps
    # 4, 5 and 6, where the task waits, writing nothing more.
    seen, deadline = b"", time.monotonic() + 180
    while b"PAUSED call 5\r\n" not in seen and time.monotonic() < deadline:
      seen += os.read(terminal, 4096)
    assert b"PAUSED call 5\r\n" in seen, seen.decode(errors="replace")[-3000:]
  finally:
    os.close(terminal)  # the hang-up: SIGHUP to the terminal's session
  closed = time.monotonic()
  # ctl's thread answers the hang-up: the stop flagged, stderr to /dev/null,
  # SIGTERM to itself. The call ends only after that (else, on a loaded
  # machine, the stop could come in the next call, saved at step 8).
  deadline = time.monotonic() + 60
  while os.readlink(f"/proc/{proc.pid}/fd/2") != os.devnull and time.monotonic() < deadline:
    time.sleep(0.01)
  go(work)
  proc.wait(timeout=180)
  report("SIGHUP (closed terminal) inside a compiled call (from the hang-up)",
         time.monotonic() - closed)
  assert proc.returncode == ctl.PREEMPTED_EXIT_CODE
  assert newest(work) == 7  # where the call ended: nothing lost
  exit_code, log = finish(start(work))
  assert exit_code == 0 and newest(work) == 12, log
  assert "restored" in log


@contextlib.contextmanager
def overloaded():
  """Twice as many busy processes as CPUs, as on a loaded machine."""
  busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
          for _ in range(2 * (os.cpu_count() or 1))]
  try:
    yield
  finally:
    for proc in busy:
      proc.kill()
      proc.wait()


def second_ctrl_c_in_a_call(work, load=lambda: None):
  """Starts the run, pauses it inside the call of steps 4-6, presses Ctrl-C
  twice; returns the process and the time of the second.

  `load()` puts the machine under load once the run is paused: the calls
  before it, whose time per step the stopper's estimate of the call's end
  comes from, ran as they would on an idle machine, so which branch the
  second Ctrl-C takes (wait for the call, or quit at once) does not depend on
  how loaded the machine was while the step was traced. The load is left on
  (the caller's `ExitStack`) until the process has ended."""
  proc = start(work, "--pause-in", "call", "--pause-at", "5")
  wait_for(proc, "PAUSED call 5")
  load()
  proc.send_signal(signal.SIGINT)
  wait_for(proc, "ctl: Ctrl-C:")
  proc.send_signal(signal.SIGINT)
  return proc, time.monotonic()


def test_a_second_ctrl_c_waits_for_a_call_that_ends_soon_and_saves_it(tmp_path):
  work = tmp_path / "work"
  proc, sent = second_ctrl_c_in_a_call(work)
  wait_for(proc, "ctl: second Ctrl-C: the compiled call in flight ends in about")
  go(work)  # the call ends within the wait
  exit_code, log = finish(proc)
  report("a second SIGINT inside a compiled call that ends soon", time.monotonic() - sent)
  assert exit_code == ctl.INTERRUPTED_EXIT_CODE, log
  assert "ctl: second Ctrl-C: saved at the end of the compiled call; stopping." in log
  assert newest(work) == 7  # nothing lost
  assert not (work / ".ctl-lock").exists()


@pytest.mark.parametrize("load", ["idle", "overloaded"])
def test_a_second_ctrl_c_in_a_call_that_does_not_end_quits_within_the_wait(tmp_path, load):
  work = tmp_path / "work"
  with contextlib.ExitStack() as loads:
    proc, sent = second_ctrl_c_in_a_call(
        work, lambda: loads.enter_context(overloaded()) if load == "overloaded" else None)
    exit_code, log = finish(proc)  # without `go`: the call never finishes
    report(f"a second SIGINT inside a compiled call that does not end ({load})",
           time.monotonic() - sent)
  assert exit_code == ctl.INTERRUPTED_EXIT_CODE, log
  assert (f"the call did not end within {stopping.SECOND_CTRL_C_WAIT_SECONDS:g} s; "
          "without saving: the steps since "
          f"{os.path.join(str(work), 'checkpoints', 'ckpt-4')} are lost.") in log
  assert newest(work) == 4
  assert not (work / ".ctl-lock").exists()  # released on the way out


def test_a_second_ctrl_c_during_a_stuck_evaluation_saves_first(tmp_path):
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "eval", "--pause-at", "6")
  wait_for(proc, "PAUSED eval 6")  # never released: as a batch that never comes
  proc.send_signal(signal.SIGINT)
  wait_for(proc, "ctl: Ctrl-C: abandoning the Evaluate in progress, saving a checkpoint "
           "and stopping; press Ctrl-C again to quit at once, saving first.")
  sent = time.monotonic()
  proc.send_signal(signal.SIGINT)
  exit_code, log = finish(proc)
  report("a second SIGINT during a stuck evaluation", time.monotonic() - sent)
  assert exit_code == ctl.INTERRUPTED_EXIT_CODE, log
  assert "ctl: second Ctrl-C: quitting now; " in log and "ckpt-6 holds every step" in log
  assert newest(work) == 6  # the steps of this run are all saved


@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_during_evaluation_abandons_it(tmp_path, name):
  signum, code = SIGNALS[name]
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "eval", "--pause-at", "6")
  wait_for(proc, "PAUSED eval 6")  # in the first of 3 batches
  proc.send_signal(signum)
  wait_for(proc, f"ctl: {'Ctrl-C' if signum == signal.SIGINT else 'SIGTERM'}: abandoning "
           "the Evaluate in progress, saving a checkpoint and stopping")  # at once
  released = time.monotonic()
  go(work)
  exit_code, log = finish(proc)
  report(f"{name} during evaluation (from the batch's end)", time.monotonic() - released)
  assert exit_code == code, log
  assert "Evaluate abandoned at step 6 by a signal" in log
  assert newest(work) == 6
  assert not os.path.exists(work / "events" / "eval")  # no metrics of a partial evaluation
  # The rerun evaluates step 6 first: no hole in the curve (there used to be one).
  exit_code, log = finish(start(work, "--pause-in", "eval", "--pause-at", "6"))
  assert exit_code == 0, log
  assert "running again at step 6 what a stop abandoned there: Evaluate" in log
  assert [row.step for row in _metrics(work)] == [6, 12]


def test_a_stop_during_an_evaluation_reading_through_python_always_exits(tmp_path):
  """Each signal 10 times, at a random moment of an evaluation whose data come
  through a slow Python function; SIGTERM and SIGHUP sent again while the run
  exits. Each try is a process forked from one that imported TensorFlow
  (tests/signal_tries.py), exiting through the interpreter's own exit."""
  tries = subprocess.run(
      [sys.executable, os.path.join(ROOT, "tests", "signal_tries.py"), "--tries",
       "SIGTERM,SIGINT,SIGHUP", "--repeat", "10", "--again", "SIGTERM,SIGHUP", "--dir",
       str(tmp_path), "--", "--steps", "12", "--pause-in", "eval-python", "--pause-at", "1"],
      cwd=ROOT, env=subprocess_env(None), capture_output=True, text=True, timeout=900)
  records = [json.loads(line) for line in tries.stdout.splitlines()]
  assert len(records) == 30, tries.stderr[-3000:]
  codes = {"SIGTERM": ctl.PREEMPTED_EXIT_CODE, "SIGINT": ctl.INTERRUPTED_EXIT_CODE,
           "SIGHUP": ctl.PREEMPTED_EXIT_CODE}
  for record in records:
    assert record["exit"] == codes[record["signal"]], record
    assert "Evaluate abandoned at step 1 by a signal" in record["tail"], record
    assert newest(tmp_path / f"try-{record['try']}") == 1, record
  assert sum(record["again"] for record in records) == 20
  seconds = sorted(record["seconds"] for record in records)
  print(f"\ntime to stop, a signal during an evaluation reading through Python (30 tries): "
        f"median {seconds[15]:.2f} s, longest {seconds[-1]:.2f} s")


@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_during_a_stuck_evaluation_saves_from_another_thread(tmp_path, name):
  signum, code = SIGNALS[name]
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "eval", "--pause-at", "6")
  wait_for(proc, "PAUSED eval 6")  # never released: as a batch that never comes
  sent = time.monotonic()
  proc.send_signal(signum)
  exit_code, log = finish(proc)
  report(f"{name} during a stuck evaluation "
         f"(ctl.loop.stopping.STUCK_SECONDS = {stopping.STUCK_SECONDS:g})",
         time.monotonic() - sent)
  assert exit_code == code, log
  said = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
  assert f"ctl: {said}: the Evaluate did not return within 5 s" in log
  assert "ckpt-6 holds every step trained" in log
  assert newest(work) == 6
  assert not os.path.exists(work / "events" / "eval")  # no metrics of a partial evaluation


@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_during_a_save_lets_it_finish(tmp_path, name):
  signum, code = SIGNALS[name]
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "save", "--pause-at", "8")
  wait_for(proc, "PAUSED save 8")
  proc.send_signal(signum)
  released = time.monotonic()
  go(work)
  exit_code, log = finish(proc)
  report(f"{name} during a checkpoint save (from the save's end)", time.monotonic() - released)
  assert exit_code == code, log
  assert newest(work) == 8


@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_during_an_export_abandons_it(tmp_path, name):
  signum, code = SIGNALS[name]
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "export", "--pause-at", "6")
  wait_for(proc, "PAUSED export")
  sent = time.monotonic()
  proc.send_signal(signum)
  exit_code, log = finish(proc)  # without `go`: abandoned, not finished
  report(f"{name} during an export", time.monotonic() - sent)
  assert exit_code == code, log
  assert "Export abandoned at step 6 by a signal" in log
  assert newest(work) == 6
  assert [n for n in os.listdir(work / "export") if n.startswith(".")] == []


def test_sigkill_during_an_export_leaves_no_scratch_for_good(tmp_path):
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "export", "--pause-at", "6")
  wait_for(proc, "PAUSED export")
  proc.kill()
  finish(proc)
  scratch = [n for n in os.listdir(work / "export") if n.startswith(".generator-")]
  assert scratch, os.listdir(work / "export")  # the .keras file is in it
  proc = start(work)  # the same run again, without the pause
  exit_code, log = finish(proc)
  assert exit_code == 0, log
  assert [n for n in os.listdir(work / "export") if n.startswith(".")] == []
  assert newest(work) == 12


def test_a_failing_export_saves_the_steps_and_names_the_fix(tmp_path):
  work = tmp_path / "work"
  exit_code, log = finish(start(work, "--fail-export-at", "6"))  # ckpt-4 before it
  assert exit_code == 1, log
  assert f"OSError: could not export model 'generator' to {work / 'export'}: " in log, log
  assert "File too large" in log, log  # the kernel's EFBIG, in the message
  assert "ctl: Export failed at step 6; the steps trained are saved in" in log, log
  assert newest(work) == 6
  assert [n for n in os.listdir(work / "export") if n.startswith(".")] == []
  exit_code, log = finish(start(work))  # the same run, the disk fixed
  assert exit_code == 0, log
  assert "restored" in log and newest(work) == 12, log


def test_ctrl_c_between_calls(tmp_path):
  work = tmp_path / "work"
  proc = start(work, "--pause-in", "action", "--pause-at", "3")
  wait_for(proc, "PAUSED 3")
  sent = time.monotonic()
  proc.send_signal(signal.SIGINT)
  exit_code, log = finish(proc)  # without `go`
  report("SIGINT between calls", time.monotonic() - sent)
  assert exit_code == ctl.INTERRUPTED_EXIT_CODE, log
  assert "INTERRUPTED: Ctrl-C: saved a checkpoint at step 3; rerun the same command" in log
  assert newest(work) == 3


def test_a_second_writer_fails_at_once(tmp_path):
  work = tmp_path / "work"
  first = start(work, "--pause-at", "3")
  try:
    wait_for(first, "PAUSED 3")
    second = start(work)
    exit_code, log = finish(second)
    assert exit_code == 1, log
    assert re.search(rf"WorkdirInUse: workdir '{re.escape(str(work))}' is in use by process "
                     rf"{first.pid} on \S+ \(since .*resume_task.py", log), log
    assert "Stop that run first" in log
    go(work)
  finally:
    exit_code, log = finish(first)
  assert exit_code == 0, log  # the first run was not disturbed
  assert newest(work) == 12


def test_a_deleted_workdir_is_made_again(tmp_path):
  work = tmp_path / "work"
  exit_code, log = finish(start(work, "--delete-workdir-at", "6"))
  assert exit_code == 0, log
  assert f"workdir {work} disappeared (deleted or moved), noticed at step 8: made it" in log
  assert f"saved {work}/checkpoints/ckpt-8" in log
  assert sorted(n for n in os.listdir(work / "checkpoints") if n.endswith(".index")) == [
      "ckpt-12.index", "ckpt-8.index"]
  assert os.listdir(work / "events" / "train")  # written again


@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_while_waiting_for_peers_exits_at_once(tmp_path, name):
  signum, code = SIGNALS[name]
  ports = free_ports(2)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})}
  proc = start(tmp_path / "work", "--strategy", "multi_worker", env=env)
  wait_for(proc, f"ctl: waiting up to 600 s for the cluster's other tasks: worker 1 at "
           f"127.0.0.1:{ports[1]}")
  sent = time.monotonic()
  proc.send_signal(signum)
  exit_code, log = finish(proc)
  report(f"{name} at start-up", time.monotonic() - sent)
  del code  # nothing to save yet: the shell's code for the signal
  assert exit_code == 128 + signum, log
  assert f"{signal.Signals(signum).name} while waiting for the cluster's other tasks" in log


def test_a_missing_peer_times_out_naming_it(tmp_path):
  ports = free_ports(2)
  cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
  env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}),
         "CTL_STARTUP_TIMEOUT": "2"}
  exit_code, log = finish(start(tmp_path / "work", "--strategy", "multi_worker", env=env))
  assert exit_code == 1, log
  assert (f"ctl: gave up after waiting 2 s for the cluster's other tasks: worker 0 at "
          f"127.0.0.1:{ports[1]} never answered") in log


def test_a_refused_private_network_is_said_and_the_tasks_use_this_machines():
  # A user namespace of the test's own that allows no network namespace, as a
  # sysctl or a container's policy refuses them (the tasks: no TensorFlow needed).
  refuse = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "sh", "-c",
            'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"', "-"]
  if subprocess.run(refuse + ["true"], capture_output=True).returncode != 0:
    pytest.skip("no user namespace of the test's own here (unshare --user)")
  command = [sys.executable, "-m", "ctl.cli", "launch", "--workers", "2"]
  task = ["--", sys.executable, "-c", "print('trained')"]
  refused = "this system refuses a private network (unshare("
  auto = subprocess.run(refuse + command + task, cwd=ROOT, env=subprocess_env(None),
                        capture_output=True, text=True, timeout=120)
  assert auto.returncode == 0, auto.stderr
  assert f"ctl launch: warning: {refused}" in auto.stderr, auto.stderr
  assert "TensorFlow's servers listen on every interface" in auto.stderr
  assert auto.stdout.count("] trained") == 2, auto.stdout
  private = subprocess.run(refuse + command + ["--network", "private"] + task, cwd=ROOT,
                           env=subprocess_env(None), capture_output=True, text=True,
                           timeout=120)
  assert private.returncode == 127, private.stderr
  assert f"ctl launch: error: {refused}" in private.stderr, private.stderr
  assert "use --network shared behind a firewall" in private.stderr
  assert "trained" not in private.stdout and "started" not in private.stderr


def test_killing_the_launcher_stops_its_workers(tmp_path):
  work = tmp_path / "work"
  os.makedirs(work)
  # Each worker's stderr goes to a file named by its PID (`exec` keeps the
  # shell's): the launcher that would have carried it is killed.
  task = " ".join([sys.executable, RESUME_TASK, "--strategy", "multi_worker", "--workdir",
                   str(work), "--out", str(tmp_path / "out"), "--steps", "12", "--dropout",
                   "0", "--pause-at", "3", "--checkpoint-every", "100"])
  command = [sys.executable, "-m", "ctl.cli", "launch", "--workers", "2", "--grace", "60",
             "--", "sh", "-c", f'exec {task} 2> "{tmp_path}/stderr.$$"']
  launcher = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(None), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
  lines, paused, workers = [], set(), []
  try:
    for line in launcher.stdout:
      lines.append(line)
      paused.update(re.findall(r"^\[worker (\d)\] PAUSED 3$", line))
      if len(paused) == 2:
        break
    workers = [int(p) for p in re.findall(r"worker \d \(pid (\d+)\)", "".join(lines))]
    assert len(workers) == 2, "".join(lines)
    launcher.kill()
    killed = time.monotonic()
    # Go on once each worker has seen its launcher gone (and sent itself
    # SIGTERM, whose handler runs before the paused action next looks for `go`).
    deadline = killed + 60  # bounds on waits, not the claim (see the report)
    logs = [tmp_path / f"stderr.{pid}" for pid in workers]
    while not all("is gone; stopping (SIGTERM" in p.read_text() for p in logs):
      assert time.monotonic() < deadline, [p.read_text()[-2000:] for p in logs]
      time.sleep(0.05)
    go(work)
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
      time.sleep(0.05)
    report("workers after their launcher's SIGKILL", time.monotonic() - killed)
  finally:
    launcher.kill()
    launcher.wait()
    for pid in workers:
      if alive(pid):
        os.kill(pid, signal.SIGKILL)
  assert not any(alive(pid) for pid in workers)
  # TF's handler, told at step 3: both workers save after the next call, together.
  assert newest(work) == 6


# A checkpoint folder that is not quite right (in this process: the faults are
# in the files, not in the run). `base` is a finished run of 12 steps with
# ckpt-4, ckpt-8 and ckpt-12; each case copies it, changes it, and runs the
# same `fit(12)` again.

def _folder_runner():
  import toy_gan  # pylint: disable=import-outside-toplevel
  return ctl.Runner(toy_gan.make_step(), toy_gan.mlp_gan(toy_gan.FEATURES),
                    toy_gan.batches(toy_gan.normal_features(40, seed=5), repeat=True),
                    steps_per_loop=2)


def _folder_fit(work, total_steps=12):
  """(the step restored, the history) of `fit(total_steps)` in `work`."""
  runner = _folder_runner()
  history = runner.fit(total_steps, str(work), checkpoint=ctl.Checkpoint(ctl.Every(steps=4)),
                       progress=False)
  return (int(history.steps[0]) if len(history.steps) else total_steps), history


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  work = tmp_path_factory.mktemp("base") / "work"
  _folder_fit(work)
  return work


def _files(work):
  """{name: bytes} of every file under <work>/checkpoints, damaged/ included."""
  found = {}
  for folder, _, names in os.walk(work / "checkpoints"):
    for name in names:
      with open(os.path.join(folder, name), "rb") as f:
        found[name] = f.read()
  return found


def _cut(path, keep=0.5):
  with open(path, "r+b") as f:
    f.truncate(int(os.path.getsize(path) * keep))


def _overwrite_middle(path):
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.seek(size // 2)
    f.write(b"\xff" * min(64, size - size // 2))


def _remove(*paths):
  for path in paths:
    os.remove(path)


def _point_at(work, step):
  """The `checkpoint` file as an older copy of it reads: naming ckpt-`step` the newest."""
  (work / "checkpoints" / "checkpoint").write_text(
      f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n')


def _lock_of_a_live_run(work):
  """A lock file as a copy taken while the run went on holds: its holder lives."""
  with open(work / ".ctl-lock", "w") as f:
    json.dump({"host": os.uname().nodename, "pid": os.getppid(),
               "since": "earlier", "command": "the run copied"}, f)


CKPT = "checkpoints/ckpt-12"
DATA = ".data-00000-of-00001"
FOLDER_FAULTS = {  # name: (the change, the step restored, what the log says)
    "pointer missing": (lambda w: _remove(w / "checkpoints/checkpoint"), 12,
                        "checkpoint, which names the newest checkpoint, is missing"),
    "pointer unreadable": (lambda w: (w / "checkpoints/checkpoint").write_text("{{ half"), 12,
                           "checkpoint, which names the newest checkpoint, cannot be read"),
    # 0 bytes (a full disk, a copy cut short): TF's manager raised ValueError
    # ("Invalid checkpoint state") before anything was restored.
    "pointer empty": (lambda w: _cut(w / "checkpoints/checkpoint", 0), 12,
                      "checkpoint, which names the newest checkpoint, names none (an empty "
                      "file?)"),
    "pointer naming a missing checkpoint": (
        lambda w: _remove(w / (CKPT + ".index"), w / (CKPT + DATA)), 8,
        "ckpt-12 is skipped: its index file ckpt-12.index is not there"),
    "pointer set back (a stale copy)": (
        lambda w: _point_at(w, 4), 12,
        "names ckpt-4 as the newest checkpoint, but ckpt-8, ckpt-12 are newer"),
    "pointer set back, the newest damaged": (
        lambda w: (_point_at(w, 4), _cut(w / (CKPT + DATA))), 8,
        "ckpt-12 is skipped: OutOfRangeError"),
    "newest data truncated": (lambda w: _cut(w / (CKPT + DATA)), 8,
                              "ckpt-12 is skipped: OutOfRangeError"),
    "newest data overwritten": (lambda w: _overwrite_middle(w / (CKPT + DATA)), 8,
                                "ckpt-12 is skipped: DataLossError"),
    "newest index damaged": (lambda w: _overwrite_middle(w / (CKPT + ".index")), 8,
                             "ckpt-12 is skipped: "),
    "newest index empty": (lambda w: _cut(w / (CKPT + ".index"), 0), 8,
                           "ckpt-12 is skipped: "),
    # A valid checkpoint under a newer one's name (was: restored without a word as
    # step 4, and the next saves wrote over ckpt-8 and ckpt-12's names).
    "newest overwritten by an older one's files": (
        lambda w: [shutil.copyfile(w / f"checkpoints/ckpt-4{end}", w / (CKPT + end))
                   for end in (DATA, ".index")], 8,
        "ckpt-12 is skipped: it holds step 4, not 12 (renamed, or copied over by hand?)"),
    "finished_step missing": (lambda w: _remove(w / "checkpoints/finished_step"), 12, ""),
    "finished_step wrong": (lambda w: (w / "checkpoints/finished_step").write_text("8\n"), 12,
                            ""),
    "finished_step garbage": (lambda w: (w / "checkpoints/finished_step").write_text("x"), 12,
                              ""),
    "copied without its lock": (lambda w: None, 12, ""),
    "copied with the lock of the run going on": (_lock_of_a_live_run, 12,
                                                 "taking over the lock file left by"),
}


@pytest.mark.parametrize("fault", FOLDER_FAULTS)
def test_a_checkpoint_folder_not_quite_right_restores_the_best_and_deletes_nothing(
    fault, finished_run, tmp_path, caplog):
  change, expected, said = FOLDER_FAULTS[fault]
  work = tmp_path / "work"
  shutil.copytree(finished_run, work)
  assert not (work / ".ctl-lock").exists()  # released at the end of the run
  change(work)
  before = _files(work)
  with caplog.at_level("WARNING", logger="ctl"):
    restored, _ = _folder_fit(work)
  assert restored == expected, caplog.text
  assert said in caplog.text
  after = _files(work)
  assert set(before) <= set(after), sorted(set(before) - set(after))  # nothing deleted
  ckpts = lambda files: {n: v for n, v in files.items() if n.startswith("ckpt-")}  # noqa: E731
  if expected == 12:  # untouched
    assert ckpts(after) == ckpts(before)
  assert newest(work) == 12
  if expected == 8 and "not there" not in said:
    damaged = sorted(os.listdir(work / "checkpoints" / "damaged"))
    assert damaged == ["ckpt-12" + DATA, "ckpt-12.index"], damaged
  assert (work / "checkpoints" / "finished_step").read_text() == "12\n"
  # The next run takes it from here without a word.
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):
    assert _folder_fit(work, 16)[0] == 12
  assert "skipped" not in caplog.text and "checkpoint, which names" not in caplog.text


def test_going_back_to_an_older_checkpoint_sets_the_newer_aside(finished_run, tmp_path,
                                                                caplog):
  """`Checkpoint(resume_from=4)`: ckpt-8 and ckpt-12 are moved aside with the records
  as they were, the run trains from step 4, and a rerun with the same option resumes
  from its own newest; a step with no checkpoint is refused, naming those there."""
  work = tmp_path / "work"
  shutil.copytree(finished_run, work)
  before = {n: v for n, v in _files(work).items() if n.startswith("ckpt-")}
  history_before = (work / "history.jsonl").read_text()

  def fit(resume_from, total_steps=12):
    history = _folder_runner().fit(
        total_steps, str(work), progress=False,
        checkpoint=ctl.Checkpoint(ctl.Every(steps=4), resume_from=resume_from))
    return int(history.steps[0]) if len(history.steps) else total_steps

  with caplog.at_level("WARNING", logger="ctl"):
    assert fit(4) == 4
  aside = work / "checkpoints" / "after-ckpt-4"
  assert "resume_from=4: moved ckpt-8, ckpt-12 and the run's records" in caplog.text
  assert {n: v for n, v in _files(work).items() if n.startswith("ckpt-")
          and (aside / n).exists()} == {n: v for n, v in before.items() if "-4." not in n}
  assert (aside / "history.jsonl").read_text() == history_before
  assert (aside / "finished_step").read_text() == "12\n"
  assert checkpoints.newest(str(work), "after-ckpt-4").endswith("ckpt-12")  # ctl eval reads it
  assert newest(work) == 12 and (work / "checkpoints" / "finished_step").exists()
  caplog.clear()
  with caplog.at_level("WARNING", logger="ctl"):  # the same option, rerun: not again
    assert fit(4, 16) == 12
  assert "went back to ckpt-4 before" in caplog.text
  with pytest.raises(checkpoints.CheckpointError, match=r"resume_from=5: ckpt-5 of .* "
                     r"cannot be restored \(it is not there\); the checkpoints there are of "
                     r"steps 8, 12, 16"):
    fit(5, 16)
  assert newest(work) == 16  # nothing moved


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (a disk that fills): root")
def test_a_save_that_fills_the_disk_leaves_no_partial_files(tmp_path):
  """ckpt-8 saved onto a disk with 0, 1, ... pages free beyond what ckpt-4 uses: each
  save fails somewhere (TF's first write, its index, its merge of the two, the
  `checkpoint` file) until it fits. After each failure no file of ckpt-8 is left
  (the merge's left a data file as large as the checkpoint, which filled the disk
  again at the next save), and `checkpoint` still names ckpt-4."""
  disk = tmp_path / "disk"
  disk.mkdir()
  subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
  try:
    runner = _folder_runner()
    directory = str(disk / "checkpoints")
    checkpointer = checkpoints.Checkpointer(runner.placement, runner.state, runner.feed,
                                            directory)
    runner.state.global_step.assign(4)
    checkpointer.save()
    stat = os.statvfs(disk)
    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    failed_in = []
    for pages in range(12):
      subprocess.run(["mount", "-o", f"remount,size={used + pages * stat.f_frsize}",
                      str(disk)], check=True)
      runner.state.global_step.assign(8)
      try:
        checkpointer.save()
      except OSError as e:
        failed_in.append(re.search(r"\[Op:(\w+)\]|(checkpoint\.tmp)", str(e)).group(0))
        assert "Its partial files were removed" in str(e) or "written whole" in str(e), e
        left = [n for n in os.listdir(directory) if n.startswith(("ckpt-8", "checkpoint."))]
        assert left == [] or "written whole" in str(e), (left, e)
        assert checkpoints.newest(str(disk)).endswith("ckpt-8" if left else "ckpt-4")
        continue
      break
    assert "[Op:MergeV2Checkpoints]" in failed_in, failed_in
    assert checkpoints.newest(str(disk)).endswith("ckpt-8")  # saved once the disk had room
  finally:
    subprocess.run(["umount", str(disk)], check=False)


def test_checkpoints_found_without_the_pointer_file_are_kept_as_before(finished_run,
                                                                       tmp_path):
  """`keep` goes on as if the file had never gone: the oldest goes when a new one comes."""
  work = tmp_path / "work"
  shutil.copytree(finished_run, work)
  os.remove(work / "checkpoints" / "checkpoint")
  assert _folder_fit(work, 16)[0] == 12
  assert sorted(n for n in os.listdir(work / "checkpoints") if n.endswith(".index")) == [
      "ckpt-12.index", "ckpt-16.index", "ckpt-8.index"]


def test_evaluating_a_folder_with_a_damaged_newest_restores_the_one_before_untouched(
    finished_run, tmp_path, caplog):
  """`Runner.restore` (`ctl eval`, `ctl export`) reads, never moves: a run may hold the folder."""
  work = tmp_path / "work"
  shutil.copytree(finished_run, work)
  _cut(work / (CKPT + DATA))
  before = _files(work)
  with caplog.at_level("WARNING", logger="ctl"):
    assert _folder_runner().restore(str(work)) == 8
  assert "ckpt-12 is skipped: OutOfRangeError" in caplog.text
  assert _files(work) == before


def test_evaluating_a_folder_with_an_empty_pointer_file_restores_the_newest_untouched(
    finished_run, tmp_path, caplog):
  """An empty `checkpoint` file (was: TF's ValueError "Invalid checkpoint state"
  when the runner opened the folder) is read as a missing one, and left as it is."""
  work = tmp_path / "work"
  shutil.copytree(finished_run, work)
  _cut(work / "checkpoints" / "checkpoint", 0)
  before = _files(work)
  with caplog.at_level("WARNING", logger="ctl"):
    assert _folder_runner().restore(str(work)) == 12
  assert "names none (an empty file?)" in caplog.text
  assert _files(work) == before


@pytest.mark.parametrize("fault", ["every checkpoint damaged", "pointer naming gone files"])
def test_no_readable_checkpoint_is_refused_and_nothing_is_touched(fault, finished_run,
                                                                 tmp_path):
  work = tmp_path / "work"
  shutil.copytree(finished_run, work)
  for step in (4, 8, 12):
    if fault == "every checkpoint damaged":
      _cut(work / f"checkpoints/ckpt-{step}{DATA}")
    else:
      _remove(*(work / f"checkpoints/ckpt-{step}{end}" for end in (DATA, ".index")))
  before = _files(work)
  with pytest.raises(ValueError) as raised:
    _folder_fit(work)
  message = str(raised.value)
  if fault == "every checkpoint damaged":
    assert re.search(r"no checkpoint in \S+ can be read: ckpt-12: OutOfRangeError.*; "
                     r"ckpt-8: .*; ckpt-4: .*Nothing was deleted", message), message
  else:
    assert "checkpoint names the checkpoint" in message and "delete" in message, message
  assert _files(work) == before


def test_evaluation_data_of_unknown_length_that_never_ends_is_cut_with_a_warning(
    tmp_path, caplog, monkeypatch):
  from ctl.parts import evaluation  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(evaluation, "UNKNOWN_LENGTH_BATCHES", 7)
  import toy_gan  # pylint: disable=import-outside-toplevel
  features = toy_gan.normal_features(40, seed=5)
  never_ends = toy_gan.batches(features, repeat=True).filter(lambda batch: True)
  ends = toy_gan.batches(features).filter(lambda batch: True)  # 5 batches
  assert int(never_ends.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)

  def eval_step(ctx, batch):
    return {"mean": ctx.average(tf.reduce_mean(batch, axis=1))}

  runner = _folder_runner()
  with caplog.at_level("WARNING", logger="ctl"):
    runner.evaluate(eval_step, ends)
  assert "UNKNOWN_LENGTH_BATCHES" not in caplog.text  # read to its end, no word
  with caplog.at_level("WARNING", logger="ctl"):
    history = runner.fit(4, str(tmp_path / "work"), progress=False,
                         actions=[ctl.Evaluate(eval_step, never_ends, ctl.Every(steps=2))])
  assert len(history.steps) == 4
  said = [r.getMessage() for r in caplog.records if "UNKNOWN_LENGTH_BATCHES" in r.getMessage()]
  assert len(said) == 2, said  # at steps 2 and 4
  assert "had not ended after 7 batches" in said[0] and "num_batches=N" in said[0]
  assert "data.take(N)" in said[0]


def test_evaluation_data_that_yields_nothing_for_long_is_said(caplog, monkeypatch):
  import time as clock  # pylint: disable=import-outside-toplevel

  from ctl.parts import evaluation  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(evaluation, "QUIET_SECONDS", 0.3)

  def slow():  # as a filter that matches little: a long wait, then batches
    clock.sleep(1.5)
    yield from np.zeros((2, 8, 4), "float32")

  data = tf.data.Dataset.from_generator(slow, output_signature=tf.TensorSpec((8, 4)))

  def eval_step(ctx, batch):
    return {"mean": ctx.average(tf.reduce_mean(batch, axis=1))}

  with caplog.at_level("WARNING", logger="ctl"):
    assert _folder_runner().evaluate(eval_step, data) == {"mean": 0.0}
  said = [r.getMessage() for r in caplog.records if "no batch from" in r.getMessage()]
  assert len(said) == 1, said  # once per evaluation
  assert said[0].startswith("evaluate: no batch from the evaluation data for 0.3 s after 0 "
                            "batches (a filter that matches nothing?")


def test_the_matrix_lists_every_test_here_and_every_cell():
  here = {name for name in globals() if name.startswith("test_")}
  listed = {cell.test for cell in MATRIX if cell.test and "::" not in cell.test}
  assert listed == here - {"test_the_matrix_lists_every_test_here_and_every_cell"}, (
      sorted(here - listed))
  for cell in MATRIX:  # "test_x.py::name": a test of another file
    if cell.test and "::" in cell.test:
      module, name = cell.test.split("::")
      assert hasattr(importlib.import_module(module[:-len(".py")]), name), cell.test
  for cell in MATRIX:
    assert cell.phase in PHASES + ("(any other)",), cell
    assert bool(cell.test) == bool(cell.exit_code), cell
