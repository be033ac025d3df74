"""The documentation site: `mkdocs build --strict` passes, and fails on a broken
link, anchor or API reference (planted in a copy of the docs); every public name
of ctl and gan has its API entry; and a browser renders the front page and the
Runner's reference.

The browser is Debian's chromium, headless. Without it that test is skipped,
saying so, unless CTL_REQUIRE_BROWSER=1 (`.ci/run` installs chromium and sets it),
when it fails. Its screenshots go to $CTL_DOCS_SHOTS when that is set:

    CTL_DOCS_SHOTS=/tmp/docs-shots python -m pytest tests/test_docs.py
"""

import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

# Material for MkDocs prints a notice about MkDocs 2 at every build; this silences it.
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
# Every file the build reads: the config, the front page, the guides (with the
# hooks) and the sources the API reference is made from.
SOURCES = ("mkdocs.yml", "README.md", "docs", "ctl", "gan")


def mkdocs_build(root, site):
  return subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
       os.path.join(root, "mkdocs.yml"), "--site-dir", str(site)],
      capture_output=True, text=True, env=ENV, cwd=root, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  site = tmp_path_factory.mktemp("site")
  proc = mkdocs_build(ROOT, site)
  assert proc.returncode == 0, proc.stderr[-5000:]
  return site


def test_the_site_builds_strictly_with_every_page(site):
  pages = {os.path.relpath(os.path.join(d, name), site)
           for d, _, names in os.walk(site) for name in names if name.endswith(".html")}
  assert {"index.html", "step.html", "outer-loop.html", "gan.html", "strategies.html",
          "parity.html", "reliability.html", "performance.html", "quality.html",
          "evaluation.html", "architecture.html", "testing.html", "workflow.html",
          os.path.join("api", "ctl.html"), os.path.join("api", "gan.html")} <= pages, pages
  # The front page is README, its links to docs/x.md made the site's x.html.
  index = (site / "index.html").read_text()
  assert 'id="quickstart"' in index and 'href="step.html"' in index
  assert 'href="docs/' not in index


def _copy_of_the_docs(tmp_path):
  tmp_path.mkdir()
  for name in SOURCES:
    path = os.path.join(ROOT, name)
    if os.path.isdir(path):
      shutil.copytree(path, tmp_path / name,  # sources and text: no data
                      ignore=shutil.ignore_patterns("__pycache__", "*.npz", "*.h5"))
    else:
      shutil.copy(path, tmp_path / name)
  return tmp_path


def _append(path, text):
  with open(path, "a") as f:
    f.write(text)


@pytest.mark.slow  # a build of its own, a few seconds
def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path):
  root = _copy_of_the_docs(tmp_path / "root")
  _append(root / "docs" / "step.md", "\nSee [a guide](nowhere.md) and "
          "[a section](parity.md#no-such-section).\n")
  _append(root / "README.md", "\nSee [the manual](docs/manual.md).\n")
  proc = mkdocs_build(root, tmp_path / "site")
  output = proc.stdout + proc.stderr
  assert proc.returncode != 0
  assert "Aborted with 3 warnings in strict mode" in output, output[-3000:]
  assert "'step.md' contains a link 'nowhere.md'" in output
  assert "does not contain an anchor '#no-such-section'" in output
  assert "'index.md' contains a link 'manual.md'" in output  # README's, in the site


@pytest.mark.slow  # a build of its own, a few seconds
def test_an_api_reference_to_a_name_that_is_not_there_fails_the_build(tmp_path):
  root = _copy_of_the_docs(tmp_path / "root")
  _append(root / "docs" / "api" / "ctl.md", "\n::: ctl.runner.Runer\n")
  proc = mkdocs_build(root, tmp_path / "site")
  output = proc.stdout + proc.stderr
  assert proc.returncode != 0
  assert "ctl.runner.Runer" in output, output[-3000:]


def _all(package):
  """The package's `__all__`, read from its source (importing gan imports TensorFlow):
  a list, or `list(TABLE)`, the keys of a dict (ctl's table of homes)."""
  with open(os.path.join(ROOT, package, "__init__.py")) as f:
    tree = ast.parse(f.read())
  values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}
  assert "__all__" in values, f"{package}/__init__.py has no __all__"
  value = values["__all__"]
  if isinstance(value, ast.Call):  # list(TABLE)
    return list(ast.literal_eval(values[value.args[0].id]))
  return ast.literal_eval(value)


@pytest.mark.parametrize("package", ["ctl", "gan"])
def test_every_public_name_has_its_api_entry(package):
  with open(os.path.join(ROOT, "docs", "api", f"{package}.md")) as f:
    page = f.read()
  # `::: ctl.runner.Runner` documents ctl.Runner; `heading: X` names an entry X.
  documented = {path.rsplit(".", 1)[-1] for path in re.findall(r"^::: ([\w.]+)", page, re.M)}
  documented |= set(re.findall(r"^\s+heading: (\w+)", page, re.M))
  missing = [name for name in _all(package) if name not in documented]
  assert not missing, (f"{missing}: add an entry `::: <home module>.<name>` to "
                       f"docs/api/{package}.md")


def _chromium():
  chromium = shutil.which("chromium") or shutil.which("chromium-browser")
  if chromium is None:
    give_up = pytest.fail if os.environ.get("CTL_REQUIRE_BROWSER") == "1" else pytest.skip
    give_up("chromium not found: install Debian's chromium package "
            "(as root: apt-get install chromium).")
  return chromium


def _browse(chromium, profile, page, *args):
  # --no-sandbox: Chromium's sandbox refuses to run as root, as CI does.
  proc = subprocess.run(
      [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
       f"--user-data-dir={profile}", *args, page.as_uri()],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _has_content(png):
  """A rendered page, not a blank one: many colours (a blank page has one or two)."""
  from PIL import Image  # matplotlib's dependency (the notebook extra)
  with Image.open(png) as image:
    assert image.size == (1280, 1000), image.size
    colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
  return colours is None or len(colours) > 50


@pytest.mark.slow  # four browser runs, about 5 s
def test_a_browser_renders_the_front_page_and_the_runners_reference(site, tmp_path):
  chromium = _chromium()
  shots = os.environ.get("CTL_DOCS_SHOTS") or str(tmp_path)
  os.makedirs(shots, exist_ok=True)
  pages = {"front-page": (site / "index.html",
                          ["Quickstart", "A quick look", "What ctl does", "Where to go next",
                           "The step contract", "make_strategy"]),
           "api-ctl-runner": (site / "api" / "ctl.html",
                              ['id="ctl.runner.Runner"', "steps_per_loop",
                               'id="ctl.runner.Runner.fit"', 'id="ctl.runner.Runner.evaluate"',
                               "Trains until the global step",
                               'id="ctl.step.context.StepContext.minimize"'])}
  for name, (page, expected) in pages.items():
    dom = _browse(chromium, tmp_path / "profile", page, "--dump-dom")
    missing = [text for text in expected if text not in dom]
    assert not missing, (name, missing)
    png = os.path.join(shots, f"{name}.png")
    _browse(chromium, tmp_path / "profile", page, "--window-size=1280,1000",
            f"--screenshot={png}")
    assert _has_content(png), png
