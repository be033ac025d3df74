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
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import logging as _logging
import sys as _sys
import typing as _typing

# The public names and the module of each. They load on first use, so that
# `import ctl` (and the `ctl` command's --help) does not import TensorFlow.
_EXPORTS = {
    "Runner": "ctl.runner", "StepContext": "ctl.step.context",
    "make_strategy": "ctl.distribute.strategies",
    "choose_strategy": "ctl.distribute.strategies",
    "configure_logical_cpus": "ctl.distribute.strategies",
    "STRATEGY_NAMES": "ctl.distribute.strategies", "worker": "ctl.distribute.strategies",
    "Worker": "ctl.distribute.strategies", "Action": "ctl.loop.actions",
    "FitContext": "ctl.loop.actions", "Every": "ctl.loop.schedule",
    "Checkpoint": "ctl.loop.checkpoints", "Summaries": "ctl.loop.actions",
    "Samples": "ctl.loop.actions", "Evaluate": "ctl.loop.actions", "Export": "ctl.loop.actions",
    "Profile": "ctl.loop.actions", "BestCheckpoints": "ctl.loop.actions",
    "PREEMPTED_EXIT_CODE": "ctl.base.constants", "INTERRUPTED_EXIT_CODE": "ctl.base.constants",
    "Preempted": "ctl.loop.stopping", "Interrupted": "ctl.loop.stopping",
    "WorkdirInUse": "ctl.loop.workdir", "SharedVariableWarning": "ctl.parts.state",
    "History": "ctl.loop.history", "EachStep": "ctl.loop.history",
    "read_history": "ctl.loop.history",
}
_RENAMED = {"STRATEGY_NAMES": "NAMES"}


# Each module's short name, `ctl.<name>`, for its home in a subpackage
# (ctl/loop, ctl/parts, ctl/step, ctl/distribute, ctl/tools, ctl/base): an
# attribute (`ctl.parity.check`) and a module to import (`import ctl.parity`);
# `ctl.loop` is the outer loop's package (its modules: `from ctl.loop import fit`).
_MODULES = {
    "actions": "ctl.loop.actions", "checkpoints": "ctl.loop.checkpoints",
    "stopping": "ctl.loop.stopping", "workdir": "ctl.loop.workdir",
    "history": "ctl.loop.history", "progress": "ctl.loop.progress",
    "schedule": "ctl.loop.schedule", "notebook": "ctl.loop.notebook",
    "state": "ctl.parts.state", "steps": "ctl.parts.steps",
    "evaluation": "ctl.parts.evaluation", "export": "ctl.parts.export",
    "data": "ctl.parts.data", "context": "ctl.step.context", "reduction": "ctl.step.reduction",
    "strategies": "ctl.distribute.strategies", "peers": "ctl.distribute.peers",
    "launch": "ctl.distribute.launch", "check": "ctl.tools.check", "parity": "ctl.tools.parity",
    "parity_runs": "ctl.tools.parity_runs", "records": "ctl.tools.records",
    "experiments": "ctl.tools.experiments", "configs": "ctl.tools.configs",
    "arguments": "ctl.base.arguments", "constants": "ctl.base.constants",
    "sources": "ctl.base.sources",
}


class _ShortNames(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
  """Lets `import ctl.<name>` and `from ctl.<name> import x` load `_MODULES[name]`:
  one module object under its short name and its home's, never a second copy."""

  def find_spec(self, fullname: str, path: _typing.Any = None,
                target: _typing.Any = None) -> _typing.Any:
    package, _, name = fullname.rpartition(".")
    if package != "ctl" or name not in _MODULES:
      return None
    return _importlib_util.spec_from_loader(fullname, self)

  def create_module(self, spec: _typing.Any) -> _typing.Any:
    module = _importlib.import_module(_MODULES[spec.name.rpartition(".")[2]])
    self._home_spec = module.__spec__  # the import system sets the short name's spec
    return module

  def exec_module(self, module: _typing.Any) -> None:
    module.__spec__ = self._home_spec  # it ran already, under its home's name


_sys.meta_path.append(_ShortNames())


def __getattr__(name: str) -> _typing.Any:
  if name in _EXPORTS:
    value = getattr(_importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
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
           "SharedVariableWarning",
           "History", "EachStep", "read_history"]
