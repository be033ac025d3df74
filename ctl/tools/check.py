"""What would fail on a TPU, found on a CPU before you pay for one.

    from ctl.tools import check
    findings = check.check_step(runner.compiled_step, num_batches=3)
    print(check.format_findings(findings))         # a table, one row per check
    ok = all(finding.ok for finding in findings)

    ctl check dcgan --steps 3                       # the same for an experiment

A TPU runs the step as one XLA program compiled for fixed shapes; XLA on the CPU
(`jit_compile=True`) is the nearest stand-in, so the step is compiled that way,
taking the batch as an argument, and run on a few real batches; `ctl check --help`
lists the checks.

The variables are put back afterwards; the training data's iterator is not touched.
"""

import builtins
import collections
import contextlib
import gc
import io
import re
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from ctl.base import _tf_internal
from ctl.base import arguments
from ctl.base import constants
from ctl.base import sources
from ctl.loop import manifest
from ctl.parts import data as data_lib
from ctl.parts.steps import TrainStep

Finding = collections.namedtuple("Finding", ["name", "ok", "message"])
Finding.__doc__ = """One check's outcome: `name`, `ok` (bool) and a `message` that says the fix."""

STATIC_INPUTS = "static input shapes"
XLA = "XLA compiles the step"
RETRACING = "no retracing"
DATA_DEPENDENT = "static shapes in step"
HOST_PYTHON = "no host Python"
DRAWS = "draws from ctx"
PRECISION = "precision speed"

# Ops that run Python on the host: a TPU cannot call back into it.
_PYTHON_OPS = {"EagerPyFunc": "tf.py_function", "PyFunc": "tf.numpy_function",
               "PyFuncStateless": "tf.numpy_function(stateful=False)"}
# Control flow whose unknown output shape comes from its branches or body,
# which are searched themselves (the cause is reported there).
_CONTROL_FLOW = {"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
                 "PartitionedCall", "StatefulPartitionedCall"}
_SHOWN = 5  # offending ops named per finding


def format_findings(findings: list[Finding], width: int = 100) -> str:
  """A table: one row per finding, the message wrapped under its check."""
  name_width = max(len(f.name) for f in findings)
  lines = [f"{'check':{name_width}}  result  message"]
  for f in findings:
    body = textwrap.wrap(f.message, width - name_width - 10) or [""]
    lines.append(f"{f.name:{name_width}}  {'ok' if f.ok else 'FAIL':6}  {body[0]}")
    lines += [" " * (name_width + 10) + line for line in body[1:]]
  return "\n".join(lines)


def precision_speed(precision: str, trains: Mapping[str, Callable[[int], Any]],
                    num_steps: int = 3, repeats: int = 5) -> Finding:
  """Times a step at a mixed precision against float32 on this CPU, whose flags do
  not tell which is faster (docs/performance.md).

  Args:
    precision: the mixed precision, a key of `trains`; "float32" is the other.
    trains: precision -> a function training a fresh runner `n` steps. One call
      each traces, then `repeats` pairs of `num_steps` steps are timed, each pair
      in the other order than the one before.
    repeats: pairs timed; one side is slower only if slower in every pair.

  Returns:
    A `Finding` named `PRECISION` with the median ratio; not ok when `precision`
    was the slower in every pair.
  """
  for train in trains.values():
    train(1)
  ratios = []
  for i in range(repeats):
    took = {}
    for name in (precision, "float32")[::1 if i % 2 else -1]:
      start = time.perf_counter()
      trains[name](num_steps)
      took[name] = time.perf_counter() - start
    ratios.append(took[precision] / took["float32"])
  cpu = manifest.cpu()
  said = (f"{precision} takes {statistics.median(ratios):.2f}x float32's time per step "
          f"on this CPU ({cpu['model']}; {', '.join(cpu.get('flags', [])) or 'no flags read'})")
  if min(ratios) > 1:
    return Finding(PRECISION, False, f"{said}, slower in each of {repeats} pairs: train in "
                   "float32 here (drop mixed_precision), or use it where it is faster.")
  if max(ratios) < 1:
    return Finding(PRECISION, True, f"{said}, faster in each of {repeats} pairs.")
  return Finding(PRECISION, True, f"{said}: within this machine's noise (pairs from "
                 f"{min(ratios):.2f}x to {max(ratios):.2f}x).")


