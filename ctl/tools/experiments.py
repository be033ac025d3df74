"""Experiments described by .gin files: the contract, finding one, parsing its config.

    from ctl.tools import experiments
    name = experiments.default_experiment()    # or a gin name, or "my.module:MyExperiment"
    make = experiments.resolve_experiment(name)
    experiments.parse_gin(["my.gin"], ["MyExperiment.batch_size = 32"])
    experiment = experiments.make_experiment(make, name, needs=("evaluate",))
    metrics = experiment.evaluate("runs/my", strategy="default")

An experiment is an object with one method per job (`Experiment` below), which
`ctl train|eval|export|check` make from a gin configuration (`find_config`) and
`--experiment NAME` (`resolve_experiment`, `default_experiment`). A mistake in
the configuration raises `ConfigError`, one paragraph naming the binding and the
closest known names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import os
import re
import tokenize
from collections.abc import Callable
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

import gin

from ctl.base import _tf_internal
from ctl.base.arguments import did_you_mean  # also the command line's, as experiments.did_you_mean
from ctl.tools import configs

if TYPE_CHECKING:  # no TensorFlow at run time: the command reports config typos before loading it
  import tensorflow as tf

  from ctl.runner import Runner

# Where the `ctl` command finds the class or function that makes its default experiment.
ENTRY_POINTS = "ctl.experiments"
METHODS = ("build", "train", "evaluate", "export")


class Experiment(Protocol):
  """What `ctl train|eval|export|check` run: one method per job, all on the same runner.

  Each method builds the runner under `strategy` (a `ctl.make_strategy` name or
  a strategy, made before any other TF op); the work directory holds the
  run's `checkpoints/`, events, samples and export.
  """

  def build(self, strategy: str | tf.distribute.Strategy = "default") -> Runner:
    """The runner, untrained (`ctl check` compiles its step)."""

  def train(self, workdir: str, strategy: str | tf.distribute.Strategy = "default", *,
            profile: tuple[int, int] | None = None, loggers: Sequence[Any] = (),
            dry_run: bool = False, resume_from: int | None = None) -> Runner:
    """Trains, resuming from the newest checkpoint in the work directory; the runner.

    Each option comes only with its flag (an experiment without it refuses the flag):
    `--profile START:STEPS` as `profile=(start, steps)` (a `ctl.Profile`), `--logger`
    and `--dry-run` as `loggers=[...]` and `dry_run=True` (for `runner.fit`),
    `--resume-from STEP` as `resume_from=STEP` (for its `ctl.Checkpoint`)."""

  def evaluate(self, workdir: str,
               strategy: str | tf.distribute.Strategy = "default") -> dict[str, Any]:
    """Restores the newest checkpoint and evaluates it; the metrics (`ctl eval` prints
    them as JSON). Raises FileNotFoundError if there is no checkpoint. `--checkpoint
    best|2000` passes `checkpoint="best"|"2000"`, for `Runner.restore` (optional)."""

  def export(self, workdir: str, directory: str | None = None,
             strategy: str | tf.distribute.Strategy = "default") -> list[str]:
    """Restores the newest checkpoint and exports its model to `directory`
    (default `<workdir>/export`); the paths written. Raises FileNotFoundError
    if there is no checkpoint. `ctl export --checkpoint best|STEP` passes
    `checkpoint="best"` or the step, as for `evaluate` (optional to support)."""


class ConfigError(Exception):
  """A mistake in the command line or the .gin files; the message says the fix."""


def require_config_file(path: str) -> None:
  """Raises ConfigError, naming the .gin files beside it, if `path` is not a file."""
  if os.path.isfile(path):
    return
  directory = os.path.dirname(path) or "."
  names = ([n for n in os.listdir(directory) if n.endswith(".gin")]
           if os.path.isdir(directory) else [])
  hint = did_you_mean(os.path.basename(path), names)
  raise ConfigError(f"config file {path} not found{hint}; give the path of a .gin "
                    f"file, or the name of a shipped config{_shipped_names()}.")


def find_config(config: str) -> str:
  """The path of the .gin file `config` gives: a path, or a shipped config's name (`dcgan`).
  ConfigError (listing the shipped names) if it is neither."""
  if os.path.isfile(config):
    return config
  shipped = configs.shipped()
  stem = config.removesuffix(".gin")
  if stem != config and stem in shipped:  # `dcgan.gin` for `dcgan`
    raise ConfigError(f"config file {config} not found; {stem!r} is a shipped config: "
                      f"give its name, {stem}, without .gin.")
  if not configs.is_name(config):
    require_config_file(config)  # raises
  if config in shipped:
    return shipped[config]
  raise ConfigError(f"config {config!r} is neither a file nor a shipped config's name"
                    f"{did_you_mean(config, shipped)}; give the name of a shipped config"
                    f"{_shipped_names(shipped)}, or the path of a .gin file.")


def _shipped_names(shipped=None):
  """` (one of a, b, c)` for the shipped configs, or "" if none is installed."""
  names = list(configs.shipped() if shipped is None else shipped)
  return f" (one of {', '.join(names)})" if names else ""


def make_experiment(make: Callable[[], Any], name: str,
                    needs: Sequence[str] = METHODS) -> Experiment:
  """`make()`, checked to have the methods `needs` (else ConfigError); after `parse_gin`."""
  experiment = make()
  missing = [m for m in needs if not callable(getattr(experiment, m, None))]
  if missing:
    raise ConfigError(
        f"--experiment {name}: {type(experiment).__name__} has no method "
        f"{', '.join(missing)}, which this command calls. An experiment is an object "
        "with build(strategy), train(workdir, strategy), evaluate(workdir, strategy) "
        "and export(workdir, directory, strategy) (ctl.tools.experiments.Experiment); "
        "--experiment names the class or function that makes one.")
  return experiment


def binding_of(error: Exception, files: Sequence[str], bindings: Sequence[str]) -> str | None:
  """'`binding` (where)' of the .gin `files` or `bindings` (`--gin`) whose value a
  gin-configured call refused (quoted in `error`'s message), or None."""
  text = str(error)
  if "In call to configurable" not in text:
    return None
  message = text.split("\n  In call to configurable")[0]
  for path, number, line in reversed(_lines(files, bindings)):  # gin keeps a name's last
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
          rf"\b(got|is|was|=) \(?{re.escape(repr(value))}(?!\w|\.\d)", message)
    if quoted:
      where = "--gin" if path is None else f"{path}:{number}"
      return f"`{match.group(1)} = {match.group(2)}` ({where})"
  return None


