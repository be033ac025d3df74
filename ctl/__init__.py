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

# Every public name (`__all__`) and the module that defines and documents it. A name
# loads on first use, so that `import ctl` (and `ctl --help`) does not import TensorFlow.
_HOMES = {
    "Runner": "ctl.runner", "MIXED_PRECISIONS": "ctl.runner", "StepContext": "ctl.step.context",
    "make_strategy": "ctl.distribute.strategies", "choose_strategy": "ctl.distribute.cluster",
    "configure_logical_cpus": "ctl.distribute.strategies",
    "STRATEGY_NAMES": "ctl.distribute.strategies", "worker": "ctl.distribute.strategies",
    "Worker": "ctl.distribute.placement",
    "Action": "ctl.loop.actions", "FitContext": "ctl.loop.actions", "Every": "ctl.loop.schedule",
    "Checkpoint": "ctl.loop.checkpoints", "Summaries": "ctl.loop.actions",
    "Samples": "ctl.loop.actions", "Evaluate": "ctl.loop.actions", "Export": "ctl.loop.actions",
    "Profile": "ctl.loop.actions", "BestCheckpoints": "ctl.loop.actions",
    "PREEMPTED_EXIT_CODE": "ctl.base.constants", "INTERRUPTED_EXIT_CODE": "ctl.base.constants",
    "Preempted": "ctl.loop.stopping", "Interrupted": "ctl.loop.stopping",
    "WorkdirInUse": "ctl.loop.workdir", "CheckpointError": "ctl.loop.checkpoints",
    "SharedVariableWarning": "ctl.parts.state", "History": "ctl.loop.history",
    "EachStep": "ctl.loop.loggers", "read_history": "ctl.loop.history",
    "Logger": "ctl.loop.loggers", "MLflow": "ctl.loop.loggers", "WandB": "ctl.loop.loggers",
    # What packages built on ctl (the GAN kit) use: argument checks, evaluation's
    # moments and noise by sample, a draw's error prefix, `ctl records`' TFRecords.
    "arguments": "ctl.base", "Moments": "ctl.parts.evaluation",
    "normal_by_index": "ctl.step.context", "DRAW_IN_CONTROL_FLOW": "ctl.step.context",
    "read_records": "ctl.tools.records",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> _typing.Any:
  if name not in _HOMES:
    raise AttributeError(f"module 'ctl' has no attribute {name!r}")
  value = getattr(_importlib.import_module(_HOMES[name]), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_HOMES))


# A library leaves output to the application: ctl logs to the "ctl" logger,
# which the `ctl` command (ctl/cli) and the examples show on stderr.
_logging.getLogger("ctl").addHandler(_logging.NullHandler())
