"""ctl: custom training loops over several models, one code path for every strategy.

    import ctl
    strategy = ctl.make_strategy("mirrored", logical_cpus=2)   # first, before other TF work
    runner = ctl.Runner(train_step, build, dataset, strategy=strategy, steps_per_loop=10)
    history = runner.train(1000)               # or, resumable, with checkpoints:
    runner.fit(10_000, "runs/x", actions=[ctl.Samples(show, ctl.Every(steps=500))])

`train_step(ctx, batch)` is the per-replica step the user writes (the step
function, `step_fn` in signatures; `ctx.step` is the step's number); `ctx` is a
`StepContext` (global-batch loss averaging, updates, replica-invariant noise).
"""

import importlib as _importlib
import logging as _logging
import typing as _typing

# The public names and the module of each, by its short name (`_MODULES`). They
# load on first use, so that `import ctl` (and the `ctl` command's --help) does
# not import TensorFlow.
_EXPORTS = {
    "Runner": "runner", "StepContext": "context", "make_strategy": "strategies",
    "choose_strategy": "distribute.cluster", "configure_logical_cpus": "strategies",
    "STRATEGY_NAMES": "strategies", "worker": "strategies", "Worker": "distribute.placement",
    "Action": "actions", "FitContext": "actions", "Every": "schedule",
    "Checkpoint": "checkpoints", "Summaries": "actions", "Samples": "actions",
    "Evaluate": "actions", "Export": "actions", "Profile": "actions",
    "BestCheckpoints": "actions", "PREEMPTED_EXIT_CODE": "constants",
    "INTERRUPTED_EXIT_CODE": "constants", "Preempted": "stopping", "Interrupted": "stopping",
    "WorkdirInUse": "workdir", "CheckpointError": "checkpoints",
    "SharedVariableWarning": "state", "History": "history",
    "EachStep": "history", "read_history": "history",
    "Logger": "loggers", "MLflow": "loggers", "WandB": "loggers",
}


# Each module's short name, `ctl.<name>`, for its home in a subpackage
# (ctl/loop, ctl/parts, ctl/step, ctl/distribute, ctl/tools, ctl/base), as an
# attribute: `ctl.parity.check`, `from ctl import parity`. (`import ctl.parity`
# would need an import hook, and importing ctl changes no global state;
# an import statement names the home: `from ctl.tools.parity import check`.)
# `ctl.loop` is the outer loop's package (its modules: `from ctl.loop import fit`).
_MODULES = {
    "actions": "ctl.loop.actions", "checkpoints": "ctl.loop.checkpoints",
    "stopping": "ctl.loop.stopping", "workdir": "ctl.loop.workdir",
    "history": "ctl.loop.history", "progress": "ctl.loop.progress",
    "schedule": "ctl.loop.schedule", "notebook": "ctl.loop.notebook",
    "loggers": "ctl.loop.loggers", "manifest": "ctl.loop.manifest",
    "dry_run": "ctl.loop.dry_run",
    "state": "ctl.parts.state", "steps": "ctl.parts.steps",
    "evaluation": "ctl.parts.evaluation", "export": "ctl.parts.export",
    "data": "ctl.parts.data", "context": "ctl.step.context", "reduction": "ctl.step.reduction",
    "strategies": "ctl.distribute.strategies", "peers": "ctl.distribute.peers",
    "launch": "ctl.distribute.launch",
    "check": "ctl.tools.check", "parity": "ctl.tools.parity",
    "parity_runs": "ctl.tools.parity_runs", "records": "ctl.tools.records",
    "experiments": "ctl.tools.experiments", "configs": "ctl.tools.configs",
    "eval_parity": "ctl.tools.eval_parity",
    "arguments": "ctl.base.arguments", "constants": "ctl.base.constants",
    "sources": "ctl.base.sources",
}


def __getattr__(name: str) -> _typing.Any:
  if name in _EXPORTS:
    module = _importlib.import_module(_MODULES.get(_EXPORTS[name], f"ctl.{_EXPORTS[name]}"))
    value = getattr(module, name)
  else:  # a submodule, e.g. ctl.checkpoints (ctl.loop.checkpoints)
    module = _MODULES.get(name, f"ctl.{name}")
    try:
      value = _importlib.import_module(module)
    except ModuleNotFoundError as e:
      if e.name != module:  # the submodule exists but an import inside it failed
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
           "CheckpointError", "SharedVariableWarning",
           "History", "EachStep", "read_history", "Logger", "MLflow", "WandB"]
