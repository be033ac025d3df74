"""ctl: custom training loops over several models, one code path for every strategy.

    import ctl
    strategy = ctl.make_strategy("mirrored", logical_cpus=2)   # first, before other TF work
    runner = ctl.Runner(step, build, dataset, strategy=strategy, steps_per_loop=10)
    history = runner.train(1000)               # or, resumable, with checkpoints:
    runner.fit(10_000, "runs/x", actions=[ctl.Samples(show, ctl.Every(steps=500))])

`step(ctx, batch)` is the per-replica step the user writes; `ctx` is a
`StepContext` (global-batch loss averaging, updates, replica-invariant noise).
"""

import importlib as _importlib
import logging as _logging
import typing as _typing

# The public names and the module of each. They load on first use, so that
# `import ctl` (and the `ctl` command's --help) does not import TensorFlow.
_EXPORTS = {
    "Runner": "ctl.runner", "StepContext": "ctl.context",
    "make_strategy": "ctl.strategies", "choose_strategy": "ctl.strategies",
    "configure_logical_cpus": "ctl.strategies", "STRATEGY_NAMES": "ctl.strategies",
    "worker": "ctl.strategies", "Worker": "ctl.strategies",
    "Action": "ctl.actions", "FitContext": "ctl.actions",
    "Every": "ctl.schedule", "Checkpoint": "ctl.checkpoints", "Summaries": "ctl.actions",
    "Samples": "ctl.actions", "Evaluate": "ctl.actions", "Export": "ctl.actions",
    "Profile": "ctl.actions", "BestCheckpoints": "ctl.actions",
    "PREEMPTED_EXIT_CODE": "ctl.constants", "INTERRUPTED_EXIT_CODE": "ctl.constants",
    "Preempted": "ctl.stopping", "Interrupted": "ctl.stopping",
    "WorkdirInUse": "ctl.workdir", "SharedVariableWarning": "ctl.state",
    "History": "ctl.history", "EachStep": "ctl.history", "read_history": "ctl.history",
}
_RENAMED = {"STRATEGY_NAMES": "NAMES"}


def __getattr__(name: str) -> _typing.Any:
  if name in _EXPORTS:
    value = getattr(_importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
  else:  # a submodule, e.g. ctl.checkpoints
    try:
      value = _importlib.import_module(f"ctl.{name}")
    except ModuleNotFoundError as e:
      if e.name != f"ctl.{name}":  # the submodule exists but an import inside it failed
        raise
      raise AttributeError(f"module 'ctl' has no attribute {name!r}") from None
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_EXPORTS))


# A library leaves output to the application: ctl logs to the "ctl" logger,
# which the `ctl` command (ctl/cli) and the examples show on stderr.
_logging.getLogger("ctl").addHandler(_logging.NullHandler())

__all__ = ["Runner", "StepContext", "make_strategy", "choose_strategy",
           "configure_logical_cpus", "STRATEGY_NAMES", "worker", "Worker", "Action",
           "FitContext",
           "Every", "Checkpoint",
           "Summaries", "Samples", "Evaluate", "Export", "Profile", "BestCheckpoints",
           "PREEMPTED_EXIT_CODE",
           "INTERRUPTED_EXIT_CODE", "Preempted", "Interrupted", "WorkdirInUse",
           "SharedVariableWarning",
           "History", "EachStep", "read_history"]