def first_line(error: Exception) -> str:
  """`Type: message` of `error`, without the call chain gin appends."""
  message = str(error).split("\n  In call to configurable")[0].strip()
  return f"{type(error).__name__}: {message}"


def resolve_experiment(name: str) -> Callable[[], Any]:
  """What makes the experiment `name`: a gin name (`package.Experiment`) or `module:attribute`."""
  if ":" in name:
    module_name, _, attribute = name.partition(":")
    module = _import(module_name, name)
    if not callable(getattr(module, attribute, None)):
      names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
      raise ConfigError(f"--experiment {name!r}: module {module_name} has no class or "
                        f"function {attribute!r}{did_you_mean(attribute, names)}.")
    make = getattr(module, attribute)
    try:
      return gin.get_configurable(make)  # so that the bindings apply to it
    except ValueError:  # not registered with gin: called as it is
      return make
  prefix = name.rpartition(".")[0]
  if prefix:
    _import(prefix)  # registers its configurables
  configurable = _tf_internal.gin_registry().get_match(name)
  if configurable is None:
    raise ConfigError(f"--experiment {name!r} is not a gin configurable"
                      f"{did_you_mean(name, _configurable_names())}; give its gin name "
                      "(e.g. package.Experiment) or module.path:attribute.")
  return gin.get_configurable(configurable.selector)


def gin_name(make: Callable[[], Any]) -> str | None:
  """The name gin knows `make` (from `resolve_experiment`) by, or None."""
  return next((selector for selector, configurable in _tf_internal.gin_registry().items()
               if make is configurable.wrapped or make is configurable.wrapper), None)


def default_experiment() -> str:
  """`module:attribute` of the experiment registered under `ENTRY_POINTS`; ConfigError
  if none is installed, or several are (then --experiment chooses)."""
  found = sorted({entry.value for entry in metadata.entry_points(group=ENTRY_POINTS)})
  if len(found) == 1:
    return found[0]
  if not found:
    raise ConfigError(f"no --experiment given, and no installed package registers one "
                      f"under the entry points {ENTRY_POINTS!r}; pass --experiment "
                      "module.path:attribute (or, if a package of yours registers one, "
                      "reinstall it: pip install -e .).")
  raise ConfigError(f"no --experiment given, and the installed packages register "
                    f"{len(found)} ({', '.join(found)}); pass --experiment with one.")


