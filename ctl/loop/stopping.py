"""How `fit` stops: SIGTERM, Ctrl-C and SIGHUP end a run within a bounded time, saved.

    stopper = Stopper(runner.placement, session)   # `fit` makes one per run
    results = compiled_step.run(n)
    stopper.check(step)                       # saves and raises if a signal came
    with stopper.abandonable():               # an evaluation, samples, an export
      action(context)
    stopper.close()

SIGTERM saves and exits with 42 (`Preempted`), Ctrl-C saves and raises
`Interrupted`, SIGHUP is taken as SIGTERM; docs/outer-loop.md ("Stopping")
tells the whole behaviour, second signals included.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import tensorflow as tf

from ctl.base import _tf_internal
from ctl.base.constants import INTERRUPTED_EXIT_CODE
from ctl.base.constants import PREEMPTED_EXIT_CODE
from ctl.loop import notebook

if TYPE_CHECKING:
  from ctl.distribute.placement import Placement
  from ctl.loop.session import Session

# How long an action may go on after a signal before ctl saves and exits from
# another thread: Python cannot abandon an action stuck in TensorFlow.
STUCK_SECONDS = 5.0
# How long a second Ctrl-C inside a compiled call waits for the call to end, to
# save its steps, when the calls so far say it ends by then.
SECOND_CTRL_C_WAIT_SECONDS = 3.0
_log = logging.getLogger("ctl")


class Preempted(SystemExit):
  """Raised after the checkpoint that follows a SIGTERM; exits the program with 42."""

  def __init__(self, step: int, saved: bool = True):
    super().__init__(PREEMPTED_EXIT_CODE)
    self.step = step
    self.saved = saved
    _log.warning("%s", self)

  def __str__(self) -> str:
    saved = "saved a checkpoint" if self.saved else "stopped (no workdir, nothing saved)"
    return (f"SIGTERM: {saved} at step {self.step}; exiting with code "
            f"{PREEMPTED_EXIT_CODE}. Rerun the same command to resume.")


class Interrupted(KeyboardInterrupt):
  """Raised after the checkpoint that follows a Ctrl-C (SIGINT)."""

  def __init__(self, step: int, saved: bool = True):
    saved = (f"saved a checkpoint at step {step}; rerun the same command to resume"
             if saved else f"stopped at step {step} (no workdir, nothing saved)")
    super().__init__(f"Ctrl-C: {saved}.")
    self.step = step


class Abandoned(Exception):
  """An action was cut short by a signal (`Stopper.abandonable`)."""


class Stopper:
  """Watches SIGTERM, SIGINT and SIGHUP during `fit`. `session` saves; None saves
  nothing, and SIGTERM then keeps its default action (ending the process at once).
  """

  def __init__(self, placement: Placement, session: Session | None, *,
               steps_per_loop: int = 1):
    self._placement = placement
    self.session = session
    self._steps_per_loop = steps_per_loop
    self._sigterm = self._sigint = False
    self._abandonable = False
    self._doing = None  # the action in progress, for the line a signal prints
    self._seen = {}  # signal: the work in progress as it came (for its line)
    self._seeing = threading.RLock()
    self._left = threading.Event()  # set outside an abandonable action
    self._left.set()
    self._saving = threading.Lock()  # the main thread's save, or a signal thread's
    self._call = None  # (steps, start time) of the compiled call in flight
    self._seconds_per_step = None  # of the last compiled call
    self._call_ended = threading.Event()
    self._quitting = False  # a second Ctrl-C: save after the call, then stop
    self._exiting = False  # Preempted was raised: the process exits with 42
    self.before_exit: Callable[[], None] | None = None  # before a thread ends the process
    self._previous = {}
    self._tf_handler = None
    self._wakeup = None
    if threading.current_thread() is not threading.main_thread():
      return  # Python delivers signals to the main thread only
    if session is not None and _tf_handler_applies(self._placement):
      self._previous[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)
      self._tf_handler = _TFHandler(self._placement, session)
      tf_sigterm = signal.getsignal(signal.SIGTERM)  # sets TF's own flag
      self._catch(signal.SIGTERM, lambda signum, frame: (tf_sigterm(signum, frame),
                                                         self._on_signal(signum)))
    elif session is not None:
      self._catch(signal.SIGTERM, lambda signum, frame: self._on_signal(signum))
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # e.g. a background job
      self._catch(signal.SIGINT, lambda signum, frame: self._on_signal(signum))
    # SIGHUP (a closed terminal): as SIGTERM, sent by `_hang_up`; `nohup`'s ignore stays.
    self._terminals = []  # stdout and stderr where they are the terminal
    if session is not None and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
      self._terminals = [fd for fd in (1, 2) if _is_terminal(fd)]
      # Detached at once in the main thread too, before it writes again.
      self._catch(signal.SIGHUP, lambda signum, frame: self._detach())
    if self._previous:
      self._wakeup = _Wakeup(self._on_signal_now)

  def check(self, step: int, then: Callable[[], object] | None = None) -> None:
    """After a compiled call or an action: if a signal came, saves, runs `then`
    (the work due at this step, which a further signal abandons) and raises."""
    preempted = self._tf_handler is not None and self._tf_handler.check()  # saved
    sigterm = self._sigterm and self._tf_handler is None
    sigterm, sigint = agree(self._placement, [sigterm, self._sigint])
    if not (preempted or sigterm or sigint):
      return
    saved = self.session is not None
    if saved and not preempted:
      with self._saving:
        self.session.save("signal")
    if self._quitting:  # a second Ctrl-C came during the call: no actions
      _write("ctl: second Ctrl-C: saved at the end of the compiled call; stopping." if saved
             else "ctl: second Ctrl-C: stopping at the end of the compiled call (no "
             "workdir: nothing saved).")
    elif then is not None:
      self._sigterm = self._sigint = False  # only a new signal abandons `then`
      with contextlib.suppress(Abandoned), self.abandonable():
        then()
    if preempted or sigterm:
      raise self._preempted(step, saved)
    raise Interrupted(step, saved)

  def check_after_end(self, step: int) -> None:
    """After the end's actions: the end saved; exit as the signal asks."""
    saved = self.session is not None  # always, with TF's handler
    if self._sigterm or (self._tf_handler is not None and self._tf_handler.received()):
      raise self._preempted(step, saved)
    if self._sigint:
      raise Interrupted(step, saved)

  @contextlib.contextmanager
  def in_call(self, num_steps: int) -> Iterator[None]:
    """Around a compiled call of `num_steps` steps: a second Ctrl-C inside it
    waits for its end if the calls so far say it comes soon (`_quit`)."""
    self._call_ended.clear()
    self._call = (num_steps, time.monotonic())
    try:
      yield
    finally:
      seconds = time.monotonic() - self._call[1]
      if num_steps:
        self._seconds_per_step = seconds / num_steps
      self._call = None
      self._call_ended.set()

  @contextlib.contextmanager
  def abandonable(self, what: str = "action") -> Iterator[None]:
    """Inside: a signal abandons the work `what` at once (`Abandoned`), in one
    process. One that lands in a callback (a weakref's, a `__del__`), where
    Python drops the exception, lets the work finish; the run stops after it."""
    # Only where no other worker waits on the action.
    self._abandonable = bool(self._previous) and self._placement.workers == 1
    previous_hook = sys.unraisablehook

    def hook(unraisable):
      if isinstance(unraisable.exc_value, Abandoned):
        _write("ctl: the signal came inside a callback: stopping after the work "
               "in progress.")
      else:
        previous_hook(unraisable)

    sys.unraisablehook = hook
    self._doing = what
    self._left.clear()
    try:
      if self._abandonable and (self._sigterm or self._sigint):
        raise Abandoned()  # it came just before
      yield
    finally:
      self._abandonable = False
      self._doing = None
      self._left.set()
      sys.unraisablehook = previous_hook

  def close(self) -> None:
    """Puts back the previous handlers; after `Preempted`, a further SIGTERM or
    SIGHUP (a closed terminal often sends two) is ignored, so that 42 stays."""
    for signum, handler in self._previous.items():
      if self._exiting and signum in (signal.SIGTERM, signal.SIGHUP):
        handler = already_stopping
      signal.signal(signum, handler)
    self._previous = {}
    if self._wakeup is not None:
      self._wakeup.close()
    if self._tf_handler is not None:
      self._tf_handler.close()

  def _preempted(self, step, saved=True):
    self._exiting = True
    # Python's exit sets the signals it handles back to their default action, so
    # a SIGTERM or SIGHUP then would still end the process by that signal.
    atexit.unregister(_ignore_further_signals)  # once, however many fits a process runs
    atexit.register(_ignore_further_signals)
    return Preempted(step, saved)

  def _catch(self, signum, handler):
    self._previous.setdefault(signum, signal.getsignal(signum))
    signal.signal(signum, handler)

  def _on_signal(self, signum):
    # Runs in the main thread between two Python operations: at once during
    # an action, only after it returns during a compiled call.
    if signum == signal.SIGTERM:
      self._sigterm = True
    else:
      self._sigint = True
    self._see(signum)  # before the action is left, for the thread's line
    if self._abandonable:
      self._abandonable = False
      raise Abandoned()

  def _on_signal_now(self, signum, count):
    # Runs in a thread as the signal arrives, even during a compiled call.
    if signum == signal.SIGHUP:
      if count == 1:
        self._hang_up()
      return
    if signum == signal.SIGINT:
      self._sigint = True
      if count > 1:
        self._quit()
    if count == 1:
      self._say(signum)
      doing, abandonable = self._see(signum)
      if doing is not None and abandonable and self.session is not None:
        threading.Thread(target=self._stop_if_stuck, args=(doing, signum), daemon=True,
                         name="ctl-stuck").start()

  def _hang_up(self):
    # The flag first: the call in flight ends with the save, however late SIGTERM comes.
    self._sigterm = True
    self._detach()
    _write("ctl: SIGHUP (the terminal closed): stopping as at SIGTERM.")
    os.kill(os.getpid(), signal.SIGTERM)

  def _detach(self):
    """stdout and stderr, where they were the lost terminal, to /dev/null."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
      for fd in self._terminals:
        os.dup2(null, fd)
    finally:
      os.close(null)

  def _save_from_thread(self):
    try:
      with self._saving:
        path = self.session.save("signal, from a thread")
      return f"{path} holds every step trained"
    except Exception as e:  # pylint: disable=broad-except
      return f"the save failed ({e}); the steps since {self.session.latest} are lost"

  def _stop_if_stuck(self, doing, signum):
    """After a signal in an action that does not return within `STUCK_SECONDS`:
    saves from this thread and ends the process (a notebook's kernel is kept)."""
    if self._left.wait(STUCK_SECONDS):
      return  # the action ended: the main thread saves and stops
    said = self._save_from_thread()
    name, code = (("SIGTERM", PREEMPTED_EXIT_CODE) if signum == signal.SIGTERM else
                  ("Ctrl-C", INTERRUPTED_EXIT_CODE))
    stuck = (f"ctl: {name}: the {doing} did not return within {STUCK_SECONDS:g} s (stuck "
             f"in TensorFlow? evaluation data that never yields a batch?); saved from "
             f"another thread: {said}")
    if notebook.in_notebook():
      _write(f"{stuck}. A notebook's kernel is kept: the cell stops when the {doing}'s "
             "call returns; restart the kernel to stop it now (nothing is lost).")
      return
    _write(f"{stuck}; exiting with code {code}.")
    self._exit(code)

  def _quit(self):
    """A second Ctrl-C (from the signal's thread): quits within a bound. In an
    action, saves first; in a compiled call (whole only at its end), waits for
    its end if it comes within `SECOND_CTRL_C_WAIT_SECONDS`. Keeps a notebook's kernel."""
    call, quitting = self._call, self._quitting
    if call is not None:
      self._quitting = True  # the main thread skips the actions due after the call
    if self.session is None:
      kept, said = "stops after the compiled call in flight", ", without saving (no workdir)"
    elif self._doing is not None and self._abandonable:  # at rest: this thread may save
      saved = self._save_from_thread()
      kept = f"{saved}; the cell stops when the {self._doing}'s TensorFlow call returns"
      said = f"; {saved}"
    else:
      lost = f"the steps since {self.session.latest or 'the start'} are lost"
      said = f", without saving: {lost}"
      if call is None or quitting:  # a save in progress, or a third Ctrl-C in a call
        kept = "the cell stops after the work in progress (restarting the kernel stops it now)"
      else:
        steps, started = call
        left = (None if self._seconds_per_step is None else
                self._seconds_per_step * steps - (time.monotonic() - started))
        kept = ("the compiled call in flight ends" + (
            f" in about {max(left, 0):.0f} s" if left is not None else
            f" (at most {steps} step{'s' if steps != 1 else ''})") + ", then a checkpoint "
            "is saved and the cell stops "
            f"(restarting the kernel stops it now: {lost})")
        if left is not None and left <= SECOND_CTRL_C_WAIT_SECONDS and not notebook.in_notebook():
          _write(f"ctl: second Ctrl-C: the compiled call in flight ends in about "
                 f"{max(left, 0):.1f} s: saving its steps then, and stopping (waiting at "
                 f"most {SECOND_CTRL_C_WAIT_SECONDS:g} s; Ctrl-C again to quit now).")
          if self._call_ended.wait(SECOND_CTRL_C_WAIT_SECONDS):
            return  # the main thread saves and stops
          said = (f": the call did not end within {SECOND_CTRL_C_WAIT_SECONDS:g} s; "
                  f"without saving: {lost}")
    if not self._keep_kernel(kept):
      self._quit_now(said)

  def _keep_kernel(self, what):
    """True in a notebook, whose kernel is kept, saying `what` happens instead."""
    if not notebook.in_notebook():
      return False
    _write(f"ctl: second Ctrl-C: a notebook's kernel is kept: {what}.")
    return True

  def _quit_now(self, said):
    _write(f"ctl: second Ctrl-C: quitting now{said}.")
    self._exit(INTERRUPTED_EXIT_CODE)

  def _exit(self, code):
    if self.before_exit is not None:  # waited for at most a second: ending is bounded
      done = threading.Thread(target=_quietly, args=(self.before_exit,), daemon=True)
      done.start()
      done.join(1.0)
    os._exit(code)  # pylint: disable=protected-access

  def _see(self, signum):
    """Notes the work in progress as `signum` came, once, from the handler or the
    thread; only the thread writes (the handler may interrupt a stderr write)."""
    with self._seeing:
      return self._seen.setdefault(signum, (self._doing, self._abandonable))

  def _say(self, signum):
    """The line a signal prints: what will happen, given the work in progress."""
    doing, abandonable = self._see(signum)
    at_rest = doing is not None and abandonable
    saving = self.session is not None
    if signum == signal.SIGINT:
      name = "Ctrl-C"
      again = ("; press Ctrl-C again to quit at once" + (
          ", saving first" if at_rest and saving else
          ", losing the steps since the last checkpoint" if saving else ""))
    else:
      name, again = "SIGTERM", f"; then exiting with code {PREEMPTED_EXIT_CODE}"
    stop = "saving a checkpoint and stopping" if saving else "stopping"
    if at_rest:
      when = f"abandoning the {doing} in progress, {stop}"
    elif doing is not None:  # collective: the other workers are in it too
      when = f"{stop} after the {doing} in progress"
    else:
      call = self._call  # fit cuts calls to land on saves and actions
      n = call[0] if call else self._steps_per_loop
      when = (f"when the compiled call in flight ends (at most {n} step"
              f"{'s' if n != 1 else ''}): "
              f"{'saving a checkpoint, then ' if saving else ''}running the actions "
              "due at that step (a second signal skips them), then stopping")
    _write(f"ctl: {name}: {when}{again}.")


def already_stopping(signum: int, frame: object) -> None:
  """SIGTERM or SIGHUP after `Preempted` is let go (a function, not SIG_IGN,
  which would read as `nohup` to whatever handles signals next in this process)."""
  del signum, frame


def _ignore_further_signals():
  for signum in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)


