"""`ctl train`, `ctl eval` and `ctl export`: run an experiment described by a .gin file.

    ctl train examples/configs/dcgan.gin --gin "gan.train.num_steps = 100"
    ctl train examples/configs/dcgan.gin --strategy mirrored --logical-cpus 2
    ctl eval examples/configs/dcgan.gin --workdir runs/dcgan  # {"step": 100, "classifier_fid": 9.1}
    ctl export examples/configs/dcgan.gin --workdir runs/dcgan --out exported/

An experiment is a gin-configurable function
`experiment(workdir, *, strategy=..., mode="train")`; `gan.train` is one.
Mode "train" trains (resuming from the newest checkpoint in the work
directory), "eval" restores the newest checkpoint and returns a dict of
metrics, "export" restores it and returns the exported paths, and "build"
returns the `ctl.Runner` as built (`ctl check` uses it). `--experiment`
names it as gin knows it, or as `module.path:function`.

A mistake in the configuration (a misspelt configurable or parameter, a
syntax error, a missing file) exits with code 2 and one paragraph naming the
binding and the closest known names, not a traceback. TensorFlow is imported
only when a subcommand runs, so `ctl --help` stays fast.
"""

import argparse
import ast
import difflib
import importlib
import inspect
import json
import os
import re
import sys

from ctl import _tf_internal

DEFAULT_EXPERIMENT = "gan.train"
MODES = ("train", "eval", "export", "build")
USAGE_ERROR = 2  # what argparse exits with for a bad command line
FAILURE = 1


class ConfigError(Exception):
  """A mistake in the command line or the .gin files; the message says the fix."""


_TRAIN = """\
Trains the experiment a .gin file describes, e.g. gan.train with the bindings of
examples/configs/dcgan.gin. Checkpoints, TensorBoard events, sample grids and the
export go to the work directory; the operative gin config is saved next to the
checkpoints. Rerunning the same command resumes from the newest checkpoint (and
does nothing if the run is complete)."""

_EVAL = """\
Restores the newest checkpoint in <workdir>/checkpoints, runs the experiment's
evaluation once (for gan.train on 28x28 digits: the classifier FID of the
generator, or of its EMA copy) and prints the metrics as one JSON object on
stdout, e.g. {"step": 25000, "classifier_fid": 5.19}. Logs go to stderr."""

_EXPORT = """\
Restores the newest checkpoint in <workdir>/checkpoints and exports the
experiment's model (for gan.train: the generator, or its EMA copy) as
<name>.keras and a SavedModel <name>/, in <workdir>/export or --out; prints the
paths. Neither needs ctl to load: keras.saving.load_model(path) or
tf.saved_model.load(path).serve(z)."""


def add_parser(subparsers):
  """Adds `train`, `eval` and `export` to the `ctl` command's subparsers."""
  for name, run, summary, description, example in (
      ("train", run_train, "train an experiment from a .gin file (resumes)", _TRAIN,
       "ctl train examples/configs/dcgan.gin --gin 'gan.train.num_steps = 100'\n"
       "  ctl train examples/configs/dcgan.gin --strategy mirrored --logical-cpus 2"),
      ("eval", run_eval, "evaluate the newest checkpoint; print JSON metrics", _EVAL,
       "ctl eval examples/configs/dcgan.gin --workdir runs/dcgan"),
      ("export", run_export, "export the model of the newest checkpoint", _EXPORT,
       "ctl export examples/configs/dcgan.gin --workdir runs/dcgan --out exported/dcgan"),
  ):
    parser = subparsers.add_parser(
        name, help=summary, description=description, epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--strategy", metavar="NAME", help="a ctl.make_strategy name "
                        "(default, mirrored, multi_worker, tpu, auto, ...); overrides "
                        "the config's")
    parser.add_argument("--logical-cpus", type=int, metavar="N", help="split the CPU "
                        "into N devices first (e.g. for --strategy mirrored)")
    parser.add_argument("--workdir", metavar="DIR",
                        help="the run's directory (default: runs/<config file stem>)")
    if name == "export":
      parser.add_argument("--out", metavar="DIR",
                          help="where to export (default: <workdir>/export)")
    parser.set_defaults(run=run)


