"""What docs/reliability.md promises about security, checked.

    .venv/bin/python -m pytest tests/test_security.py -n 0 -q

- The package never unpickles: no `pickle`/`marshal`/`shelve`/`dill` import,
  no `allow_pickle=True`, no `yaml.load` (only `safe_load`), no `eval`/`exec`,
  in `ctl/`, `gan/`, `examples/` or `bench/`.
- `ctl launch` puts every task on 127.0.0.1 unless told otherwise, and its
  help says that TensorFlow's gRPC servers are unauthenticated.
(That exports load without this library, in a process that cannot import it,
is tests/test_outer_loop.py's `test_export_loads_without_ctl`.)
"""

import json
import os
import re

import helpers

FORBIDDEN = [
    (re.compile(r"^\s*(import|from)\s+(pickle|cPickle|marshal|shelve|dill|joblib)\b", re.M),
     "an unpickling module"),
    (re.compile(r"allow_pickle\s*=\s*True"), "allow_pickle=True"),
    (re.compile(r"\byaml\.(unsafe_)?load\("), "yaml.load (use yaml.safe_load)"),
    (re.compile(r"(?<![\w.])(eval|exec)\("), "eval/exec"),
]


def _sources():
  for top in ("ctl", "gan", "examples", "bench"):
    for directory, _, files in os.walk(os.path.join(helpers.ROOT, top)):
      for name in files:
        if name.endswith(".py"):
          yield os.path.join(directory, name)


def test_nothing_unpickles_or_evaluates_files():
  found = []
  for path in _sources():
    with open(path) as f:
      text = f.read()
    for pattern, what in FORBIDDEN:
      for match in pattern.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(f"{os.path.relpath(path, helpers.ROOT)}:{line}: {what}")
  assert not found, found


def test_launch_binds_to_loopback_and_warns_about_grpc():
  printed = helpers.ctl("launch", "--workers", "2", "--", "python", "-c",
                        "import os; print('CONFIG', os.environ['TF_CONFIG'])").stdout
  configs = [json.loads(line.split("CONFIG ", 1)[1]) for line in printed.splitlines()
             if "CONFIG " in line]
  assert len(configs) == 2
  for config in configs:
    assert all(a.startswith("127.0.0.1:") for a in config["cluster"]["worker"]), config
  help_text = helpers.ctl("launch", "--help").stdout
  assert "unauthenticated" in help_text, help_text