def agree(placement: Placement, flags: Sequence[bool]) -> list[bool]:
  """Each flag True on every worker if it is on any: collective work (a save, an
  evaluation, stopping) runs on all of them or none, whatever their clocks say."""
  if not flags or placement.workers <= 1:
    return list(flags)  # one process decides (with parameter servers, the coordinator)
  strategy = placement.strategy
  votes = tf.constant([int(f) for f in flags], tf.int32)
  values = strategy.experimental_distribute_values_from_function(lambda _: votes)
  return list(strategy.reduce("SUM", values, axis=None).numpy() > 0)


def _quietly(fn):
  with contextlib.suppress(Exception):
    fn()


def _is_terminal(fd):  # a seam for tests
  return os.isatty(fd)


def _write(line):
  # Through tqdm's lock, as the "ctl" logger's lines (`ctl.cli`), so that a signal's
  # line, written from the signal thread, never lands inside one of theirs.
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  tqdm.write(line, file=sys.stderr)
  sys.stderr.flush()


class _Wakeup:
  """Calls `on_signal(signum, count so far)` from a thread as each caught signal
  arrives, even during a compiled call (no Python handler runs then): Python's
  C-level handler writes it to the wakeup fd, and TF releases the GIL in a call."""

  def __init__(self, on_signal):
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self._counts = {}
    self._on_signal = on_signal
    self._thread = threading.Thread(target=self._run, name="ctl-sigint", daemon=True)
    self._thread.start()

  def _run(self):
    with contextlib.suppress(OSError):
      while data := os.read(self._read, 64):  # until end-of-file
        for signum in data:
          if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._counts[signum] = self._counts.get(signum, 0) + 1
            self._on_signal(signum, self._counts[signum])

  def close(self):
    signal.set_wakeup_fd(self._previous)
    os.close(self._write)  # the thread reads what is left, then end-of-file
    self._thread.join(15)  # so a signal's line is out before `fit` returns
    os.close(self._read)