def check_step(compiled_step: TrainStep, num_batches: int = 3) -> list[Finding]:
  """Checks that a runner's step (`runner.compiled_step`) would compile and run on a TPU.

  Args:
    compiled_step: the compiled step of a `ctl.Runner` on one device (strategy
      "default" or "one_device") whose data is a dataset of global batches.
    num_batches: batches to run the compiled step on.

  Returns:
    A list of `Finding`s, one per check (see the module docstring).
  """
  placement = compiled_step.placement
  if placement.replicas != 1:
    raise ValueError(f"check_step needs a runner on one device, got "
                     f"{placement.replicas} replicas: XLA cannot hold "
                     "the cross-replica sum of a multi-device strategy on CPU; build "
                     "the runner with strategy='default'.")
  feed = compiled_step.feed
  if not isinstance(feed, data_lib.GlobalBatches):
    raise ValueError("check_step needs a runner whose data is a tf.data.Dataset of "
                     "global batches, not a dataset function.")
  arguments.integer("num_batches", num_batches, minimum=1)
  findings = [_static_inputs(feed)]
  batches = _batches(feed, num_batches)
  saved = [(v, v.numpy()) for v in tf.nest.flatten(compiled_step.state.variables())]
  try:
    step = _CompiledStep(compiled_step,
                         tf.nest.map_structure(tf.TensorSpec.from_tensor, batches[0]))
    if step.error:
      findings += [step.error] + [Finding(n, False, "not run: the step did not trace.")
                             for n in (XLA, RETRACING, DATA_DEPENDENT, DRAWS)]
    else:
      graphs = [step.concrete.graph] + _tf_internal.function_graphs(step.concrete.graph)
      findings.append(_host_python(graphs, step.printed))
      findings.append(_data_dependent_shapes(graphs))
      findings.append(_draws(step.concrete.graph, batches[0]))
      findings.append(_retracing(step, batches))
      findings.append(_xla(step, batches))
  finally:
    for variable, value in saved:
      variable.assign(value)
  order = [STATIC_INPUTS, XLA, RETRACING, DATA_DEPENDENT, HOST_PYTHON, DRAWS]
  return sorted(findings, key=lambda f: order.index(f.name))


class _CompiledStep:
  """The replica step under XLA, traced on `batch_spec`; `error`: a Finding if it failed."""

  def __init__(self, compiled_step, batch_spec):
    self.python_calls = 0  # the user's step runs as Python only while traced
    self.printed = []
    self.concrete = self.error = None

    def replica_step(batch, step):
      self.python_calls += 1
      return compiled_step.replica_step(batch, step)

    def compiled(batch, step):
      return compiled_step.placement.strategy.run(replica_step, args=(batch, step))

    self.function = tf.function(compiled, jit_compile=True, autograph=False)
    self.step = compiled_step.state.global_step.read_value()
    try:
      with _recording_prints(self.printed):
        self.concrete = self.function.get_concrete_function(
            batch_spec, tf.TensorSpec([], self.step.dtype))
    except Exception as e:  # pylint: disable=broad-except
      self.error = _trace_failure(e)


def _static_inputs(feed):
  spec = feed.element_spec
  unknown = [s for s in tf.nest.flatten(spec) if not s.shape.is_fully_defined()]
  if not unknown:
    return Finding(STATIC_INPUTS, True, f"every dimension of the data is known: {spec}.")
  shapes = ", ".join(str(s.shape) for s in unknown)
  fixes = []
  if any(s.shape.rank is None or s.shape[0] is None for s in unknown):
    fixes.append("batch with drop_remainder=True (dataset.batch(global_batch_size, "
                 "drop_remainder=True)) so that every batch has the same size")
  if any(s.shape.rank is None or None in s.shape.as_list()[1:] for s in unknown):
    fixes.append("give every example one shape (tf.image.resize, or padded_batch "
                 "with fixed padded_shapes)")
  return Finding(STATIC_INPUTS, False, f"the data has unknown dimensions ({shapes}), "
                 f"so a TPU would compile a new program for each shape; "
                 f"{'; and '.join(fixes)}.")


def _batches(feed, count):
  iterator = feed.make_iterator()  # not training's: its position is checkpointed
  batches = []
  for _ in range(count):
    try:
      batches.append(feed.next(iterator))
    except (tf.errors.OutOfRangeError, StopIteration):
      break
  if not batches:
    raise ValueError("check_step: the training data gave no batch.")
  return batches


@contextlib.contextmanager
def _recording_prints(printed):
  """Replaces print: each call is recorded as `file:line` and shows nothing."""
  real_print = builtins.print

  def recording_print(*args, **kwargs):
    del args, kwargs
    printed.append(_source_line(sys._getframe(1)))  # pylint: disable=protected-access

  builtins.print = recording_print
  try:
    with contextlib.redirect_stdout(io.StringIO()):  # prints that bypass builtins
      yield
  finally:
    builtins.print = real_print


def _source_line(frame):
  """`file:line` of `frame`, mapped back from AutoGraph's generated code to the user's."""
  location = f"{frame.f_code.co_filename}:{frame.f_lineno}"
  if "__autograph_generated" not in frame.f_code.co_filename:
    return location
  for function in gc.get_referrers(frame.f_code):  # the converted function
    for generated, origin in getattr(function, "ag_source_map", {}).items():
      if generated.lineno == frame.f_lineno:
        return f"{origin.loc.filename}:{origin.loc.lineno}"
  return location