def load(config: str, bindings: Sequence[str],
         experiment: str | None = None) -> tuple[str, Callable[[], Any]]:
  """Parses the gin file `config`, then `bindings`; `(name, make)` for `make_experiment`."""
  name = experiment or default_experiment()
  make = resolve_experiment(name)
  parse_gin([config], bindings)
  return name, make


def parse_gin(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Parses gin `files`, then `bindings`; a mistake becomes a ConfigError. An `include`
  is resolved beside its file first (gin alone: the current directory first), so a
  config runs, and resumes, from any directory."""
  gin.clear_config()  # a second command in the same process starts afresh
  tree, directories = _include_tree(files)
  try:
    with _tf_internal.gin_search_paths_first(directories):
      # Absolute: gin joins a relative name to each search path first, and logs
      # "Path not found" for each miss (cfg/cfg/my.gin) before it finds the file.
      gin.parse_config_files_and_bindings([os.path.abspath(f) for f in files], bindings)
  except tokenize.TokenError as e:  # an unclosed bracket or string
    raise ConfigError(_describe_unclosed(e, tree, bindings)) from None
  except SyntaxError as e:
    raise ConfigError(_describe_syntax_error(e)) from None
  except (ValueError, KeyError, OSError, ImportError) as e:
    raise ConfigError(_describe_gin_error(e, tree, bindings)) from None
  _check_binding_values(tree, bindings)


# Parameters Keras 3 renamed: a configurable taking **kwargs (a Keras optimizer)
# accepts the old name at parse time and fails only when the run builds it.
_RENAMED = {"lr": "learning_rate"}


def _check_binding_values(files, bindings):
  """Raises ConfigError for a binding gin accepts but the call would refuse only once
  the run builds it: a parameter by its Keras 2 name (`Adam.lr`), or a number as a
  string (`learning_rate = '2e-4'`) where the parameter takes a number: its default
  is one, or it has no default and its annotation says a number or nothing
  (`CosineDecay.initial_learning_rate`: Keras would fail inside the step's first
  trace; `image_folder_dataset.directory = '2024'`, annotated `str`, is a name)."""
  for (scope, selector), values in _tf_internal.gin_bindings_and_uses()[0].items():
    if selector == "gin.macro":
      continue
    parameters = _signature_of(selector)
    for parameter, value in values.items():
      new_name = _RENAMED.get(parameter)
      if new_name in parameters and parameter not in parameters:
        where, text = _binding_source(scope, selector, parameter, value, files, bindings)
        raise ConfigError(
            f"{where}: {selector} has no parameter {parameter!r}, which is Keras 2's "
            f"name: Keras 3 calls it {new_name!r}. Write "
            f"{_key(scope, selector, new_name)} = {text}.")
      default = getattr(parameters.get(parameter), "default", None)
      numeric = not isinstance(default, bool) and isinstance(default, (int, float))
      if (isinstance(value, str) and _is_number(value)
          and (numeric or (default is inspect.Parameter.empty
                           and _may_take_a_number(parameters[parameter])))):
        where, _ = _binding_source(scope, selector, parameter, value, files, bindings)
        raise ConfigError(
            f"{where}: {value!r} is a string, but {parameter} takes a number"
            + (f" (its default is {default!r})" if numeric else "") + ". Write it without "
            f"quotes: {_key(scope, selector, parameter)} = {value.strip()}.")


def _may_take_a_number(parameter):
  """Whether `parameter`'s annotation names int or float, or there is none."""
  annotation = parameter.annotation
  if annotation is inspect.Parameter.empty:
    return True
  text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
  return re.search(r"\b(int|float)\b", text) is not None


def _signature_of(selector):
  """{name: inspect.Parameter} of the configurable `selector`; {} if unknown or ambiguous."""
  try:
    configurable = _tf_internal.gin_registry().get_match(selector)  # KeyError: ambiguous
    return dict(inspect.signature(configurable.wrapped).parameters) if configurable else {}
  except (KeyError, TypeError, ValueError):
    return {}


def _is_number(text):
  try:
    float(text)
  except ValueError:
    return False
  return True


def _key(scope, selector, parameter):
  return f"{scope + '/' if scope else ''}{selector}.{parameter}"


def _binding_source(scope, selector, parameter, value, files, bindings):
  """(where, the value as written) of the binding of `parameter` gin keeps (the last)."""
  found = None
  for where, number, line in _lines(files, bindings):
    match = re.match(r"\s*(?:([\w./]*)/)?([\w.]+)\.(\w+)\s*=", line.split("#")[0])
    if (match and (match[1] or "") == scope and match[3] == parameter
        and (match[2] == selector or selector.endswith("." + match[2]))):
      found = (where, number, line)
  if found is None:
    return f"binding `{_key(scope, selector, parameter)} = {value!r}`", repr(value)
  return _where(*found), found[2].split("#")[0].split("=", 1)[1].strip()


def unused_bindings() -> list[str]:
  """The gin bindings no call has used so far, as `scope/selector.parameter` (a macro
  by its name): gin never checks a binding's scope, nor that the run calls it."""
  bindings, uses = _tf_internal.gin_bindings_and_uses()
  return [scope if selector == "gin.macro" else _key(scope, selector, parameter)
          for (scope, selector), parameters in bindings.items() for parameter in parameters
          if not any(used_selector == selector and parameter in values
                     and _scope_within(scope, used_scope)
                     for (used_scope, used_selector), values in uses.items())]


def referenced_macros() -> set[str]:
  """The gin macros the bindings parsed so far refer to (`%NAME`), at any depth."""
  bindings, _ = _tf_internal.gin_bindings_and_uses()
  found, values = set(), [v for bound in bindings.values() for v in bound.values()]
  while values:
    value = values.pop()
    if isinstance(value, gin.config.ConfigurableReference) and value.selector == "gin.macro":
      found.add("/".join(value.scopes))
    elif isinstance(value, dict):
      values += [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
      values += value
  return found


def _scope_within(scope, active):
  """Whether a binding under `scope` applies to a call under `active` scopes."""
  outer, inner = scope.split("/") if scope else [], active.split("/") if active else []
  return inner[:len(outer)] == outer


_INCLUDE = re.compile(r"""^\s*include\s+(['"])(?P<path>[^'"]+)\1""")


def _includes(path):
  """(line number, line, path as written, path resolved) of each include of the
  file `path`, resolved beside it if a file is there, else as written."""
  here = os.path.dirname(os.path.abspath(path))
  for number, line in enumerate(open(path, encoding="utf-8").read().splitlines(), 1):
    match = _INCLUDE.match(line)
    if match:
      beside = os.path.normpath(os.path.join(here, match["path"]))
      yield number, line, match["path"], beside if os.path.isfile(beside) else match["path"]


def _include_tree(files):
  """(`files` and what they include; the directories to search). ConfigError for an
  include loop, or a relative include gin would find beside another file first."""
  tree, directories, includes = {}, [], []  # tree: {absolute path: path}

  def visit(path, chain):
    key = os.path.abspath(path)
    if key in tree or not os.path.isfile(path):
      return
    tree[key] = path
    if os.path.dirname(key) not in directories:
      directories.append(os.path.dirname(key))
    chain = chain + [key]
    for number, line, included, resolved in _includes(path):
      if os.path.abspath(resolved) in chain:
        start = chain.index(os.path.abspath(resolved))
        loop = " -> ".join(os.path.basename(p) for p in chain[start:] + [resolved])
        raise ConfigError(
            f"{path}, line {number}: `{line.strip()}` closes an include loop ({loop}): "
            "gin would include the files over and over. Remove this include, or the one "
            "that leads back here.")
      if not os.path.isabs(included):
        includes.append((path, number, included, resolved))
      visit(resolved, chain)

  for path in files:
    visit(path, [])
  for path, number, included, resolved in includes:
    found = next((os.path.join(d, included) for d in directories
                  if os.path.isfile(os.path.join(d, included))), resolved)
    if os.path.abspath(found) != os.path.abspath(resolved):
      raise ConfigError(
          f"{path}, line {number}: `include '{included}'` means {resolved}, but "
          f"{found} (beside another included file) has the same relative path and "
          "gin would read that one. Give the include as a path that only one of "
          "them matches (e.g. with its folder), or an absolute path.")
  return list(tree.values()), directories


_BINDING_FORM = ("A binding reads `configurable.parameter = value`, the value a Python "
                 "literal, an @reference or a %macro.")


def _describe_unclosed(error, files, bindings):
  """Where a bracket or string that never closes opens, from Python's tokenizer."""
  for where, text in [(f, open(f, encoding="utf-8").read()) for f in files] + [
      (None, b) for b in bindings or ()]:
    opened, unclosed = _open_brackets(text)
    if not unclosed:
      continue
    line, column, content = opened[0] if opened else (error.args[1][0], 0, "")
    if where is None:
      return (f"binding `{text.strip()}` (--gin): gin cannot parse it: a bracket or a "
              "string opened there never closes.")
    return (f"{_where(where, line, content.rstrip())} (column {column + 1}): gin cannot "
            "parse this line: the bracket opened here never closes (a `)`, `]` or "
            f"`}}` missing, or a string left open). {_BINDING_FORM}")
  return f"gin syntax error: {error.args[0]}"


def _open_brackets(text, before=None):
  """((line, column, text) of each bracket open before line `before`; whether unclosed)."""
  opened = []
  try:
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
      if before is not None and token.start[0] >= before:
        break
      if token.type == tokenize.OP and token.string in "([{":
        opened.append((*token.start, token.line))
      elif token.type == tokenize.OP and token.string in ")]}" and opened:
        opened.pop()
  except tokenize.TokenError:
    return opened, True
  return opened, False


def _import(module_name, experiment=None):
  """The module `module_name`, or if there is none, a ConfigError naming `experiment`
  (None without it: a gin name's prefix need not be a module)."""
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if not module_name.startswith(e.name or "\0"):  # a missing import inside the module
      raise
    if experiment is None:
      return None
    raise ConfigError(f"--experiment {experiment!r}: no module named {module_name!r}; "
                      "check the spelling and that it is importable (on sys.path, or "
                      "installed).") from None


def _configurable_names():
  """Every registered configurable's full name and its last component."""
  return sorted({name for selector, _ in _tf_internal.gin_registry().items()
                 for name in (selector, selector.rpartition(".")[2])})


# gin appends where a binding came from: `\n  In file "x.gin", line 3\n    text`
# or `\n  In bindings string line 1\n    text`, possibly with a `^` line.
_LOCATION = re.compile(r'\n\s*In (?:file "(?P<file>[^"]*)",|bindings string) '
                       r'line (?P<line>\d+)\n\s*(?P<text>[^\n]*)')


def _where(filename, line, text):
  text = (text or "").strip()
  if filename:
    return f"{filename}, line {line}: `{text}`"
  return f"binding `{text}` (--gin)"


def _lines(files, bindings):
  """(file, number, text) of each line of `files` that exist, then (None, 1, binding)."""
  lines = [(f, n, line) for f in files if os.path.isfile(f)
           for n, line in enumerate(open(f, encoding="utf-8").read().splitlines(), 1)]
  return lines + [(None, 1, binding) for binding in bindings or ()]


def _macros(name, files, bindings):
  """(where `%name` is first used, or None; the macros the files and bindings define)."""
  used, defined = None, []
  for where, number, line in _lines(files, bindings):
    code = line.split("#")[0]
    if used is None and re.search(rf"%{re.escape(name)}\b", code):
      used = (where, number, line)
    definition = re.match(r"\s*([A-Za-z_][\w]*)\s*=", code)
    if definition:
      defined.append(definition[1])
  return used, defined


def _describe_gin_error(error, files=(), bindings=()):
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
  macro = re.search(r"No bindings specified for '([\w.]+)/gin.macro'", message)
  if macro:
    used, defined = _macros(macro[1], files, bindings)
    if used and not where:
      where = _where(*used) + ": "
    fix = did_you_mean(macro[1], defined, prefix="%") or (
        f" (define it: a line `{macro[1]} = value` in the .gin file, or "
        f"--gin '{macro[1]} = value')")
  elif unknown:
    fix = (did_you_mean(unknown[1], _configurable_names()) or
           " (no registered configurable is close: is its module imported, e.g. by an "
           "`import` line in the .gin file?)")
  elif parameter:
    selector, name = parameter[1].rpartition("/")[2], parameter[2]
    parameters = list(_signature_of(selector))
    fix = did_you_mean(name, parameters, prefix=f"{selector}.") or (
        f" (its parameters: {', '.join(parameters)})" if parameters else "")
  return f"{where}{message.rstrip('.')}{fix}."


def _describe_syntax_error(error):
  location = error.args[1] if len(error.args) > 1 else None
  message = str(error.args[0]) if error.args else str(error)
  if location is None or not hasattr(location, "line_num"):
    return f"gin syntax error: {message}"
  column = f" (column {location.char_num + 1})" if location.char_num is not None else ""
  opened = []
  if location.filename and os.path.isfile(location.filename):
    text = open(location.filename, encoding="utf-8").read()
    opened = _open_brackets(text, before=location.line_num)[0]
  if opened:  # it opened on an earlier line
    line, _, text = opened[0]
    message += (f" The bracket opened on line {line} (`{text.strip()}`) is not closed "
                "before this line.")
  return (f"{_where(location.filename, location.line_num, location.line_content)}"
          f"{column}: gin cannot parse this line: {message} {_BINDING_FORM}")