def add_config_arguments(parser):
  """The options every experiment subcommand shares: the .gin file and bindings."""
  parser.add_argument("config", metavar="CONFIG.gin", help="the experiment's .gin file")
  parser.add_argument("--gin", action="append", default=[], metavar="BINDING",
                      help="an extra binding, e.g. 'gan.train.num_steps = 100' "
                      "(repeatable; applied after the file)")
  parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, metavar="NAME",
                      help="the experiment function: its gin name or "
                      f"module.path:function (default: {DEFAULT_EXPERIMENT})")


def run_train(args):
  def report(runner, workdir):
    strategy = getattr(runner, "strategy", None)
    if strategy is not None and not strategy.extended.should_checkpoint:
      return  # another worker: the chief keeps (and reports) the outputs
    step = f"step {int(runner.global_step.numpy())}, " if hasattr(runner, "global_step") else ""
    print(f"ctl train: {step}outputs in {workdir}:")
    for name in ("checkpoints", "events", "samples", "export"):
      if os.path.exists(os.path.join(workdir, name)):
        print(f"  {os.path.join(workdir, name)}")
  return _run(args, "train", report)


def run_eval(args):
  def report(metrics, workdir):
    del workdir
    print(json.dumps(metrics, default=float))
  return _run(args, "eval", report)


def run_export(args):
  def report(paths, workdir):
    del workdir
    for path in ([paths] if isinstance(paths, str) else paths):
      print(path)
  return _run(args, "export", report, out=args.out)


def _run(args, mode, report, out=None):
  """Loads the experiment, runs it in `mode` and reports; returns the exit code."""
  needs = ["mode"] + ["strategy"] * bool(args.strategy) + ["export_dir"] * bool(out)
  try:
    experiment = load_experiment(args, needs)
  except ConfigError as e:
    return fail(args.command, e, USAGE_ERROR)
  workdir = args.workdir or default_workdir(args.config)
  kwargs = {"strategy": args.strategy} if args.strategy else {}
  if out:
    kwargs["export_dir"] = out
  from ctl import stopping, workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  try:
    result = experiment(workdir, mode=mode, **kwargs)
  except (FileNotFoundError, workdir_lib.WorkdirInUse) as e:
    # e.g. eval or export before any checkpoint; another run in the workdir
    return fail(args.command, e, FAILURE)
  except stopping.Interrupted as e:
    print(f"ctl {args.command}: {e}", file=sys.stderr)
    return stopping.INTERRUPTED_EXIT_CODE
  except (TypeError, ValueError) as e:
    binding = _binding_of(e, [args.config], args.gin)
    if binding is None:
      raise
    return fail(args.command, f"{_first_line(e)} That value comes from {binding}; "
                "fix the binding.", USAGE_ERROR)
  report(result, workdir)
  return 0


def _binding_of(error, files, bindings):
  """'`binding` (where)' whose value a gin-configured call refused, or None.

  Gin adds "In call to configurable ..." to an error raised inside a
  configurable; the binding is the one whose value the message quotes.
  """
  text = str(error)
  if "In call to configurable" not in text:
    return None
  message = text.split("\n  In call to configurable")[0]
  lines = [(f"{path}:{number}", line) for path in files if os.path.isfile(path)
           for number, line in enumerate(open(path).read().splitlines(), 1)]
  lines += [("--gin", binding) for binding in bindings or ()]
  for where, line in reversed(lines):  # the last binding of a name wins in gin
    match = re.fullmatch(r"\s*([\w./]+)\s*=\s*(.+?)\s*", line.split("#")[0])
    if not match:
      continue
    try:
      value = ast.literal_eval(match.group(2))
    except (ValueError, SyntaxError):
      continue
    if isinstance(value, str):
      quoted = repr(value) in message
    else:  # a number is named only as a refused value: "got 0.5", "is -1"
      quoted = isinstance(value, (bool, int, float)) and re.search(
          rf"\b(got|is|was|=) \(?{re.escape(repr(value))}(?![\w.])", message)
    if quoted:
      return f"`{match.group(1)} = {match.group(2)}` ({where})"
  return None