def _trace_failure(error):
  text = _first_lines(str(error))
  if "numpy" in str(error):
    return Finding(HOST_PYTHON, False, f"the step calls .numpy() (or np.asarray) on a "
                   f"tensor: {text} A compiled step's tensors have no value on the "
                   "host; compute with TF ops, and return values to log them.")
  return Finding(HOST_PYTHON, False, f"the step failed to trace: {type(error).__name__}: "
                 f"{text} Python that needs a tensor's value (float(x), if x:, "
                 ".numpy()) cannot run in a compiled step; use TF ops.")


def _host_python(graphs, printed):
  problems = []
  if printed:
    where = ", ".join(sorted(set(printed))[:_SHOWN])
    problems.append(f"print() at {where} runs once while the step is traced, not at "
                    "every step, and a TPU cannot call the host: use tf.print")
  calls = [(op.type, op.name) for g in graphs for op in g.get_operations()
           if op.type in _PYTHON_OPS]
  if calls:
    named = ", ".join(f"{_PYTHON_OPS[t]} ({t} op '{n}')" for t, n in calls[:_SHOWN])
    problems.append(f"{named} calls Python on the host, which XLA cannot compile and a "
                    "TPU cannot run: write that part with TF ops")
  if not problems:
    return Finding(HOST_PYTHON, True, "no print, tf.py_function or tf.numpy_function.")
  return Finding(HOST_PYTHON, False, "; ".join(problems) + ".")


def _draws(graph, batch):
  """The user's draws that depend on the layout (`sources.layout_dependent_draws`)."""
  rows = tf.nest.flatten(batch)[0].shape[0]
  draws = sources.layout_dependent_draws(graph, rows)
  if not draws:
    return Finding(DRAWS, True, "every draw is the context's (or none is made).")
  return Finding(DRAWS, False, f"{'; '.join(draws[:_SHOWN])}: numbers that depend on the "
                 f"layout. {constants.STEP_DRAWS_FIX}")


def _data_dependent_shapes(graphs):
  """Ops that make an unknown dimension from inputs whose shapes are all known."""
  causes = []
  for graph in graphs:
    for op in graph.get_operations():
      if op.type in _CONTROL_FLOW or op.type in _PYTHON_OPS:
        continue
      outputs = [t for t in op.outputs if _is_data(t)]
      if (any(not t.shape.is_fully_defined() for t in outputs) and
          all(t.shape.is_fully_defined() for t in op.inputs if _is_data(t))):
        shape = next(t.shape for t in outputs if not t.shape.is_fully_defined())
        causes.append(f"{op.type} '{op.name}' (output shape {shape})")
  if not causes:
    return Finding(DATA_DEPENDENT, True, "every tensor in the step has a static shape.")
  return Finding(DATA_DEPENDENT, False, f"{', '.join(causes[:_SHOWN])}: the output "
                 "size depends on the data, which a TPU cannot compile (XLA on CPU "
                 "may). Keep shapes fixed: a 0/1 mask multiplied in instead of "
                 "tf.boolean_mask, tf.where(cond, x, y) with three arguments, sums "
                 "over one-hot codes instead of tf.unique.")


def _is_data(tensor):
  return tensor.dtype not in (tf.resource, tf.variant)


def _retracing(step, batches):
  shapes = []
  for batch in batches:
    step.function.get_concrete_function(batch, step.step)
    shapes.append(", ".join(str(t.shape) for t in tf.nest.flatten(batch)))
  traces = step.function.experimental_get_tracing_count()
  if traces <= 1 and step.python_calls <= 1:
    return Finding(RETRACING, True, f"one trace for {_plural_batches(len(batches))}.")
  distinct = list(dict.fromkeys(shapes))
  return Finding(RETRACING, False, f"the step was traced {traces} times for "
                 f"{len(batches)} batches (the step's Python ran {step.python_calls} "
                 f"times); their shapes: {'; '.join(distinct)}. A TPU compiles a new "
                 "program for each: batch with drop_remainder=True and give every "
                 "example one shape.")


def _xla(step, batches):
  try:
    for batch in batches:
      step.function(batch, step.step)
  except (tf.errors.OpError, ValueError, TypeError) as e:
    return Finding(XLA, False, f"XLA failed: {_first_lines(str(e))} Replace that op "
                   "with ops XLA compiles (most TF ops; not tf.py_function, "
                   "tf.numpy_function, string ops, or ops on the host).")
  return Finding(XLA, True, f"compiled and ran the step on {_plural_batches(len(batches))}.")


def _first_lines(text, limit=400):
  """The gist of a TF error: its first line(s), without compiler attributes."""
  text = re.sub(r"\[_XlaMustCompile[^\]]*\]", "", text)
  text = text.split("The op is created at")[0]
  text = " ".join(line.strip() for line in text.splitlines() if line.strip())
  return (text[:limit] + "...") if len(text) > limit else text


def _plural_batches(count):
  return f"{count} batch" if count == 1 else f"{count} batches"
