"""The layers: imports point one way (command line -> gan -> ctl core), a
module's private names stay in it, and private TF/Keras/gin attributes are
reached from ctl/base/_tf_internal.py only."""

import ast
import os
import re

import pytest

from helpers import ROOT


def _ctl_lines(pattern, *, outside_cli=False):
  """`path:line: text` of each line of ctl/ (outside ctl/cli/ if asked) matching `pattern`."""
  found = []
  for directory, _, files in os.walk(os.path.join(ROOT, "ctl")):
    if outside_cli and os.path.relpath(directory, ROOT).split(os.sep)[:2] == ["ctl", "cli"]:
      continue
    for name in sorted(files):
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        with open(path) as f:
          found += [f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}"
                    for number, line in enumerate(f, 1) if re.match(pattern, line)]
  return found


def test_no_module_of_ctl_imports_gan():
  importing = _ctl_lines(r"\s*(import gan\b|from gan\b)")
  assert not importing, "\n".join(importing)


def test_only_ctl_cli_parses_command_lines():
  # The command line is its own layer: the library modules hold no parsers or
  # subcommands, and so can import TensorFlow at the top.
  parsing = _ctl_lines(r"\s*(import argparse\b|from argparse\b|def add_parser\b)",
                       outside_cli=True)
  assert not parsing, "\n".join(parsing)


# Names a module may read from another although they start with "_": the
# namedtuple API, and two standard-library functions meant for such use.
_PUBLIC_UNDERSCORE = {"_fields", "_asdict", "_replace", "_make", "_exit", "_getframe"}
_PRIVATE_TF_MODULES = ("tensorflow.python", "tensorflow.core", "keras.src")
_TF_HOME = os.path.join("ctl", "base", "_tf_internal.py")


def _sources():
  for top in ("ctl", "gan", "bench", "examples", "tests"):
    for directory, _, files in os.walk(os.path.join(ROOT, top)):
      for name in sorted(files):
        if name.endswith(".py"):
          path = os.path.join(directory, name)
          with open(path) as f:
            yield os.path.relpath(path, ROOT), ast.parse(f.read(), path)