def _first_line(error):
  message = str(error).split("\n  In call to configurable")[0].strip()
  return f"{type(error).__name__}: {message}"


def fail(command, error, code):
  """Prints `error` as `ctl <command>: error: ...` on stderr; returns `code`."""
  print(f"ctl {command}: error: {error}", file=sys.stderr)
  return code


def default_workdir(config):
  return os.path.join("runs", os.path.splitext(os.path.basename(config))[0])


def load_experiment(args, needs=("mode",)):
  """Applies --logical-cpus, finds the experiment, parses the gin file and bindings.

  Args:
    args: parsed arguments with `config`, `gin`, `experiment` and optionally
      `logical_cpus` and `strategy`.
    needs: parameters the experiment function must accept.

  Returns:
    The experiment function (gin-configured).

  Raises:
    ConfigError: with a message naming the bad argument or binding and the fix.
  """
  _require_file(args.config)
  if getattr(args, "logical_cpus", None) is not None:
    if args.logical_cpus < 1:
      raise ConfigError(f"--logical-cpus {args.logical_cpus}: give a positive count.")
    from ctl import strategies  # pylint: disable=import-outside-toplevel
    strategies.configure_logical_cpus(args.logical_cpus)  # before any TF op
  if getattr(args, "strategy", None):
    from ctl import strategies  # pylint: disable=import-outside-toplevel
    if args.strategy not in strategies.NAMES:
      raise ConfigError(f"--strategy {args.strategy!r} is not a strategy name"
                        f"{_did_you_mean(args.strategy, strategies.NAMES)}; use one of "
                        f"{', '.join(strategies.NAMES)}.")
  experiment = resolve_experiment(args.experiment)
  _require_parameters(experiment, args.experiment, needs)
  parse_gin([args.config], args.gin)
  return experiment


def resolve_experiment(name):
  """The experiment function `name`: a gin name (e.g. `gan.train`) or `module:function`.

  For a gin name, the module of the same dotted prefix is imported first (if
  there is one) so that its configurables are registered.
  """
  import gin  # pylint: disable=import-outside-toplevel
  if ":" in name:
    module_name, _, function = name.partition(":")
    module = _import(module_name, name)
    if not callable(getattr(module, function, None)):
      names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
      raise ConfigError(f"--experiment {name!r}: module {module_name} has no function "
                        f"{function!r}{_did_you_mean(function, names)}.")
    return getattr(module, function)
  prefix = name.rpartition(".")[0]
  if prefix:
    try:
      importlib.import_module(prefix)
    except ModuleNotFoundError as e:
      if not prefix.startswith(e.name or "\0"):  # a missing import inside the module
        raise
  configurable = _tf_internal.gin_registry().get_match(name)
  if configurable is None:
    raise ConfigError(f"--experiment {name!r} is not a gin configurable"
                      f"{_did_you_mean(name, _configurable_names())}; give its gin name "
                      "(e.g. gan.train) or module.path:function.")
  return gin.get_configurable(configurable.selector)


def parse_gin(files, bindings):
  """Parses gin `files`, then `bindings`; a mistake becomes a ConfigError."""
  import gin  # pylint: disable=import-outside-toplevel
  gin.clear_config()  # a second command in the same process starts afresh
  try:
    gin.parse_config_files_and_bindings(files, bindings)
  except SyntaxError as e:
    raise ConfigError(_describe_syntax_error(e)) from None
  except (ValueError, KeyError, OSError, ImportError) as e:
    raise ConfigError(_describe_gin_error(e)) from None


def _require_file(path):
  if os.path.isfile(path):
    return
  directory = os.path.dirname(path) or "."
  names = ([n for n in os.listdir(directory) if n.endswith(".gin")]
           if os.path.isdir(directory) else [])
  hint = _did_you_mean(os.path.basename(path), names)
  raise ConfigError(f"config file {path} not found{hint}; give the path of a .gin "
                    "file, e.g. examples/configs/dcgan.gin.")


