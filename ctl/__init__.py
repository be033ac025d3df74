"""ctl: custom training loops over several models, one code path for every strategy.

    import ctl
    strategy = ctl.make_strategy("mirrored", logical_cpus=2)   # first, before other TF work
    runner = ctl.Runner(step, build, dataset, strategy=strategy, steps_per_loop=10)
    history = runner.train(1000)               # or, resumable, with checkpoints:
    runner.fit(10_000, "runs/x", actions=[ctl.Samples(show, ctl.Every(steps=500))])

`step(ctx, batch)` is the per-replica step the user writes; `ctx` is a
`StepContext` (global-batch loss averaging, updates, replica-invariant noise).
"""

import logging as _logging

from ctl.actions import Checkpoint
from ctl.actions import Evaluate
from ctl.actions import Every
from ctl.actions import Export
from ctl.actions import Samples
from ctl.actions import Summaries
from ctl.context import StepContext
from ctl.loop import PREEMPTED_EXIT_CODE
from ctl.runner import Runner
from ctl.strategies import NAMES as STRATEGY_NAMES
from ctl.strategies import choose_strategy
from ctl.strategies import configure_logical_cpus
from ctl.strategies import make_strategy

# Show ctl's INFO lines (e.g. what strategy 'auto' chose) unless the
# application configured logging itself.
_logger = _logging.getLogger("ctl")
if not _logger.handlers:
  _handler = _logging.StreamHandler()
  _handler.setFormatter(_logging.Formatter("ctl: %(message)s"))
  _logger.addHandler(_handler)
  _logger.setLevel(_logging.INFO)
  _logger.propagate = False

__all__ = ["Runner", "StepContext", "make_strategy", "choose_strategy",
           "configure_logical_cpus", "STRATEGY_NAMES", "Every", "Checkpoint",
           "Summaries", "Samples", "Evaluate", "Export", "PREEMPTED_EXIT_CODE"]