def _names_defined_in(tree):
  """Every name a module binds: its functions, classes, attributes, variables."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
      names.add(node.attr)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      names.add(node.id)
    elif isinstance(node, ast.arg):
      names.add(node.arg)
  return names


def _private_reads(tree, own):
  """(line, text) of each read of a private attribute this module does not define."""
  for node in ast.walk(tree):
    name = None
    if isinstance(node, ast.Attribute):
      if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
        continue
      name = node.attr
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
          and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
      name = node.args[1].value
    if (name and name.startswith("_") and not name.startswith("__")
        and name not in own and name not in _PUBLIC_UNDERSCORE and name != "_tf_internal"):
      yield node.lineno, ast.unparse(node)


def test_no_module_reads_another_modules_private_attributes():
  # A name with a leading underscore belongs to the module that defines it;
  # private TF, Keras and gin attributes are read in ctl/base/_tf_internal.py only.
  reads = []
  for path, tree in _sources():
    if path != _TF_HOME:
      own = _names_defined_in(tree)
      reads += [f"{path}:{line}: {text}" for line, text in _private_reads(tree, own)]
  assert not reads, "\n".join(reads)


def test_private_tensorflow_and_keras_modules_are_imported_in_one_place():
  imports = []
  for path, tree in _sources():
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        modules = [node.module or ""]
      elif isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
      else:
        continue
      imports += [f"{path}:{node.lineno}: {m}" for m in modules
                  if m.startswith(_PRIVATE_TF_MODULES) and path != _TF_HOME]
  assert not imports, "\n".join(imports)


def _is_public(name):
  return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _public_functions(tree):
  """(qualified name, node, is_method) of each public function and method of a module."""
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_public(node.name):
      yield node.name, node, False
    elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
      for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_public(item.name):
          static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                       for d in item.decorator_list)
          yield f"{node.name}.{item.name}", item, not static


def _unannotated(function, is_method):
  """The parameters (and "return") of `function` that have no annotation."""
  arguments = function.args
  parameters = arguments.posonlyargs + arguments.args
  if is_method:
    parameters = parameters[1:]  # self or cls
  missing = [p.arg for p in parameters + arguments.kwonlyargs if p.annotation is None]
  if function.returns is None and function.name != "__init__":
    missing.append("return")
  return missing


@pytest.mark.parametrize("package", ["ctl", "gan"])
def test_public_functions_are_annotated(package):
  # Public: a function, or a method of a class, without a leading "_" (or a
  # dunder), in a module without one. *args and **kwargs may go unannotated.
  unannotated = []
  for directory, _, files in os.walk(os.path.join(ROOT, package)):
    for file_name in sorted(files):
      path = os.path.relpath(os.path.join(directory, file_name), ROOT)
      if not file_name.endswith(".py") or not _is_public(file_name[:-len(".py")]):
        continue
      with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), path)
      for name, function, is_method in _public_functions(tree):
        missing = _unannotated(function, is_method)
        if missing:
          unannotated.append(f"{path}:{function.lineno}: {name}: {', '.join(missing)}")
  assert not unannotated, "\n".join(unannotated)


# What a strategy is (its replicas, workers, chief, kind) is decided in
# ctl/distribute/strategies.py, once, as a `Placement` (ctl/distribute/placement.py);
# every other module asks that.
_STRATEGY_HOME = (os.path.join("ctl", "distribute", "strategies.py"),
                  os.path.join("ctl", "distribute", "placement.py"), _TF_HOME)
_STRATEGY_INSPECTIONS = {"extended", "num_replicas_in_sync", "cluster_resolver"}


def _strategy_inspections(tree):
  """(line, text) of each strategy class named, or strategy internals read."""
  for node in ast.walk(tree):
    if not isinstance(node, ast.Attribute):
      continue
    text = ast.unparse(node)
    if text == "tf.distribute.cluster_resolver":  # TF's module of resolvers
      continue
    if node.attr in _STRATEGY_INSPECTIONS or (
        re.fullmatch(r"tf\.distribute\.(experimental\.)?\w+Strategy", text)
        and text != "tf.distribute.Strategy"):
      yield node.lineno, text


def test_no_module_outside_the_strategy_module_inspects_strategies():
  found = []
  for path, tree in _sources():
    if path.split(os.sep)[0] in ("ctl", "gan") and path not in _STRATEGY_HOME:
      found += [f"{path}:{line}: {text}" for line, text in _strategy_inspections(tree)]
  assert not found, "\n".join(found)


def test_the_outer_loop_and_its_helpers_take_the_parts_they_use_not_the_runner():
  # As Orbit's controller takes a trainer and a checkpoint manager: the
  # placement, the training state, the data feed and the compiled step,
  # never the whole Runner (nor an attribute named runner).
  helpers = ["loop/fit", "loop/checkpoints", "loop/stopping", "loop/actions", "loop/history",
             "loop/workdir", "loop/progress", "tools/check", "parts/evaluation", "parts/steps",
             "parts/state", "parts/data", "parts/export"]
  found = []
  for path, tree in _sources():
    if path not in [os.path.join("ctl", *f"{name}.py".split("/")) for name in helpers]:
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.arg) and node.arg == "runner":
        found.append(f"{path}:{node.lineno}: parameter runner")
      elif isinstance(node, ast.Attribute) and (ast.unparse(node) == "ctl.Runner"
                                                or node.attr == "runner"):
        found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
      elif isinstance(node, ast.ImportFrom) and node.module == "ctl.runner":
        found.append(f"{path}:{node.lineno}: imports ctl.runner")
  assert not found, "\n".join(found)


# The tree is the layers of docs/architecture.md, lowest first: a module of
# ctl/ imports its own layer's modules and lower layers' only.
_LAYERS = ["base", "distribute", "step", "parts", "loop", "runner", "tools", "cli"]


def _layer(module):
  """The layer of `ctl.<...>` module `module` (a dotted name), or None for ctl itself."""
  parts = module.split(".")
  if parts[0] != "ctl" or len(parts) == 1:
    return None
  return parts[1]


def test_every_module_of_ctl_lives_in_a_layer_and_imports_down_only():
  upward, homeless = [], []
  for path, tree in _sources():
    folders = path.split(os.sep)
    if folders[0] != "ctl" or path == os.path.join("ctl", "__init__.py"):
      continue
    own = folders[1] if len(folders) > 2 else folders[1][:-len(".py")]
    if own not in _LAYERS:
      homeless.append(path)
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                   if node.module == "ctl"]
      elif isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      else:
        continue
      for target in targets:
        layer = _layer(target)
        if layer in _LAYERS and _LAYERS.index(layer) > _LAYERS.index(own):
          upward.append(f"{path}:{node.lineno}: {own} imports {target}")
  assert not homeless, f"modules outside the layers {_LAYERS}: {homeless}"
  assert not upward, "\n".join(upward)


def _homes():
  """ctl's one table: each public name and its home module, read from ctl/__init__.py."""
  with open(os.path.join(ROOT, "ctl", "__init__.py")) as f:
    tree = ast.parse(f.read())
  tables = [node.value for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)]
  assert len(tables) == 1, f"ctl/__init__.py keeps {len(tables)} tables; keep one"
  return ast.literal_eval(tables[0])