def _require_parameters(experiment, name, needs):
  try:
    parameters = inspect.signature(experiment).parameters
  except (TypeError, ValueError):
    return  # a builtin or C function: let the call tell
  if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
    return
  missing = [n for n in needs if n not in parameters]
  if missing:
    raise ConfigError(
        f"--experiment {name!r} has no parameter {', '.join(missing)}, which this "
        "subcommand passes: an experiment "
        "is a function (workdir, *, strategy=..., mode='train', ...) where mode is "
        f"one of {', '.join(MODES)} (see gan.train).")


def _import(module_name, experiment):
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if not module_name.startswith(e.name or "\0"):
      raise
    raise ConfigError(f"--experiment {experiment!r}: no module named {module_name!r}; "
                      "check the spelling and that it is importable (on sys.path, or "
                      "installed).") from None


def _configurable_names():
  """Every registered configurable's full name and its last component."""
  names = set()
  for selector, _ in _tf_internal.gin_registry().items():
    names.update((selector, selector.rpartition(".")[2]))
  return sorted(names)


def _parameters_of(selector):
  try:
    configurable = _tf_internal.gin_registry().get_match(selector)
  except KeyError:  # ambiguous
    return []
  if configurable is None:
    return []
  try:
    return list(inspect.signature(configurable.wrapped).parameters)
  except (TypeError, ValueError):
    return []


def _did_you_mean(name, candidates, prefix=""):
  """` (did you mean 'x'?)` for the candidates closest to `name`, or ""."""
  matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
  shown = " or ".join(repr(prefix + m) for m in matches)
  return f" (did you mean {shown}?)" if matches else ""


# gin appends where a binding came from: `\n  In file "x.gin", line 3\n    text`
# or `\n  In bindings string line 1\n    text`, possibly with a `^` line.
_LOCATION = re.compile(r'\n\s*In (?:file "(?P<file>[^"]*)",|bindings string) '
                       r'line (?P<line>\d+)\n\s*(?P<text>[^\n]*)')


def _where(filename, line, text):
  text = (text or "").strip()
  if filename:
    return f"{filename}, line {line}: `{text}`"
  return f"binding `{text}` (--gin)"


def _describe_gin_error(error):
  """One paragraph from gin's error: where, what, and the closest known names."""
  text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
  match = _LOCATION.search(text)
  message = (text[:match.start()] if match else text).strip()
  message = message.split(" in config string:")[0]  # gin then prints the whole config
  message = " ".join(line.strip() for line in message.splitlines() if line.strip())
  where = _where(match["file"], match["line"], match["text"]) + ": " if match else ""
  fix = ""
  unknown = re.search(r"No configurable matching (?:reference )?'@?(?:[\w/]*/)?([\w.]+)'",
                      message)
  parameter = re.search(r"Configurable '([\w./]+)' doesn't have a parameter named '(\w+)'",
                        message)
  macro = re.search(r"No bindings specified for '(\w+)/gin.macro'", message)
  if macro:
    fix = (f" (define it: a line `{macro[1]} = value` in the .gin file, or "
           f"--gin '{macro[1]} = value')")
  elif unknown:
    fix = (_did_you_mean(unknown[1], _configurable_names()) or
           " (no registered configurable is close: is its module imported, e.g. by an "
           "`import` line in the .gin file?)")
  elif parameter:
    selector, name = parameter[1].rpartition("/")[2], parameter[2]
    parameters = _parameters_of(selector)
    fix = _did_you_mean(name, parameters, prefix=f"{selector}.") or (
        f" (its parameters: {', '.join(parameters)})" if parameters else "")
  return f"{where}{message.rstrip('.')}{fix}."


def _describe_syntax_error(error):
  location = error.args[1] if len(error.args) > 1 else None
  message = str(error.args[0]) if error.args else str(error)
  if location is None or not hasattr(location, "line_num"):
    return f"gin syntax error: {message}"
  column = f" (column {location.char_num + 1})" if location.char_num is not None else ""
  return (f"{_where(location.filename, location.line_num, location.line_content)}"
          f"{column}: gin cannot parse this line: {message} A binding reads "
          "`configurable.parameter = value`, the value a Python literal, an "
          "@reference or a %macro.")