_cluster_handler_made = False  # TF's handler works once per cluster and process


def _tf_handler_applies(placement):
  """Whether TF's PreemptionCheckpointHandler serves here: a multi-worker cluster,
  not GCE (it watches the metadata server instead of SIGTERM), first handler of
  the process (a second finds its coordination keys set); else ctl catches SIGTERM."""
  return bool(placement.kind.multi_process and placement.in_cluster
              and _tf_internal.on_internal_platform() and not _cluster_handler_made)


class _TFHandler:
  """TF's PreemptionCheckpointHandler: workers agree on the step to save at (its
  SIGTERM flag and watcher threads are read through `ctl.base._tf_internal`)."""

  def __init__(self, placement, session):
    global _cluster_handler_made
    self._exited = False

    def exit_fn():  # after its save; the Stopper then exits
      self._exited = True

    config = tf.distribute.experimental.TerminationConfig(
        exit_fn=exit_fn, save_fn=lambda: session.save("preemption"))
    # It restores from this manager: the chief's directory, on every worker.
    self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        placement.resolver, session.restore_manager,
        termination_config=config)
    _cluster_handler_made = True

  def check(self):
    """Whether TF's handler saved the checkpoint of a preemption now."""
    self._exited = False
    self._handler.save_checkpoint_if_preempted()
    return self._exited

  def received(self):
    return _tf_internal.preemption_handler_received_sigterm(self._handler)

  def close(self):
    _tf_internal.stop_preemption_handler_threads(self._handler)