def _bound_at_top(tree):
  """The names a module binds at its top level (definitions, assignments, imports)."""
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names |= {t.id for t in targets if isinstance(t, ast.Name)}
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names |= {(a.asname or a.name).split(".")[0] for a in node.names}
  return names


def test_ctl_keeps_one_table_of_public_names_and_their_homes():
  import ctl  # pylint: disable=import-outside-toplevel
  homes = _homes()
  assert ctl.__all__ == list(homes)
  trees = dict(_sources())
  missing = []
  for name, home in homes.items():
    path = os.path.join(*home.split("."))
    tree = trees.get(f"{path}.py") or trees[os.path.join(path, "__init__.py")]
    if name not in _bound_at_top(tree):
      missing.append(f"{name}: not defined in its home {home}")
  assert not missing, "\n".join(missing)


def _past_the_face(tree, exported, *, homes=False):
  """(line, text) of each use of ctl beyond its public names: `ctl.<name>` or `from
  ctl import <name>` of a name it does not export and, unless `homes`, any import
  of a module of ctl (`from ctl.<module> import`, `import ctl.<module>`)."""
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == "ctl" and node.attr not in exported):
      yield node.lineno, ast.unparse(node)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "ctl":
      yield from ((node.lineno, f"from ctl import {a.name}") for a in node.names
                  if a.name not in exported and not (homes and a.name in _LAYERS))
    elif isinstance(node, ast.ImportFrom) and not homes and node.level == 0 and (
        node.module.startswith("ctl.")):
      yield node.lineno, f"from {node.module} import ..."
    elif isinstance(node, ast.Import) and not homes:
      yield from ((node.lineno, f"import {a.name}") for a in node.names
                  if a.name.startswith("ctl."))


def test_gan_uses_ctls_public_names_only():
  # The kit is built on ctl as any package would be: `import ctl`, `ctl.Runner`,
  # `from ctl import arguments`; what it needs more is made public in ctl/__init__.py.
  exported = set(_homes())
  found = [f"{path}:{line}: {text}" for path, tree in _sources()
           if path.split(os.sep)[0] == "gan" for line, text in _past_the_face(tree, exported)]
  assert not found, "\n".join(found)


def test_no_arrow_through_ctls_face_to_a_name_it_does_not_export():
  # `ctl.<name>` loads only the names of the table; a module is reached by its
  # home (`from ctl.tools import parity`), not as `ctl.parity`.
  exported = set(_homes())
  found = [f"{path}:{line}: {text}" for path, tree in _sources()
           if path.split(os.sep)[0] in ("ctl", "gan")
           for line, text in _past_the_face(tree, exported, homes=True)]
  assert len(found) == 0, "\n".join(found)


def test_results_are_reduced_over_replicas_in_one_place():
  # A step's results, in training and evaluation alike, are reduced by
  # ctl/step/reduction.py (`across_replicas`); the one other cross-replica
  # reduce is the workers' vote on what is due (ctl/loop/stopping.py, `agree`).
  homes = {os.path.join("ctl", "step", "reduction.py"): "across_replicas",
           os.path.join("ctl", "loop", "stopping.py"): "agree"}
  found = []
  for path, tree in _sources():
    if path.split(os.sep)[0] not in ("ctl", "gan"):
      continue
    for function in ast.walk(tree):
      if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(function):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("reduce", "experimental_local_results")
            and homes.get(path) != function.name):
          found.append(f"{path}:{node.lineno}: {ast.unparse(node.func)} in {function.name}")
  assert not found, "\n".join(found)
